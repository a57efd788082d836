"""Hit rates by replay: the token ids through the lab's PrefixCache (vLLM V1's block pool) of a stated capacity,
one request at a time in arrival order; the radix tree as the token-granular bound."""

from __future__ import annotations

from collections.abc import Sequence

from lab.audit.prompts import AuditInputError
from lab.core.block_hash import REPLAY_HASH
from lab.core.prefix_cache import PrefixCache
from lab.core.radix_cache import RadixCache


def replay_hit_rate(token_ids: Sequence[Sequence[int]], block_size: int, kv_tokens: int,
                    salts: Sequence[str | None] | None = None) -> float:
    """Token hit rate of the prompts replayed one at a time, in order, through one `PrefixCache` holding
    `kv_tokens` tokens (least recently used blocks evicted first, as in vLLM)."""
    cache = PrefixCache(num_blocks=max(kv_tokens // block_size, 1), block_size=block_size, hash_algo=REPLAY_HASH)
    return sum(cache.replay(token_ids, salts)) / sum(map(len, token_ids))


def radix_hit_rate(token_ids: Sequence[Sequence[int]], kv_tokens: int) -> float:
    """The same replay through a token-granular radix tree of the same capacity: what blocks cost."""
    return sum(RadixCache(capacity_tokens=kv_tokens).replay(token_ids)) / sum(map(len, token_ids))


def check_capacity(token_ids: Sequence[Sequence[int]], kv_tokens: int, lines: Sequence[int], path: str) -> None:
    longest = max(range(len(token_ids)), key=lambda i: len(token_ids[i]))
    if len(token_ids[longest]) + 128 > kv_tokens:
        raise AuditInputError(f"kv_tokens={kv_tokens} cannot hold {path}:{lines[longest]} ({len(token_ids[longest])} "
                              "tokens) with room for a block per size; use your engine's KV capacity, which vLLM logs at "
                              "start ('KV cache size: N tokens')")
