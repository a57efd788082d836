"""The audit at scale (a benchmark, not a test): `python -m lab.audit` on a generated log of N
prompts.

    python -m lab.audit.scale_bench [--prompts 100000] [--log PATH]

The log: customer-service prompts of about 1,000 tokens
(lab.experiments.generators.customer_service), gzipped JSONL, from three sources (the bot's three
stages) whose timestamps interleave, written out of time order, with twelve tenants. A separate
process writes it (once per size, kept under runs/audit/), so that the memory recorded is the
audit's alone. Each stage's seconds and the peak memory go to data/results/bench_audit-N: the larger
of the audit process's peak resident size (what `/usr/bin/time -v` reports as "Maximum resident set
size" for one process) and the total of it and its reading processes (`--workers`), sampled
(PeakMemory).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil

from lab.audit.core import audit
from lab.audit.report import audit_dir
from lab.audit.settings import AuditSettings
from lab.experiments.results import environment, hardware_line, save_results

TARGETS = {100_000: (60.0, 2.0), 1_000_000: (600.0, 2.0)}  # prompts: (seconds, peak GB), on 2 cores
BATCH = 3000  # prompts generated at a time


def write_log(path: str | Path, prompts: int, seed: int = 0, tenants: int = 12) -> None:
    """`prompts` customer-service requests, a batch at a time (one bot's templates, each batch's own
    customers): each batch's three stages written one after the other, so that the file is out of
    time order."""
    from tqdm.auto import tqdm

    from lab.experiments.generators import customer_service

    rng = random.Random(seed)
    with gzip.open(path, "wt", compresslevel=1) as f:
        for start in tqdm(
            range(0, prompts, BATCH), desc="writing the log", unit="batches", leave=False
        ):
            records = customer_service(
                -(-min(BATCH, prompts - start) // 3),
                seed=seed + 1 + start // BATCH,
                template_seed=seed,
            )[: prompts - start]
            arrival = {
                r["id"]: 1_764_579_600 + (start + i) * 0.05 + rng.random()
                for i, r in enumerate(records)
            }
            for r in sorted(records, key=lambda r: r["stage"]):
                f.write(
                    json.dumps(
                        {
                            "prompt": r["prompt"],
                            "source": r["stage"],
                            "tenant": f"customer-{rng.randrange(tenants)}",
                            "timestamp": arrival[r["id"]],
                        }
                    )
                    + "\n"
                )


def peak_rss_gib() -> float:
    """This process's own peak resident memory (the reading processes' is in PeakMemory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux


class PeakMemory:
    """The largest memory this process and its children (the audit's reading processes) held
    together, sampled in a thread every `interval` seconds: the sum of their proportional set sizes
    (PSS: a page shared by k processes counts 1/k in each, so the sum is what they hold, where
    resident sizes would count shared pages twice)."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak_bytes, self.processes = interval, 0, 1
        self.largest_child_bytes = (
            0  # the most one child process held at once (a reading process, a Ray worker)
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / 2**30

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval):
            processes = [me, *me.children(recursive=True)]
            total = 0
            for process in processes:
                try:
                    pss = process.memory_full_info().pss
                except psutil.Error:  # it ended between the listing and the reading
                    continue
                total += pss
                if process is not me:
                    self.largest_child_bytes = max(self.largest_child_bytes, pss)
            self.peak_bytes = max(self.peak_bytes, total)
            self.processes = max(self.processes, len(processes))


def bench_log(prompts: int, log: Path | None = None) -> Path:
    """The benchmark's synthetic log of `prompts` prompts (at `log`, default: under runs/audit/),
    written in a process of its own the first time it is asked for."""
    log = log or audit_dir() / f"bench-log-{prompts}.jsonl.gz"
    if not log.is_file():
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "lab.audit.scale_bench", "--write-log", str(log)]
        subprocess.run([*command, "--prompts", str(prompts)], check=True)
    return log


def run(prompts: int, log: Path | None, kv_tokens: int, replicas: int, workers: int = 1) -> int:
    log = bench_log(prompts, log)
    start = time.perf_counter()
    with PeakMemory() as memory:
        result = audit(log, AuditSettings(kv_tokens=kv_tokens, replicas=replicas, workers=workers))
    seconds, peak = time.perf_counter() - start, peak_rss_gib()
    stages = pd.DataFrame([{"stage": name, "seconds": s} for name, s in result.seconds.items()])
    env = environment(
        benchmark="audit",
        prompts=result.prompts,
        mean_prompt_tokens=round(result.prompt_tokens.mean, 1),
        seconds=round(seconds, 1),
        peak_memory_gib=round(max(peak, memory.peak_gib), 3),
        peak_rss_gib=round(peak, 3),
        peak_total_pss_gib=round(memory.peak_gib, 3),
        processes=memory.processes,
        workers=result.reading_workers,
        kv_tokens=kv_tokens,
        replicas=replicas,
        explained=result.explained,
        field_sample=result.field_sample,
        block_sizes=sorted(result.hit_rate_by_block_size),
        log=log.name,
    )
    path = save_results(stages, f"bench_audit-{result.prompts}", env)
    target = TARGETS.get(result.prompts)
    print(hardware_line(env))
    print(stages.to_string(index=False))
    top = max(peak, memory.peak_gib)
    print(
        f"{result.prompts:,} prompts of {result.prompt_tokens.mean:,.0f} tokens on average, read by "
        f"{result.reading_workers} process(es): {seconds:.1f} s; peak memory {top * 2**30 / 1e9:.2f} GB ({top:.2f} GiB: "
        f"the larger of this process's peak resident size, {peak:.2f} GiB, and the sampled total over "
        f"{memory.processes} processes, {memory.peak_gib:.2f} GiB)"
        + (f"; targets: at most {target[0]:.0f} s and {target[1]:.0f} GB" if target else "")
    )
    print(f"saved {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.audit.scale_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--log", type=Path, help="audit this log instead of the generated one")
    parser.add_argument("--kv-tokens", type=int, default=AuditSettings().kv_tokens)
    parser.add_argument("--replicas", type=int, default=AuditSettings().replicas)
    parser.add_argument(
        "--workers", type=int, default=1, help="processes that read the log (default 1)"
    )
    parser.add_argument("--write-log", type=Path, help="only write the generated log to this path")
    args = parser.parse_args(argv)
    if args.prompts < 1:
        parser.error(f"--prompts {args.prompts}: give a positive number of prompts, e.g. 100000")
    if args.write_log:
        write_log(args.write_log, args.prompts)
        return 0
    return run(args.prompts, args.log, args.kv_tokens, args.replicas, args.workers)


if __name__ == "__main__":
    raise SystemExit(main())
