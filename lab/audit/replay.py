"""Hit rates by replay: the token ids through the lab's PrefixCache (vLLM V1's block pool) of a
stated capacity, one request at a time in arrival order; the radix tree as the token-granular bound.
`hit_rates` is the audit's replay stage: every request at every block size, and the best size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.audit import cluster
from lab.audit.settings import AuditSettings
from lab.audit.trace import Trace
from lab.core.block_hash import (
    REPLAY_HASH,
    blocks_needed,
    hittable_blocks,
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
    hashes per request) and the requests' lengths: the cached tokens of each request. Compiled
    (`lab.audit.fast_replay`); the readable version it equals is `replay_chains_reference`."""
    from lab.audit.fast_replay import flatten_chains, replay_flat

    hashes, offsets = flatten_chains(list(chains))
    return replay_flat(hashes, offsets, np.fromiter(lengths, np.int64), block_size, num_blocks)


def replay_chains_reference(
    chains: Iterable[Sequence[int]], lengths: Iterable[int], block_size: int, num_blocks: int
) -> np.ndarray:
    """`PrefixCache.replay`, block for block, for chains already hashed (one list of 64-bit block
    hashes per request, lab.audit.block_arrays) and the requests' lengths: the cached tokens of each
    request.

    The same pool, leaner: a block is an int, the free queue an ordered dict of block ids (least
    recently used first), and `cached` maps a hash to its block, or to a list of them when the
    last-token rule registered a duplicate (a lookup takes the first registered). Between two
    requests every block is free, so a request takes its hits out of the queue, takes new blocks
    from the head (dropping what they held), and gives all back: blocks with a hash to the tail, the
    chain's tail first; blocks without one (the last, partial block) to the front, to be reused
    first.
    """
    queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
    held: list[int | None] = [None] * num_blocks
    cached: dict[int, int | list[int]] = {}
    out = []
    for hashes, length in zip(chains, lengths):
        hittable = min(len(hashes), hittable_blocks(length, block_size))
        table = []
        for h in hashes[:hittable]:
            block = cached.get(h)
            if block is None:
                break
            table.append(block if type(block) is int else block[0])
        hits = len(table)
        for block in table:
            del queue[block]
        for k in range(blocks_needed(length, block_size) - hits):
            block = queue.popitem(last=False)[0]
            old = held[block]
            if old is not None:
                _forget(cached, old, block)
            if hits + k < len(hashes):  # a full block: cached under its hash
                h = held[block] = hashes[hits + k]
                present = cached.get(h)
                cached[h] = (
                    block
                    if present is None
                    else [present, block]
                    if type(present) is int
                    else present + [block]
                )
            else:
                held[block] = None
            table.append(block)
        unhashed = []
        for block in reversed(table):
            if held[block] is None:
                unhashed.append(block)
            else:
                queue[block] = None
        for block in reversed(unhashed):
            queue[block] = None
            queue.move_to_end(block, last=False)
        out.append(hits * block_size)
    return np.asarray(out, dtype=np.int64)


def _forget(cached: dict[int, int | list[int]], block_hash: int, block: int) -> None:
    """Evict `block`, which holds `block_hash`."""
    present = cached[block_hash]
    if type(present) is int:
        del cached[block_hash]
    else:
        rest = [b for b in present if b != block]
        cached[block_hash] = rest[0] if len(rest) == 1 else rest
