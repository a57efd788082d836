"""Block-hash traces (lab.audit.block_trace): read with clear errors, replayed with vLLM's rules, equal to the lab's
PrefixCache (proven against vLLM) on the same requests, and the shipped Mooncake traces as the paper describes."""

import gzip
import json
import math
import random

import numpy as np
import pytest

from lab import PROJECT_ROOT
from lab.audit.block_trace import cached_tokens, capacity_curve, combine, hit_rate, is_block_trace, read_block_trace
from lab.audit.prompts import AuditInputError
from lab.core.block_hash import REPLAY_HASH, chain_hashes, full_blocks
from lab.core.prefix_cache import PrefixCache

TRACES = PROJECT_ROOT / "data" / "traces"


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_rules_by_hand(tmp_path):
    """512-token blocks: a partial block is never cached, and a prompt that ends on a block boundary recomputes
    its last block (the last token is always computed)."""
    trace = read_block_trace(write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1500, "output_length": 4, "hash_ids": [0, 1, 2]},
        {"timestamp": 5, "input_length": 1400, "output_length": 4, "hash_ids": [0, 1, 7]},
        {"timestamp": 9, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]},
        {"timestamp": 12, "input_length": 1500, "output_length": 4, "hash_ids": [0, 1, 2]},
    ]))
    assert trace.format == "mooncake" and trace.block_tokens == 512
    assert cached_tokens(trace, 10**6).tolist() == [0, 1024, 512, 1024]


def test_arrival_order_is_the_timestamps_not_the_file(tmp_path):
    trace = read_block_trace(write(tmp_path / "t.jsonl", [
        {"timestamp": 9, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 3]},
        {"timestamp": 1, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 2]},
    ]))
    assert trace.arrival_s.tolist() == [0.0, 0.008] and trace.chains[0].tolist() == [0, 1]
    assert cached_tokens(trace, 10**6).tolist() == [0, 1024]


def to_trace(prompts, block_size):
    """Token prompts as a block-hash trace: each full block's chained hash numbered (and the partial block an id
    of its own), as Mooncake's ids are made."""
    ids, records = {}, []
    for t, prompt in enumerate(prompts):
        hashes = chain_hashes(full_blocks(prompt, block_size), REPLAY_HASH)
        chain = [ids.setdefault(h, len(ids)) for h in hashes]
        if len(prompt) % block_size:
            chain.append(ids.setdefault(("partial", t), len(ids)))
        records.append({"timestamp": t, "input_length": len(prompt), "output_length": 1, "hash_ids": chain})
    return records


