"""lab.audit.fast_replay: the compiled replay equals the readable pool (lab.core.chain_pool.ChainPool, LRU),
request for request, under eviction and duplicated blocks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.audit.fast_replay import flatten_chains, replay_flat
from lab.audit.replay import replay_chains
from lab.core.chain_pool import replay as replay_in_chain_pool

# chains from a few shared stems of block ids (so hits, evictions and duplicates happen), with lengths that
# leave a partial last block or not
requests = st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 6), max_size=8), st.integers(0, 3)),
                    min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(requests, st.sampled_from([1, 2, 4, 16]), st.integers(0, 12), st.booleans())
def test_the_compiled_replay_is_the_chain_pools_replay(workload, block_size, spare, big_hashes):
    offset = 2**63 + 11 if big_hashes else 0  # 64-bit hashes with the top bit set keep their bits
    ids: dict[tuple, int] = {}  # a block's hash stands for every block before it and its own content, as a chain's
    blocks = [[1000 * stem + k for k in range(3)] + tail for stem, tail, _ in workload]
    chains = [[offset + ids.setdefault(tuple(b[:k + 1]), len(ids)) for k in range(len(b))] for b in blocks]
    lengths = [len(c) * block_size + extra for c, (_, _, extra) in zip(chains, workload)]
    lengths = [max(n, 1) for n in lengths]
    longest = max(-(-n // block_size) for n in lengths)
    expected = replay_in_chain_pool(chains, lengths, block_size, longest + spare)
    assert replay_chains(chains, lengths, block_size, longest + spare).tolist() == expected


def test_a_repeated_chain_hits_and_a_small_pool_evicts():
    chain = np.arange(10, dtype=np.uint64) + np.uint64(2**63)
    hashes, offsets = flatten_chains([chain, chain, chain[:3]])
    assert replay_flat(hashes, offsets, np.array([161, 161, 48]), 16, 64).tolist() == [0, 160, 32]
    assert replay_flat(hashes, offsets, np.array([161, 161, 48]), 16, 11).tolist() == [0, 160, 32]
    other = np.arange(100, 110)
    hashes, offsets = flatten_chains([chain, other, chain])
    assert replay_flat(hashes, offsets, np.array([161, 161, 161]), 16, 11).tolist() == [0, 0, 0]


def test_a_pool_smaller_than_a_request_is_refused():
    hashes, offsets = flatten_chains([[1, 2, 3]])
    with pytest.raises(ValueError, match="num_blocks=2 cannot hold the longest request"):
        replay_flat(hashes, offsets, np.array([48]), 16, 2)


@pytest.mark.engine
def test_a_vllm_engine_starts_in_a_process_that_loaded_the_compiled_replay():
    import subprocess
    import sys

    script = ("import lab; lab.setup()\n"
              "import lab.audit.fast_replay\n"  # numba and llvmlite first, as an audit before `--confirm` loads them
              "from lab.core.model import ensure_model\n"
              "from lab.serving.engine import make_llm\n"
              "llm = make_llm(ensure_model('tiny'))\n"
              "print('started', llm.llm_engine is not None)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "started True" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_the_replay_benchmark_runs_small_and_records_its_targets(tmp_path, monkeypatch):
    import pandas as pd

    from lab.audit import replay_bench

    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    assert replay_bench.main(["--requests", "3000", "--curve-requests", "4000", "--repeats", "1"]) == 0
    table = pd.read_csv(next(tmp_path.glob("bench_replay-3000-*.csv")))
    speed, curve = table[table.benchmark == "replay"].iloc[0], table[table.benchmark == "capacity curve"].iloc[0]
    assert speed.requests == 3000 and speed.speedup > 0 and curve.requests == 4000 and curve.points == 16
    assert 0 < curve.hit_rate_at_3m <= curve.max_hit_rate < 1
    assert sorted(replay_bench.dealt(np.arange(6), 2).tolist()) == list(range(6))
