"""`replay_chains` compiled: the same block pool, rule for rule, as a loop over integer arrays that
numba compiles.

The pool's state is three small structures, all arrays:
- the free queue, a doubly linked list over block ids with a sentinel (`NIL`): least recently used
  at the head;
- `cached`, an open-addressing hash table from a block hash to the first block registered under it,
  with linear probing and deletion by backward shift (no tombstones, so a long replay never
  degrades);
- `next_holder[b]`, the next block registered under the same hash (vLLM's duplicated blocks), oldest
  first.

Between two requests every block is free, so a request takes its hits out of the queue, takes new
blocks from the head (dropping what they held), and gives all back: hashed blocks to the tail, the
chain's tail first; blocks without a hash (the partial last block) to the front.
`tests/test_fast_replay.py` holds it equal to the readable pool, `lab.core.chain_pool.ChainPool`
with vLLM's LRU policy, request for request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit


def _let_vllm_scan_llvmlite() -> None:
    """vLLM 0.32 scans every loaded module's attributes when an engine starts, reading
    `vars(x).get("kernel")` of any that has a `__dict__` (vllm/triton_utils/dispatcher.py). numba
    loads llvmlite, whose `ffi.lib` answers every attribute, `__dict__` too, with a wrapped C
    function, so an engine started later in the same process fails. An empty dict in `ffi.lib`'s own
    lookup table answers `__dict__` instead; llvmlite never reads it."""
    from llvmlite.binding import ffi

    ffi.lib._fntab["__dict__"] = {}


_let_vllm_scan_llvmlite()
NIL = -1
_FIB = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: multiply, keep the top bits


@njit(cache=True)
def _slot(key, bits):
    return np.int64((np.uint64(key) * _FIB) >> np.uint64(64 - bits))


@njit(cache=True)
def _find(keys, used, key, bits):
    mask = (1 << bits) - 1
    i = _slot(key, bits)
    while used[i]:
        if keys[i] == key:
            return i
        i = (i + 1) & mask
    return NIL


@njit(cache=True)
def _insert(keys, values, used, key, value, bits):
    mask = (1 << bits) - 1
    i = _slot(key, bits)
    while used[i]:
        i = (i + 1) & mask
    keys[i], values[i], used[i] = key, value, True


@njit(cache=True)
def _delete(keys, values, used, i, bits):
    """Empty slot i, shifting later entries of its probe run back (Knuth's algorithm R)."""
    mask = (1 << bits) - 1
    used[i] = False
    j = i
    while True:
        j = (j + 1) & mask
        if not used[j]:
            return
        home = _slot(keys[j], bits)
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            keys[i], values[i], used[i] = keys[j], values[j], True
            used[j] = False
            i = j


@njit(cache=True)
def _unlink(prev, nxt, block):
    p, n = prev[block], nxt[block]
    nxt[p], prev[n] = n, p


@njit(cache=True)
def _push_tail(prev, nxt, sentinel, block):
    last = prev[sentinel]
    nxt[last], prev[block], nxt[block], prev[sentinel] = block, last, sentinel, block


@njit(cache=True)
def _push_front(prev, nxt, sentinel, block):
    first = nxt[sentinel]
    prev[first], nxt[block], prev[block], nxt[sentinel] = block, first, sentinel, block


@njit(cache=True)
def _forget(keys, values, used, next_holder, bits, block_hash, block):
    """Evict `block`, which holds `block_hash`: the next block registered under it (if any) takes
    its place."""
    i = _find(keys, used, block_hash, bits)
    first = values[i]
    if first == block:
        if next_holder[block] == NIL:
            _delete(keys, values, used, i, bits)
        else:
            values[i] = next_holder[block]
    else:
        b = first
        while next_holder[b] != block:
            b = next_holder[b]
        next_holder[b] = next_holder[block]
    next_holder[block] = NIL


@njit(cache=True)
def _register(keys, values, used, next_holder, bits, block_hash, block):
    i = _find(keys, used, block_hash, bits)
    if i == NIL:
        _insert(keys, values, used, block_hash, block, bits)
    else:
        b = values[i]
        while next_holder[b] != NIL:
            b = next_holder[b]
        next_holder[b] = block


@njit(cache=True)
def _release(table, needed, has_hash, prev, nxt, sentinel, unhashed_blocks):
    """A finished request's blocks back to the queue: hashed ones to the tail, the chain's tail
    first; the rest to the front, in their order in the request."""
    unhashed = 0
    for k in range(needed - 1, -1, -1):
        block = table[k]
        if has_hash[block]:
            _push_tail(prev, nxt, sentinel, block)
        else:
            unhashed_blocks[unhashed] = block
            unhashed += 1
    for k in range(unhashed - 1, -1, -1):
        _push_front(prev, nxt, sentinel, unhashed_blocks[k])


@njit(cache=True)
def _replay(hashes, offsets, lengths, block_size, num_blocks):
    sentinel = num_blocks
    prev = np.empty(num_blocks + 1, np.int64)
    nxt = np.empty(num_blocks + 1, np.int64)
    for b in range(num_blocks + 1):
        prev[b], nxt[b] = (b - 1) % (num_blocks + 1), (b + 1) % (num_blocks + 1)
    held = np.zeros(num_blocks, np.int64)
    has_hash = np.zeros(num_blocks, np.bool_)
    next_holder = np.full(num_blocks, NIL, np.int64)
    bits = 1
    while (1 << bits) < 2 * num_blocks:
        bits += 1
    keys = np.zeros(1 << bits, np.int64)
    values = np.zeros(1 << bits, np.int64)
    used = np.zeros(1 << bits, np.bool_)
    out = np.zeros(len(lengths), np.int64)
    table = np.empty(num_blocks, np.int64)
    unhashed_blocks = np.empty(num_blocks, np.int64)
    for r in range(len(lengths)):
        start, count, length = offsets[r], offsets[r + 1] - offsets[r], lengths[r]
        hittable = min(count, (length - 1) // block_size)
        hits = 0
        while hits < hittable:
            i = _find(keys, used, hashes[start + hits], bits)
            if i == NIL:
                break
            table[hits] = values[i]
            hits += 1
        for k in range(hits):
            _unlink(prev, nxt, table[k])
        needed = (length + block_size - 1) // block_size
        for k in range(hits, needed):
            block = nxt[sentinel]
            _unlink(prev, nxt, block)
            if has_hash[block]:
                _forget(keys, values, used, next_holder, bits, held[block], block)
            if k < count:
                held[block], has_hash[block] = hashes[start + k], True
                _register(keys, values, used, next_holder, bits, hashes[start + k], block)
            else:
                has_hash[block] = False
            table[k] = block
        _release(table, needed, has_hash, prev, nxt, sentinel, unhashed_blocks)
        out[r] = hits * block_size
    return out


def flatten_chains(chains: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The chains end to end as int64 (64-bit hashes keep their bits) and the offset where each one
    starts."""
    counts = np.fromiter((len(c) for c in chains), np.int64, len(chains))
    offsets = np.zeros(len(chains) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    parts = [
        c.astype(np.uint64, copy=False)
        if isinstance(c, np.ndarray)
        else np.asarray(c, dtype=np.uint64)
        for c in chains
        if len(c)
    ]
    flat = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return flat.view(np.int64), offsets


def replay_flat(
    hashes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, block_size: int, num_blocks: int
) -> np.ndarray:
    """Each request's cached tokens, from chains already flattened (`flatten_chains`)."""
    lengths = np.asarray(lengths, np.int64)
    longest = int(((lengths + block_size - 1) // block_size).max(initial=0))
    if num_blocks < max(longest, 1):
        raise ValueError(
            f"num_blocks={num_blocks} cannot hold the longest request ({longest} blocks of {block_size})"
        )
    return _replay(hashes, offsets, lengths, np.int64(block_size), np.int64(num_blocks))
