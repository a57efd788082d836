"""Block hashes for logs too large to hold as token ids: numpy arrays of 64-bit hashes, computed a
chunk at a time.

A prompt's chain is what vLLM's is (lab.core.block_hash): each full block's hash depends on its
tokens and on its parent's hash, the first block's parent is a seed, and a `cache_salt` changes the
seed and so every hash after it. Only the hash function differs: a 64-bit multiply-and-mix over
whole arrays instead of SHA-256 over each block, because a replay that counts hits only needs equal
blocks to hash equal and different ones not to. Two different blocks share a 64-bit hash with a
chance of about 2^-64 per pair: among the 31 million blocks of a billion tokens, about 1 in 40,000
logs of that size has one such pair.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

MAX_BLOCK_SIZE = 1024
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TOKEN_WEIGHTS = np.random.default_rng(20261201).integers(
    1, 2**63, MAX_BLOCK_SIZE, dtype=np.uint64
) | np.uint64(1)
NO_SALT = np.uint64(
    0x5EED_0F_B10C_C4A1
)  # every chain's first parent, unless the request has a cache_salt


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def salt_seeds(salts: Sequence[str | None]) -> np.ndarray:
    """Each request's first parent: NO_SALT, or one that its salt alone gives (the same in every
    process)."""
    return np.array(
        [NO_SALT if s is None else np.uint64(xxhash.xxh3_64_intdigest(s.encode())) for s in salts],
        dtype=np.uint64,
    )


def flatten(token_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Every token of the prompts (lists or arrays) in one array, and each prompt's length."""
    lengths = np.fromiter(map(len, token_ids), dtype=np.int64, count=len(token_ids))
    if token_ids and isinstance(token_ids[0], np.ndarray):
        return np.concatenate(token_ids).astype(np.uint64), lengths
    return np.fromiter(
        itertools.chain.from_iterable(token_ids), dtype=np.uint64, count=int(lengths.sum())
    ), lengths


def content_hashes(
    tokens: np.ndarray, lengths: np.ndarray, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The hash of each full block's tokens (prompts one after another, as `flatten` gives them) and
    each prompt's number of full blocks."""
    if not 0 < block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size={block_size}: choose 1 to {MAX_BLOCK_SIZE}")
    full = lengths // block_size
    position = np.arange(len(tokens)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    blocks = tokens[position < np.repeat(full * block_size, lengths)].reshape(
        -1, block_size
    ) + np.uint64(1)
    return _mix((blocks * _TOKEN_WEIGHTS[:block_size]).sum(axis=1, dtype=np.uint64)), full


def chain(content: np.ndarray, counts: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Each block's chain hash: H(parent's hash, its content hash), the first parent of prompt i
    being seeds[i]. `content` holds the prompts' blocks one after another, `counts[i]` of them for
    prompt i."""
    first = np.cumsum(counts) - counts
    hashes = np.empty_like(content)
    parents = seeds.astype(np.uint64)
    for k in range(int(counts.max(initial=0))):
        alive = counts > k  # prompts with a block at position k
        at = first[alive] + k
        hashes[at] = _mix(parents[alive] * _GOLDEN + content[at])
        parents = parents.copy()
        parents[alive] = hashes[at]
    return hashes


@dataclass
class BlockArrays:
    """One block size's content hashes for a whole log, a chunk at a time (never copied into one
    array)."""

    block_size: int
    chunks: list[np.ndarray] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)

    def append(self, content: np.ndarray, counts: np.ndarray) -> None:
        """One chunk's content hashes and blocks per prompt, as `content_hashes` gives them."""
        self.chunks.append(content)
        self.counts.append(counts)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks) + sum(c.nbytes for c in self.counts)

    def chunk_chain(self, k: int, seeds: np.ndarray) -> np.ndarray:
        """Chunk k's chain hashes, its prompt i's first parent being seeds[i] (computed when asked:
        a log's chains are never all held at once)."""
        return chain(self.chunks[k], self.counts[k], seeds)

    def layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per prompt (file order): the chunk its blocks are in, where they start in that chunk, and
        how many there are."""
        chunk_of = np.repeat(np.arange(len(self.counts)), [len(c) for c in self.counts])
        starts = [np.cumsum(c) - c for c in self.counts]
        return (
            chunk_of,
            np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64),
            np.concatenate(self.counts) if self.counts else np.zeros(0, dtype=np.int64),
        )
