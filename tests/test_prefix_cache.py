"""lab.core.prefix_cache: the contract of vLLM V1's prefix caching, unit by unit and under random operations."""

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.core.prefix_cache import CacheFullError, PrefixCache, block_hashes

BS = 4


def tokens(n, start=10):
    return list(range(start, start + n))


# --- hashing ------------------------------------------------------------------------------------

def test_only_full_blocks_are_hashed():
    assert len(block_hashes(tokens(11), BS)) == 2
    assert len(block_hashes(tokens(12), BS)) == 3
    assert block_hashes(tokens(3), BS) == []


def test_hashes_chain_so_an_early_change_changes_every_later_hash():
    base = block_hashes(tokens(16), BS)
    changed = tokens(16)
    changed[1] = 999
    assert all(a != b for a, b in zip(base, block_hashes(changed, BS)))
    late = tokens(16)
    late[13] = 999
    assert block_hashes(late, BS)[:3] == base[:3] and block_hashes(late, BS)[3] != base[3]


def test_salt_changes_the_whole_chain():
    plain, salted = block_hashes(tokens(12), BS), block_hashes(tokens(12), BS, cache_salt="tenant-a")
    assert all(a != b for a, b in zip(plain, salted))
    assert salted != block_hashes(tokens(12), BS, cache_salt="tenant-b")


ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
FRESH_PROCESS = """
import json, sys
from lab.core.block_hash import block_hashes
from lab.serving.vllm_internals import vllm_block_hashes
ids, size = list(range(10, 30)), 4
print(json.dumps({algo: [[h.hex() for h in block_hashes(ids, size, algo, "s")],
                         [h.hex() for h in vllm_block_hashes(ids, size, algo, "s")]] for algo in sys.argv[1:]}))
"""


def hashes_in_a_fresh_process(**env) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | env
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, *ALGOS], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_algorithm_gives_the_same_hashes_in_every_process():
    """Hashes are a function of the tokens alone (no per-process seed), so results files and replicas agree."""
    fresh = hashes_in_a_fresh_process()
    for algo in ALGOS:
        assert fresh[algo][0] == [h.hex() for h in block_hashes(tokens(20), BS, algo, "s")]
    assert len({fresh[algo][0][0] for algo in ALGOS}) == len(ALGOS), "each algorithm its own hashes"


def test_lab_hashes_are_byte_identical_to_vllms_for_every_algorithm():
    """vLLM seeds the first parent from PYTHONHASHSEED when set (xxhash otherwise draws a random seed)."""
    fresh = hashes_in_a_fresh_process(PYTHONHASHSEED="0")
    for algo in ALGOS:
        ours, theirs = fresh[algo]
        assert ours == theirs and len(ours) == 5, algo


# --- allocation rules ---------------------------------------------------------------------------

def test_second_request_hits_the_shared_full_blocks():
    cache = PrefixCache(num_blocks=16, block_size=BS)
    assert cache.allocate("a", tokens(10)) == 0
    assert cache.allocate("b", tokens(9) + [77]) == 8  # 2 full shared blocks; the third differs
    assert cache.block_table("a")[:2] == cache.block_table("b")[:2]
    assert cache.stats.queries == 20 and cache.stats.hits == 8 and cache.stats.hit_rate == 0.4


def test_last_token_rule_keeps_a_full_hit_one_block_short():
    cache = PrefixCache(num_blocks=16, block_size=BS)
    cache.allocate("a", tokens(12))
    cache.free("a")
    assert cache.allocate("b", tokens(12)) == 8  # the last block is recomputed for its logits
    assert cache.allocate("c", tokens(13)) == 12


def test_recomputed_block_is_a_duplicate_and_the_first_copy_serves_hits():
    cache = PrefixCache(num_blocks=16, block_size=BS)
    cache.allocate("a", tokens(12))
    cache.allocate("b", tokens(12))
    last_hash = block_hashes(tokens(12), BS)[-1]
    first_copy, second_copy = cache.block_table("a")[2], cache.block_table("b")[2]
    assert list(cache.cached[last_hash]) == [first_copy, second_copy]
    cache.allocate("c", tokens(13))
    assert cache.block_table("c")[2] == first_copy


