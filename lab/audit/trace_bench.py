"""Block-hash traces at speed (a benchmark, not a test): the capacity sweep on Kimi's hour, and the
audit of a million-request trace made by scaling it.

    python -m lab.audit.trace_bench [--requests 1000000] [--sizes 12]

1. The conversation trace (12,031 requests) replayed at `--sizes` KV capacities from 1e5 to 1e9
   tokens: target at most 10 s on 2 cores.
2. A trace of `--requests` requests: copies of the conversation trace with each copy's ids kept
   distinct (more conversations of the same shape) and their arrivals spread over the same hour,
   written by a separate process; then `python -m lab.audit`'s trace audit on it: target at most 60
   s within 2 GB peak memory. Both go to data/results/bench_trace-*, with the machine and the lab's
   commit.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lab import PROJECT_ROOT
from lab.audit.block_trace import capacity_curve, read_block_trace
from lab.audit.scale_bench import PeakMemory, peak_rss_gib
from lab.audit.settings import AuditSettings
from lab.audit.trace_audit import audit_trace
from lab.experiments.results import environment, save_benchmark
from lab.paths import folder

CONVERSATION = PROJECT_ROOT / "data" / "traces" / "mooncake_conversation_trace.jsonl.gz"
TARGETS = {
    "sweep": 10.0,
    "audit": (60.0, 2.0),
}  # seconds; (seconds, peak GB) for a million requests, on 2 cores


def write_scaled(path: Path, requests: int, seed: int = 0) -> None:
    """`requests` requests: copies of the conversation trace, each copy's ids shifted past the last
    one's (so copies share nothing) and its arrivals jittered within the hour."""
    from tqdm.auto import tqdm

    source = [json.loads(line) for line in gzip.open(CONVERSATION, "rt")]
    span = max(r["hash_ids"][-1] for r in source) + 1
    rng = np.random.default_rng(seed)
    copies = -(-requests // len(source))
    with gzip.open(path, "wt", compresslevel=1) as f:
        for copy in tqdm(range(copies), desc="writing the scaled trace", leave=False):
            shift, jitter = copy * span, rng.uniform(0, 1000, len(source))
            for record, wobble in zip(source[: requests - copy * len(source)], jitter):
                f.write(
                    json.dumps(
                        {
                            **record,
                            "timestamp": round(record["timestamp"] + wobble, 1),
                            "hash_ids": [i + shift for i in record["hash_ids"]],
                        }
                    )
                    + "\n"
                )


def sweep(sizes: int) -> dict:
    trace = read_block_trace(CONVERSATION)
    start = time.perf_counter()
    curve = capacity_curve(trace, np.logspace(5, 9, sizes).round(-3).astype(int), progress=True)
    seconds = time.perf_counter() - start
    return {
        "benchmark": "capacity sweep",
        "requests": len(trace),
        "sizes": sizes,
        "seconds": round(seconds, 2),
        "peak_gb": None,
        "target": f"at most {TARGETS['sweep']:.0f} s",
        "met": seconds <= TARGETS["sweep"],
        "max_hit_rate": round(float(curve.max_hit_rate.iloc[0]), 4),
    }


def audit_at_scale(requests: int) -> dict:
    path = folder("audit") / f"bench-trace-{requests}.jsonl.gz"
    if not path.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "lab.audit.trace_bench",
                "--write",
                str(path),
                "--requests",
                str(requests),
            ],
            check=True,
        )
    start = time.perf_counter()
    with PeakMemory(interval=1.0) as memory:  # sampling a large process's PSS is itself costly
        result = audit_trace(path, AuditSettings(kv_tokens=3_000_000, replicas=16, progress=False))
    seconds, peak = time.perf_counter() - start, max(peak_rss_gib(), memory.peak_gib) * 2**30 / 1e9
    target_s, target_gb = TARGETS["audit"]
    return {
        "benchmark": "trace audit",
        "requests": result.requests,
        "sizes": len(result.curve),
        "seconds": round(seconds, 1),
        "peak_gb": round(peak, 3),
        "target": f"at most {target_s:.0f} s and {target_gb:.0f} GB (a million requests)",
        "met": seconds <= target_s and peak <= target_gb,
        "max_hit_rate": round(result.max_hit_rate, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.audit.trace_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--sizes", type=int, default=12)
    parser.add_argument("--write", type=Path, help="only write the scaled trace to this path")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.sizes < 2:
        parser.error("--requests must be positive and --sizes at least 2")
    if args.write:
        write_scaled(args.write, args.requests)
        return 0
    table = pd.DataFrame([sweep(args.sizes), audit_at_scale(args.requests)])
    env = environment(benchmark="trace", requests=args.requests, sizes=args.sizes)
    save_benchmark(table, f"bench_trace-{args.requests}", env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
