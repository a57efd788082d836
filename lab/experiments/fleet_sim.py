"""A fleet of N simulated replicas, each a `lab.core.prefix_cache.PrefixCache`, behind vllm-router's
policies written from its documentation and from what the real router was seen to do, and two
policies the router does not have that bound each replica's load. It carries the routing lesson to
fleet sizes one CPU cannot run, and it is only to be believed where it agrees with
`lab.serving.fleet` on the same workload and arrival order.

    sim = FleetSim(replicas=64, policy="cache_aware", kv_blocks=160, block_size=32)
    routed = sim.run(token_ids_per_request, concurrency=6)    # one row per request: replica, cached tokens, TTFT

Concurrency is a closed loop of `concurrency` clients: each sends its next request when its last one
has its first token. A replica prefills its requests one after another (first come, first served),
each for `service(prompt_tokens, cached_tokens)`; a request holds its replica (its load, and its KV
blocks) until its prefill ends. So a miss keeps its replica busy far longer than a hit, a hot
replica builds a queue, and a load-aware policy sends the next miss elsewhere. The default service
time is in steps (one per request plus one per uncached block); `fit_service` gives milliseconds,
fitted on a real run of one request at a time.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from lab.checks import positive_int
from lab.core.block_hash import (
    REPLAY_HASH,
    BlockChain,
    chain_hashes,
    full_blocks,
    hittable_blocks,
    token_hit_rate,
)
from lab.core.prefix_cache import CacheFullError, PrefixCache
from lab.core.radix_cache import RadixCache

SIMULATED_ROUTER_POLICIES = (
    "random",
    "round_robin",
    "power_of_two",
    "consistent_hash",
    "cache_aware",
)  # vllm-router's
BOUNDED_POLICIES = (
    "bounded_load",
    "kv_cost",
)  # not in vllm-router: each bounds what one replica takes
SIM_POLICIES = SIMULATED_ROUTER_POLICIES + BOUNDED_POLICIES
KEYED_POLICIES = (
    "consistent_hash",
    "bounded_load",
)  # the policies that hash a key (a tenant) onto a ring
RING_POINTS = 64  # virtual nodes per replica on the hash ring

Service = Callable[[int, int], float]  # (prompt tokens, cached tokens) -> prefill time


@dataclass
class CacheAwareKnobs:
    """vllm-router 0.1.20's defaults (`vllm-router --help`)."""

    cache_threshold: float = 0.3  # route to the best-matching replica only above this match rate
    balance_abs_threshold: int = 64  # imbalanced when max load - min load exceeds this ...
    balance_rel_threshold: float = 1.5  # ... and max load exceeds this times min load
    # a miss: "least_loaded" (what 0.1.17 did, ties to the first) or "smallest_tree" (its docs)
    miss_to: str = "least_loaded"
    load_factor: float = (
        1.25  # bounded_load: no replica takes more than this times the mean load (rounded up)
    )

    @classmethod
    def from_router_flags(cls, flags: Sequence[str]) -> CacheAwareKnobs:
        """The knobs a vllm-router command line sets, e.g. ["--balance-abs-threshold", "1"]."""
        names = {
            "--cache-threshold": ("cache_threshold", float),
            "--balance-abs-threshold": ("balance_abs_threshold", int),
            "--balance-rel-threshold": ("balance_rel_threshold", float),
        }
        unknown = [flag for flag in flags[::2] if flag not in names]
        if unknown or len(flags) % 2:
            raise ValueError(
                f"flags={list(flags)!r}: the simulator knows {', '.join(names)}, each with a value"
            )
        return cls(
            **{
                names[flag][0]: names[flag][1](value)
                for flag, value in zip(flags[::2], flags[1::2])
            }
        )


def steps(block_size: int) -> Service:
    """The default service time: one step per request plus one per uncached block."""
    return lambda prompt, cached: 1 + (prompt - cached) / block_size


def block_chain(token_ids: Sequence[int], block_size: int) -> BlockChain:
    """A prompt's full blocks and their chain hashes, as the simulated pools hash them."""
    blocks = full_blocks(token_ids, block_size)
    return BlockChain(blocks, chain_hashes(blocks, REPLAY_HASH))


