"""Miss attribution (lab.audit.misses): one cause per uncached token, adding up exactly, each cause where it belongs.
The same attribution against the real engine runs in notebook 14 (lab.audit.reconcile)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.audit.misses import CAUSES, STRIDE, Routes, attribute
from lab.audit.replay import replay_hit_rate

BS = 16


def words(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 900) for _ in range(n)]


def causes_of(trace, **kwargs) -> list[dict]:
    misses = attribute(trace, block_size=BS, kv_tokens=kwargs.pop("kv_tokens", 10_000), **kwargs)
    return misses.requests.to_dict("records")


def only(row: dict, **expected) -> None:
    """The row's causes are `expected` and zero elsewhere."""
    assert {c: row[c] for c in CAUSES} == dict.fromkeys(CAUSES, 0) | expected


def test_a_first_prompt_is_cold_and_a_repeat_misses_only_its_partial_block():
    prompt = words(100, 1)  # 6 full blocks and 4 tokens
    first, repeat = causes_of([prompt, prompt])
    only(first, cold=100)
    assert repeat["cached_tokens"] == 96
    only(repeat, partial_block=4)


def test_a_repeat_of_a_whole_number_of_blocks_computes_its_last_block():
    prompt = words(96, 2)
    _, repeat = causes_of([prompt, prompt])
    assert repeat["cached_tokens"] == 80
    only(repeat, last_token=16)


def test_a_shared_prefix_that_ends_inside_a_block():
    shared = words(40, 3)  # 2 full blocks and 8 tokens
    _, second = causes_of([shared + words(60, 4), shared + words(60, 5)])
    assert second["cached_tokens"] == 32 and second["shared_prefix"] == 40
    only(second, partial_block=8, cold=60)


def test_evicted_blocks_are_blamed_on_the_cache_size_and_named():
    tenants = [words(160, 10 + t) for t in range(3)]
    trace = tenants + tenants  # each tenant's 10 blocks; a pool of 12 holds one tenant at a time
    misses = attribute(trace, block_size=BS, kv_tokens=12 * BS)
    again = misses.requests.iloc[3]
    assert again.cached_tokens == 0 and again.evicted == 144 and again.last_token == 16
    assert len(misses.evicted_hashes) == 3 and misses.evictions > 0
    assert attribute(trace, block_size=BS, kv_tokens=100 * BS).requests.iloc[3].evicted == 0


def test_another_replica_and_another_salt():
    prompt = words(64, 20)
    _, elsewhere = causes_of([prompt, prompt], routes=Routes([0, 1], replicas=2))
    only(elsewhere, other_replica=48, last_token=16)
    _, salted = causes_of([prompt, prompt], salts=["tenant-a", "tenant-b"])
    only(salted, salt=48, last_token=16)
    _, same_salt = causes_of([prompt, prompt], salts=["tenant-a", "tenant-a"])
    only(same_salt, last_token=16)


def test_text_behind_a_different_prefix_is_told_from_new_text():
    instructions, question = words(200, 30), words(50, 31)
    trace = [[1, 2, 3] + instructions + question, [4, 5] + instructions + words(50, 32)]
    _, second = causes_of(trace)
    assert second["shared_prefix"] == 0
    assert second["other_prefix"] >= 200 - 2 * STRIDE  # the instructions, seen before behind another first line
    assert second["cold"] == 252 - second["other_prefix"]


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="salts has 1 entries for 2 prompts"):
        attribute([[1, 2], [3, 4]], block_size=BS, kv_tokens=1000, salts=["a"])
    with pytest.raises(ValueError, match="replica_of must name replicas 0 .. 1"):
        attribute([[1, 2]], block_size=BS, kv_tokens=1000, routes=Routes([2], replicas=2))
    with pytest.raises(ValueError, match="routes has 1 entries for 2 prompts"):
        attribute([[1, 2], [3, 4]], block_size=BS, kv_tokens=1000, routes=Routes([0], replicas=1))
    with pytest.raises(ValueError, match="block_size"):
        attribute([[1, 2]], block_size=0, kv_tokens=1000)


segments = st.lists(st.integers(0, 5), min_size=1, max_size=6)  # prompts built from a few shared pieces


@settings(max_examples=60, deadline=None)
@given(st.lists(segments, min_size=1, max_size=12), st.integers(4, 40), st.booleans(), st.integers(1, 3))
def test_causes_add_up_to_the_uncached_tokens_exactly(pieces, kv_blocks, salted, replicas):
    library = [words(7 + 5 * k, 40 + k) for k in range(6)]
    trace = [[t for k in prompt for t in library[k]] for prompt in pieces]
    trace = [ids for ids in trace if len(ids) < kv_blocks * BS - BS] or [[1, 2, 3]]
    salts = [random.Random(i).choice(["a", None]) for i in range(len(trace))] if salted else None
    routes = [i % replicas for i in range(len(trace))]
    misses = attribute(trace, block_size=BS, kv_tokens=kv_blocks * BS, salts=salts, routes=Routes(routes, replicas))
    rows = misses.requests
    assert (rows[list(CAUSES)] >= 0).all().all()
    assert (rows[list(CAUSES)].sum(axis=1) == rows.prompt_tokens - rows.cached_tokens).all()
    if replicas == 1:
        assert misses.hit_rate == pytest.approx(replay_hit_rate(trace, BS, kv_blocks * BS, salts))
    table = misses.table()
    assert table.tokens.sum() == rows.prompt_tokens.sum() and table.share.sum() == pytest.approx(1)