def test_salted_requests_share_nothing_with_other_salts():
    cache = PrefixCache(num_blocks=16, block_size=BS)
    cache.allocate("a", tokens(13), cache_salt="alice")
    assert cache.allocate("b", tokens(13), cache_salt="bob") == 0
    assert cache.allocate("c", tokens(13)) == 0
    assert cache.allocate("d", tokens(13), cache_salt="alice") == 12


def test_free_queue_order_tail_blocks_evict_first_and_unhashed_blocks_are_reused_first():
    cache = PrefixCache(num_blocks=6, block_size=BS)
    cache.allocate("a", tokens(10))  # blocks 0, 1 hashed; 2 partial
    cache.free("a")
    assert list(cache.free_queue) == [2, 3, 4, 5, 1, 0]
    cache.allocate("b", tokens(24, start=500))  # needs all 6 blocks: evicts 1, then 0
    assert cache.block_table("b") == [2, 3, 4, 5, 1, 0]
    assert cache.stats.evictions == 2 and not cache.cached.get(block_hashes(tokens(10), BS)[0])


def test_a_hit_takes_a_free_block_out_of_the_queue():
    cache = PrefixCache(num_blocks=6, block_size=BS)
    cache.allocate("a", tokens(9))
    cache.free("a")
    assert cache.allocate("b", tokens(9)) == 8
    assert 0 not in cache.free_queue and 1 not in cache.free_queue


def test_pool_too_small_is_a_clear_error_and_changes_nothing():
    cache = PrefixCache(num_blocks=3, block_size=BS)
    cache.allocate("a", tokens(8))
    with pytest.raises(CacheFullError, match=r"needs 2 free blocks but only 1 of num_blocks=3"):
        cache.allocate("b", tokens(8, start=100))
    assert cache.num_free_blocks == 1 and cache.stats.requests == 1 and "b" not in cache.tables


@pytest.mark.parametrize("kwargs, match", [
    ({"num_blocks": 0, "block_size": 4}, "num_blocks=0"),
    ({"num_blocks": 4, "block_size": -1}, "block_size=-1"),
    ({"num_blocks": 4, "block_size": 4, "hash_algo": "md5"}, "hash_algo='md5'.*sha256"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrefixCache(**kwargs)


def test_request_misuse_is_named():
    cache = PrefixCache(num_blocks=4, block_size=BS)
    with pytest.raises(ValueError, match="empty"):
        cache.allocate("a", [])
    cache.allocate("a", tokens(3))
    with pytest.raises(ValueError, match="already holds blocks"):
        cache.allocate("a", tokens(3))
    with pytest.raises(KeyError, match="holds no blocks"):
        cache.free("zzz")
    with pytest.raises(RuntimeError, match="cannot reset"):
        cache.reset()
    cache.free("a")
    cache.reset()
    assert cache.allocate("b", tokens(3)) == 0 and not cache.cached


def test_hash_collision_is_never_a_hit():
    cache = PrefixCache(num_blocks=8, block_size=BS)
    cache.allocate("a", tokens(9))
    victim = cache.blocks[cache.block_table("a")[0]]
    victim.token_ids = (0, 0, 0, 0)  # as if another prompt had produced the same hash
    assert cache.allocate("b", tokens(9)) == 0


# --- properties under random operations -------------------------------------------------------

PREFIXES = [tokens(12, 100), tokens(7, 200), tokens(16, 100)[:5] + tokens(11, 300)]


@st.composite
def prompt(draw):
    base = draw(st.sampled_from(PREFIXES))
    cut = draw(st.integers(0, len(base)))
    tail = draw(st.lists(st.integers(1, 6), max_size=9))
    return (base[:cut] + tail) or [1]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), prompt(), st.sampled_from([None, None, "s1", "s2"])),
        st.tuples(st.just("free"), st.integers(0, 50), st.none()),
    ),
    max_size=40,
)


