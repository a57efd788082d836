"""A minimal block pool with prefix caching that follows vLLM V1's contract, block for block.

- A prompt is cut into blocks of `block_size` tokens; only full blocks get a hash and can be hit.
- Hashes chain: H(parent hash, block token ids, extra keys). The first block's parent is
  H(seed); `cache_salt` goes into the first block's extra keys, so it changes every hash after it.
- A lookup walks the chain from the first block and stops at the first miss. At least the last
  prompt token is always recomputed (its logits are needed), so a hit covers at most
  (len - 1) // block_size blocks.
- Blocks are reference counted. A block whose count drops to 0 keeps its hash and joins the free
  queue: blocks with a hash at the tail (a request's last block first), blocks without one at the
  front. Allocation takes the queue's head and drops that block's hash (eviction).
- A hash can map to several blocks (a recomputed last block is registered again); a lookup takes
  the first one registered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lab.checks import positive_int
from lab.core.block_hash import (  # noqa: F401
    HASH_FUNCTIONS,
    BlockChain,
    block_hashes,
    blocks_needed,
    chain_hashes,
    full_blocks,
    hash_function,
    hittable_blocks,
    kv_blocks,
    none_hash,
)


class CacheFullError(RuntimeError):
    """The pool has too few free blocks for a request."""


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = (
        None  # kept with the hash, so a collision can never be a hit
    )


@dataclass
class CacheStats:
    requests: int = 0
    queries: int = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
    hits: int = 0  # prompt tokens served from cache (vllm:prefix_cache_hits)
    evictions: int = 0  # cached blocks whose hash was dropped to reuse the block

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class PrefixCache:
    """`num_blocks` usable KV blocks of `block_size` tokens with vLLM V1's prefix caching."""

    num_blocks: int
    block_size: int
    hash_algo: str = "sha256"
    enable_caching: bool = (
        True  # False: a plain block pool, as vLLM with --no-enable-prefix-caching
    )
    on_evict: Callable[[Block], None] | None = field(
        default=None, repr=False
    )  # sees a block before it is evicted
    stats: CacheStats = field(default_factory=CacheStats, init=False)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size"):
            value = getattr(self, name)
            positive_int(name, value)
        hash_function(self.hash_algo)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[
            bytes, dict[int, Block]
        ] = {}  # hash -> blocks holding it, first registered first
        self.tables: dict[str, list[Block]] = {}
        self.token_ids: dict[str, list[int]] = {}  # every token whose K/V a request's blocks hold
        self.salts: dict[str, str | None] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def block_table(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._table(request_id)]

    def lookup(self, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
        """How many prompt tokens a request would get from cache now (changes nothing)."""
        if not self.enable_caching:
            return 0
        blocks = full_blocks(token_ids, self.block_size)
        hashes = chain_hashes(blocks, self.hash_algo, cache_salt)
        return (
            len(
                self._longest_hit(
                    hashes[: hittable_blocks(len(token_ids), self.block_size)], blocks
                )
            )
            * self.block_size
        )

    def cached_prefix_blocks(
        self, hashes: Sequence[bytes], blocks: Sequence[tuple[int, ...]]
    ) -> int:
        """How many leading blocks of a chain (hashed with this pool's `hash_algo`) are cached now:
        a lookup for callers that hash a prompt once and ask many pools (changes nothing)."""
        if not self.enable_caching or not hashes or hashes[0] not in self.cached:
            return 0
        return len(self._longest_hit(hashes, blocks))

    def allocate(
        self,
        request_id: str,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        chain: BlockChain | None = None,
    ) -> int:
        """Give a request blocks for its prompt; returns how many prompt tokens come from cache.
        `chain`: the prompt's full blocks and their hashes (this pool's `hash_algo`, the salt), for
        a caller that has them."""
        if request_id in self.tables:
            raise ValueError(f"request_id={request_id!r} already holds blocks; free it first")
        if len(token_ids) == 0:
            raise ValueError("token_ids is empty: a request needs at least one prompt token")
        if not self.enable_caching:
            blocks, hashes = [], []
        elif chain is not None:
            blocks, hashes = chain
        else:
            blocks = full_blocks(token_ids, self.block_size)
            hashes = chain_hashes(blocks, self.hash_algo, cache_salt)
        hit = self._longest_hit(hashes[: hittable_blocks(len(token_ids), self.block_size)], blocks)
        num_new = blocks_needed(len(token_ids), self.block_size) - len(hit)
        needed = num_new + sum(
            b.ref_count == 0 for b in hit
        )  # hit blocks in the free queue leave it too
        if needed > self.num_free_blocks:
            raise CacheFullError(
                f"request {request_id!r} ({len(token_ids)} tokens) needs {needed} free blocks but only "
                f"{self.num_free_blocks} of num_blocks={self.num_blocks} are free; free finished requests "
                f"or use more blocks"
            )
        if self.enable_caching:
            self.stats.requests += 1
            self.stats.queries += len(token_ids)
            self.stats.hits += len(hit) * self.block_size
        self._touch(hit)
        self.tables[request_id] = hit + [self._take_free_block() for _ in range(num_new)]
        self.token_ids[request_id], self.salts[request_id] = list(token_ids), cache_salt
        self._register_full_blocks(request_id, first=len(hit), hashes=hashes, blocks=blocks)
        return len(hit) * self.block_size

    def append_tokens(self, request_id: str, new_token_ids: Sequence[int]) -> None:
        """Extend a running request (decoding): more blocks as needed; blocks that fill up get
        cached."""
        table, token_ids = self._table(request_id), self.token_ids[request_id]
        num_full_before = len(token_ids) // self.block_size
        token_ids.extend(new_token_ids)
        num_new = blocks_needed(len(token_ids), self.block_size) - len(table)
        if num_new > self.num_free_blocks:
            del token_ids[len(token_ids) - len(new_token_ids) :]
            raise CacheFullError(
                f"request {request_id!r} needs {num_new} more blocks; {self.num_free_blocks} are free"
            )
        table.extend(self._take_free_block() for _ in range(num_new))
        if self.enable_caching:
            blocks = full_blocks(token_ids, self.block_size)
            hashes = chain_hashes(blocks, self.hash_algo, self.salts[request_id])
            self._register_full_blocks(
                request_id, first=num_full_before, hashes=hashes, blocks=blocks
            )

    def free(self, request_id: str) -> None:
        """Release a request's blocks; they stay cached until their block is reused."""
        table = self._table(request_id)
        del self.tables[request_id], self.token_ids[request_id], self.salts[request_id]
        to_front, to_tail = [], []
        for block in reversed(table):  # the chain's tail becomes evictable before its head
            block.ref_count -= 1
            if block.ref_count == 0:
                (to_tail if block.block_hash is not None else to_front).append(block)
        for block in reversed(to_front):  # unhashed blocks can never be hit: reuse them first
            self.free_queue[block.block_id] = block
            self.free_queue.move_to_end(block.block_id, last=False)
        for block in to_tail:
            self.free_queue[block.block_id] = block

    def replay(
        self, prompts: Sequence[Sequence[int]], salts: Sequence[str | None] | None = None
    ) -> list[int]:
        """Serve `prompts` one at a time, in order (allocate, then free): the cached tokens of each."""
        if salts is not None and len(salts) != len(prompts):
            raise ValueError(
                f"salts has {len(salts)} entries for {len(prompts)} prompts: give one per prompt"
            )
        cached = []
        for i, token_ids in enumerate(prompts):
            request_id = f"replay-{i}"
            cached.append(
                self.allocate(request_id, token_ids, cache_salt=salts[i] if salts else None)
            )
            self.free(request_id)
        return cached

    def reset(self) -> None:
        """Forget every cached hash (like vLLM's reset_prefix_cache: only when no request holds
        blocks)."""
        if self.tables:
            raise RuntimeError(f"cannot reset while requests hold blocks: {sorted(self.tables)}")
        self.cached.clear()
        for block in self.blocks:
            block.block_hash = block.token_ids = None

    def evict_free_blocks(self) -> int:
        """Evict every cached block no request holds, least recently used first, as a pool under
        pressure would (`on_evict` sees each one); returns how many."""
        evicted = [block for block in self.free_queue.values() if block.block_hash is not None]
        for block in evicted:
            self._evict(block)
        return len(evicted)

    def _table(self, request_id: str) -> list[Block]:
        if request_id not in self.tables:
            raise KeyError(
                f"request_id={request_id!r} holds no blocks (never allocated, or already freed)"
            )
        return self.tables[request_id]

    def _longest_hit(
        self, hashes: Sequence[bytes], blocks: Sequence[tuple[int, ...]]
    ) -> list[Block]:
        hit = []
        for block_hash, tokens in zip(hashes, blocks):
            holders = self.cached.get(block_hash)
            if not holders:
                break
            block = next(iter(holders.values()))
            if block.token_ids != tokens:
                break  # a hash collision: never hand out another prompt's K/V
            hit.append(block)
        return hit

    def _touch(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block.ref_count == 0:
                del self.free_queue[block.block_id]
            block.ref_count += 1

    def _take_free_block(self) -> Block:
        _, block = self.free_queue.popitem(last=False)
        if block.block_hash is not None:
            self._evict(block)
        block.ref_count = 1
        return block

    def _evict(self, block: Block) -> None:
        if self.on_evict is not None:
            self.on_evict(block)
        holders = self.cached[block.block_hash]
        del holders[block.block_id]
        if not holders:
            del self.cached[block.block_hash]
        block.block_hash = block.token_ids = None
        self.stats.evictions += 1

    def _register_full_blocks(
        self, request_id: str, first: int, hashes: list[bytes], blocks: list[tuple[int, ...]]
    ) -> None:
        """Cache blocks `first`.. of a request that are full (a hash may gain a duplicate block)."""
        table = self.tables[request_id]
        for i in range(first, len(hashes)):
            block = table[i]
            block.block_hash, block.token_ids = hashes[i], blocks[i]
            self.cached.setdefault(hashes[i], {})[block.block_id] = block
