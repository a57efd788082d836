"""lab.core.kv_tier: evicted blocks kept in a second tier and loaded back, never changing what the model computes."""

import pytest
import torch

from lab.core.kv_tier import DiskTier, MemoryTier, ThrottledTier
from lab.core.mini_engine import MiniEngine
from lab.core.model import ensure_model

BLOCK = 16


@pytest.fixture(scope="module")
def model_path():
    return ensure_model("tiny")


def prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 2300, (length,), generator=generator).tolist() for _ in range(count)]


def serve(engine: MiniEngine, token_lists, max_tokens: int = 4):
    return [engine.generate(tokens, max_tokens=max_tokens) for tokens in token_lists]


@pytest.mark.parametrize("make_tier", [lambda tmp: MemoryTier(64), lambda tmp: DiskTier(tmp / "kv", 64),
                                       lambda tmp: ThrottledTier(MemoryTier(64), bandwidth=1e12, latency_s=0)],
                         ids=["memory", "disk", "throttled"])
def test_a_tier_changes_no_output_and_serves_what_the_small_pool_evicted(model_path, tmp_path, make_tier):
    first, second = prompts(2, 100)
    order = [first, second, first + [7, 8, 9], second]  # each 7-block prompt pushes the other out of 7 blocks
    tiered = serve(MiniEngine(model_path, block_size=BLOCK, num_blocks=7, tier=make_tier(tmp_path)), order)
    no_tier = serve(MiniEngine(model_path, block_size=BLOCK, num_blocks=7), order)
    large_pool = serve(MiniEngine(model_path, block_size=BLOCK, num_blocks=64), order)
    uncached = serve(MiniEngine(model_path, block_size=BLOCK, num_blocks=7, enable_prefix_caching=False), order)

    assert [g.num_cached_tokens for g in no_tier] == [0, 0, 0, 0]  # the pool alone forgot each prompt
    assert [g.num_tier_tokens for g in tiered] == [0, 0, 96, 96]  # six full blocks of each came back
    assert [g.num_cached_tokens for g in tiered] == [g.num_cached_tokens for g in large_pool] == [0, 0, 96, 96]
    for runs in (no_tier, large_pool, uncached):
        assert [g.output_token_ids for g in tiered] == [g.output_token_ids for g in runs]
    for tier_run, large_run in zip(tiered, large_pool):  # the same K/V, from the tier or from the pool
        assert torch.equal(tier_run.first_logits, large_run.first_logits)


def test_the_pool_comes_first_and_the_tier_continues_its_chain(model_path):
    (prompt,) = prompts(1, 100)
    tier = MemoryTier(64)
    engine = MiniEngine(model_path, block_size=BLOCK, num_blocks=16, tier=tier)
    engine.generate(prompt)
    assert engine.generate(prompt).num_tier_tokens == 0  # all six blocks still in the pool
    assert engine.cache.evict_free_blocks() == 6 and len(tier) == 6
    again = engine.generate(prompt)
    assert (again.num_cached_tokens, again.num_tier_tokens) == (96, 96)
    assert tier.stats.hits == 6 and tier.stats.bytes_read == 6 * 2 * engine.k_pool[:, 0].numel() * 4


def test_a_tier_lookup_stops_at_its_first_miss(model_path):
    shared, other = prompts(2, 64)
    tier = MemoryTier(64)
    engine = MiniEngine(model_path, block_size=BLOCK, num_blocks=16, tier=tier)
    engine.generate(shared + other)
    engine.cache.evict_free_blocks()
    tier.clear()  # nothing left anywhere
    engine.generate(other)  # the same tokens at another place in the chain hash to other blocks
    engine.cache.evict_free_blocks()
    assert engine.generate(shared + other).num_cached_tokens == 0


def test_a_full_tier_drops_its_least_recently_stored_block():
    tier = MemoryTier(2)
    kv = (torch.zeros(1, 2, 1, 2), torch.ones(1, 2, 1, 2))
    for name in (b"a", b"b", b"c"):
        tier.put(name, (1, 2), kv)
    assert b"a" not in tier and len(tier) == 2 and tier.stats.drops == 1
    assert len(tier.load_chain([b"b", b"c"], [(1, 2), (1, 2)])) == 2
    assert tier.load_chain([b"b"], [(3, 4)]) == [] and tier.load_chain([b"a", b"b"], [(1, 2)] * 2) == []


