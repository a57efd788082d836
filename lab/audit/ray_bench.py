"""The audit on a local Ray cluster at scale (a benchmark, not a test): one worker against two, the
same numbers.

    python -m lab.audit.ray_bench [--prompts 1000000] [--workers 1 2]

The log is the scale benchmark's (lab.audit.scale_bench: customer-service prompts of about 1,000
tokens, gzipped JSONL), written once per size under runs/audit/. For each worker count the whole
audit runs on a fresh local cluster of that many CPUs (`AuditSettings(ray="local", workers=W)`), its
stages timed, after the same audit in one process without Ray (the default: its tokenizer's threads
on every core); the reports must be equal but for their timings. Memory: the driver's peak resident
size and the largest any one child process (a Ray worker, the raylet) held, sampled. Target: two
workers at least 1.7x faster than one, at most 2 GB per worker. Saved as data/results/bench_ray-N,
with the machine and the lab's commit.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import pandas as pd

from lab.audit.core import audit
from lab.audit.prompts import raw_records
from lab.audit.scale_bench import PeakMemory, bench_log, peak_rss_gib
from lab.audit.settings import AuditSettings
from lab.audit.trace import CHUNK
from lab.experiments.results import environment, save_benchmark

TARGETS = {"speed-up": 1.7, "worker_gb": 2.0}
VARIES = ("seconds", "reading_workers")  # the report's fields that may differ between worker counts


def one_run(log, workers: int, on_ray: bool = True) -> tuple[dict, dict]:
    """The audit on a local cluster of `workers` CPUs (or, not `on_ray`, in this process alone, its
    tokenizer's threads on every core): its row (seconds per stage, memory) and its report."""
    start = time.perf_counter()
    with PeakMemory(interval=0.5) as memory:
        result = audit(log, AuditSettings(ray="local" if on_ray else None, workers=workers))
    row = {
        "setup": f"Ray, {workers} worker(s)" if on_ray else "one process, no Ray",
        "workers": workers,
        "seconds": round(time.perf_counter() - start, 1),
        **{f"{stage} (s)": s for stage, s in result.seconds.items()},
        "driver_peak_gb": round(peak_rss_gib() * 2**30 / 1e9, 3),
        "largest_child_gb": round(memory.largest_child_bytes / 1e9, 3),
    }
    report = {k: v for k, v in result.to_json().items() if k not in VARIES}
    return row, json.loads(json.dumps(report, default=str, sort_keys=True))


def driver_read_s(log) -> float:
    """The seconds the driver alone takes to read the log's raw lines and cut them into chunks (what
    it does while the actors tokenize): the rate no number of workers can pass."""
    records = raw_records(log)
    start = time.perf_counter()
    for _ in iter(lambda: list(itertools.islice(records, CHUNK)), []):
        pass
    return time.perf_counter() - start


def run(prompts: int, worker_counts: list[int], baseline: bool = True) -> int:
    """The audit of `prompts` on each local cluster of `worker_counts` CPUs, after the same audit in
    one process without Ray (`baseline`)."""
    log = bench_log(prompts)
    raw_s = driver_read_s(log)
    rows, reports = [], []
    for workers, on_ray in [(1, False)] * baseline + [(w, True) for w in worker_counts]:
        row, report = one_run(log, workers, on_ray)
        rows.append(row)
        reports.append(report)
        print(f"{row['setup']}: {row['seconds']} s", flush=True)
    table = pd.DataFrame(rows)
    table["speed-up"] = table.seconds.iloc[int(baseline)] / table.seconds  # against one Ray worker
    equal = all(r == reports[0] for r in reports)
    env = environment(
        benchmark="ray",
        prompts=prompts,
        log=log.name,
        reports_equal=equal,
        targets=TARGETS,
        driver_read_s=round(raw_s, 3),
        log_bytes=log.stat().st_size,
    )
    save_benchmark(table, f"bench_ray-{prompts}", env)
    print(f"reports equal but for their timings: {equal}")
    return 0 if equal else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.audit.ray_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="the clusters' CPUs, in turn"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run in one process without Ray"
    )
    args = parser.parse_args(argv)
    if args.prompts < 1 or min(args.workers) < 1:
        parser.error(
            "--prompts and --workers must be positive, e.g. --prompts 100000 --workers 1 2"
        )
    return run(args.prompts, args.workers, baseline=not args.no_baseline)


if __name__ == "__main__":
    raise SystemExit(main())
