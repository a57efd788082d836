"""A fleet of N simulated replicas, each a `lab.core.prefix_cache.PrefixCache`, behind vllm-router's policies
written from its documentation and from what the real router was seen to do. It carries the routing lesson
to fleet sizes one CPU cannot run, and it is only to be believed where it agrees with `lab.serving.fleet` on the
same workload and arrival order.

    sim = FleetSim(replicas=64, policy="cache_aware", kv_blocks=160, block_size=32)
    routed = sim.run(token_ids_per_request, concurrency=6)    # one row per request: replica, cached tokens

Concurrency is modelled as a closed loop of `concurrency` clients: each sends its next request when its last
one finishes, and a request holds its replica (its load, and its KV blocks) for as long as its prefill takes,
one step plus one per uncached block. So a miss keeps its replica busy far longer than a hit, as on a real
server, and a load-aware policy sends the next miss elsewhere.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import pandas as pd

from lab.checks import positive_int
from lab.core.prefix_cache import CacheFullError, PrefixCache
from lab.core.radix_cache import RadixCache

POLICIES = ("random", "round_robin", "power_of_two", "consistent_hash", "cache_aware")


@dataclass
class CacheAwareKnobs:
    """vllm-router 0.1.17's defaults (`vllm-router --help`)."""

    cache_threshold: float = 0.3  # route to the best-matching replica only above this match rate
    balance_abs_threshold: int = 64  # imbalanced when max load - min load exceeds this ...
    balance_rel_threshold: float = 1.5  # ... and max load exceeds this times min load
    miss_to: str = "least_loaded"  # a miss: "least_loaded" (what 0.1.17 did, ties to the first) or "smallest_tree" (its docs)


class FleetSim:
    def __init__(self, replicas: int, policy: str, kv_blocks: int, block_size: int, seed: int = 0,
                 knobs: CacheAwareKnobs | None = None) -> None:
        positive_int("replicas", replicas, "a positive number of replicas")
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r}: the simulator has {', '.join(POLICIES)}")
        self.policy, self.knobs, self.seed, self.rng = policy, knobs or CacheAwareKnobs(), seed, random.Random(seed)
        self.caches = [PrefixCache(num_blocks=kv_blocks, block_size=block_size) for _ in range(replicas)]
        self.trees = [RadixCache(capacity_tokens=10**12) for _ in range(replicas)]  # the router's view, never evicted
        self.load = [0] * replicas
        self.block_size = block_size
        self.turn = 0

    def choose(self, token_ids: Sequence[int], key: Hashable | None = None) -> tuple[int, float]:
        """The replica for one request, and the best approximate match rate the router saw (cache_aware)."""
        n = len(self.caches)
        if self.policy == "round_robin":
            self.turn += 1
            return (self.turn - 1) % n, 0.0
        if self.policy == "random":
            return self.rng.randrange(n), 0.0
        if self.policy == "power_of_two":
            a, b = self.rng.sample(range(n), 2) if n > 1 else (0, 0)
            return (a if self.load[a] <= self.load[b] else b), 0.0
        if self.policy == "consistent_hash":  # no session key: the router hashes the whole request body
            # which replica a key lands on depends on the router's own hash function; the seed stands for it
            hashed = key if key is not None else tuple(token_ids)
            digest = hashlib.sha256(repr((self.seed, hashed)).encode()).digest()
            return int.from_bytes(digest[:8], "big") % n, 0.0
        return self._cache_aware(token_ids)

    def _cache_aware(self, token_ids: Sequence[int]) -> tuple[int, float]:
        least = min(range(len(self.load)), key=self.load.__getitem__)  # ties: the first
        lo, hi = self.load[least], max(self.load)
        if hi - lo > self.knobs.balance_abs_threshold and hi > self.knobs.balance_rel_threshold * lo:
            return least, 0.0
        matches = [tree.match_length(token_ids) for tree in self.trees]
        best = max(range(len(matches)), key=matches.__getitem__)
        rate = matches[best] / len(token_ids)
        if rate > self.knobs.cache_threshold:
            return best, rate
        if self.knobs.miss_to == "smallest_tree":
            return min(range(len(self.trees)), key=lambda i: self.trees[i].num_tokens), rate
        return least, rate

    def run(self, requests: Sequence[Sequence[int]], concurrency: int = 1,
            keys: Sequence[Hashable] | None = None) -> pd.DataFrame:
        """Route every request in order; one row per request: replica, prompt and cached tokens, match rate."""
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency!r}: use at least one request in flight")
        in_flight: list[tuple[float, int, int]] = []  # heap of (finish time, request, replica)
        now, rows = 0.0, []
        for i, token_ids in enumerate(requests):
            if len(in_flight) == concurrency:
                now = self._finish_next(in_flight)
            replica, rate = self.choose(token_ids, keys[i] if keys is not None else None)
            cached = self._admit(replica, i, token_ids, in_flight)
            self.trees[replica].allocate(str(i), token_ids)  # the router remembers the prompt ...
            self.trees[replica].free(str(i))  # ... and never forgets it (its tree is not evicted here)
            self.load[replica] += 1
            prefill_steps = 1 + (len(token_ids) - cached) / self.block_size
            heapq.heappush(in_flight, (now + prefill_steps, i, replica))
            rows.append({"request": i, "replica": replica, "prompt_tokens": len(token_ids), "cached_tokens": cached,
                         "match_rate": rate})
        while in_flight:
            self._finish_next(in_flight)
        return pd.DataFrame(rows)

    def _admit(self, replica: int, request: int, token_ids: Sequence[int], in_flight: list) -> int:
        """Allocate on the replica; if its pool is full of running requests, finish the earliest ones first
        (a real server would queue the request until they finish)."""
        while True:
            try:
                return self.caches[replica].allocate(str(request), token_ids)
            except CacheFullError:
                if not in_flight:
                    raise
                self._finish_next(in_flight)

    def _finish_next(self, in_flight: list) -> float:
        """Finish the request that ends first; returns its finish time."""
        finish, request, replica = heapq.heappop(in_flight)
        self.caches[replica].free(str(request))
        self.load[replica] -= 1
        return finish


def summarize_sim(routed: pd.DataFrame, replicas: int) -> pd.Series:
    """Fleet token hit rate and load imbalance (max / mean requests per replica), as lab.serving.routing reports them."""
    per_replica = routed.replica.value_counts().reindex(range(replicas), fill_value=0)
    return pd.Series({"requests": len(routed), "fleet_hit_rate": routed.cached_tokens.sum() / routed.prompt_tokens.sum(),
                      "imbalance": per_replica.max() / per_replica.mean()})


def upper_bound_hit_rate(requests: Sequence[Sequence[int]], block_size: int) -> float:
    """The token hit rate of one prefix cache that never evicts: every full block seen before is a hit (and,
    as in vLLM, the last prompt token is always computed). No routing policy can beat it."""
    seen: set[int] = set()
    hits = total = 0
    for token_ids in requests:
        parent, matching, cached = 0, True, 0
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = hash((parent, tuple(token_ids[start:start + block_size])))
            if matching and parent in seen and start + block_size < len(token_ids):
                cached += block_size
            else:
                matching = False
            seen.add(parent)
        hits, total = hits + cached, total + len(token_ids)
    return hits / total
