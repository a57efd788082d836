"""lab.audit.trace and lab.audit.block_arrays: a log read once into block hash arrays, replayed exactly as the lab's
PrefixCache (vLLM V1's block pool) replays the token ids, with the log's records, order and errors."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.audit.block_arrays import chain, content_hashes, flatten, salt_seeds
from lab.audit.prompts import AuditInputError, read_prompts
from lab.audit.replay import replay_chains
from lab.audit.settings import AuditSettings
from lab.audit.trace import read_trace
from lab.core.block_hash import REPLAY_HASH
from lab.core.prefix_cache import PrefixCache

QUIET, SKIPPING = AuditSettings(progress=False), AuditSettings(skip_bad=True, progress=False)


def chains_of(prompts, block_size, salts=None):
    tokens, lengths = flatten(prompts)
    content, counts = content_hashes(tokens, lengths, block_size)
    hashes = chain(content, counts, salt_seeds(salts or [None] * len(prompts)))
    starts = np.cumsum(counts) - counts
    return [hashes[s:s + n].tolist() for s, n in zip(starts, counts)]


def replayed_both_ways(prompts, block_size, num_blocks, salts=None):
    fast = replay_chains(chains_of(prompts, block_size, salts), [len(p) for p in prompts], block_size, num_blocks)
    pool = PrefixCache(num_blocks=num_blocks, block_size=block_size, hash_algo=REPLAY_HASH)
    return fast.tolist(), pool.replay(prompts, salts)


# prompts built from a few shared stems, so that hits, evictions and duplicated blocks all happen
stems = st.lists(st.integers(0, 5), min_size=0, max_size=40)
workloads = st.lists(st.tuples(st.integers(0, 3), stems, st.sampled_from([None, "a", "b"])), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(workloads, st.sampled_from([1, 2, 4, 8]), st.integers(0, 30))
def test_the_array_replay_is_the_prefix_cache_replay_block_for_block(workload, block_size, spare_blocks):
    stem = [list(range(100 * s, 100 * s + 24)) for s in range(4)]
    prompts = [stem[s] + tail for s, tail, _ in workload]
    salts = [salt for _, _, salt in workload]
    longest = max(-(-len(p) // block_size) for p in prompts)
    fast, exact = replayed_both_ways(prompts, block_size, longest + spare_blocks, salts)
    assert fast == exact


def test_a_full_hit_recomputes_its_last_block_and_keeps_both_copies():
    """A 64-token prompt seen before hits one block of 32 (the last-token rule); the recomputed copy of the second
    is registered beside the first, so evicting either leaves it hittable."""
    prompt, other = list(range(64)), list(range(1000, 1064))
    fast, exact = replayed_both_ways([prompt, prompt, other, prompt + [7]], 32, 4)
    assert fast == exact == [0, 32, 0, 64]


def test_equal_blocks_hash_equal_only_behind_the_same_prefix_and_salt():
    a, b = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9, 5, 6, 7, 8]
    tokens, lengths = flatten([a, b])
    content, counts = content_hashes(tokens, lengths, 4)
    assert counts.tolist() == [2, 2] and content[1] == content[3] and content[0] != content[2]
    (a1, a2), (b1, b2) = chains_of([a, b], 4)
    assert a2 != b2, "the same tokens behind another block are another block"
    assert chains_of([a], 4, ["tenant-1"])[0][0] != a1 != chains_of([a], 4, ["tenant-2"])[0][0]
    assert chains_of([a + [0, 0]], 4) == [[a1, a2]], "only full blocks are hashed"


def log_lines(n, seed=0):
    rng = random.Random(seed)
    systems = [f"System {k}: you answer questions about product {k}. " * 12 for k in range(3)]
    return [{"prompt": systems[rng.randrange(3)] + f"Question {i}: why {rng.random()}?", "tenant": f"t{i % 2}",
             "timestamp": 1_764_579_600 + rng.randrange(1000)} for i in range(n)]


def test_a_trace_reads_the_records_read_prompts_reads_in_the_same_order(tmp_path, tok, write_jsonl):
    path = write_jsonl(tmp_path / "log.jsonl", [*log_lines(50), "not json"])
    with pytest.raises(AuditInputError, match=r"log.jsonl:51: not JSON"):
        read_trace(path, tok, block_sizes=[32], sample=10, settings=QUIET)
    prompts = read_prompts(path, tok, skip_bad=True, progress=False)
    trace = read_trace(path, tok, block_sizes=[32, 64], sample=10, settings=SKIPPING)
    assert trace.lines.tolist() == prompts.lines and trace.arrivals == prompts.arrivals
    assert trace.lengths.tolist() == [len(ids) for ids in prompts.token_ids] and trace.tenants == prompts.tenants
    assert trace.sample.token_ids == prompts.token_ids[:10] and trace.sample.lines == prompts.lines[:10]
    assert len(trace.skipped) == 1 and sorted(trace.arrivals) == trace.arrivals


@pytest.mark.parametrize("kv_tokens", [1_000, 100_000])
def test_a_trace_replays_as_the_prefix_cache_replays_its_token_ids(tmp_path, tok, write_jsonl, kv_tokens):
    path = write_jsonl(tmp_path / "log.jsonl", log_lines(120, seed=1))
    prompts = read_prompts(path, tok, progress=False)
    trace = read_trace(path, tok, block_sizes=[32], sample=5, settings=QUIET)
    for salts in (None, prompts.tenants):
        pool = PrefixCache(num_blocks=kv_tokens // 32, block_size=32, hash_algo=REPLAY_HASH)
        assert trace.replay(32, kv_tokens, salts=salts).tolist() == pool.replay(prompts.token_ids, salts)
    with pytest.raises(ValueError, match="block_size=64 was not hashed"):
        trace.replay(64, kv_tokens)


def test_a_sample_size_that_is_not_a_count_is_named(tmp_path, tok, write_jsonl):
    path = write_jsonl(tmp_path / "log.jsonl", [{"prompt": "hello"}])
    with pytest.raises(ValueError, match="sample"):
        read_trace(path, tok, block_sizes=[32], sample=0, settings=QUIET)


def test_the_working_set_per_window_counts_the_blocks_the_token_ids_hold(tmp_path, tok, write_jsonl):
    from lab.audit.timeline import distinct_block_tokens

    path = write_jsonl(tmp_path / "log.jsonl", log_lines(80, seed=2))
    prompts = read_prompts(path, tok, progress=False)
    trace = read_trace(path, tok, block_sizes=[32], sample=5, settings=QUIET)
    window = np.arange(80) * 5 // 80
    tokens = distinct_block_tokens(prompts.token_ids, 32)(window)
    assert {w: n * 32 for w, n in trace.block_hash_sets(32, window).items()} == tokens


def test_reading_in_two_processes_gives_the_trace_one_process_gives(tmp_path, tok, write_jsonl, monkeypatch):
    import lab.audit.trace as trace_module

    monkeypatch.setattr(trace_module, "CHUNK", 16)  # several chunks, so that both processes read and the sample
    lines = log_lines(150, seed=3)                  # is chosen across chunks
    lines[40] = {"prompt": ""}  # a bad record, skipped in either
    path = write_jsonl(tmp_path / "log.jsonl.gz", lines)
    one, two = (read_trace(path, tok, block_sizes=[32, 64], sample=20,
                           settings=AuditSettings(skip_bad=True, progress=False, workers=n)) for n in (1, 2))
    for name in ("lengths", "lines", "order"):
        assert getattr(one, name).tolist() == getattr(two, name).tolist()
    assert (one.arrivals, one.tenants, one.skipped) == (two.arrivals, two.tenants, two.skipped) and len(one.skipped) == 1
    assert one.sample.token_ids == two.sample.token_ids and one.sample.lines == two.sample.lines
    assert one.replay(32, 2_000).tolist() == two.replay(32, 2_000).tolist()
    assert one.sample.lines == read_prompts(path, tok, skip_bad=True, progress=False).lines[:20]
    with pytest.raises(AuditInputError, match=r"log.jsonl.gz:41: 'prompt' must be a non-empty string"):
        read_trace(path, tok, block_sizes=[32], settings=AuditSettings(progress=False, workers=2))
    with pytest.raises(ValueError, match="workers"):
        AuditSettings(progress=False, workers=0)
