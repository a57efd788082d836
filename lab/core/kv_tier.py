"""A second, slower home for K/V blocks the pool had to evict: host memory, a file per block, or
either behind a stand-in for a network.

The pool (`lab.core.prefix_cache`) drops a cached block's hash when it needs the block for something
else. With a tier, the block's K/V is copied out first, keyed by the same hash. A later request
whose chain misses in the pool but finds the next blocks in the tier loads them back instead of
recomputing them (`lab.core.mini_engine`). A tier is an LRU of at most `num_blocks` blocks; each
entry keeps the block's token ids, so a hash collision can never hand out another prompt's K/V. A
block loaded back keeps its copy here (an inclusive tier, as a store behind many engines would), so
a tier and a pool hold less together than one pool of both sizes.

Loading p tokens costs about (a read's fixed cost) + p x (K/V bytes per token) / (the tier's
bandwidth), where recomputing them costs about p x (FLOPs per token) / (the machine's FLOP/s):
`lab.experiments.load_vs_recompute` measures both.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lab.checks import number_in, positive_int

BlockKV = tuple[
    torch.Tensor, torch.Tensor
]  # K and V of one block: [layer, token in block, kv head, head dim]


@dataclass
class TierStats:
    stores: int = 0  # blocks written (evicted from the pool)
    hits: int = 0  # blocks read back
    misses: int = 0  # lookups that found nothing
    drops: int = 0  # blocks the tier itself evicted (it was full)
    bytes_read: int = 0
    read_s: float = 0.0  # time spent in reads (throttling included)

    @property
    def read_bandwidth(self) -> float:
        """Bytes per second over every read so far."""
        return self.bytes_read / self.read_s if self.read_s else 0.0


class KVTier:
    """The LRU bookkeeping every tier shares; subclasses say where a block's bytes live."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.entries: OrderedDict[bytes, tuple[int, ...]] = (
            OrderedDict()
        )  # hash -> token ids, LRU first
        self.stats = TierStats()

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, block_hash: bytes, token_ids: Sequence[int], kv: BlockKV) -> None:
        """Keep a block the pool is evicting (the least recently stored one leaves when the tier is
        full)."""
        if block_hash in self.entries:
            self.entries.move_to_end(block_hash)
            return
        while len(self.entries) >= self.num_blocks:
            old, _ = self.entries.popitem(last=False)
            self._delete(old)
            self.stats.drops += 1
        self.entries[block_hash] = tuple(token_ids)
        self._write(block_hash, (kv[0].clone(), kv[1].clone()))
        self.stats.stores += 1

    def load_chain(self, hashes: Sequence[bytes], blocks: Sequence[Sequence[int]]) -> list[BlockKV]:
        """K and V of the leading blocks of a chain that this tier holds, in one read (a chain stops
        at its first miss, in the tier as in the pool). A hash counts only with the same tokens."""
        start = time.perf_counter()
        found = []
        for block_hash, token_ids in zip(hashes, blocks):
            if self.entries.get(block_hash) != tuple(token_ids):
                self.stats.misses += 1
                break
            found.append(self._read(block_hash))
            self.entries.move_to_end(block_hash)
        size = sum(t.numel() * t.element_size() for kv in found for t in kv)
        if hashes:  # a lookup is a round trip, whether it finds anything or not
            self._transfer_wait(size, time.perf_counter() - start)
        if found:
            self.stats.hits += len(found)
            self.stats.bytes_read += size
            self.stats.read_s += time.perf_counter() - start
        return found

    def clear(self) -> None:
        for block_hash in list(self.entries):
            self._delete(block_hash)
        self.entries.clear()

    def _transfer_wait(self, size: int, elapsed_s: float) -> None:
        """A read of `size` bytes took `elapsed_s`: a tier that stands for a slower link waits out
        the rest."""

    def _write(self, block_hash: bytes, kv: BlockKV) -> None:
        raise NotImplementedError

    def _read(self, block_hash: bytes) -> BlockKV:
        raise NotImplementedError

    def _delete(self, block_hash: bytes) -> None:
        raise NotImplementedError


class MemoryTier(KVTier):
    """Blocks in host memory (on a CPU machine: the same DRAM as the pool, so a read is one copy)."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.data: dict[bytes, BlockKV] = {}

    def _write(self, block_hash: bytes, kv: BlockKV) -> None:
        self.data[block_hash] = kv

    def _read(self, block_hash: bytes) -> BlockKV:
        k, v = self.data[block_hash]
        return k.clone(), v.clone()  # what a copy from another memory costs

    def _delete(self, block_hash: bytes) -> None:
        del self.data[block_hash]


class DiskTier(KVTier):
    """A safetensors file per block in `folder` (created if missing), named by the block's hash."""

    def __init__(self, folder: str | Path, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, block_hash: bytes) -> Path:
        return self.folder / f"{block_hash.hex()}.safetensors"

    def _write(self, block_hash: bytes, kv: BlockKV) -> None:
        save_file({"k": kv[0].contiguous(), "v": kv[1].contiguous()}, self.path(block_hash))

    def _read(self, block_hash: bytes) -> BlockKV:
        tensors = load_file(self.path(block_hash))
        return tensors["k"], tensors["v"]

    def _delete(self, block_hash: bytes) -> None:
        self.path(block_hash).unlink(missing_ok=True)


class ThrottledTier(KVTier):
    """Another tier read as if over a link of `bandwidth` bytes/s with `latency_s` per read (a
    stand-in for a network or remote store: one round trip a request, however many blocks it reads;
    the wait is real, the link is not)."""

    def __init__(self, inner: KVTier, bandwidth: float, latency_s: float) -> None:
        super().__init__(inner.num_blocks)
        self.inner = inner
        self.bandwidth = number_in(
            "bandwidth", bandwidth, 0, float("inf"), "bytes per second above 0", ends="()"
        )
        self.latency_s = number_in("latency_s", latency_s, 0, 60, "seconds between 0 and 60")

    def _transfer_wait(self, size: int, elapsed_s: float) -> None:
        time.sleep(max(0.0, self.latency_s + size / self.bandwidth - elapsed_s))

    def _write(self, block_hash: bytes, kv: BlockKV) -> None:
        self.inner._write(block_hash, kv)

    def _read(self, block_hash: bytes) -> BlockKV:
        return self.inner._read(block_hash)

    def _delete(self, block_hash: bytes) -> None:
        self.inner._delete(block_hash)