def hash_requests(requests: Sequence[Sequence[int]], block_size: int) -> list[BlockChain]:
    """Every request's `block_chain`: hash a trace once, then simulate it under several policies."""
    return [block_chain(token_ids, block_size) for token_ids in requests]


def _hash64(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


class FleetSim:
    def __init__(
        self,
        replicas: int,
        policy: str,
        kv_blocks: int,
        block_size: int,
        seed: int = 0,
        knobs: CacheAwareKnobs | None = None,
        service: Service | None = None,
        placement: Mapping[Hashable, int] | None = None,
    ) -> None:
        positive_int("replicas", replicas, "a positive number of replicas")
        if policy not in SIM_POLICIES:
            raise ValueError(f"policy={policy!r}: the simulator has {', '.join(SIM_POLICIES)}")
        self.policy, self.knobs, self.seed, self.rng = (
            policy,
            knobs or CacheAwareKnobs(),
            seed,
            random.Random(seed),
        )
        self.caches = [
            PrefixCache(num_blocks=kv_blocks, block_size=block_size, hash_algo=REPLAY_HASH)
            for _ in range(replicas)
        ]
        # the router's view, never evicted (kept only by the policy that reads it)
        self.trees = (
            [RadixCache(capacity_tokens=10**12) for _ in range(replicas)]
            if policy == "cache_aware"
            else []
        )
        self.load = (
            [0] * replicas
        )  # requests holding each replica (queued or prefilling), as the router counts them
        self.busy_until = [0.0] * replicas  # kv_cost: when the work it sent each replica should end
        self.block_size, self.service = block_size, service or steps(block_size)
        self.turn = 0
        self.ring = sorted(
            (_hash64(seed, r, v), r) for r in range(replicas) for v in range(RING_POINTS)
        )
        self.placement = (
            placement  # consistent_hash: where a real router put each key (its hash is not ours)
        )

    def choose(
        self,
        token_ids: Sequence[int],
        key: Hashable | None = None,
        now: float = 0.0,
        chain: BlockChain | None = None,
    ) -> tuple[int, float]:
        """The replica for one request, and the best match rate the router saw (cache_aware,
        kv_cost). `chain`: the prompt's full blocks and their hashes, if already computed."""
        n = len(self.caches)
        if self.policy == "round_robin":
            self.turn += 1
            return (self.turn - 1) % n, 0.0
        if self.policy == "random":
            return self.rng.randrange(n), 0.0
        if self.policy == "power_of_two":
            a, b = self.rng.sample(range(n), 2) if n > 1 else (0, 0)
            return (a if self.load[a] <= self.load[b] else b), 0.0
        if (
            self.policy == "consistent_hash"
            and self.placement is not None
            and key in self.placement
        ):
            return self.placement[key], 0.0
        if self.policy in ("consistent_hash", "bounded_load"):
            # no session key: the router hashes the whole request body. Which replica a key lands on
            # depends on the router's own hash function; the seed stands for it.
            return self._on_ring(key if key is not None else tuple(token_ids)), 0.0
        if self.policy == "kv_cost":
            return self._least_cost(
                token_ids, chain or block_chain(token_ids, self.block_size), now
            )
        return self._cache_aware(token_ids)

    def replica_for_key(self, key: Hashable) -> int:
        """consistent_hash's replica for a session key: the same every time, whatever else was
        routed."""
        return self.ring[self._ring_start(key) % len(self.ring)][1]

    def _ring_start(self, key: Hashable) -> int:
        return bisect.bisect(self.ring, (_hash64(self.seed, key),))

    def _on_ring(self, key: Hashable) -> int:
        """consistent_hash: the first replica clockwise from the key's point. bounded_load
        (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018): the first
        whose load stays within `load_factor` x the mean load once this request is counted."""
        start = self._ring_start(key)
        cap = math.ceil(self.knobs.load_factor * (sum(self.load) + 1) / len(self.load))
        for i in range(len(self.ring)):
            replica = self.ring[(start + i) % len(self.ring)][1]
            if self.policy == "consistent_hash" or self.load[replica] < cap:
                return replica
        raise AssertionError("a replica under the cap always exists")

    def _least_cost(
        self, token_ids: Sequence[int], chain: BlockChain, now: float
    ) -> tuple[int, float]:
        """kv_cost, the cost function of KV-aware routers: the replica where this request's first
        token comes soonest, counting the work queued there and this request's prefill after that
        replica's cached blocks (known exactly, as from KV events). Cached blocks and queued work
        are weighed in one currency: time."""
        hittable = hittable_blocks(len(token_ids), self.block_size)
        blocks, hashes = chain.blocks[:hittable], chain.hashes[:hittable]
        best, best_cost, best_cached = 0, math.inf, 0
        for replica, cache in enumerate(self.caches):
            cached = cache.cached_prefix_blocks(hashes, blocks) * self.block_size
            cost = max(self.busy_until[replica] - now, 0.0) + self.service(len(token_ids), cached)
            if cost < best_cost:
                best, best_cost, best_cached = replica, cost, cached
        self.busy_until[best] = (
            now + best_cost
        )  # the router's own estimate of the work it has queued there
        return best, best_cached / len(token_ids)

    def _cache_aware(self, token_ids: Sequence[int]) -> tuple[int, float]:
        least = min(range(len(self.load)), key=self.load.__getitem__)  # ties: the first
        lo, hi = self.load[least], max(self.load)
        if (
            hi - lo > self.knobs.balance_abs_threshold
            and hi > self.knobs.balance_rel_threshold * lo
        ):
            return least, 0.0
        matches = [tree.match_length(token_ids) for tree in self.trees]
        best = max(range(len(matches)), key=matches.__getitem__)
        rate = matches[best] / len(token_ids)
        if rate > self.knobs.cache_threshold:
            return best, rate
        if self.knobs.miss_to == "smallest_tree":
            return min(range(len(self.trees)), key=lambda i: self.trees[i].num_tokens), rate
        return least, rate

    def run(
        self,
        requests: Sequence[Sequence[int]],
        concurrency: int = 1,
        keys: Sequence[Hashable] | None = None,
        chains: Sequence[BlockChain] | None = None,
    ) -> pd.DataFrame:
        """Route every request in order; one row per request: replica, prompt and cached tokens,
        match rate, when it was sent and its TTFT (in the service time's unit). `chains`:
        `hash_requests(requests, block_size)`, to hash a trace once for several runs."""
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency!r}: use at least one request in flight")
        if chains is not None and len(chains) != len(requests):
            raise ValueError(
                f"chains has {len(chains)} entries for {len(requests)} requests: pass "
                "hash_requests(requests, block_size)"
            )
        self._trace = (requests, keys, chains or [None] * len(requests))
        self._queues = [
            deque() for _ in self.caches
        ]  # requests waiting for each replica, first come first served
        self._running: list[int | None] = [None] * len(self.caches)
        self._ends: list[
            tuple[float, int, int]
        ] = []  # heap of (first token time, request, replica)
        self._rows: list[dict] = [{} for _ in requests]
        self._sent = 0
        for _ in range(min(concurrency, len(requests))):
            self._send(0.0)
        while self._ends:
            now, request, replica = heapq.heappop(self._ends)
            self._finish(replica, request, now)
            self._send(now)  # the client whose request just got its first token sends its next
        return pd.DataFrame(self._rows)

    def _send(self, now: float) -> None:
        """The next request of the trace reaches the router, which queues it at the replica it
        chooses."""
        requests, keys, chains = self._trace
        if self._sent == len(requests):
            return
        i, self._sent = self._sent, self._sent + 1
        token_ids = requests[i]
        chain = chains[i] or block_chain(token_ids, self.block_size)
        replica, rate = self.choose(token_ids, keys[i] if keys is not None else None, now, chain)
        if self.trees:
            self.trees[replica].allocate(str(i), token_ids)  # the router remembers the prompt ...
            self.trees[replica].free(
                str(i)
            )  # ... and never forgets it (its tree is not evicted here)
        self.load[replica] += 1
        self._rows[i] = {
            "request": i,
            "replica": replica,
            "prompt_tokens": len(token_ids),
            "match_rate": rate,
            "sent": now,
        }
        self._queues[replica].append((i, chain))
        self._start_next(replica, now)

    def _start_next(self, replica: int, now: float) -> None:
        """An idle replica takes the first request in its queue: its blocks are looked up and
        allocated now, as vLLM's scheduler does when it admits a request, and its prefill ends at
        its first token."""
        if self._running[replica] is not None or not self._queues[replica]:
            return
        request, chain = self._queues[replica].popleft()
        token_ids = self._trace[0][request]
        try:
            cached = self.caches[replica].allocate(str(request), token_ids, chain=chain)
        except CacheFullError:
            raise ValueError(
                f"request {request} ({len(token_ids)} tokens) does not fit in kv_blocks="
                f"{self.caches[replica].num_blocks} of block_size={self.block_size}: use more "
                "blocks"
            ) from None
        first_token = now + self.service(len(token_ids), cached)
        self._running[replica] = request
        heapq.heappush(self._ends, (first_token, request, replica))
        row = self._rows[request]
        row.update(cached_tokens=cached, ttft=first_token - row["sent"])

    def _finish(self, replica: int, request: int, now: float) -> None:
        self.caches[replica].free(str(request))
        self.load[replica] -= 1
        self._running[replica] = None
        self._start_next(replica, now)


