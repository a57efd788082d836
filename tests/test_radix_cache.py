"""lab.core.radix_cache: token-granular matching, node splits, LRU eviction of unreferenced leaves."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.core.prefix_cache import CacheFullError, PrefixCache
from lab.core.radix_cache import RadixCache


def test_matches_token_by_token_where_blocks_cannot():
    radix, blocks = RadixCache(capacity_tokens=1000), PrefixCache(num_blocks=100, block_size=16)
    first, second = list(range(40)), list(range(37)) + [900, 901]
    for cache in (radix, blocks):
        cache.allocate("a", first)
    assert radix.allocate("b", second) == 37
    assert blocks.allocate("b", second) == 32


def test_split_keeps_both_branches():
    cache = RadixCache(capacity_tokens=100)
    cache.allocate("a", [1, 2, 3, 4, 5])
    cache.allocate("b", [1, 2, 3, 9, 9])
    assert sorted(t for _, t in cache.sequences()) == [(1, 2, 3, 4, 5), (1, 2, 3, 9, 9)]
    assert cache.num_tokens == 7
    assert cache.allocate("c", [1, 2, 3, 4, 5, 6]) == 5


def test_last_token_rule_and_salts():
    cache = RadixCache(capacity_tokens=100)
    cache.allocate("a", [1, 2, 3], cache_salt="alice")
    assert cache.allocate("b", [1, 2, 3], cache_salt="alice") == 2
    assert cache.allocate("c", [1, 2, 3], cache_salt="bob") == 0


def test_lru_leaf_is_evicted_and_running_requests_are_not():
    cache = RadixCache(capacity_tokens=10)
    cache.allocate("old", [1, 1, 1, 1])
    cache.allocate("new", [2, 2, 2, 2])
    cache.free("old")
    cache.free("new")
    cache.allocate("x", [3, 3, 3, 3])  # 12 tokens > 10: the least recently used leaf goes
    assert sorted(t for _, t in cache.sequences()) == [(2, 2, 2, 2), (3, 3, 3, 3)]
    with pytest.raises(CacheFullError, match="capacity_tokens=10"):
        cache.allocate("y", list(range(20, 29)))  # "x" is running and cannot be evicted
    assert cache.allocate("y", [3, 3, 3, 3, 5]) == 4


def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity_tokens=0"):
        RadixCache(capacity_tokens=0)
    cache = RadixCache(capacity_tokens=10)
    with pytest.raises(ValueError, match="empty"):
        cache.allocate("a", [])
    with pytest.raises(KeyError, match="not running"):
        cache.free("a")


prompts = st.lists(st.integers(1, 3), min_size=1, max_size=12)
operations = st.lists(
    st.one_of(st.tuples(st.just("allocate"), prompts, st.sampled_from([None, "s"])),
              st.tuples(st.just("free"), st.integers(0, 50), st.none())),
    max_size=40,
)


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(ops=operations, capacity=st.integers(12, 40))
def test_random_operations_keep_the_contract(ops, capacity):
    cache = RadixCache(capacity_tokens=capacity)
    running = {}
    for n, (op, arg, salt) in enumerate(ops):
        if op == "free":
            if running:
                rid = sorted(running)[arg % len(running)]
                cache.free(rid)
                del running[rid]
        else:
            cached = [t for s, t in cache.sequences() if s == salt]
            longest = max((common_prefix(arg, t) for t in cached), default=0)
            try:
                hit = cache.allocate(f"r{n}", arg, cache_salt=salt)
            except CacheFullError:
                continue
            assert hit == min(longest, len(arg) - 1), "a hit is the longest cached prefix, token-exact"
            running[f"r{n}"] = (salt, tuple(arg))
        assert cache.num_tokens <= capacity
        assert cache.num_tokens == sum(len(node.key) for node in cache._nodes())
        sequences = cache.sequences()
        for salt_, tokens in running.values():
            assert any(s == salt_ and t[:len(tokens)] == tokens for s, t in sequences), "running requests stay cached"
        assert all(node.ref_count >= 0 for node in cache._nodes())


@settings(max_examples=200, deadline=None)
@given(key=st.lists(st.integers(0, 2), max_size=12), tokens=st.lists(st.integers(0, 2), max_size=14),
       start=st.integers(0, 14))
def test_common_prefix_length_matches_a_token_by_token_count(key, tokens, start):
    from lab.core.radix_cache import common_prefix_length

    start = min(start, len(tokens))
    expected = 0
    while expected < len(key) and start + expected < len(tokens) and key[expected] == tokens[start + expected]:
        expected += 1
    assert common_prefix_length(tuple(key), tokens, start) == expected
