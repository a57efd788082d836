"""lab.experiments.fleet_sim: simulated replicas behind the router's policies."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.core.prefix_cache import PrefixCache
from lab.experiments.fleet_sim import (
    SIM_POLICIES,
    SIMULATED_ROUTER_POLICIES,
    CacheAwareKnobs,
    FleetSim,
    hash_requests,
    summarize_sim,
)

BLOCK = 4


def tenant_requests(tenants: int, per_tenant: int, context_blocks: int = 6) -> list[list[int]]:
    """Tenants in a seeded random order, each request its tenant's context plus a question of its own."""
    contexts = [[1000 * (t + 1) + i for i in range(context_blocks * BLOCK)] for t in range(tenants)]
    order = random.Random(0).choices(range(tenants), k=tenants * per_tenant)
    return [contexts[t] + [7, i, i + 1] for i, t in enumerate(order)]


def test_one_replica_is_one_prefix_cache():
    requests = tenant_requests(tenants=3, per_tenant=5)
    routed = FleetSim(1, "cache_aware", kv_blocks=64, block_size=BLOCK).run(requests)
    cache = PrefixCache(num_blocks=64, block_size=BLOCK)
    expected = []
    for i, token_ids in enumerate(requests):
        expected.append(cache.allocate(str(i), token_ids))
        cache.free(str(i))
    assert routed.cached_tokens.tolist() == expected and (routed.replica == 0).all()


def test_cache_aware_beats_round_robin_when_tenants_partition_over_replicas():
    requests = tenant_requests(tenants=4, per_tenant=12)
    # each replica holds two tenants' contexts, not four: where a tenant goes decides whether it hits
    rates = {policy: summarize_sim(FleetSim(2, policy, kv_blocks=16, block_size=BLOCK).run(requests, concurrency=4), 2)
             for policy in ("round_robin", "cache_aware")}
    assert rates["cache_aware"].fleet_hit_rate > rates["round_robin"].fleet_hit_rate + 0.2


def test_one_at_a_time_cache_aware_sends_everything_to_the_first_replica():
    """What vllm-router 0.1.17 did: with every load tied, a miss goes to the first least-loaded replica."""
    routed = FleetSim(2, "cache_aware", kv_blocks=64, block_size=BLOCK).run(tenant_requests(4, 4), concurrency=1)
    assert (routed.replica == 0).all()
    documented = CacheAwareKnobs(miss_to="smallest_tree")
    routed = FleetSim(2, "cache_aware", kv_blocks=64, block_size=BLOCK, knobs=documented).run(tenant_requests(4, 4))
    assert set(routed.replica) == {0, 1}, "the documented miss rule spreads new prefixes"


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(SIM_POLICIES), replicas=st.integers(1, 5), concurrency=st.integers(1, 6),
       lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30), seed=st.integers(0, 3))
def test_every_request_is_served_once_and_loads_add_up(policy, replicas, concurrency, lengths, seed):
    requests = [[(seed + i) % 3] * n for i, n in enumerate(lengths)]  # three prefixes, many repeats
    sim = FleetSim(replicas, policy, kv_blocks=64, block_size=BLOCK, seed=seed)
    routed = sim.run(requests, concurrency=concurrency)
    assert routed.request.tolist() == list(range(len(requests)))
    assert routed.replica.between(0, replicas - 1).all()
    assert (routed.cached_tokens < routed.prompt_tokens).all(), "the last prompt token is always computed"
    assert sim.load == [0] * replicas, "every request finished and released its replica"
    assert all(cache.num_free_blocks == 64 for cache in sim.caches), "no block is left held"
    assert (routed.ttft >= 1).all(), "a request waits at least its own prefill step"
    again = FleetSim(replicas, policy, kv_blocks=64, block_size=BLOCK, seed=seed)
    assert again.run(requests, concurrency=concurrency, chains=hash_requests(requests, BLOCK)).equals(routed), \
        "a trace hashed once routes exactly as one hashed per run"


