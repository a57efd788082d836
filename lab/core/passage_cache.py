"""Reuse a passage's K/V wherever it sits in a prompt: a passage cache and five ways to fill one
prompt.

A prefix cache (`lab.core.prefix_cache`) reuses K/V only up to the first token that differs, so a
retrieved passage is recomputed whenever different passages came before it. Here each passage's K/V
is computed once, on its own, and stored with K taken *before* RoPE. RoPE makes attention depend
only on how far apart two positions are, so a passage's own hidden states do not depend on where it
starts, and its stored K can be rotated to any position later. What stored K/V cannot hold is the
text before the passage: from layer 1 up, every token's K/V depend on everything it attends to. The
methods differ in which tokens they recompute to repair that:

- `full`: every token in every layer: the reference.
- `prefix`: the first chunk reused (it leads the prompt, where it was computed: a full prefill's
  K/V, to rounding), everything after it computed: what a prefix cache does when the passages come
  in an order it has not seen.
- `naive`: every stored chunk reused as it is; only the tokens of no stored chunk are computed.
- `cacheblend` (Yao et al., EuroSys 2025): layers 0..`check_layer` compute every token; at
  `check_layer` the reused tokens whose computed K moved furthest from the stored K (the top `ratio`
  of them) are chosen, and only they, with the tokens of no stored chunk, are computed in every
  later layer.
- `epic` (Hu et al., 2024): the first `k` tokens of every reused chunk computed in every layer, with
  the rest (not those of a chunk at position 0: it sits where it was computed).

A prompt is a list of chunks of token ids. The last chunk (the question) is never taken from the
cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lab.checks import number_in, positive_int
from lab.core.mini_engine import MiniEngine, rms_norm, rotate_half

METHODS = ("full", "prefix", "naive", "cacheblend", "epic")
QUERY_ROWS = 256  # query rows per attention call: bounds the score matrix of a long prompt


@dataclass(frozen=True)
class Method:
    """How to fill a prompt: `name` one of METHODS; `ratio` and `check_layer` for cacheblend, `k`
    for epic."""

    name: str
    ratio: float = 0.15
    check_layer: int = 1
    k: int = 16

    def __post_init__(self) -> None:
        if self.name not in METHODS:
            raise ValueError(f"method name={self.name!r} must be one of {', '.join(METHODS)}")
        number_in("ratio", self.ratio, 0, 1, "a share of the reused tokens, in [0, 1]")
        positive_int(
            "check_layer",
            self.check_layer,
            "-1 (no layer computed in full) or a layer index",
            minimum=-1,
        )
        positive_int("k", self.k, "a number of tokens, 0 or more", minimum=0)

    def __str__(self) -> str:
        extra = {
            "cacheblend": f"(r={self.ratio:g}, check layer {self.check_layer})",
            "epic": f"(k={self.k})",
        }
        return self.name + extra.get(self.name, "")


@dataclass
class StoredChunk:
    """A chunk's K (before RoPE) and V in every layer, computed with the chunk alone: [layer, token,
    head, dim]."""

    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class Fill:
    """A filled prompt: the K/V every later token attends to, and what it took."""

    method: Method
    logits: (
        torch.Tensor
    )  # [tokens of the last chunk, vocab]: the next-token logits at each of its positions
    keys: list[torch.Tensor]  # per layer, rotated to the prompt's positions: [token, head, dim]
    values: list[torch.Tensor]
    recomputed: torch.Tensor  # [layer, token] bool: which rows the model computed
    seconds: float  # the fill, from stored K/V to the last chunk's logits

    @property
    def compute_share(self) -> float:
        """Token-layer rows computed, as a share of a full prefill's (its FLOPs, to first order)."""
        return self.recomputed.float().mean().item()


