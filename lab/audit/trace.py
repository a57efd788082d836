"""A log of any size, read once: each request's length, arrival, tenant and salt, its blocks as 64-bit hash arrays
for every block size (lab.audit.block_arrays), and the token ids of only the first `sample` requests, which the
audit's explanations read. Memory grows by about 8 bytes per full block per block size, not per token.

    trace = read_trace("requests.jsonl.gz", tokenizer, block_sizes=(32, 64, 128), sample=5_000)
    cached = trace.replay(block_size=32, kv_tokens=100_000)   # each request's cached tokens, in arrival order
"""

from __future__ import annotations

import gc
import heapq
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lab.audit.block_arrays import NO_SALT, BlockArrays, flatten, salt_seeds
from lab.audit.prompts import AuditInputError, Prompts, arrival_key, tokenized_chunks
from lab.audit.replay import replay_chains
from lab.checks import positive_int

CHUNK = 2000  # requests tokenized and hashed at a time


@dataclass
class Trace:
    """Everything the audit keeps of a log, each per-request array in arrival (replay) order."""
    path: str
    lengths: np.ndarray  # prompt tokens
    arrivals: list[float | None]
    tenants: list[str | None]
    salts: list[str | None]  # each request's cache_salt, if the log gives one
    lines: np.ndarray  # the line (or row) of the file each request came from
    order: np.ndarray  # replay position -> position in the file's order (the hash arrays' order)
    blocks: dict[int, BlockArrays]  # block size -> the blocks' content hashes, in file order
    sample: Prompts  # the first requests in arrival order, with their texts and token ids
    skipped: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.lengths)

    def chains(self, block_size: int, salts: Sequence[str | None] | None = None) -> Iterator[list[int]]:
        """Each request's chain of block hashes, in replay order; `salts` (replay order): another salt per request
        than the log's own."""
        arrays = self._arrays(block_size)
        seeds = np.empty(self.requests, dtype=np.uint64)
        seeds[self.order] = salt_seeds(self.salts if salts is None else salts)  # to file order
        hashes, starts = arrays.chains(seeds)
        in_chunk, counts = arrays.prompt_chunks(), np.concatenate(arrays.counts)
        for i in self.order:
            start = starts[i]
            yield hashes[in_chunk[i]][start:start + counts[i]].tolist()

    def replay(self, block_size: int, kv_tokens: int, salts: Sequence[str | None] | None = None,
               progress: bool = False) -> np.ndarray:
        """Each request's cached tokens when the log is served one request at a time, in arrival order, by one
        engine holding `kv_tokens` tokens (lab.audit.replay.replay_chains: vLLM V1's block pool)."""
        from tqdm.auto import tqdm

        chains = tqdm(self.chains(block_size, salts), total=self.requests, desc=f"replaying blocks of {block_size}",
                      unit="requests", disable=not progress, leave=False)
        return replay_chains(chains, self.lengths.tolist(), block_size, max(kv_tokens // block_size, 1))

    def block_hash_sets(self, block_size: int, window: np.ndarray) -> dict[int, int]:
        """For each window (`window[i]`: request i's, replay order), how many distinct blocks its requests hold
        (unsalted chains, counted with numpy a chunk at a time)."""
        arrays = self._arrays(block_size)
        in_file_order = np.empty(self.requests, dtype=np.int64)
        in_file_order[self.order] = window
        hashes, _ = arrays.chains(np.full(self.requests, NO_SALT, dtype=np.uint64))
        seen: dict[int, list[np.ndarray]] = {}
        done = 0
        for chunk, counts in zip(hashes, arrays.counts):
            block_window = np.repeat(in_file_order[done:done + len(counts)], counts)
            for w in np.unique(block_window).tolist():
                seen.setdefault(w, []).append(np.unique(chunk[block_window == w]))
            done += len(counts)
        counted = {w: len(np.unique(np.concatenate(parts))) for w, parts in seen.items()}
        return {w: counted.get(w, 0) for w in np.unique(window).tolist()}

    def _arrays(self, block_size: int) -> BlockArrays:
        if block_size not in self.blocks:
            raise ValueError(f"block_size={block_size} was not hashed; read the trace with it in block_sizes "
                             f"(hashed: {sorted(self.blocks)})")
        return self.blocks[block_size]


class _FirstArrivals:
    """The `size` requests that come first in replay order, kept while the log streams past."""

    def __init__(self, size: int) -> None:
        self.size, self.heap = size, []  # a max-heap on the replay key: the latest kept request on top

    def offer(self, key: tuple[bool, float, int], entry: dict, ids: np.ndarray) -> None:
        item = ((not key[0], -key[1], -key[2]), entry, ids)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        elif item[0] > self.heap[0][0]:
            heapq.heapreplace(self.heap, item)

    def prompts(self, path: str) -> Prompts:
        kept = [(entry, ids.tolist()) for _, entry, ids in sorted(self.heap, reverse=True)]
        return Prompts(path, [g["text"] for g, _ in kept], [ids for _, ids in kept], [g["line"] for g, _ in kept],
                       [g["tenant"] for g, _ in kept], [g["salt"] for g, _ in kept], [],
                       [g["arrival_s"] for g, _ in kept])


class _Requests:
    """Each request's length, arrival, tenant, salt and line, held compactly (a repeated tenant or salt once)."""

    def __init__(self) -> None:
        self.lengths, self.lines, self.arrivals = array("q"), array("q"), array("d")
        self.tenants: list[str | None] = []
        self.salts: list[str | None] = []
        self.names: dict[str, str] = {}

    def add(self, entry: dict, length: int) -> None:
        self.lengths.append(length)
        self.lines.append(entry["line"])
        self.arrivals.append(math.nan if entry["arrival_s"] is None else entry["arrival_s"])
        self.tenants.append(self._once(entry["tenant"]))
        self.salts.append(self._once(entry["salt"]))

    def _once(self, name: str | None) -> str | None:
        return None if name is None else self.names.setdefault(name, name)

    def replay_order(self) -> np.ndarray:
        """By arrival time where the log gives one, then the rest in file order (lab.audit.prompts.arrival_key)."""
        arrivals = np.frombuffer(self.arrivals, dtype=np.float64)
        untimed = np.isnan(arrivals)
        return np.lexsort((np.arange(len(arrivals)), np.where(untimed, 0.0, arrivals), untimed))


def read_trace(path: str | Path, tokenizer, *, block_sizes: Sequence[int], sample: int = 5_000,
               max_model_len: int | None = None, skip_bad: bool = False, progress: bool = True) -> Trace:
    """Read a prompts file (as lab.audit.prompts.read_prompts reads it: the same records, errors and arrival order)
    in one pass, keeping per request only its length, arrival, tenant, salt and block hashes, and the texts and
    token ids of the first `sample` requests in arrival order."""
    from tqdm.auto import tqdm

    positive_int("sample", sample, "the requests whose token ids the explanations read, e.g. 5000")
    skipped: list[str] = []
    blocks = {size: BlockArrays(size) for size in block_sizes}
    first, requests = _FirstArrivals(sample), _Requests()
    bar = tqdm(desc="reading, tokenizing, hashing", unit="requests", disable=not progress, leave=False)
    collecting = gc.isenabled()
    gc.disable()  # nothing here makes a cycle, and full collections over a growing heap cost minutes at scale
    try:
        for chunk in tokenized_chunks(path, tokenizer, skipped=skipped, max_model_len=max_model_len,
                                      skip_bad=skip_bad, chunk=CHUNK, arrays=True):
            if chunk:
                tokens, lengths = flatten([ids for _, ids in chunk])
                for arrays in blocks.values():
                    arrays.add(tokens, lengths)
                for entry, ids in chunk:
                    first.offer(arrival_key(entry["arrival_s"], len(requests.lengths)), entry, ids)
                    requests.add(entry, len(ids))
                bar.update(len(chunk))
    finally:
        bar.close()
        if collecting:
            gc.enable()
    if not requests.lengths:
        raise AuditInputError(f"{path}: nothing to audit, every prompt is longer than the model's context")
    order = requests.replay_order()
    pick = order.tolist()
    arrivals = [None if math.isnan(a) else a for a in np.frombuffer(requests.arrivals, dtype=np.float64)[order].tolist()]
    sampled = first.prompts(str(path))
    sampled.skipped = skipped
    return Trace(str(path), np.frombuffer(requests.lengths, dtype=np.int64)[order], arrivals,
                 [requests.tenants[i] for i in pick], [requests.salts[i] for i in pick],
                 np.frombuffer(requests.lines, dtype=np.int64)[order], order, blocks, sampled, skipped)
