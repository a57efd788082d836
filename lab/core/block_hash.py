"""vLLM V1's block hashes: H(parent hash, block token ids, extra keys), chained from a seed.

The byte-level details match `vllm.v1.core.kv_cache_utils.hash_block_tokens` and
`vllm.utils.hashing` (pickle or canonical CBOR, then SHA-256 or xxHash-128).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from functools import cache, lru_cache
from typing import Any, NamedTuple

import cbor2
import numpy as np

NONE_HASH_SEED = (
    "vllm-none-hash"  # vLLM's seed for the first block's parent (unless PYTHONHASHSEED is set)
)


def _xxh3_128(data: bytes) -> bytes:
    import xxhash

    return xxhash.xxh3_128_digest(data)


def _pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(obj: Any) -> bytes:
    return cbor2.dumps(obj, canonical=True)


HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": lambda obj: hashlib.sha256(_pickled(obj)).digest(),
    "sha256_cbor": lambda obj: hashlib.sha256(_cbor(obj)).digest(),
    "xxhash": lambda obj: _xxh3_128(_pickled(obj)),  # fast, not collision resistant
    "xxhash_cbor": lambda obj: _xxh3_128(_cbor(obj)),
}
REPLAY_HASH = (
    "builtin"  # not vLLM's: Python's own hash, ten times faster, for counting hits in large traces
)


def _builtin(obj: Any) -> bytes:
    return hash(obj).to_bytes(8, "big", signed=True)


MEMO_SIZE = 1 << 14  # block hashes remembered per algorithm (a few MB at most)


@cache
def hash_function(hash_algo: str) -> Callable[[Any], bytes]:
    """The hash of one block's (parent hash, token ids, extra keys).

    A request that hits the cache hashes again blocks that were hashed before, so recent results are
    remembered: the same bytes, about five times faster on a hit. vLLM hashes each request once when
    it arrives and keeps no such memo; nothing else differs.
    """
    if (
        hash_algo == REPLAY_HASH
    ):  # a block pool's hits and evictions depend only on which blocks are equal
        return _builtin
    if hash_algo not in HASH_FUNCTIONS:
        raise ValueError(
            f"hash_algo={hash_algo!r} is not supported; choose one of {sorted(HASH_FUNCTIONS)} "
            f"(or {REPLAY_HASH!r} for replays that only count hits)"
        )
    return lru_cache(maxsize=MEMO_SIZE)(HASH_FUNCTIONS[hash_algo])


def none_hash(hash_algo: str = "sha256") -> bytes:
    """The parent hash of every chain's first block: the hash of PYTHONHASHSEED when it is set, else
    of vLLM's fixed seed string. The seed is read at each call, as vLLM's `init_none_hash` reads it
    each time it runs.

    vLLM draws a random seed for the xxhash algorithms when PYTHONHASHSEED is unset; the lab keeps
    the fixed seed then, so that its hashes are reproducible.
    """
    return _none_hash(hash_algo, os.environ.get("PYTHONHASHSEED", NONE_HASH_SEED))


@lru_cache(maxsize=64)
def _none_hash(hash_algo: str, seed: str) -> bytes:
    return hash_function(hash_algo)(seed)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """The blocks a request of `num_tokens` tokens holds: every full block and a partial last one."""
    return -(-num_tokens // block_size)


def kv_blocks(kv_tokens: int, block_size: int) -> int:
    """The blocks a KV cache of `kv_tokens` tokens holds: whole blocks only, and at least one (a
    capacity below one block still gets a block, so a replay of it runs and says how little it
    keeps)."""
    return max(kv_tokens // block_size, 1)


def token_hit_rate(cached_tokens: Iterable[int], prompt_tokens: Iterable[int]) -> float:
    """The token hit rate of a set of requests: cached prompt tokens over all prompt tokens, as vLLM
    counts `prefix_cache_hits / prefix_cache_queries` (a request's share is weighted by its length).
    NaN for no tokens."""
    total = np.sum(np.asarray(prompt_tokens, dtype=np.int64))
    return (
        float(np.sum(np.asarray(cached_tokens, dtype=np.int64)) / total) if total else float("nan")
    )


def hittable_blocks(num_tokens: int, block_size: int) -> int:
    """The full blocks a request of `num_tokens` tokens can take from the cache. Its last prompt
    token is always computed (its logits give the first output token), so a block that holds it is
    computed too: vLLM V1's last-token rule."""
    return (num_tokens - 1) // block_size


def full_blocks(token_ids: Sequence[int], block_size: int) -> list[tuple[int, ...]]:
    """The token ids of every full block of a prompt (a partial last block is left out)."""
    return [
        tuple(token_ids[start : start + block_size])
        for start in range(0, len(token_ids) - block_size + 1, block_size)
    ]


class BlockChain(NamedTuple):
    """A prompt's full blocks and their chain hashes, computed once and handed to a pool that would
    hash them."""

    blocks: list[tuple[int, ...]]
    hashes: list[bytes]


def chain_hashes(
    blocks: Sequence[tuple[int, ...]], hash_algo: str = "sha256", cache_salt: str | None = None
) -> list[bytes]:
    """Hash each block with its parent's hash; the salt goes into the first block's extra keys only."""
    hash_fn = hash_function(hash_algo)
    parent = none_hash(hash_algo)
    hashes = []
    extra_keys = (("cache_salt", cache_salt),) if cache_salt else None
    for tokens in blocks:
        parent = hash_fn((parent, tokens, extra_keys))
        hashes.append(parent)
        extra_keys = None
    return hashes


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    hash_algo: str = "sha256",
    cache_salt: str | None = None,
) -> list[bytes]:
    """The chained hash of every full block of a prompt (a partial last block has none)."""
    return chain_hashes(full_blocks(token_ids, block_size), hash_algo, cache_salt)