def expected_hit(cache, token_ids, salt):
    """Longest block-aligned prefix whose every block is cached with these contents, capped for the last token."""
    hashes = block_hashes(token_ids, cache.block_size, cache.hash_algo, salt)
    count = 0
    for h in hashes[:(len(token_ids) - 1) // cache.block_size]:
        if h not in cache.cached:
            break
        count += 1
    return count * cache.block_size


def check_invariants(cache):
    refs = {b.block_id: 0 for b in cache.blocks}
    for table in cache.tables.values():
        for block in table:
            refs[block.block_id] += 1
    for block in cache.blocks:
        assert block.ref_count == refs[block.block_id] >= 0
        assert (block.ref_count == 0) == (block.block_id in cache.free_queue)
        if block.block_hash is not None:
            assert block.block_id in cache.cached[block.block_hash]
    assert cache.num_free_blocks + sum(b.ref_count > 0 for b in cache.blocks) == cache.num_blocks
    assert all(cache.blocks[i].block_hash == h for h, holders in cache.cached.items() for i in holders)


@settings(max_examples=150, deadline=None)
@given(ops=operations, num_blocks=st.integers(4, 12), block_size=st.sampled_from([1, 2, 4]))
def test_random_operations_keep_the_contract(ops, num_blocks, block_size):
    cache = PrefixCache(num_blocks=num_blocks, block_size=block_size)
    for n, (op, arg, salt) in enumerate(ops):
        if op == "free":
            if cache.tables:
                cache.free(sorted(cache.tables)[arg % len(cache.tables)])
            check_invariants(cache)
            continue
        queue_before = list(cache.free_queue)
        held = {b.block_id: b.block_hash for b in cache.blocks if b.ref_count > 0}
        want = expected_hit(cache, arg, salt)
        try:
            got = cache.allocate(f"r{n}", arg, cache_salt=salt)
        except CacheFullError:
            assert list(cache.free_queue) == queue_before, "a refused request changes nothing"
            continue
        assert got == want, "a hit is exactly the longest cached block-aligned prefix"
        table = cache.block_table(f"r{n}")
        hit_ids = set(table[:got // block_size])
        new_ids = table[got // block_size:]
        assert new_ids == [i for i in queue_before if i not in hit_ids][:len(new_ids)], "eviction takes the queue's head"
        for block_id, block_hash in held.items():
            assert block_id not in new_ids, "a referenced block is never handed out again"
            assert cache.blocks[block_id].block_hash == block_hash, "a referenced block is never evicted"
        check_invariants(cache)


def test_replay_serves_one_request_at_a_time_and_counts_each_hit():
    shared = list(range(100))
    prompts = [shared + [500], shared + [501], [7] * 40, shared + [502]]
    manual = PrefixCache(num_blocks=16, block_size=16)
    expected = []
    for i, ids in enumerate(prompts):
        expected.append(manual.allocate(str(i), ids))
        manual.free(str(i))
    replayed = PrefixCache(num_blocks=16, block_size=16)
    assert replayed.replay(prompts) == expected == [0, 96, 0, 96]
    assert replayed.num_free_blocks == 16, "every request was freed"
    with pytest.raises(ValueError, match="salts has 1 entries for 4 prompts"):
        replayed.replay(prompts, salts=["a"])


def test_a_seed_set_after_import_is_read_as_vllm_reads_it(monkeypatch):
    """vLLM's init_none_hash reads PYTHONHASHSEED each time it runs; so does the lab's first parent hash."""
    from lab.core.block_hash import NONE_HASH_SEED, hash_function, none_hash
    from lab.serving.vllm_internals import vllm_block_hashes

    ids = list(range(100, 164))
    default = none_hash("sha256")
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert none_hash("sha256") == hash_function("sha256")("7") != default
    assert block_hashes(ids, 16, "sha256") == vllm_block_hashes(ids, 16, "sha256")
    monkeypatch.delenv("PYTHONHASHSEED")
    assert none_hash("sha256") == default == hash_function("sha256")(NONE_HASH_SEED)


def test_the_token_hit_rate_weighs_requests_by_their_length():
    from lab.core.block_hash import token_hit_rate

    assert token_hit_rate([0, 90], [10, 90]) == 0.9, "cached over prompt tokens, not the mean of each request's share"
    assert token_hit_rate(pd.Series([3]), pd.Series([4])) == 0.75
    assert math.isnan(token_hit_rate([], []))