def test_a_throttled_read_waits_for_its_link_once_a_read():
    tier = ThrottledTier(MemoryTier(4), bandwidth=1e6, latency_s=0.01)
    kv = (torch.zeros(1000), torch.zeros(1000))  # 8,000 bytes a block: 8 ms at 1 MB/s
    tier.put(b"x", (1,), kv)
    tier.put(b"y", (2,), kv)
    assert len(tier.load_chain([b"x", b"y"], [(1,), (2,)])) == 2
    assert tier.stats.read_s >= 0.01 + 0.016  # one latency, two blocks' bytes: sleeping never returns early


@pytest.mark.parametrize("kwargs, message", [({"bandwidth": 0, "latency_s": 0}, "bandwidth=0"),
                                             ({"bandwidth": 1e9, "latency_s": -1}, "latency_s=-1")])
def test_bad_throttle_settings_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ThrottledTier(MemoryTier(4), **kwargs)


def test_the_hash_only_tier_of_chain_pool_counts_what_the_engine_loads(model_path):
    from lab.core.block_hash import chain_hashes, full_blocks
    from lab.core.chain_pool import ChainPool

    heads = prompts(3, 24, seed=1)
    rng = torch.Generator().manual_seed(2)
    order = [heads[int(torch.randint(0, 3, (1,), generator=rng))] + prompts(1, 9, seed=i)[0] for i in range(40)]
    engine = MiniEngine(model_path, block_size=4, num_blocks=12, tier=MemoryTier(10))
    pool = ChainPool(12, 4, tier_blocks=10)
    served = [engine.generate(tokens) for tokens in order]
    counted = [pool.serve([int.from_bytes(h[:8], "big") for h in chain_hashes(full_blocks(tokens, 4))], len(tokens))
               for tokens in order]
    assert [g.num_cached_tokens for g in served] == counted
    assert engine.tier.stats.hits == pool.tier_hits > 0


def test_the_formula_of_load_against_recompute():
    from lab.experiments.load_vs_recompute import break_even_bandwidth, crossover_tokens, kv_bytes_per_token

    smollm2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3}
    assert kv_bytes_per_token(smollm2) == 46_080  # 30 layers x 3 KV heads x 64 x (K and V) x 4 bytes
    assert break_even_bandwidth(2e11, 46_080, 2.1e8) == pytest.approx(43.9e6, rel=1e-3)
    assert crossover_tokens(0.0, 1e9, 2e11, 46_080, 2.1e8) == 0.0  # no fixed cost: loading wins from one token
    assert crossover_tokens(0.01, 1e7, 2e11, 46_080, 2.1e8) == float("inf")  # below break-even: never
    per_token = 2.1e8 / 2e11 - 46_080 / 1e9
    assert crossover_tokens(0.01, 1e9, 2e11, 46_080, 2.1e8) == pytest.approx(0.01 / per_token)


def test_load_against_recompute_measures_every_way_and_refuses_bad_lengths(model_path):
    from lab.experiments.load_vs_recompute import measure, rates

    engine = MiniEngine(model_path, block_size=BLOCK, num_blocks=16)
    tiers = {"memory": MemoryTier(16), "slow": ThrottledTier(MemoryTier(16), bandwidth=1e6, latency_s=0.0)}
    table = rates(measure(engine, tiers, [16, 64], repeats=2), engine.config)
    assert len(table) == 2 * 2 * 2 and set(table.tier) == set(tiers)
    assert (table.recompute_s == table.ttft_cold_s - table.ttft_local_s).all() and (table.load_s > 0).all()
    slow = table[(table.tier == "slow") & (table.hit_tokens == 64)]  # 64 tokens x 4,096 bytes at 1 MB/s: 0.26 s
    assert (slow.load_s >= 64 * 4096 / 1e6).all()
    with pytest.raises(ValueError, match="not a multiple of block_size=16"):
        measure(engine, tiers, [20], repeats=1)
    with pytest.raises(ValueError, match="tiers is empty"):
        measure(engine, {}, [16], repeats=1)


def test_the_connector_flags_and_an_empty_folder(tmp_path):
    import json

    from lab.serving.kv_connector import RestartPrompts, example_connector_flags, stored_prompts

    flag, config = example_connector_flags(tmp_path)
    assert flag == "--kv-transfer-config"
    assert json.loads(config)["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path.resolve())
    assert stored_prompts(tmp_path / "missing").empty
    with pytest.raises(ValueError, match="the same number of prompts"):
        RestartPrompts(["a", "b"], ["c"], longer="d")