@dataclass(frozen=True)
class FittedService:
    """TTFT of a request alone on a replica, fitted on a real run: `fixed_ms` + `per_token_ms` x
    uncached tokens. Measured through the server, it holds what a cost model fitted in-process
    leaves out (HTTP, tokenization, streaming, a replica's one core)."""

    fixed_ms: float
    per_token_ms: float
    requests: int  # how many measured requests it was fitted on

    def __call__(self, prompt: int, cached: int) -> float:
        return self.fixed_ms + self.per_token_ms * (prompt - cached)


def fit_service(
    prompt_tokens: Sequence[int], cached_tokens: Sequence[int], ttft_ms: Sequence[float]
) -> FittedService:
    """Least squares of TTFT on uncached tokens over requests that ran one at a time (no queue in
    their TTFT); both costs kept non-negative. Needs hits and misses: two different numbers of
    uncached tokens at least."""
    import numpy as np

    uncached = np.asarray(prompt_tokens, float) - np.asarray(cached_tokens, float)
    if len(set(uncached.tolist())) < 2:
        raise ValueError(
            "fit_service needs requests with at least two different numbers of uncached tokens "
            "(hits and misses), e.g. a tenants workload sent one request at a time"
        )
    per_token, fixed = np.polyfit(uncached, np.asarray(ttft_ms, float), 1)
    if per_token < 0 or fixed < 0:  # clamp, and refit the other cost alone
        per_token = max(per_token, 0.0)
        fixed = max(float(np.mean(np.asarray(ttft_ms) - per_token * uncached)), 0.0)
    return FittedService(float(fixed), float(per_token), len(uncached))


