"""lab.fleet_sim: simulated replicas behind the router's policies."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.fleet_sim import POLICIES, CacheAwareKnobs, FleetSim, summarize_sim
from lab.prefix_cache import PrefixCache

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
@given(policy=st.sampled_from(POLICIES), replicas=st.integers(1, 5), concurrency=st.integers(1, 6),
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


@pytest.mark.parametrize("kwargs, message", [
    ({"replicas": 0, "policy": "random"}, r"replicas=0: use a positive number"),
    ({"replicas": 2, "policy": "kv_aware"}, r"policy='kv_aware': the simulator has random, round_robin"),
])
def test_bad_fleets_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FleetSim(kv_blocks=8, block_size=BLOCK, **kwargs)
