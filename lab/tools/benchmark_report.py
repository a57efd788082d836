"""docs/TESTING.md's table of the canonical benchmarks: each run with its machine, vLLM, the lab's
commit it timed, and what it measured against its target, read from the benchmark's own results
file."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def _replay_summary(table: pd.DataFrame, env: dict) -> str:
    """One bench_replay run: the compiled replay against the readable pool (ChainPool), and the
    10M-request curve."""
    speed, curve = (
        table[table.benchmark == "replay"],
        table[table.benchmark == "capacity curve"].iloc[0],
    )
    gain = speed.speedup
    return (
        f"{int(speed.requests.iloc[0]):,} requests at {env['kv_tokens']:,} tokens, single-threaded: the compiled replay "
        f"x{gain.median():.1f} (x{gain.min():.1f}-x{gain.max():.1f}, {len(gain)} pairs) the readable pool's (ChainPool) speed, "
        f"equal results (at least x10: {'met' if gain.median() >= 10 else 'not met'}), at "
        f"{speed.share_of_probe_rate.median():.0%} of a bare probe loop's rate; a {int(curve.points)}-point "
        f"capacity curve of {int(curve.requests):,} requests on the cores: {curve.seconds:.0f} s, peak "
        f"{curve.peak_gb:.2f} GB (at most 60 s and 2 GB: {'met' if curve.met else 'not met'})"
    )


def _ray_summary(table: pd.DataFrame, env: dict) -> str:
    """One bench_ray run: one worker against two, the reports compared, the memory, the run without
    Ray."""
    alone = table[~table.setup.str.startswith("Ray")]
    table = table[table.setup.str.startswith("Ray")]
    one, two = table.iloc[0], table.iloc[-1]
    gain, worker_gb = one.seconds / two.seconds, table.largest_child_gb.max()
    fast, small = gain >= env["targets"]["speed-up"], worker_gb <= env["targets"]["worker_gb"]
    return (
        f"{env['prompts']:,} prompts, the whole audit on local Ray clusters: {int(one.workers)} worker "
        f"{one.seconds:.0f} s, {int(two.workers)} workers {two.seconds:.0f} s (x{gain:.2f}, at least x1.7: "
        f"{'met' if fast else 'not met'}; reading and tokenizing "
        f"x{one['read and tokenize (s)'] / two['read and tokenize (s)']:.2f}), reports "
        f"{'equal' if env['reports_equal'] else 'DIFFERENT'}, at most {worker_gb:.2f} GB in one child process "
        f"(at most 2 GB: {'met' if small else 'not met'}; the driver's running peak {table.driver_peak_gb.max():.2f} GB)"
        + (
            f"; one process without Ray, its tokenizer on every core: {alone.seconds.iloc[0]:.0f} s"
            if len(alone)
            else ""
        )
    )


def _benchmark_summary(name: str, table: pd.DataFrame, env: dict) -> str:
    """What one canonical benchmark measured, in a line, from its own table and environment."""
    if name.startswith("bench_audit"):
        seconds, gb = env["seconds"], env["peak_memory_gib"] * 2**30 / 1e9
        target = {100_000: 60, 1_000_000: 600}.get(env["prompts"])
        met = (
            f" (at most {target} s and 2 GB: {'met' if seconds <= target and gb <= 2 else 'not met'})"
            if target
            else ""
        )
        return f"{env['prompts']:,} prompts: {seconds:.1f} s, peak {gb:.2f} GB{met}"
    if name.startswith("bench_trace"):
        return "; ".join(
            f"{row.benchmark}: {row.requests:,} requests, {row.seconds:.1f} s"
            + (f", peak {row.peak_gb:.2f} GB" if pd.notna(row.peak_gb) else "")
            + f" ({row.target}: {'met' if row.met else 'not met'})"
            for row in table.itertuples()
        )
    if name.startswith("bench_replay"):
        return _replay_summary(table, env)
    if name.startswith("bench_ray"):
        return _ray_summary(table, env)
    if name.startswith("bench_sim"):
        router = ["random", "round_robin", "power_of_two", "consistent_hash", "cache_aware"]
        parts = []
        for (requests, replicas), rows in table.groupby(["requests", "replicas"]):
            five = (
                rows[rows.policy.isin(router)].seconds.sum()
                + rows[rows.policy.str.startswith("(")].seconds.sum()
            )
            target = (
                f" (at most 10 s: {'met' if five <= 10 else 'not met'})"
                if (requests, replicas) == (10_000, 64)
                else ""
            )
            parts.append(
                f"{requests:,} x {replicas}: vllm-router's five policies {five:.1f} s{target}"
            )
        return "; ".join(parts)
    if name.startswith("bench_blend_timing"):
        blend = table[table.method.str.startswith("cacheblend")]
        wide = table.pivot(index="round", columns="method", values="fill_s")
        gains = wide["full"] / wide[blend.method.iloc[0]]
        ceiling = 1 / blend.compute_share.iloc[0]
        return (
            f"{env['preset']}, 4 passages of at least {env['passage_tokens']} corpus tokens: CacheBlend (r = {env['ratio']:g}) "
            f"x{gains.median():.2f} (x{gains.min():.2f}-x{gains.max():.2f}, {len(gains)} rounds) the full prefill's "
            f"speed, {gains.median() / ceiling:.0%} of the x{ceiling:.2f} its compute share allows (at least x2.5: "
            f"{'met' if gains.median() >= 2.5 else 'not met'})"
        )
    if name.startswith("bench_blend_quality"):
        by = table.groupby("method", sort=False).agg(
            right=("exact_match", "mean"), kl=("kl_nats", "mean")
        )
        blend = next(m for m in by.index if m.startswith("cacheblend"))
        short = 100 * (by.right["full"] - by.right[blend])
        return (
            f"{table.prompt.nunique()} prompts: right answers, full prefill {by.right['full']:.0%}, CacheBlend "
            f"{by.right[blend]:.0%}, naive reuse {by.right['naive']:.0%} (CacheBlend within 5 points of the full "
            f"prefill: {'met' if short <= 5 else f'not met, {short:.0f} points short'}); mean KL from the full "
            f"prefill: CacheBlend {by.kl[blend]:.3f}, naive {by.kl['naive']:.3f} nats"
        )
    if name.startswith("bench_mini"):
        medians = table.groupby(["engine", "caching"]).ttft_ms.median()
        return (
            f"median TTFT mini / vLLM: caching on {medians['mini', True] / medians['vllm', True]:.2f}x, off "
            f"{medians['mini', False] / medians['vllm', False]:.2f}x"
        )
    return ""


def benchmark_rows(canonical_dir: Path) -> pd.DataFrame:
    """One row per canonical benchmark file: its run, machine, vLLM, the lab's commit it timed, what
    it measured."""
    rows = []
    for meta_path in sorted(canonical_dir.glob("bench_*.json")):
        meta = json.loads(meta_path.read_text())
        env = meta["environment"]
        table = pd.read_csv(meta_path.with_suffix(".csv"))
        rows.append(
            {
                "benchmark": f"`{meta['run_id']}`",
                "machine": env.get("device", ""),
                "vLLM": env.get("vllm", ""),
                "lab commit": f"`{env['code']}`"
                if env.get("code")
                else "not recorded (before commits were)",
                "measured": _benchmark_summary(meta["name"], table, env),
            }
        )
    return pd.DataFrame(rows)


PROJECTED = ((10_000_000, 16), (100_000_000, 64))  # prompts, workers: the README's projection


def projected_seconds(prompts: int, workers: int, table: pd.DataFrame, env: dict) -> float:
    """The whole audit of `prompts` on `workers` workers, projected from one bench_ray run (not
    measured): the reading at one worker's measured rate, divided over the workers at the efficiency
    measured with two, and no faster than the driver reads raw lines; the other stages at the rate
    measured with two workers, as if they grew with the log (most grow less)."""
    table = table[table.setup.str.startswith("Ray")]
    one, two = table.iloc[0], table.iloc[-1]
    read_one, read_two = one["read and tokenize (s)"], two["read and tokenize (s)"]
    efficiency = min(1.0, read_one / read_two / two.workers)
    reading = max(read_one / (workers * efficiency), env["driver_read_s"])
    return prompts / env["prompts"] * (reading + two.seconds - read_two)


def cluster_lines(canonical_dir: Path) -> str:
    """The README's measured scaling of the audit on Ray and its projection, from the canonical
    bench_ray run."""
    runs = sorted(canonical_dir.glob("bench_ray-*.json"))
    if not runs:
        return "Not measured yet: `python -m lab.audit.ray_bench`."
    meta = json.loads(runs[-1].read_text())
    env, table = meta["environment"], pd.read_csv(runs[-1].with_suffix(".csv"))
    guesses = ", ".join(
        f"{n:,} prompts on {w} workers about {projected_seconds(n, w, table, env) / 60:.0f} min"
        for n, w in PROJECTED
    )
    return (
        f"Measured (`{meta['run_id']}`, {env['device']}): {_benchmark_summary(meta['name'], table, env)}. "
        f"Projected from those rates, not measured: {guesses} (the driver reads the raw log at "
        f"{env['log_bytes'] / env['driver_read_s'] / 1e6:.0f} MB/s, which bounds the reading however many "
        f"workers there are; the projection assumes the reading's efficiency measured with two workers stays, "
        f"scales the driver's other stages with the log, as timed on these cores, and needs a driver with memory "
        f"for the whole trace's block hashes)."
    )
