"""A token-granular radix tree cache (SGLang's RadixAttention style), the upper bound on prefix
reuse.

Where `lab.core.prefix_cache` can only hit whole blocks, the tree matches token by token: its hit
rate is what the same workload would get with a block size of 1 and no per-block cost. Nodes hold
runs of tokens; a partial match splits a node; unreferenced leaves are evicted least recently used
first.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from lab.core.prefix_cache import CacheFullError, CacheStats


def common_prefix_length(key: tuple[int, ...], token_ids: Sequence[int], start: int) -> int:
    """How many leading tokens of `key` equal `token_ids[start:]`. Slices compare in C: one
    comparison when the whole edge matches (the common case), a bisection of slices where it does
    not."""
    n = min(len(key), len(token_ids) - start)
    if key[:n] == tuple(token_ids[start : start + n]):
        return n
    low, high = 0, n  # key[:low] matches, key[:high] does not
    while high - low > 1:
        mid = (low + high) // 2
        if key[low:mid] == tuple(token_ids[start + low : start + mid]):
            low = mid
        else:
            high = mid
    return low


@dataclass(eq=False)
class Node:
    key: tuple[int, ...] = ()
    parent: Node | None = None
    children: dict[int, Node] = field(
        default_factory=dict
    )  # first token of the child's key -> child
    ref_count: int = 0
    last_access: int = 0


@dataclass
class RadixCache:
    """Holds up to `capacity_tokens` tokens of K/V; same allocate / free / stats surface as
    PrefixCache."""

    capacity_tokens: int
    stats: CacheStats = field(default_factory=CacheStats, init=False)

    def __post_init__(self) -> None:
        if (
            isinstance(self.capacity_tokens, bool)
            or not isinstance(self.capacity_tokens, int)
            or self.capacity_tokens <= 0
        ):
            raise ValueError(f"capacity_tokens={self.capacity_tokens!r} must be a positive integer")
        self.roots: dict[
            str | None, Node
        ] = {}  # one tree per cache salt: salted prompts never share
        self.paths: dict[str, list[Node]] = {}
        self.num_tokens = 0
        self._clock = count(1)

    def allocate(
        self, request_id: str, token_ids: Sequence[int], cache_salt: str | None = None
    ) -> int:
        """Insert a request's prompt; returns how many of its tokens were already cached (at most
        len - 1)."""
        if request_id in self.paths:
            raise ValueError(f"request_id={request_id!r} is already running; free it first")
        if len(token_ids) == 0:
            raise ValueError("token_ids is empty: a request needs at least one prompt token")
        root = self.roots.setdefault(cache_salt, Node())
        node, matched = self._match(root, token_ids)
        path = self._path(node)
        self._lock(path, +1)  # the matched prefix must survive the eviction below
        missing = len(token_ids) - matched
        if not self._make_room(missing):
            self._lock(path, -1)
            raise CacheFullError(
                f"request {request_id!r} needs room for {missing} tokens; "
                f"capacity_tokens={self.capacity_tokens} are held by running requests"
            )
        if missing:
            leaf = Node(tuple(token_ids[matched:]), parent=node, ref_count=1)
            node.children[leaf.key[0]] = leaf
            self.num_tokens += missing
            path.append(leaf)
        now = next(self._clock)
        for n in path:
            n.last_access = now
        self.paths[request_id] = path
        hit = min(matched, len(token_ids) - 1)
        self.stats.requests += 1
        self.stats.queries += len(token_ids)
        self.stats.hits += hit
        return hit

    def replay(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        """Serve `prompts` one at a time, in order (allocate, then free): the cached tokens of each."""
        cached = []
        for i, token_ids in enumerate(prompts):
            cached.append(self.allocate(f"replay-{i}", token_ids))
            self.free(f"replay-{i}")
        return cached

    def free(self, request_id: str) -> None:
        if request_id not in self.paths:
            raise KeyError(
                f"request_id={request_id!r} is not running (never allocated, or already freed)"
            )
        self._lock(self.paths.pop(request_id), -1)

    def match_length(self, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
        """How many leading tokens of `token_ids` the tree holds (changes nothing, not even
        recency)."""
        node, matched = self.roots.get(cache_salt), 0
        while node is not None and matched < len(token_ids):
            child = node.children.get(token_ids[matched])
            if child is None:
                break
            common = common_prefix_length(child.key, token_ids, matched)
            matched += common
            node = child if common == len(child.key) else None
        return matched

    def sequences(self) -> list[tuple[str | None, tuple[int, ...]]]:
        """Every cached root-to-leaf token sequence, with its salt (for tests and display)."""
        found = []
        for salt, root in self.roots.items():
            stack = [(root, ())]
            while stack:
                node, prefix = stack.pop()
                tokens = prefix + node.key
                if not node.children and node is not root:
                    found.append((salt, tokens))
                stack.extend((child, tokens) for child in node.children.values())
        return found

    def _match(self, root: Node, token_ids: Sequence[int]) -> tuple[Node, int]:
        """Deepest node whose path is a prefix of token_ids (splitting an edge matched part-way)."""
        node, matched = root, 0
        while matched < len(token_ids) and (child := node.children.get(token_ids[matched])):
            common = common_prefix_length(child.key, token_ids, matched)
            if common < len(child.key):
                child = self._split(child, common)
            node, matched = child, matched + common
        return node, matched

    def _split(self, node: Node, at: int) -> Node:
        head = Node(
            node.key[:at], node.parent, {node.key[at]: node}, node.ref_count, node.last_access
        )
        node.parent.children[head.key[0]] = head
        node.key, node.parent = node.key[at:], head
        return head

    @staticmethod
    def _path(node: Node) -> list[Node]:
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    @staticmethod
    def _lock(path: list[Node], delta: int) -> None:
        for node in path:
            node.ref_count += delta

    def _make_room(self, num_tokens: int) -> bool:
        """Evict unreferenced leaves, least recently used first, until num_tokens fit."""
        if self.num_tokens + num_tokens <= self.capacity_tokens:
            return True
        leaves = [
            (n.last_access, id(n), n) for n in self._nodes() if not n.children and n.ref_count == 0
        ]
        heapq.heapify(leaves)
        while self.num_tokens + num_tokens > self.capacity_tokens and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            self.num_tokens -= len(leaf.key)
            self.stats.evictions += 1
            if parent.parent is not None and not parent.children and parent.ref_count == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return self.num_tokens + num_tokens <= self.capacity_tokens

    def _nodes(self):
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            if node.parent is not None:
                yield node
            stack.extend(node.children.values())
