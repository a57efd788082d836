"""Beyond one engine: every router policy simulated over the user's prompts, the recommended
policy's misses and the replay over time (the audit's fleet stage), and what a per-tenant salt
costs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.audit.misses import Routes, attribute
from lab.audit.settings import AuditSettings
from lab.audit.timeline import Timeline, timeline
from lab.audit.trace import Trace
from lab.core.block_hash import REPLAY_HASH, kv_blocks, token_hit_rate
from lab.experiments.fleet_sim import (
    SIMULATED_ROUTER_POLICIES,
    CacheAwareKnobs,
    FleetSim,
    hash_requests,
    summarize_sim,
)

THRESHOLDS = (0.3, 0.5, 0.8)  # cache_aware --cache-threshold values tried
MAX_IMBALANCE = 1.5  # the recommended policy sends at most this times the mean load to one replica


@dataclass
class FleetAdvice:
    """Every policy simulated over `replicas` replicas on the first `sample` prompts, and the one
    recommended."""

    replicas: int
    sample: int
    recommended_policy: str
    policies: pd.DataFrame  # policy, fleet_hit_rate, imbalance, session_key
    routes: list[int]  # the replica the recommended policy chose for each request
    reason: str = ""  # why this policy, in one sentence the report prints beside it


@dataclass
class SaltCost:
    """The hit rate with one shared cache and with a `cache_salt` per tenant."""

    tenants: int
    hit_rate_shared: float
    hit_rate_salted: float

    @property
    def cost(self) -> float:
        return self.hit_rate_shared - self.hit_rate_salted


def fleet_policies(
    token_ids: Sequence[Sequence[int]],
    tenants: Sequence[str | None],
    replicas: int,
    block_size: int,
    kv_tokens: int,
    progress: bool = False,
) -> FleetAdvice:
    """Every router policy (cache_aware at several cache thresholds) simulated over `replicas`
    replicas of `kv_tokens` each, with 2 requests per replica in flight; the recommendation is the
    highest hit rate whose load imbalance (max / mean requests) stays within MAX_IMBALANCE."""
    from tqdm.auto import tqdm

    keys = list(tenants) if all(t is not None for t in tenants) else None
    runs = [
        (policy, threshold)
        for policy in SIMULATED_ROUTER_POLICIES
        for threshold in (THRESHOLDS if policy == "cache_aware" else (None,))
    ]
    chains = hash_requests(token_ids, block_size)  # once for every policy
    num_blocks = kv_blocks(kv_tokens, block_size)
    rows, routes = [], {}
    for policy, threshold in tqdm(
        runs, desc="simulating policies", disable=not progress, leave=False
    ):
        knobs = CacheAwareKnobs(cache_threshold=threshold) if threshold is not None else None
        sim = FleetSim(
            replicas,
            policy,
            kv_blocks=num_blocks,
            block_size=block_size,
            knobs=knobs,
        )
        routed = sim.run(
            token_ids,
            concurrency=2 * replicas,
            keys=keys if policy == "consistent_hash" else None,
            chains=chains,
        )
        s = summarize_sim(routed, replicas)
        name = policy if threshold is None else f"cache_aware --cache-threshold {threshold}"
        routes[name] = routed.replica.tolist()
        rows.append(
            {
                "policy": name,
                "fleet_hit_rate": s.fleet_hit_rate,
                "imbalance": s.imbalance,
                "session_key": "tenant" if policy == "consistent_hash" and keys else "",
            }
        )
    table = pd.DataFrame(rows)
    recommended = _recommend(table, MAX_IMBALANCE)
    return FleetAdvice(
        replicas,
        len(token_ids),
        recommended,
        table,
        routes[recommended],
        _reason(table, recommended, MAX_IMBALANCE),
    )


@dataclass
class FleetSection:
    """The router policies simulated over the explained requests, the causes of the recommended
    one's misses (None on one replica), and the replay over time (every request on one cache; the
    explained on the fleet)."""

    advice: FleetAdvice
    misses: pd.DataFrame | None
    over_time: Timeline


def fleet_section(
    trace: Trace, settings: AuditSettings, block_size: int, cached: np.ndarray
) -> FleetSection:
    """The audit's fleet stage over the first `settings.explained` requests on `settings.replicas`
    replicas; `cached`: every request's cached tokens on one cache, for the timeline."""
    explained, kv_tokens, replicas = (
        trace.sample.head(settings.explained),
        settings.kv_tokens,
        settings.replicas,
    )
    advice = fleet_policies(
        explained.token_ids,
        explained.tenants,
        replicas,
        block_size,
        kv_tokens,
        progress=settings.progress,
    )
    routed = None
    if replicas > 1:
        routed = attribute(
            explained.token_ids,
            block_size=block_size,
            kv_tokens=kv_tokens,
            routes=Routes(advice.routes, replicas),
            hash_algo=REPLAY_HASH,
        )
    one_cache = pd.DataFrame({"prompt_tokens": trace.lengths, "cached_tokens": cached})

    def tokens_touched(window):
        return {w: n * block_size for w, n in trace.block_hash_sets(block_size, window).items()}

    over_time = timeline(
        trace.arrivals,
        one_cache,
        routed.requests if routed else None,
        tokens_touched,
        kv_tokens=kv_tokens,
    )
    return FleetSection(advice, routed.table() if routed else None, over_time)


def salt_cost(
    trace: Trace, settings: AuditSettings, block_size: int, shared: float
) -> SaltCost | None:
    """The hit rate with one shared cache and with a `cache_salt` per tenant (which closes the
    timing side channel between tenants, and stops them sharing); None when the log names no
    tenants."""
    if not any(t is not None for t in trace.tenants):
        return None
    salted = trace.replay(
        block_size, settings.kv_tokens, salts=trace.tenants, progress=settings.progress
    )
    return SaltCost(len(set(trace.tenants)), shared, token_hit_rate(salted, trace.lengths))


def _recommend(table: pd.DataFrame, max_imbalance: float) -> str:
    if table.fleet_hit_rate.max() < 0.01:  # nothing to share: only the load matters
        return "round_robin"
    balanced = table[table.imbalance <= max_imbalance]
    best = (balanced if len(balanced) else table).sort_values(
        "fleet_hit_rate", ascending=False, kind="stable"
    )
    return best.policy.iloc[0]


def _reason(table: pd.DataFrame, recommended: str, max_imbalance: float) -> str:
    if table.fleet_hit_rate.max() < 0.01:
        return "nothing is shared between these prompts, so only the load matters"
    by_hits = table.set_index("policy").sort_values(
        "fleet_hit_rate", ascending=False, kind="stable"
    )
    chosen = by_hits.loc[recommended]
    text = (
        f"the highest hit rate ({chosen.fleet_hit_rate:.1%}) among the policies that keep the busiest replica "
        f"within x{max_imbalance} the mean load"
    )
    more = by_hits[by_hits.fleet_hit_rate > chosen.fleet_hit_rate + 0.005]
    if len(more):
        top = more.iloc[0]
        text += (
            f"; {more.index[0]} would keep more ({top.fleet_hit_rate:.1%}) but loads one replica "
            f"x{top.imbalance:.2f} the mean"
        )
    close = by_hits[
        (by_hits.index != recommended)
        & ((by_hits.fleet_hit_rate - chosen.fleet_hit_rate).abs() <= 0.005)
    ]
    if len(close):
        text += (
            f"; {', '.join(close.index)} keep as many hits as {recommended}, within half a point"
        )
    return text
