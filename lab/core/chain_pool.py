"""A block pool over chains of block hashes, one request at a time, with the eviction policy as a
choice.

`lab.core.prefix_cache.PrefixCache` is vLLM V1's block pool over token ids. This is the same pool
when the blocks are already hashed (a block-hash trace, or prompts hashed once): a block is an int,
`cached` maps a hash to its block, and freed blocks wait in a free queue until a new block is
needed. With `policy="lru"` it follows vLLM exactly (tests check it against `replay_chains` and
`PrefixCache`); the other policies change only which free block is taken when one must be evicted:

- `lru`: vLLM's free queue: the least recently freed first; a request's blocks are freed tail first,
  and a block with no hash (a partial last block) goes to the front, to be reused first.
- `lfu`: the free block hit the fewest times first (ties: least recently freed).
- `protect_roots`: as lru, but a shared root (one of the first `root_blocks` blocks of a chain that
  a later request has hit: a system prompt or conversation start that several requests begin with)
  is evicted only when no other free block is left.

With `tier_blocks`, a hash the pool evicts moves to a second tier of that many blocks (LRU) instead
of vanishing, and a chain that misses in the pool goes on in the tier: what `lab.core.kv_tier` does
with the K/V themselves. `tier_hits` counts the blocks served from there.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Sequence

from lab.core.block_hash import hittable_blocks

POLICIES = ("lru", "lfu", "protect_roots")


class ChainPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        policy: str = "lru",
        root_blocks: int = 1,
        tier_blocks: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r}: choose one of {', '.join(POLICIES)}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks!r}: a pool needs at least one block")
        self.block_size, self.policy, self.root_blocks = block_size, policy, root_blocks
        self.held: list[int | None] = [None] * num_blocks  # the hash each block holds
        self.depth = [0] * num_blocks  # its position in the chain that filled it
        self.hits = [0] * num_blocks
        self.cached: dict[
            int, list[int]
        ] = {}  # hash -> blocks holding it (more than one: vLLM's duplicates)
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(
            range(num_blocks)
        )  # LRU order, head first
        self.protected: OrderedDict[int, None] = OrderedDict()  # protect_roots: free root blocks
        self._heap: list[
            tuple[int, int, int]
        ] = []  # lfu: (hits, freed at, block), stale entries skipped
        self._clock = itertools.count()
        self._freed_at = [0] * num_blocks
        self.tier_blocks, self.tier_hits = tier_blocks, 0
        self.tier: OrderedDict[int, None] = (
            OrderedDict()
        )  # hashes the pool evicted, least recently used first

    def cached_blocks(self, hashes: Sequence[int], num_tokens: int) -> int:
        """How many leading blocks of a request's chain are cached now (at most its hittable
        blocks)."""
        count = 0
        for h in hashes[: hittable_blocks(num_tokens, self.block_size)]:
            if h not in self.cached:
                break
            count += 1
        return count

    def serve(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Admit one request (its full blocks' hashes and its length), run it, free its blocks; its
        cached tokens."""
        hits = self.cached_blocks(hashes, num_tokens)
        table = [self.cached[h][0] for h in hashes[:hits]]
        for block in table:
            self._take(block)
            self.hits[block] += 1
        loaded = self._tier_hits(hashes[hits : hittable_blocks(num_tokens, self.block_size)])
        for k in range(hits, -(-num_tokens // self.block_size)):
            table.append(self._fill(self._evict(), hashes[k] if k < len(hashes) else None, k))
        self._release(table)
        return (hits + loaded) * self.block_size

    def _tier_hits(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of the rest of a chain the tier holds, looked up before the
        request takes new blocks (as vLLM asks its connector first); each keeps its copy in the
        tier."""
        count = 0
        for h in hashes:
            if h not in self.tier:
                break
            self.tier.move_to_end(h)
            count += 1
        self.tier_hits += count
        return count

    def _fill(self, block: int, block_hash: int | None, depth: int) -> int:
        old = self.held[block]
        if old is not None:
            holders = self.cached[old]
            holders.remove(block)
            if not holders:
                del self.cached[old]
            self._demote(old)
        self.held[block], self.depth[block], self.hits[block] = block_hash, depth, 0
        if block_hash is not None:
            self.cached.setdefault(block_hash, []).append(block)
        return block

    def _demote(self, block_hash: int) -> None:
        if self.tier_blocks:
            self.tier[block_hash] = None
            self.tier.move_to_end(block_hash)
            if len(self.tier) > self.tier_blocks:
                self.tier.popitem(last=False)

    def _release(self, table: list[int]) -> None:
        """Free a finished request's blocks: hashed ones to the tail, the chain's tail first; the
        rest to the front (vLLM's order)."""
        unhashed = []
        for block in reversed(table):
            if self.held[block] is None:
                unhashed.append(block)
            elif (
                self.policy == "protect_roots"
                and self.depth[block] < self.root_blocks
                and self.hits[block]
            ):
                self.protected[block] = None
            else:
                self.free[block] = None
            self._freed_at[block] = next(self._clock)
            if self.policy == "lfu" and self.held[block] is not None:
                heapq.heappush(self._heap, (self.hits[block], self._freed_at[block], block))
        for block in reversed(unhashed):
            self.free[block] = None
            self.free.move_to_end(block, last=False)

    def _take(self, block: int) -> None:
        """A hit on a free block takes it out of the free queue."""
        self.free.pop(block, None)
        self.protected.pop(block, None)

    def _evict(self) -> int:
        """The free block to reuse for a new one."""
        if self.policy == "lfu":
            while (
                self.free and self.held[next(iter(self.free))] is None
            ):  # unhashed blocks first, as in vLLM
                return self.free.popitem(last=False)[0]
            while self._heap:
                hits, freed_at, block = heapq.heappop(self._heap)
                if (
                    block in self.free
                    and freed_at == self._freed_at[block]
                    and hits == self.hits[block]
                ):
                    del self.free[block]
                    return block
        if self.free:
            return self.free.popitem(last=False)[0]
        if self.protected:
            return self.protected.popitem(last=False)[0]
        raise RuntimeError("no free block: the pool is smaller than one request")


def replay(
    chains: Sequence[Sequence[int]],
    lengths: Sequence[int],
    block_size: int,
    num_blocks: int,
    policy: str = "lru",
) -> list[int]:
    """Each request's cached tokens, the requests served one at a time in order through one
    ChainPool."""
    pool = ChainPool(num_blocks, block_size, policy)
    return [pool.serve(chain, int(length)) for chain, length in zip(chains, lengths)]
