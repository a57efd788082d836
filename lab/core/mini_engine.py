"""A paged-attention Llama in plain PyTorch that uses `lab.core.prefix_cache` for its KV blocks.

K/V live in a pool of fixed-size blocks; a request's block table maps its positions to blocks. On a
prefix-cache hit the first `num_cached_tokens` positions are already in the pool, so prefill runs
the model only on the uncached suffix, whose queries attend to the cached K/V and to their own.

With a `tier` (`lab.core.kv_tier`), a block the pool evicts keeps its K/V there, and a request whose
chain misses in the pool loads the next blocks it finds in the tier back into its own blocks before
prefill starts.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lab.core.block_hash import chain_hashes, full_blocks, hittable_blocks
from lab.core.kv_tier import KVTier
from lab.core.prefix_cache import Block, PrefixCache

ATTENTION_CHUNK = 128  # query rows per attention call during prefill


@dataclass
class Generation:
    output_token_ids: list[int]
    num_cached_tokens: int  # from the pool and the tier
    ttft_s: float  # request start to first token (lookup + prefill + sampling)
    lookup_s: float  # hashing the prompt's blocks and looking them up in the pool
    first_logits: torch.Tensor  # logits at the last prompt position
    num_tier_tokens: int = 0  # of num_cached_tokens, those loaded back from the tier
    load_s: float = 0.0  # reading them from the tier and copying them into the request's blocks


def rope_theta(config: dict) -> float:
    """RoPE's base: transformers 5 writes it under `rope_parameters`, older configs at the top
    level."""
    return (config.get("rope_parameters") or {}).get("rope_theta") or config.get(
        "rope_theta", 10000.0
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class MiniEngine:
    def __init__(
        self,
        model_path: str | Path,
        *,
        block_size: int = 16,
        num_blocks: int = 1024,
        enable_prefix_caching: bool = True,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        hash_algo: str = "sha256",
        tier: KVTier | None = None,
    ) -> None:
        path = Path(model_path)
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"model_path={str(model_path)!r} needs config.json and model.safetensors"
            )
        self.config = json.loads((path / "config.json").read_text())
        self.device, self.dtype = torch.device(device), dtype
        self.w = {
            k: v.to(self.device, dtype) for k, v in load_file(path / "model.safetensors").items()
        }
        if self.config.get(
            "tie_word_embeddings"
        ):  # the output layer is the embedding matrix (SmolLM2)
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.cache = PrefixCache(
            num_blocks, block_size, hash_algo, enable_caching=enable_prefix_caching
        )
        c = self.config
        self.n_layers, self.n_heads, self.n_kv_heads = (
            c["num_hidden_layers"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
        )
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.n_heads
        self.eps = c["rms_norm_eps"]
        # K and V of every layer: [layer, block, offset in block, kv head, head dim]
        shape = (self.n_layers, num_blocks, block_size, self.n_kv_heads, self.head_dim)
        self.k_pool = torch.zeros(shape, device=self.device, dtype=dtype)
        self.v_pool = torch.zeros(shape, device=self.device, dtype=dtype)
        self.inv_freq = 1.0 / (
            rope_theta(c)
            ** (
                torch.arange(0, self.head_dim, 2, device=self.device, dtype=torch.float32)
                / self.head_dim
            )
        )
        self._ids = count()
        self.use_tier(tier)

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    def _slots(
        self, table: list[int], positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = torch.tensor(table, device=self.device)[positions // self.block_size]
        return blocks, positions % self.block_size

    def _attention(
        self, layer: int, x: torch.Tensor, table: list[int], start: int, cos, sin
    ) -> torch.Tensor:
        p = f"model.layers.{layer}.self_attn."
        n = x.shape[0]
        q = (x @ self.w[p + "q_proj.weight"].T).view(n, self.n_heads, self.head_dim)
        k = (x @ self.w[p + "k_proj.weight"].T).view(n, self.n_kv_heads, self.head_dim)
        v = (x @ self.w[p + "v_proj.weight"].T).view(n, self.n_kv_heads, self.head_dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        blocks, offsets = self._slots(table, torch.arange(start, start + n, device=self.device))
        self.k_pool[layer, blocks, offsets] = k
        self.v_pool[layer, blocks, offsets] = v
        # Every key of the request so far: the cached prefix and the tokens just written.
        end = start + n
        ids = torch.tensor(table[: math.ceil(end / self.block_size)], device=self.device)
        keys = self.k_pool[layer, ids].flatten(0, 1)[:end]
        values = self.v_pool[layer, ids].flatten(0, 1)[:end]
        group = self.n_heads // self.n_kv_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        out = self._causal_attention(q.transpose(0, 1), keys, values, start)
        return out.transpose(0, 1).reshape(n, -1) @ self.w[p + "o_proj.weight"].T

    def _causal_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Queries at positions start.. over keys 0..; in chunks, so keys past a chunk's end are
        skipped."""
        out = torch.empty_like(q)
        key_positions = torch.arange(keys.shape[1], device=self.device)
        for lo in range(0, q.shape[1], ATTENTION_CHUNK):
            hi = min(q.shape[1], lo + ATTENTION_CHUNK)
            end = start + hi
            mask = (
                key_positions[None, :end]
                <= (start + torch.arange(lo, hi, device=self.device))[:, None]
            )
            out[:, lo:hi] = F.scaled_dot_product_attention(
                q[:, lo:hi], keys[:, :end], values[:, :end], attn_mask=mask
            )
        return out

    def _mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{layer}.mlp."
        gate, up = x @ self.w[p + "gate_proj.weight"].T, x @ self.w[p + "up_proj.weight"].T
        return (F.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], start: int, table: list[int]) -> torch.Tensor:
        """Run `token_ids` at positions start.., writing their K/V into `table`'s blocks; logits of
        the last one."""
        x = self.w["model.embed_tokens.weight"][torch.tensor(token_ids, device=self.device)]
        cos, sin = self._rope(torch.arange(start, start + len(token_ids), device=self.device))
        for layer in range(self.n_layers):
            p = f"model.layers.{layer}."
            x = x + self._attention(
                layer,
                rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps),
                table,
                start,
                cos,
                sin,
            )
            x = x + self._mlp(
                layer, rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            )
        last = rms_norm(x[-1], self.w["model.norm.weight"], self.eps)
        return last @ self.w["lm_head.weight"].T

    def generate(
        self, prompt_token_ids: Sequence[int], max_tokens: int = 1, cache_salt: str | None = None
    ) -> Generation:
        """Greedy decoding of one request; its blocks stay cached after it finishes."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be at least 1")
        limit = self.config["max_position_embeddings"]
        if len(prompt_token_ids) + max_tokens > limit:
            raise ValueError(
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens={max_tokens} exceeds the "
                f"model's context of {limit} tokens"
            )
        request_id = f"mini-{next(self._ids)}"
        start = time.perf_counter()
        blocks = full_blocks(prompt_token_ids, self.block_size)
        chain = blocks, chain_hashes(blocks, self.cache.hash_algo, cache_salt)
        in_pool = self.cache.cached_prefix_blocks(
            chain[1][: hittable_blocks(len(prompt_token_ids), self.block_size)], blocks
        )
        lookup_s = time.perf_counter() - start
        loaded = self._read_tier(
            chain, in_pool, len(prompt_token_ids)
        )  # before allocating: its evictions can't touch it
        load_s = time.perf_counter() - start - lookup_s
        num_cached = self.cache.allocate(request_id, prompt_token_ids, cache_salt, chain=chain)
        try:
            table = self.cache.tables[request_id]
            copy_start = time.perf_counter()
            for block, (k, v) in zip(table[in_pool:], loaded):
                self.k_pool[:, block.block_id], self.v_pool[:, block.block_id] = k, v
            load_s += time.perf_counter() - copy_start
            num_loaded = len(loaded) * self.block_size
            num_cached += num_loaded
            ids = [b.block_id for b in table]
            logits = self.forward(prompt_token_ids[num_cached:], num_cached, ids)
            output = [int(logits.argmax())]
            ttft_s = time.perf_counter() - start
            for position in range(len(prompt_token_ids), len(prompt_token_ids) + max_tokens - 1):
                self.cache.append_tokens(request_id, output[-1:])
                ids = [b.block_id for b in table]
                output.append(int(self.forward(output[-1:], position, ids).argmax()))
        finally:
            self.cache.free(request_id)
        return Generation(
            output, num_cached, ttft_s, lookup_s, logits.float().cpu(), num_loaded, load_s
        )

    def use_tier(self, tier: KVTier | None) -> None:
        """From now on, keep evicted blocks in `tier` and load from it (None: no tier)."""
        self.tier = tier
        self.cache.on_evict = None if tier is None else self._demote

    def _demote(self, block: Block) -> None:
        """The pool is evicting `block`: keep its K/V in the tier."""
        kv = self.k_pool[:, block.block_id], self.v_pool[:, block.block_id]
        self.tier.put(block.block_hash, block.token_ids, kv)

    def _read_tier(self, chain, in_pool: int, num_tokens: int) -> list:
        """The K/V of the tier's blocks that continue the pool's hit of `in_pool` blocks (a chain
        stops at its first miss, in the tier as in the pool)."""
        if self.tier is None or not self.cache.enable_caching:
            return []
        blocks, hashes = chain
        last = hittable_blocks(num_tokens, self.block_size)
        return self.tier.load_chain(hashes[in_pool:last], blocks[in_pool:last])
