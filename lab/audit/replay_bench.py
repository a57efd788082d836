"""The compiled replay at speed (a benchmark, not a test): against the readable pool, against a
probe loop, and a capacity curve of ten million requests.

    python -m lab.audit.replay_bench [--requests 1000000] [--curve-requests 10000000] [--repeats 3]

The trace is Kimi's hour (Mooncake's conversation trace) repeated with its block ids remapped per
copy: each copy keeps the hour's own sharing, and no two copies share a block (more conversations of
the same shape).

1. `--requests` requests replayed at 3M tokens by the readable pool (`lab.core.chain_pool.ChainPool`,
   vLLM's LRU policy, Python) and by its compiled fast path, in pairs, one right after the other, on
   one core (run it with OMP_NUM_THREADS=1): target at least 10x, the results equal.
2. The kernel's block lookups a second against a probe loop over an array as large as its hash table
   (the same count of random reads, nothing else): how close the replay comes to what the memory
   allows.
3. A capacity curve of 16 points on `--curve-requests` requests, the capacities spread over the
   cores: target at most 60 s and 2 GB on 2 cores. Saved as data/results/bench_replay-*, with the
   machine and the lab's commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numba
import numpy as np
import pandas as pd
from numba import njit, prange

from lab import PROJECT_ROOT
from lab.audit.block_trace import pool_blocks, read_block_trace
from lab.audit.fast_replay import _replay, replay_flat
from lab.audit.scale_bench import PeakMemory, peak_rss_gib
from lab.core.chain_pool import replay as replay_in_chain_pool
from lab.experiments.results import environment, save_benchmark

CONVERSATION = PROJECT_ROOT / "data" / "traces" / "mooncake_conversation_trace.jsonl.gz"
KV_TOKENS = 3_000_000
TARGETS = {"speed-up": 10.0, "curve_s": 60.0, "curve_gb": 2.0}


def repeated_trace(requests: int):
    """Kimi's hour repeated to `requests` requests, each copy's ids shifted past the last: flat
    int32 chains (int64 where the ids would not fit), their offsets, the lengths, and the trace
    itself."""
    trace = read_block_trace(CONVERSATION)
    counts = np.array([len(c) for c in trace.chains], np.int64)
    base = np.concatenate(trace.chains)
    span = int(base.max()) + 1
    copies = -(-requests // len(trace))
    dtype = np.int32 if span * copies < 2**31 else np.int64
    flat = np.empty(copies * len(base), dtype)
    for copy in range(copies):  # a copy at a time: no temporary as large as the whole
        flat[copy * len(base) : (copy + 1) * len(base)] = base + copy * span
    offsets = np.zeros(copies * len(trace) + 1, np.int64)
    np.cumsum(np.tile(counts, copies), out=offsets[1:])
    keep = requests
    lengths = np.tile(trace.input_tokens.astype(np.int64), copies)[:keep]
    return flat[: offsets[keep]], offsets[: keep + 1], lengths, trace


@njit(cache=True)
def probe_loop(table_size: int, probes: int) -> int:
    """`probes` reads at scattered places of an int64 array of `table_size` entries: the replay's
    memory traffic with none of its work."""
    table = np.arange(table_size, dtype=np.int64)
    mask, acc, at = table_size - 1, 0, 0
    for i in range(probes):
        at = (at * 6364136223846793005 + 1442695040888963407 + i) & mask
        acc += table[at]
    return acc


@njit(parallel=True, cache=True)
def _curve(hashes, offsets, lengths, block_size, pools):
    hits = np.zeros(len(pools), np.int64)
    for k in prange(len(pools)):
        hits[k] = _replay(hashes, offsets, lengths, block_size, pools[k]).sum()
    return hits


def dealt(pools: np.ndarray, workers: int) -> np.ndarray:
    """The pools' order for `workers` threads that each take a contiguous run (numba's static
    schedule): the sizes dealt round-robin from the largest, so that each run holds large and small
    alike."""
    by_size = np.argsort(pools)[::-1]
    return np.concatenate([by_size[w::workers] for w in range(workers)])


def speed(requests: int, repeats: int) -> list[dict]:
    flat, offsets, lengths, trace = repeated_trace(requests)
    pool = pool_blocks(trace, KV_TOKENS)
    chains = [flat[offsets[i] : offsets[i + 1]] for i in range(len(lengths))]
    replay_flat(
        flat[:0], offsets[:1], lengths[:0], trace.block_tokens, pool
    )  # compile first, untimed
    probe_loop(2, 1)
    rows = []
    for repeat in range(repeats):
        start = time.perf_counter()
        reference = replay_in_chain_pool(chains, lengths, trace.block_tokens, pool)
        middle = time.perf_counter()
        compiled = replay_flat(flat.astype(np.int64), offsets, lengths, trace.block_tokens, pool)
        end = time.perf_counter()
        if not np.array_equal(reference, compiled):
            raise RuntimeError(
                "the compiled replay differs from the chain pool's: a bug, not a benchmark result"
            )
        lookups = int(offsets[-1])
        table = 1 << int(np.ceil(np.log2(2 * pool)))
        probe_start = time.perf_counter()
        probe_loop(table, lookups)
        probe_s = time.perf_counter() - probe_start
        rows.append(
            {
                "benchmark": "replay",
                "repeat": repeat,
                "requests": len(lengths),
                "blocks": lookups,
                "reference_s": middle - start,
                "compiled_s": end - middle,
                "probe_s": probe_s,
                "speedup": (middle - start) / (end - middle),
                "share_of_probe_rate": probe_s / (end - middle),
            }
        )
    return rows


def curve_in_a_process(requests: int) -> dict:
    """`curve` in a fresh process, so that its peak memory is its own."""
    every_core = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
    }
    done = subprocess.run(
        [sys.executable, "-m", "lab.audit.replay_bench", "--curve-only", str(requests)],
        check=True,
        capture_output=True,
        text=True,
        env=every_core,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def curve(requests: int, points: int = 16) -> dict:
    with PeakMemory(interval=1.0) as memory:
        start = time.perf_counter()
        flat, offsets, lengths, trace = repeated_trace(requests)
        capacities = np.logspace(5, 9, points).round(-3).astype(np.int64)
        pools = np.array([pool_blocks(trace, int(c)) for c in capacities], np.int64)
        order = dealt(pools, numba.get_num_threads())
        hits = np.empty_like(pools)
        hits[order] = _curve(flat, offsets, lengths, trace.block_tokens, pools[order])
        seconds = time.perf_counter() - start
    peak = max(peak_rss_gib(), memory.peak_gib) * 2**30 / 1e9
    rates = hits / lengths.sum()
    return {
        "benchmark": "capacity curve",
        "requests": len(lengths),
        "points": points,
        "seconds": seconds,
        "threads": numba.get_num_threads(),
        "peak_gb": peak,
        "hit_rate_at_3m": float(np.interp(np.log(3e6), np.log(capacities), rates)),
        "max_hit_rate": float(rates.max()),
        "met": bool(seconds <= TARGETS["curve_s"] and peak <= TARGETS["curve_gb"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.audit.replay_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--curve-requests", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--curve-only", type=int, metavar="REQUESTS", help=argparse.SUPPRESS
    )  # curve_in_a_process
    args = parser.parse_args(argv)
    if args.curve_only:
        for dtype in (np.int32, np.int64):  # compiled before the clock starts
            _curve(np.zeros(1, dtype), np.array([0, 1]), np.array([16]), 16, np.array([2]))
        print(json.dumps(curve(args.curve_only)))
        return 0
    if min(args.requests, args.curve_requests, args.repeats) < 1:
        parser.error("--requests, --curve-requests and --repeats must be positive")
    table = pd.DataFrame(
        speed(args.requests, args.repeats) + [curve_in_a_process(args.curve_requests)]
    )
    env = environment(
        benchmark="replay",
        requests=args.requests,
        curve_requests=args.curve_requests,
        repeats=args.repeats,
        kv_tokens=KV_TOKENS,
        trace="Kimi's hour repeated, ids remapped per copy",
    )
    save_benchmark(table, f"bench_replay-{args.requests}", env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
