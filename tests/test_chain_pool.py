"""The block pool over hashed chains (lab.core.chain_pool): with LRU it is vLLM's pool, equal to the fast replay
request for request; the other eviction policies differ only in what they evict."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.audit.replay import replay_chains
from lab.core.chain_pool import POLICIES, ChainPool, replay


def random_trace(seed: int, n: int = 80):
    rng = random.Random(seed)
    stems = [[rng.randrange(10**9) for _ in range(rng.randrange(1, 8))] for _ in range(5)]
    chains, lengths, block_size = [], [], 4
    for _ in range(n):
        stem = rng.choice(stems)[: rng.randrange(1, 8)]
        chain = stem + [rng.randrange(10**9) for _ in range(rng.randrange(0, 4))]
        length = len(chain) * block_size + rng.choice([0, 0, 1, 3])  # some end on a block boundary
        chains.append(chain), lengths.append(length)
    return chains, lengths, block_size


@given(st.integers(0, 10**6), st.integers(14, 60))
@settings(max_examples=60, deadline=None)
def test_lru_is_the_fast_replay_request_for_request(seed, num_blocks):
    chains, lengths, block_size = random_trace(seed)
    assert replay(chains, lengths, block_size, num_blocks) == replay_chains(chains, lengths, block_size, num_blocks).tolist()


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_agrees_when_nothing_is_evicted_and_never_exceeds_the_hittable(policy):
    chains, lengths, block_size = random_trace(7)
    big = replay(chains, lengths, block_size, 10_000, policy)
    assert big == replay(chains, lengths, block_size, 10_000, "lru")
    small = replay(chains, lengths, block_size, 14, policy)
    assert all(0 <= c <= (n - 1) // block_size * block_size for c, n in zip(small, lengths))


def test_protect_roots_keeps_a_shared_root_that_lru_evicts():
    """A root that two requests share, then two one-off requests before each next use: enough to flush it from
    an LRU pool, not from one that protects shared roots."""
    root, chains = 1, [[1, 100], [1, 101]]
    for i in range(2, 30):
        chains.append([root, 100 + i] if i % 3 == 1 else [1000 + i, 2000 + i, 3000 + i, 4000 + i])
    lengths, block_size = [len(c) * 4 + 1 for c in chains], 4
    lru = replay(chains, lengths, block_size, 6, "lru")
    protected = replay(chains, lengths, block_size, 6, "protect_roots")
    assert sum(lru) == 4 and protected == [0, 4] + [4 if i % 3 == 1 else 0 for i in range(2, 30)]


def test_bad_policy_and_pool_are_named():
    with pytest.raises(ValueError, match="policy='fifo'"):
        ChainPool(4, 4, "fifo")
    with pytest.raises(ValueError, match="num_blocks=0"):
        ChainPool(0, 4)