@pytest.mark.parametrize("kwargs, message", [
    ({"replicas": 0, "policy": "random"}, r"replicas=0 must be a positive number"),
    ({"replicas": 2, "policy": "kv_aware"}, r"policy='kv_aware': the simulator has random, round_robin"),
])
def test_bad_fleets_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FleetSim(kv_blocks=8, block_size=BLOCK, **kwargs)


def test_a_session_key_keeps_each_tenant_on_one_replica():
    requests = tenant_requests(tenants=4, per_tenant=6)
    tenants = [r[0] // 1000 for r in requests]
    routed = FleetSim(3, "consistent_hash", kv_blocks=64, block_size=BLOCK).run(requests, keys=tenants)
    assert (routed.groupby(tenants).replica.nunique() == 1).all()
    keyless = FleetSim(3, "consistent_hash", kv_blocks=64, block_size=BLOCK).run(requests)
    assert (keyless.groupby(tenants).replica.nunique() > 1).any(), "without a key the whole request is hashed"
    placed = FleetSim(3, "consistent_hash", kv_blocks=64, block_size=BLOCK, placement={1: 2, 2: 2, 3: 0, 4: 2})
    assert placed.run(requests, keys=tenants).replica.tolist() == [{1: 2, 2: 2, 3: 0, 4: 2}[t] for t in tenants], \
        "a real router's placement, probed, replaces the simulator's ring"


def test_a_miss_holds_its_replica_longer_than_a_hit():
    """Two in flight: a long miss on replica 0, then a short request on replica 1. The short one ends first,
    so the next miss finds replica 1 idle and replica 0 still busy (with equal durations, first in first
    out, it would have found replica 0 idle)."""
    long_a, short, long_b = [1] * 40 + [7], [2, 3], [4] * 40 + [7]
    routed = FleetSim(2, "cache_aware", kv_blocks=64, block_size=BLOCK).run([long_a, short, long_b], concurrency=2)
    assert routed.replica.tolist() == [0, 1, 1]


def test_synthetic_tenants_share_a_context_per_tenant_and_follow_zipf():
    from lab.experiments.generators import synthetic_tenants

    requests, order = synthetic_tenants(4, 400, context_tokens=64, zipf=1.5, shared_system_tokens=16, seed=1)
    assert len(requests) == len(order) == 400
    by_tenant = {t: r[:80] for r, t in zip(requests, order)}
    assert all(r[:80] == by_tenant[t] for r, t in zip(requests, order)), "a tenant's requests share its context"
    assert len({tuple(r[:16]) for r in requests}) == 1, "every tenant starts with the shared system prompt"
    counts = [order.count(k) for k in range(4)]
    assert counts[0] > counts[1] > counts[3], "tenant 0 is the most popular under Zipf"
    with pytest.raises(ValueError, match=r"zipf=-1.*zipf >= 0"):
        synthetic_tenants(4, 10, context_tokens=64, zipf=-1)


def test_the_upper_bound_is_a_cache_that_never_evicts():
    from lab.experiments.fleet_sim import upper_bound_hit_rate

    requests = tenant_requests(tenants=3, per_tenant=5)
    cache = PrefixCache(num_blocks=1000, block_size=BLOCK)
    hits = sum(cache.allocate(str(i), r) for i, r in enumerate(requests))
    assert upper_bound_hit_rate(requests, BLOCK) == hits / sum(map(len, requests))
    for policy in SIMULATED_ROUTER_POLICIES:
        routed = FleetSim(3, policy, kv_blocks=16, block_size=BLOCK).run(requests, concurrency=3)
        assert summarize_sim(routed, 3).fleet_hit_rate <= upper_bound_hit_rate(requests, BLOCK)


def test_bounded_load_keeps_a_hot_key_within_its_cap():
    """One key sends everything: consistent_hash piles it on one replica; bounded_load moves the overflow on
    round the ring, and no replica ever holds more than load_factor x the mean load."""
    requests = [[5] * 40 + [i] for i in range(60)]
    keys = ["hot"] * 60
    pinned = FleetSim(4, "consistent_hash", kv_blocks=64, block_size=BLOCK).run(requests, concurrency=8, keys=keys)
    assert pinned.replica.nunique() == 1
    sim = FleetSim(4, "bounded_load", kv_blocks=64, block_size=BLOCK)
    highest = []
    original_choose = sim.choose

    def watching_choose(*args):
        chosen = original_choose(*args)
        highest.append(sim.load[chosen[0]] + 1)  # the chosen replica's load once this request is on it
        return chosen
    sim.choose = watching_choose
    spread = sim.run(requests, concurrency=8, keys=keys)
    assert spread.replica.nunique() > 1
    assert max(highest) <= 3, "8 in flight over 4 replicas: ceil(1.25 x 8 / 4) = 3 per replica at most"
    assert summarize_sim(spread, 4).fleet_hit_rate > 0.5, "the key's ring order keeps its overflow on few replicas"


def test_kv_cost_weighs_cached_blocks_against_queued_work():
    """Request 0 caches a 40-token prefix on replica 0. Alone, a request sharing it goes there (a hit is cheaper
    than a prefill). Behind enough queued work, it is prefilled again on the other replica."""
    prefix = [9] * 40
    routed = FleetSim(2, "kv_cost", kv_blocks=64, block_size=BLOCK).run([prefix + [1], prefix + [2]])
    assert routed.replica.tolist() == [0, 0] and routed.cached_tokens.tolist() == [0, 40]
    # all sent at once; in steps: replica 0 holds 11.25 (the prefix), replica 1 takes 51 (200 tokens), replica 0
    # the next two (26 each): the last request waits 63.25 + 1.25 on replica 0 or 51 + 11.25 on replica 1
    queued = [prefix + [1], [3] * 200, [4] * 100, [5] * 100, prefix + [2]]
    routed = FleetSim(2, "kv_cost", kv_blocks=256, block_size=BLOCK).run(queued, concurrency=5)
    assert routed.replica.tolist() == [0, 1, 0, 0, 1] and routed.cached_tokens.iloc[-1] == 0


def test_a_replica_serves_its_queue_first_come_first_served():
    """Three misses on one replica, sent together: each waits for the prefills before it."""
    requests = [[i] * 16 + [99] for i in range(3)]  # 4 full blocks and one token: 1 + 17/4 steps each
    routed = FleetSim(1, "round_robin", kv_blocks=64, block_size=BLOCK).run(requests, concurrency=3)
    step = 1 + 17 / BLOCK
    assert routed.ttft.tolist() == [step, 2 * step, 3 * step]


def test_router_flags_become_knobs():
    knobs = CacheAwareKnobs.from_router_flags(["--balance-abs-threshold", "1", "--balance-rel-threshold", "1.0"])
    assert (knobs.balance_abs_threshold, knobs.balance_rel_threshold, knobs.cache_threshold) == (1, 1.0, 0.3)
    with pytest.raises(ValueError, match=r"the simulator knows --cache-threshold"):
        CacheAwareKnobs.from_router_flags(["--router-temperature", "1"])


def test_a_service_time_fitted_on_measured_ttfts():
    from lab.experiments.fleet_sim import fit_service

    prompts, cached = [1000, 1000, 1000, 1000], [0, 960, 0, 992]
    ttft = [20 + 0.5 * (p - c) for p, c in zip(prompts, cached)]
    service = fit_service(prompts, cached, ttft)
    assert abs(service.fixed_ms - 20) < 1e-6 and abs(service.per_token_ms - 0.5) < 1e-9 and service.requests == 4
    assert abs(service(2000, 0) - 1020) < 1e-6
    with pytest.raises(ValueError, match="two different numbers of uncached tokens"):
        fit_service([100, 100], [0, 0], [5, 6])