class PassageEngine(MiniEngine):
    """The mini-engine's weights and layers over one prompt's contiguous K/V, with a store of
    chunks' K/V."""

    def __init__(self, model_path: str | Path, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(
            model_path, block_size=1, num_blocks=1, dtype=dtype
        )  # no paged pool is used here
        self.store: dict[tuple[int, ...], StoredChunk] = {}

    def cache_chunk(self, token_ids: Sequence[int]) -> StoredChunk:
        """Compute a chunk alone, at positions 0.., and keep its K before RoPE and its V (once per
        chunk)."""
        key = tuple(token_ids)
        if key not in self.store:
            run = self._run(
                list(token_ids), [None] * len(token_ids), full_layers=self.n_layers, choose=None
            )
            self.store[key] = StoredChunk(torch.stack(run.pre_rope_keys), torch.stack(run.values))
        return self.store[key]

    def pre_rope_keys(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Every layer's K before RoPE for a prompt computed in full: [layer, token, head, dim]."""
        run = self._run(
            list(token_ids), [None] * len(token_ids), full_layers=self.n_layers, choose=None
        )
        return torch.stack(run.pre_rope_keys)

    def fill(self, chunks: Sequence[Sequence[int]], method: Method) -> Fill:
        """Fill a prompt of `chunks` by `method`; every chunk but the last is taken from the store
        where the method reuses it (it is stored first if it is not there yet, outside the timed
        fill)."""
        if len(chunks) < 1 or any(len(c) < 1 for c in chunks):
            raise ValueError(
                "chunks must be a non-empty list of non-empty token id lists (the last is the question)"
            )
        limit = self.config["max_position_embeddings"]
        token_ids = [t for c in chunks for t in c]
        if len(token_ids) > limit:
            raise ValueError(
                f"the prompt's {len(token_ids)} tokens exceed the model's context of {limit}"
            )
        vocab = self.w["model.embed_tokens.weight"].shape[0]
        if not all(0 <= t < vocab for t in token_ids):
            raise ValueError(
                f"token id {next(t for t in token_ids if not 0 <= t < vocab)} is outside the model's "
                f"vocabulary of {vocab}: tokenize with this model's own tokenizer"
            )
        if method.name == "cacheblend" and method.check_layer >= self.n_layers:
            raise ValueError(
                f"check_layer={method.check_layer} must be below the model's {self.n_layers} layers"
            )
        reusable = self._reusable_chunks(len(chunks), method)
        stored = [self.cache_chunk(c) if i in reusable else None for i, c in enumerate(chunks)]
        start = time.perf_counter()
        per_token = [
            (s, j) if s is not None else None for s, c in zip(stored, chunks) for j in range(len(c))
        ]
        full_layers = {"full": self.n_layers, "cacheblend": method.check_layer + 1}.get(
            method.name, 0
        )
        run = self._run(token_ids, per_token, full_layers, self._chooser(chunks, stored, method))
        logits = (
            rms_norm(run.hidden[-len(chunks[-1]) :], self.w["model.norm.weight"], self.eps)
            @ self.w["lm_head.weight"].T
        )
        return Fill(
            method,
            logits.float(),
            run.keys,
            run.values,
            run.recomputed,
            time.perf_counter() - start,
        )

    def _reusable_chunks(self, n_chunks: int, method: Method) -> set[int]:
        """Which chunks the method takes from the store: none, the first, or all but the question."""
        if method.name == "full" or n_chunks == 1:
            return set()
        return {0} if method.name == "prefix" else set(range(n_chunks - 1))

    def _chooser(
        self, chunks, stored, method: Method
    ) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
        """The rows computed after the full layers: from (is-reused mask, K deviation at the check
        layer)."""
        starts, at = [], 0
        for chunk, s in zip(chunks, stored):
            if s is not None and at > 0:  # a chunk at position 0 sits where it was computed
                starts.append(at)
            at += len(chunk)

        def choose(reused: torch.Tensor, deviation: torch.Tensor | None) -> torch.Tensor:
            chosen = ~reused
            if method.name == "epic":
                for s in starts:
                    chosen[s : s + method.k] = True
            elif method.name == "cacheblend" and method.ratio == 1:
                chosen |= reused
            elif method.name == "cacheblend" and method.ratio > 0 and reused.any():
                if deviation is None:
                    raise ValueError(
                        "cacheblend with check_layer=-1 has no layer to choose by: use ratio=0 or 1"
                    )
                chosen |= select_by_deviation(deviation, reused, method.ratio)
            return chosen

        return choose

    @torch.inference_mode()
    def _run(self, token_ids: list[int], per_token: list, full_layers: int, choose) -> _Run:
        """The layers over a whole prompt. `per_token[i]` is (stored chunk, offset) for a reused
        token, else None. Layers before `full_layers` compute every row; from there on, only the
        rows `choose` returns, and the others keep their stored K/V, rotated to their place."""
        n = len(token_ids)
        cos, sin = self._rope(torch.arange(n, device=self.device))
        reused = torch.tensor([p is not None for p in per_token], device=self.device)
        stored_k, stored_v = self._gather_stored(per_token)
        x = self.w["model.embed_tokens.weight"][torch.tensor(token_ids, device=self.device)]
        rows = torch.arange(n, device=self.device)
        run = _Run(torch.zeros(self.n_layers, n, dtype=torch.bool))
        deviation = None
        for layer in range(self.n_layers):
            if layer == full_layers and choose is not None:
                rows = choose(reused, deviation).nonzero().squeeze(1)
                x = x[rows]
            run.recomputed[layer, rows] = True
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q, k_pre, v = self._project(layer, h)
            if layer < full_layers and stored_k is not None:
                deviation = torch.where(reused, (k_pre - stored_k[layer]).norm(dim=(1, 2)), 0.0)
            keys_pre = k_pre if len(rows) == n else stored_k[layer].index_copy(0, rows, k_pre)
            values = v if len(rows) == n else stored_v[layer].index_copy(0, rows, v)
            keys = keys_pre * cos + rotate_half(keys_pre) * sin
            q = q * cos[rows] + rotate_half(q) * sin[rows]
            x = x + self._attend(layer, q, keys, values, rows)
            x = x + self._mlp(
                layer, rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            )
            run.keep(keys_pre, keys, values)
        run.hidden = x
        return run

    def _gather_stored(self, per_token: list) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Stored K (before RoPE) and V for each position, zeros where no chunk is stored: [layer,
        token, ...]."""
        if all(p is None for p in per_token):
            return None, None
        shape = (self.n_layers, len(per_token), self.n_kv_heads, self.head_dim)
        keys, values = torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype)
        i = 0
        while i < len(per_token):
            if per_token[i] is None:
                i += 1
                continue
            chunk = per_token[i][0]
            n = chunk.keys.shape[1]
            keys[:, i : i + n], values[:, i : i + n] = chunk.keys, chunk.values
            i += n
        return keys, values

    def _project(
        self, layer: int, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p, n = f"model.layers.{layer}.self_attn.", h.shape[0]
        q = (h @ self.w[p + "q_proj.weight"].T).view(n, self.n_heads, self.head_dim)
        k = (h @ self.w[p + "k_proj.weight"].T).view(n, self.n_kv_heads, self.head_dim)
        v = (h @ self.w[p + "v_proj.weight"].T).view(n, self.n_kv_heads, self.head_dim)
        return q, k, v

    def _attend(self, layer: int, q, keys, values, rows: torch.Tensor) -> torch.Tensor:
        """Causal attention of the query rows (at positions `rows`) over every key up to each row's
        position."""
        keys, values, q = (
            keys.transpose(0, 1),
            values.transpose(0, 1),
            q.transpose(0, 1),
        )  # heads first
        out = torch.empty_like(q)
        key_positions = torch.arange(keys.shape[1], device=self.device)
        for lo in range(0, q.shape[1], QUERY_ROWS):
            hi = min(q.shape[1], lo + QUERY_ROWS)
            end = int(rows[hi - 1]) + 1
            mask = key_positions[None, :end] <= rows[lo:hi, None]
            out[:, lo:hi] = F.scaled_dot_product_attention(
                q[:, lo:hi], keys[:, :end], values[:, :end], attn_mask=mask, enable_gqa=True
            )  # each K/V head serves a group of queries
        return (
            out.transpose(0, 1).reshape(q.shape[1], -1)
            @ self.w[f"model.layers.{layer}.self_attn.o_proj.weight"].T
        )

    @torch.inference_mode()
    def decode(self, filled: Fill, max_tokens: int) -> list[int]:
        """Greedy tokens after a filled prompt, each attending to the fill's K/V and the tokens
        before it."""
        positive_int("max_tokens", max_tokens)
        limit = self.config["max_position_embeddings"]
        if filled.keys[0].shape[0] + max_tokens > limit:
            raise ValueError(
                f"the prompt ({filled.keys[0].shape[0]} tokens) + max_tokens={max_tokens} exceeds the "
                f"model's context of {limit} tokens"
            )
        n = filled.keys[0].shape[0]
        keys = [
            torch.cat([k, k.new_empty((max_tokens, *k.shape[1:]))]) for k in filled.keys
        ]  # room for the answer
        values = [torch.cat([v, v.new_empty((max_tokens, *v.shape[1:]))]) for v in filled.values]
        output = [int(filled.logits[-1].argmax())]
        while len(output) < max_tokens:
            position = n + len(output) - 1
            cos, sin = self._rope(torch.tensor([position], device=self.device))
            x = self.w["model.embed_tokens.weight"][torch.tensor(output[-1:], device=self.device)]
            rows = torch.tensor([position], device=self.device)
            for layer in range(self.n_layers):
                p = f"model.layers.{layer}."
                q, k, v = self._project(
                    layer, rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
                )
                keys[layer][position], values[layer][position] = (
                    (k * cos + rotate_half(k) * sin)[0],
                    v[0],
                )
                x = x + self._attend(
                    layer,
                    q * cos + rotate_half(q) * sin,
                    keys[layer][: position + 1],
                    values[layer][: position + 1],
                    rows,
                )
                x = x + self._mlp(
                    layer, rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
                )
            logits = (
                rms_norm(x[-1], self.w["model.norm.weight"], self.eps) @ self.w["lm_head.weight"].T
            )
            output.append(int(logits.argmax()))
        return output


@dataclass
class _Run:
    recomputed: torch.Tensor
    pre_rope_keys: list[torch.Tensor] | None = None
    keys: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None
    hidden: torch.Tensor | None = None

    def keep(self, pre_rope_keys: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        for name, tensor in (("pre_rope_keys", pre_rope_keys), ("keys", keys), ("values", values)):
            if getattr(self, name) is None:
                setattr(self, name, [])
            getattr(self, name).append(tensor)


def select_by_deviation(
    deviation: torch.Tensor, reused: torch.Tensor, ratio: float
) -> torch.Tensor:
    """CacheBlend's choice: of the reused tokens, the `ratio` share (rounded) whose K moved most at
    the check layer; a bool mask over every position."""
    chosen = torch.zeros_like(reused)
    n = round(ratio * int(reused.sum()))
    scores = torch.where(reused, deviation, torch.tensor(-1.0, dtype=deviation.dtype))
    chosen[scores.topk(n).indices] = True
    return chosen


def ceiling(n_layers: int, check_layer: int, ratio: float) -> float:
    """CacheBlend's speed-up bound: 1 over the share of token-layer rows it computes, (c+1)/L +
    r(L-c-1)/L, when the question is short beside the passages."""
    return 1 / ((check_layer + 1) / n_layers + ratio * (n_layers - check_layer - 1) / n_layers)