@pytest.mark.parametrize("seed", range(20))
def test_the_replay_equals_the_prefix_cache_block_for_block(tmp_path, seed):
    """Random prompts built from a few shared stems, through a pool small enough to evict: the trace replay and
    PrefixCache (vLLM V1's contract) cache the same tokens request by request."""
    rng = random.Random(seed)
    block_size, stems = 4, [[rng.randrange(50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    prompts = [rng.choice(stems)[: rng.randrange(1, 30)] + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
               for _ in range(60)]
    num_blocks = rng.randrange(12, 40)
    trace = read_block_trace(write(tmp_path / "t.jsonl", to_trace(prompts, block_size)), block_tokens=block_size)
    expected = PrefixCache(num_blocks=num_blocks, block_size=block_size, hash_algo=REPLAY_HASH).replay(prompts)
    assert cached_tokens(trace, num_blocks * block_size).tolist() == expected


def test_bad_lines_are_named(tmp_path):
    with pytest.raises(AuditInputError, match=r"t.jsonl:2: 2 hash_ids for input_length 1500.*needs 3"):
        read_block_trace(write(tmp_path / "t.jsonl", [
            {"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [0]},
            {"timestamp": 1, "input_length": 1500, "output_length": 1, "hash_ids": [0, 1]}]))
    with pytest.raises(AuditInputError, match="missing hash_ids"):
        read_block_trace(write(tmp_path / "u.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1}]))
    with pytest.raises(AuditInputError, match="no such file"):
        read_block_trace(tmp_path / "missing.jsonl")


def test_bailian_format_is_recognised_with_its_16_token_blocks(tmp_path):
    records = [{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 3,
                "hash_ids": [10, 11, 12], "type": "text", "turn": 1},
               {"chat_id": 2, "parent_chat_id": 1, "timestamp": 2.0, "input_length": 70, "output_length": 3,
                "hash_ids": [10, 11, 13, 14, 15], "type": "text", "turn": 2}]
    path = tmp_path / "bailian.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    assert is_block_trace(path)
    trace = read_block_trace(path)
    assert (trace.format, trace.block_tokens) == ("bailian", 16) and trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.conversations.parent_chat_id.tolist() == [-1, 1]
    assert cached_tokens(trace, 10**4).tolist() == [0, 32]


def test_the_shipped_conversation_trace_reproduces_the_papers_capacity_statements():
    """Mooncake (FAST'25) section 5.3: a 3M-token cache reaches under half the maximum; 50M nearly reaches it."""
    trace = read_block_trace(TRACES / "mooncake_conversation_trace.jsonl.gz")
    assert len(trace) == 12_031 and trace.block_tokens == 512
    curve = capacity_curve(trace, [3_000_000, 50_000_000])
    assert curve.share_of_max.iloc[0] < 0.5 and curve.share_of_max.iloc[1] > 0.95
    assert 0.3 < curve.max_hit_rate.iloc[0] < 0.5


def test_combined_traces_share_no_block():
    conversation = read_block_trace(TRACES / "mooncake_conversation_trace.jsonl.gz", limit=300)
    synthetic = read_block_trace(TRACES / "mooncake_synthetic_trace.jsonl.gz", limit=300)
    both = combine(conversation, synthetic)
    assert len(both) == 600 and np.all(np.diff(both.arrival_s) >= 0)
    alone = cached_tokens(conversation, None).sum() + cached_tokens(synthetic, None).sum()
    assert cached_tokens(both, None).sum() == alone
    assert math.isclose(hit_rate(both, None), alone / both.input_tokens.sum())


def shared_root_trace(tmp_path):
    """512-token blocks: a root two requests share, then one-off requests between its uses (the chain-pool test's
    case as a trace): enough to flush the root from an LRU pool of 6 blocks, not from one that protects roots."""
    chains = [[1, 100], [1, 101]] + [[1, 100 + i] if i % 3 == 1 else [1000 + i, 2000 + i, 3000 + i, 4000 + i]
                                     for i in range(2, 30)]
    return read_block_trace(write(tmp_path / "t.jsonl", [
        {"timestamp": t, "input_length": len(c) * 512 + 1, "output_length": 1, "hash_ids": c + [9000 + t]}
        for t, c in enumerate(chains)]))


def test_a_compared_eviction_policy_says_how_many_requests_it_changed(tmp_path):
    from lab.audit.trace_fleet import eviction_table

    trace = shared_root_trace(tmp_path)
    small, large = (eviction_table(trace, [tokens], ("lru", "protect_roots")).set_index("policy")
                    for tokens in (6 * 512, 10**6))
    assert small.requests_changed.to_dict() == {"lru": 0, "protect_roots": 9}, "the protected root hits 9 more times"
    assert small.hit_rate.protect_roots > small.hit_rate.lru
    assert large.requests_changed.to_dict() == {"lru": 0, "protect_roots": 0}, "a pool that never fills: no change"
    assert not small.raised_to_admit.any()


def test_a_capacity_below_the_longest_request_is_marked_as_raised_not_measured(tmp_path):
    trace = shared_root_trace(tmp_path)  # the longest request: 5 blocks of 512 tokens
    curve = capacity_curve(trace, [1024, 5 * 512, 10**6]).set_index("kv_tokens")
    assert curve.raised_to_admit.to_dict() == {1024: True, 5 * 512: False, 10**6: False}
    assert curve.pool_tokens[1024] == 5 * 512
