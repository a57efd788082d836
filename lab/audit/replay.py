"""Hit rates by replay: the token ids through the lab's PrefixCache (vLLM V1's block pool) of a
stated capacity, one request at a time in arrival order; the radix tree as the token-granular bound.
`hit_rates` is the audit's replay stage: every request at every block size, and the best size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.audit import cluster
from lab.audit.settings import AuditSettings
from lab.audit.trace import Trace
from lab.core.block_hash import (
    REPLAY_HASH,
    kv_blocks,
    token_hit_rate,
)
from lab.core.prefix_cache import PrefixCache
from lab.core.radix_cache import RadixCache


def replay_hit_rate(
    token_ids: Sequence[Sequence[int]],
    block_size: int,
    kv_tokens: int,
    salts: Sequence[str | None] | None = None,
) -> float:
    """Token hit rate of the prompts replayed one at a time, in order, through one `PrefixCache`
    holding `kv_tokens` tokens (least recently used blocks evicted first, as in vLLM)."""
    cache = PrefixCache(
        num_blocks=kv_blocks(kv_tokens, block_size), block_size=block_size, hash_algo=REPLAY_HASH
    )
    return token_hit_rate(cache.replay(token_ids, salts), [len(ids) for ids in token_ids])


def radix_hit_rate(token_ids: Sequence[Sequence[int]], kv_tokens: int) -> float:
    """The same replay through a token-granular radix tree of the same capacity: what blocks cost."""
    return token_hit_rate(
        RadixCache(capacity_tokens=kv_tokens).replay(token_ids), [len(ids) for ids in token_ids]
    )


@dataclass
class HitRates:
    """The replay per block size over every request, the radix tree's over the first requests, the
    best size."""

    table: pd.DataFrame  # cache, block_size, hit_rate
    by_block_size: dict[int, float]
    radix: float
    best_size: int  # the highest hit rate, to a tenth of a point (ties: the larger block)
    cached: np.ndarray  # each request's cached tokens at the best size


def _replay_at(trace: Trace, kv_tokens: int, block_size: int) -> np.ndarray:
    return trace.replay(block_size, kv_tokens)


def hit_rates(trace: Trace, settings: AuditSettings) -> HitRates:
    """Every request replayed at each block size the trace was hashed at (a Ray task per size on a
    cluster), the first requests through the radix tree, and the size with the highest hit rate."""
    sizes = list(trace.blocks)
    replays = cluster.map_in_order(
        _replay_at,
        sizes,
        shared=(trace, settings.kv_tokens),
        desc="replaying",
        progress=settings.progress,
    )
    cached = dict(zip(sizes, replays))
    rates = {size: token_hit_rate(c, trace.lengths) for size, c in cached.items()}
    first = trace.sample.token_ids
    radix = radix_hit_rate(first, settings.kv_tokens)
    radix_label = "radix tree (token-granular)"
    if len(first) != trace.requests:
        radix_label += f", first {len(first):,} requests"
    table = pd.DataFrame(
        {
            "cache": [f"blocks of {s}" for s in sizes] + [radix_label],
            "block_size": sizes + [1],
            "hit_rate": list(rates.values()) + [radix],
        }
    )
    best = max(sizes, key=lambda s: (round(rates[s], 3), s))
    return HitRates(table, {int(s): r for s, r in rates.items()}, radix, best, cached[best])


def replay_chains(
    chains: Iterable[Sequence[int]], lengths: Iterable[int], block_size: int, num_blocks: int
) -> np.ndarray:
    """`PrefixCache.replay`, block for block, for chains already hashed (one sequence of block
    hashes per request) and the requests' lengths: the cached tokens of each request. The fast path
    of `lab.core.chain_pool.ChainPool` with vLLM's LRU policy, compiled (`lab.audit.fast_replay`);
    tests hold the two equal request for request."""
    from lab.audit.fast_replay import flatten_chains, replay_flat

    hashes, offsets = flatten_chains(list(chains))
    return replay_flat(hashes, offsets, np.fromiter(lengths, np.int64), block_size, num_blocks)
