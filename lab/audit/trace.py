"""A log of any size, read once: each request's length, arrival, tenant and salt, its blocks as
64-bit hash arrays per block size (lab.audit.block_arrays), the token ids of only the first `sample`
requests: about 8 bytes a block.

    trace = read_trace("requests.jsonl.gz", tokenizer, block_sizes=(32, 64, 128), sample=5_000)
    cached = trace.replay(block_size=32, kv_tokens=100_000)   # each request's cached tokens, in arrival order
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import multiprocessing
import os
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lab.audit import cluster
from lab.audit.block_arrays import NO_SALT, BlockArrays, content_hashes, flatten, salt_seeds
from lab.audit.piece_tokens import TokenEncoder
from lab.audit.prompts import (
    AuditInputError,
    BadLines,
    Prompts,
    arrival_key,
    good_records,
    prompts_from,
    raise_nothing_to_audit,
    raw_records,
    tokenize_batch,
)
from lab.audit.settings import AuditSettings
from lab.checks import positive_int
from lab.core.block_hash import kv_blocks

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

    def check_capacity(self, kv_tokens: int) -> None:
        """Refuse a KV capacity that cannot hold the longest prompt with a block to spare."""
        longest = int(np.argmax(self.lengths))
        if int(self.lengths[longest]) + 128 > kv_tokens:
            raise AuditInputError(
                f"kv_tokens={kv_tokens} cannot hold {self.path}:{self.lines[longest]} "
                f"({int(self.lengths[longest])} tokens) with room for a block per size; use your "
                "engine's KV capacity, which vLLM logs at start ('KV cache size: N tokens')"
            )

    def chains(
        self, block_size: int, salts: Sequence[str | None] | None = None
    ) -> Iterator[np.ndarray]:
        """Each request's chain of block hashes, in replay order; `salts` (replay order): another
        salt per request than the log's own. A chunk's chains are computed when its first request
        comes, and dropped after its last, so a log in about arrival order holds only a few chunks'
        chains at a time."""
        arrays = self._arrays(block_size)
        seeds = np.empty(self.requests, dtype=np.uint64)
        seeds[self.order] = salt_seeds(self.salts if salts is None else salts)  # to file order
        chunk_of, starts, counts = arrays.layout()
        first = np.searchsorted(
            chunk_of, np.arange(len(arrays.chunks))
        )  # each chunk's first prompt (file order)
        last_use = np.zeros(len(arrays.chunks), dtype=np.int64)
        np.maximum.at(last_use, chunk_of[self.order], np.arange(self.requests))
        held: dict[int, np.ndarray] = {}
        for position, (i, k) in enumerate(zip(self.order.tolist(), chunk_of[self.order].tolist())):
            if k not in held:
                held[k] = arrays.chunk_chain(k, seeds[first[k] : first[k] + len(arrays.counts[k])])
            yield held[k][starts[i] : starts[i] + counts[i]]
            if last_use[k] == position:
                del held[k]

    def replay(
        self,
        block_size: int,
        kv_tokens: int,
        salts: Sequence[str | None] | None = None,
        progress: bool = False,
    ) -> np.ndarray:
        """Each request's cached tokens when the log is served one request at a time, in arrival
        order, by one engine of `kv_tokens` tokens (lab.audit.fast_replay, compiled), the chains
        laid end to end as uint64."""
        from tqdm.auto import tqdm

        from lab.audit.fast_replay import replay_flat

        counts = self._arrays(block_size).layout()[2][
            self.order
        ]  # blocks per request, replay order
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        hashes = np.empty(int(offsets[-1]), np.uint64)
        for start, end, chain in zip(
            offsets[:-1].tolist(),
            offsets[1:].tolist(),
            tqdm(
                self.chains(block_size, salts),
                total=self.requests,
                desc=f"chains of {block_size}",
                disable=not progress,
            ),
        ):
            hashes[start:end] = chain
        return replay_flat(
            hashes.view(np.int64),
            offsets,
            self.lengths,
            block_size,
            kv_blocks(kv_tokens, block_size),
        )

    def block_hash_sets(self, block_size: int, window: np.ndarray) -> dict[int, int]:
        """For each window (`window[i]`: request i's, replay order), how many distinct blocks its
        requests hold (unsalted chains, counted with numpy a chunk at a time)."""
        arrays = self._arrays(block_size)
        in_file_order = np.empty(self.requests, dtype=np.int64)
        in_file_order[self.order] = window
        seen: dict[int, list[np.ndarray]] = {}
        done = 0
        for k, counts in enumerate(arrays.counts):
            chunk = arrays.chunk_chain(k, np.full(len(counts), NO_SALT, dtype=np.uint64))
            block_window = np.repeat(in_file_order[done : done + len(counts)], counts)
            for w in np.unique(block_window).tolist():
                seen.setdefault(w, []).append(np.unique(chunk[block_window == w]))
            done += len(counts)
        counted = {w: len(np.unique(np.concatenate(parts))) for w, parts in seen.items()}
        return {w: counted.get(w, 0) for w in np.unique(window).tolist()}

    def _arrays(self, block_size: int) -> BlockArrays:
        if block_size not in self.blocks:
            raise ValueError(
                f"block_size={block_size} was not hashed; read the trace with it in block_sizes "
                f"(hashed: {sorted(self.blocks)})"
            )
        return self.blocks[block_size]


class _FirstArrivals:
    """The `size` requests that come first in replay order, kept while the log streams past."""

    def __init__(self, size: int) -> None:
        self.size, self.heap = (
            size,
            [],
        )  # a max-heap on the replay key: the latest kept request on top

    def offer(self, key: tuple[bool, float, int], entry: dict, ids: np.ndarray) -> None:
        item = ((not key[0], -key[1], -key[2]), entry, ids)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        elif item[0] > self.heap[0][0]:
            heapq.heapreplace(self.heap, item)

    def last_kept(self) -> tuple[bool, float, int] | None:
        """The replay key of the latest request kept once `size` are kept (a later one cannot get
        in), else None."""
        if len(self.heap) < self.size:
            return None
        timed, later, position_after = self.heap[0][0]
        return not timed, -later, -position_after

    def prompts(self, path: str) -> Prompts:
        kept = [(entry, ids.tolist()) for _, entry, ids in sorted(self.heap, reverse=True)]
        return prompts_from(path, kept, [])


class _Requests:
    """Each request's length, arrival, tenant, salt and line, held compactly (a repeated tenant or
    salt once)."""

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
        """By arrival time where the log gives one, then the rest in file order
        (lab.audit.prompts.arrival_key)."""
        arrivals = np.frombuffer(self.arrivals, dtype=np.float64)
        untimed = np.isnan(arrivals)
        return np.lexsort((np.arange(len(arrivals)), np.where(untimed, 0.0, arrivals), untimed))


@dataclass
class _Chunk:
    """What reading one chunk of a log leaves: per good request its entry (without text), length and
    block hashes; the texts and ids of those that may be among the first arrivals; the lines
    skipped."""

    entries: list[dict]
    lengths: np.ndarray
    blocks: dict[
        int, tuple[np.ndarray, np.ndarray]
    ]  # block size -> content hashes, blocks per request
    candidates: list[tuple[dict, np.ndarray]]
    skipped: list[str]
    found: int  # good records before the length check


@dataclass
class _Reader:
    """Reads chunks of one log. Its token encoder is made on the first read, in the process that
    reads: its piece memo lives as long as this reader (one reading, or one reading process's copy).
    """

    tokenizer: object
    path: str
    block_sizes: list[int]
    skip_bad: bool
    limit: int | None  # prompts longer than this are bad records
    encoder: TokenEncoder | None = None

    def read(self, records: list, keep_before: tuple[bool, float, int] | None) -> _Chunk:
        """Parse, render, tokenize and hash one chunk of raw records (raw_records); keep the ids of
        requests whose replay key comes before `keep_before` (None: all)."""
        self.encoder = self.encoder or TokenEncoder(self.tokenizer)
        skipped: list[str] = []
        good = list(good_records(records, self.tokenizer, self.skip_bad, skipped))
        kept = tokenize_batch(
            good,
            self.encoder,
            BadLines(self.path, self.skip_bad, skipped),
            limit=self.limit,
            arrays=True,
        )
        tokens, lengths = flatten([ids for _, ids in kept])
        blocks = {size: content_hashes(tokens, lengths, size) for size in self.block_sizes}
        candidates = [
            (entry, ids.copy())
            for entry, ids in kept  # a copy: a view would hold the whole chunk's ids
            if keep_before is None or arrival_key(entry["arrival_s"], entry["line"]) < keep_before
        ]
        entries = [
            {k: v for k, v in entry.items() if k not in ("text", "chat")} for entry, _ in kept
        ]
        return _Chunk(entries, lengths, blocks, candidates, skipped, len(good))


_process_reader: _Reader | None = (
    None  # a reading process's own, set by the pool's initializer (never in the caller's)
)


def _start_reader(reader: _Reader) -> None:
    global _process_reader
    os.environ["TOKENIZERS_PARALLELISM"] = (
        "false"  # one thread per process (the processes are the parallelism),
    )
    _process_reader = reader  # and no warning about a fork after the parent's threads


def _read_in_process(records: list, keep_before: tuple[bool, float, int] | None) -> _Chunk:
    return _process_reader.read(records, keep_before)


def _chunks(path: Path, reader: _Reader, workers: int, keep_before) -> Iterator[_Chunk]:
    """Every chunk of the log read, in file order: by `reader` in this process, or spread over
    `workers` processes or a Ray cluster's actors (lab.audit.cluster), each with its own copy of
    `reader`, so its own piece memo, with a few chunks in flight."""
    records = raw_records(path)
    batches = iter(lambda: list(itertools.islice(records, CHUNK)), [])
    if cluster.active():
        yield from cluster.ordered_reads(reader, batches, keep_before)
        return
    if workers == 1:
        for batch in batches:
            yield reader.read(batch, keep_before())
        return
    # fork where there is one: it needs no `if __name__ == "__main__"` in the caller's script, and
    # starts at once
    context = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_reader, initargs=(reader,)
    ) as pool:
        pending = deque(
            pool.submit(_read_in_process, batch, keep_before())
            for batch in itertools.islice(batches, 2 * workers)
        )
        while pending:
            chunk = pending.popleft().result()
            for batch in itertools.islice(batches, 1):
                pending.append(pool.submit(_read_in_process, batch, keep_before()))
            yield chunk


def read_trace(
    path: str | Path,
    tokenizer,
    *,
    block_sizes: Sequence[int],
    sample: int = 5_000,
    settings: AuditSettings | None = None,
) -> Trace:
    """Read a prompts file (as lab.audit.prompts.read_prompts reads it: the same records, errors and
    arrival order) in one pass, keeping per request only its length, arrival, tenant, salt and block
    hashes, and the texts and token ids of the first `sample` requests in arrival order. From
    `settings` (default: AuditSettings()): whether bad lines are skipped, progress bars, and
    `workers`: above 1, that many processes parse, tokenize and hash, each with its own piece memo
    (the result is the same). On 2 cores one process is the better choice (the Rust tokenizer uses
    both cores already; two processes were 5% faster and took 30% more memory); more processes pay
    where more cores are. A prompt longer than the tokenizer's `model_max_length` is refused."""
    from tqdm.auto import tqdm

    settings = settings or AuditSettings()
    positive_int("sample", sample, "the requests whose token ids the explanations read, e.g. 5000")
    skip_bad, progress, workers = settings.skip_bad, settings.progress, settings.workers
    path = Path(path)
    reader = _Reader(
        tokenizer,
        str(path),
        list(block_sizes),
        skip_bad,
        getattr(tokenizer, "model_max_length", None),
    )
    skipped: list[str] = []
    blocks = {size: BlockArrays(size) for size in block_sizes}
    first, requests, found = _FirstArrivals(sample), _Requests(), 0
    bar = tqdm(
        desc="reading, tokenizing, hashing", unit="requests", disable=not progress, leave=False
    )
    collecting = gc.isenabled()
    # nothing here makes a cycle, and full collections over a growing heap cost minutes at scale
    gc.disable()
    try:
        for chunk in _chunks(path, reader, workers, first.last_kept):
            skipped += chunk.skipped
            found += chunk.found
            for size, (content, counts) in chunk.blocks.items():
                blocks[size].append(content, counts)
            for entry, ids in chunk.candidates:
                first.offer(arrival_key(entry["arrival_s"], entry["line"]), entry, ids)
            for entry, length in zip(chunk.entries, chunk.lengths.tolist()):
                requests.add(entry, length)
            bar.update(len(chunk.entries))
    finally:
        bar.close()
        if collecting:
            gc.enable()
    if not found:
        raise_nothing_to_audit(path, skipped)
    if not requests.lengths:
        raise AuditInputError(
            f"{path}: nothing to audit, every prompt is longer than the model's context"
        )
    order = requests.replay_order()
    pick = order.tolist()
    arrivals = [
        None if math.isnan(a) else a
        for a in np.frombuffer(requests.arrivals, dtype=np.float64)[order].tolist()
    ]
    sampled = first.prompts(str(path))
    sampled.skipped = skipped
    return Trace(
        str(path),
        np.frombuffer(requests.lengths, dtype=np.int64)[order],
        arrivals,
        [requests.tenants[i] for i in pick],
        [requests.salts[i] for i in pick],
        np.frombuffer(requests.lines, dtype=np.int64)[order],
        order,
        blocks,
        sampled,
        skipped,
    )