def summarize_sim(routed: pd.DataFrame, replicas: int) -> pd.Series:
    """Fleet token hit rate, load imbalance (max / mean requests per replica) and TTFT percentiles,
    as lab.serving.routing reports them (TTFT in the simulator's service unit)."""
    per_replica = routed.replica.value_counts().reindex(range(replicas), fill_value=0)
    return pd.Series(
        {
            "requests": len(routed),
            "fleet_hit_rate": token_hit_rate(routed.cached_tokens, routed.prompt_tokens),
            "imbalance": per_replica.max() / per_replica.mean(),
            "p50_ttft": routed.ttft.quantile(0.5),
            "p99_ttft": routed.ttft.quantile(0.99),
        }
    )


def upper_bound_hit_rate(requests: Sequence[Sequence[int]], block_size: int) -> float:
    """The token hit rate of one prefix cache that never evicts: every full block seen before is a
    hit (and, as in vLLM, the last prompt token is always computed). No routing policy can beat it.
    """
    seen: set[int] = set()
    cached = []
    for token_ids in requests:
        parent, matching, hits, hittable = 0, True, 0, hittable_blocks(len(token_ids), block_size)
        for block, start in enumerate(range(0, len(token_ids) - block_size + 1, block_size)):
            parent = hash((parent, tuple(token_ids[start : start + block_size])))
            matching = matching and parent in seen and block < hittable
            hits += block_size if matching else 0
            seen.add(parent)
        cached.append(hits)
    return token_hit_rate(cached, [len(token_ids) for token_ids in requests])
