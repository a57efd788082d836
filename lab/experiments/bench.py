"""Benchmarks (not tests): timings reported as ratios measured side by side in one run.

    python -m lab.experiments.bench mini [--requests N] [--prefix-tokens T] [--block-size B]
    python -m lab.experiments.bench sim [--points 10000x64 100000x256]
    python -m lab.experiments.bench blend [--preset smollm2] [--passage-tokens 512] [--prompts 6] [--repeats 5]

`mini` sends one shared-prefix workload, one request at a time, through lab.core.mini_engine and
through vLLM, each with prefix caching on and off, and saves per-request TTFT under data/results/.
`sim` times `lab.experiments.fleet_sim`: a tenants trace of N requests over R replicas (twice as
many tenants as replicas, two requests per replica in flight), hashed once, then routed under every
policy. `blend` fills RAG prompts (a system text, 4 stored passages, a question) by each method of
lab.core.passage_cache: its TTFT against the full prefill's, side by side on one engine and as a
share of CacheBlend's ceiling, and its quality against the full prefill's
(lab.experiments.passage_reuse).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import pandas as pd
from tqdm import tqdm

from lab.core.block_hash import blocks_needed
from lab.core.model import ensure_model, tokenizer_for
from lab.experiments.generators import shared_prefix_workload
from lab.experiments.results import environment, hardware_line, save_results

TARGET_LOOKUP_SHARE = 0.02  # hash + lookup at most 2% of TTFT on 2k-token prompts
TARGET_MINI_VS_VLLM = 3.0  # mini-engine TTFT within 3x of vLLM's
TARGET_SIM_S = 10.0  # vllm-router's five policies over 10,000 requests and 64 replicas


def run_mini(model_path, prompts, block_size: int, caching: bool) -> list[dict]:
    from lab.core.mini_engine import MiniEngine

    pool_blocks = sum(blocks_needed(len(p), block_size) for p in prompts) + 8
    engine = MiniEngine(
        model_path, block_size=block_size, num_blocks=pool_blocks, enable_prefix_caching=caching
    )
    engine.generate([7] * len(prompts[0]))  # warm-up, shares no block with the workload
    rows = []
    for i, prompt in enumerate(
        tqdm(prompts, desc=f"mini, caching {'on' if caching else 'off'}", leave=False)
    ):
        r = engine.generate(prompt)
        rows.append(
            {
                "engine": "mini",
                "caching": caching,
                "request": i,
                "prompt_tokens": len(prompt),
                "cached_tokens": r.num_cached_tokens,
                "ttft_ms": r.ttft_s * 1e3,
                "lookup_ms": r.lookup_s * 1e3,
            }
        )
    return rows


def run_vllm(model_path, prompts, block_size: int, caching: bool) -> list[dict]:

    from lab.serving.engine import generate, make_llm

    llm = make_llm(model_path, enable_prefix_caching=caching, block_size=block_size)
    generate(llm, [[7] * len(prompts[0])])
    rows = []
    for i, prompt in enumerate(
        tqdm(prompts, desc=f"vLLM, caching {'on' if caching else 'off'}", leave=False)
    ):
        out = generate(llm, [prompt])[0]
        rows.append(
            {
                "engine": "vllm",
                "caching": caching,
                "request": i,
                "prompt_tokens": len(prompt),
                "cached_tokens": out.num_cached_tokens,
                "ttft_ms": out.metrics.first_token_latency * 1e3,
                "lookup_ms": float("nan"),
            }
        )
    del llm
    return rows


def summarize_mini(df: pd.DataFrame) -> pd.DataFrame:
    summary = df.groupby(["engine", "caching"]).agg(
        requests=("request", "count"),
        mean_prompt_tokens=("prompt_tokens", "mean"),
        hit_rate=("cached_tokens", "sum"),
        mean_ttft_ms=("ttft_ms", "mean"),
        median_ttft_ms=("ttft_ms", "median"),
        lookup_ms=("lookup_ms", "sum"),
        ttft_total_ms=("ttft_ms", "sum"),
    )
    summary["hit_rate"] /= df.groupby(["engine", "caching"])["prompt_tokens"].sum()
    summary["lookup_share"] = summary.pop("lookup_ms") / summary.pop("ttft_total_ms")
    return summary


def bench_mini(args: argparse.Namespace) -> int:
    model_path = ensure_model(args.preset)
    tokenizer = tokenizer_for(model_path)
    prompts = shared_prefix_workload(tokenizer, args.requests, args.prefix_tokens)
    rows = []
    for caching in (True, False):
        rows += run_mini(model_path, prompts, args.block_size, caching)
        rows += run_vllm(model_path, prompts, args.block_size, caching)
    df = pd.DataFrame(rows)
    env = environment(
        benchmark="mini",
        preset=args.preset,
        block_size=args.block_size,
        requests=args.requests,
        prefix_tokens=args.prefix_tokens,
        order="one request at a time",
    )
    path = save_results(df, "bench_mini", env)

    summary = summarize_mini(df)
    ratio = {
        c: summary.loc[("mini", c), "median_ttft_ms"] / summary.loc[("vllm", c), "median_ttft_ms"]
        for c in (True, False)
    }
    mini_on = df[(df.engine == "mini") & df.caching]
    hits = mini_on[mini_on.cached_tokens > 0]
    pd.set_option("display.width", 140)
    print(hardware_line(env))
    print(summary.round(3).to_string())
    print(
        f"mini / vLLM median TTFT: caching on {ratio[True]:.2f}x, off {ratio[False]:.2f}x "
        f"(target <= {TARGET_MINI_VS_VLLM:.0f}x)"
    )
    print(
        f"mini hash + lookup, share of TTFT (block size {args.block_size}, ~{args.prefix_tokens}-token prompts, "
        f"target <= {TARGET_LOOKUP_SHARE:.0%}): {summary.loc[('mini', True), 'lookup_share']:.2%} over all requests, "
        f"{hits.lookup_ms.sum() / hits.ttft_ms.sum():.2%} over the {len(hits)} hits alone "
        f"(median lookup {mini_on.lookup_ms.median():.3f} ms)"
    )
    print(f"saved {path}")
    return 0


@dataclass(frozen=True)
class SimPoint:
    """A point of the simulator benchmark: a tenants trace of `requests` over `replicas` (two
    tenants each)."""

    requests: int
    replicas: int
    context_tokens: int = 1984  # each tenant's shared context


def time_sim_policies(
    point: SimPoint, *, block_size: int = 32, kv_blocks: int = 160, seed: int = 0, service=None
) -> pd.DataFrame:
    """Seconds to hash a tenants trace once, then to route it under each of the simulator's
    policies."""
    import time

    from lab.experiments.fleet_sim import (
        KEYED_POLICIES,
        SIM_POLICIES,
        FleetSim,
        hash_requests,
        summarize_sim,
    )
    from lab.experiments.generators import synthetic_tenants

    n_requests, n_replicas = point.requests, point.replicas
    requests, order = synthetic_tenants(2 * n_replicas, n_requests, point.context_tokens, seed=seed)
    start = time.perf_counter()
    chains = hash_requests(requests, block_size)
    rows = [{"policy": "(hashing the trace once)", "seconds": time.perf_counter() - start}]
    for policy in tqdm(SIM_POLICIES, desc=f"{n_requests} x {n_replicas}", leave=False):
        start = time.perf_counter()
        sim = FleetSim(
            n_replicas,
            policy,
            kv_blocks=kv_blocks,
            block_size=block_size,
            seed=seed,
            service=service,
        )
        keys = order if policy in KEYED_POLICIES else None
        s = summarize_sim(
            sim.run(requests, concurrency=2 * n_replicas, keys=keys, chains=chains), n_replicas
        )
        rows.append(
            {
                "policy": policy,
                "seconds": time.perf_counter() - start,
                "fleet_hit_rate": s.fleet_hit_rate,
                "imbalance": s.imbalance,
            }
        )
    return pd.DataFrame(rows).assign(requests=n_requests, replicas=n_replicas)


def router_policies_seconds(timing: pd.DataFrame) -> float:
    """vllm-router's five policies, with the one hashing of the trace they share."""
    from lab.experiments.fleet_sim import BOUNDED_POLICIES

    return float(timing.seconds[~timing.policy.isin(BOUNDED_POLICIES)].sum())


def bench_sim(args: argparse.Namespace) -> int:
    points = []
    for point in args.points:
        try:
            n_requests, n_replicas = (int(x) for x in point.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--points {point!r}: give REQUESTSxREPLICAS, e.g. 10000x64") from None
        points.append((n_requests, n_replicas))
    df = pd.concat(
        [time_sim_policies(SimPoint(n, r)) for n, r in tqdm(points, desc="points")],
        ignore_index=True,
    )
    env = environment(
        benchmark="sim",
        points=args.points,
        context_tokens=1984,
        block_size=32,
        kv_blocks=160,
        in_flight="2 per replica",
        tenants="2 per replica",
    )
    path = save_results(df, "bench_sim", env)
    print(hardware_line(env))
    for (n, r), t in df.groupby(["requests", "replicas"], sort=False):
        print(
            f"{n:,} requests x {r} replicas: vllm-router's 5 policies {router_policies_seconds(t):.1f} s, all "
            f"{t.seconds.sum():.1f} s"
            + (f" (target <= {TARGET_SIM_S:.0f} s)" if (n, r) == (10000, 64) else "")
        )
    print(f"saved {path}")
    return 0


def blend_methods(ratio: float, check_layer: int, k: int) -> list:
    from lab.core.passage_cache import Method

    return [
        Method("full"),
        Method("prefix"),
        Method("naive"),
        Method("cacheblend", ratio, check_layer),
        Method("epic", k=k),
    ]


def bench_blend(args: argparse.Namespace) -> int:
    from lab.core.passage_cache import PassageEngine, ceiling
    from lab.experiments.passage_reuse import (
        make_passages,
        quality_rows,
        rag_prompts,
        speedups,
        timing_rows,
    )

    model_path = ensure_model(args.preset)
    tokenizer, engine = tokenizer_for(model_path), PassageEngine(model_path)
    prompts = rag_prompts(
        tokenizer, make_passages(tokenizer, 8, args.passage_tokens), args.prompts, per_prompt=4
    )
    methods = blend_methods(args.ratio, args.check_layer, args.k)
    env = environment(
        benchmark="blend",
        preset=args.preset,
        passage_tokens=args.passage_tokens,
        passages=4,
        prompts=args.prompts,
        repeats=args.repeats,
        ratio=args.ratio,
        check_layer=args.check_layer,
        k=args.k,
        order="methods in a new random order each round, one engine",
    )
    timing = timing_rows(engine, prompts[0], methods, args.repeats)
    quality = quality_rows(engine, prompts, methods, answer_tokens=16, tokenizer=tokenizer)
    paths = [
        save_results(timing, "bench_blend_timing", env),
        save_results(quality, "bench_blend_quality", env),
    ]
    bound = ceiling(engine.n_layers, args.check_layer, args.ratio)
    print(hardware_line(env))
    print(
        f"prompt: {sum(map(len, prompts[0].chunks))} tokens; CacheBlend's ceiling {bound:.2f}x "
        f"({engine.n_layers} layers, check layer {args.check_layer}, r = {args.ratio:g})"
    )
    print(speedups(timing).round(3).to_string(index=False))
    gains = speedups(timing).set_index("method").loc[str(methods[3])]
    print(
        f"CacheBlend: {gains.speedup_median:.2f}x the full prefill's speed, {gains.speedup_median / bound:.0%} of the "
        f"formula's {bound:.2f}x, {gains.speedup_median * gains.compute_share:.0%} of the "
        f"{1 / gains.compute_share:.2f}x its measured compute share allows"
    )
    print(
        quality.groupby("method", sort=False)[
            ["kl_nats", "top1_agreement", "greedy_equal_tokens", "exact_match"]
        ]
        .mean()
        .round(3)
        .to_string()
    )
    for path in paths:
        print(f"saved {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="benchmark", required=True)
    mini = sub.add_parser("mini", help="lab.core.mini_engine vs vLLM, prefix caching on and off")
    mini.add_argument("--requests", type=int, default=32)
    mini.add_argument("--prefix-tokens", type=int, default=2000)
    mini.add_argument("--block-size", type=int, default=32)
    mini.add_argument("--preset", default="tiny")
    sim = sub.add_parser(
        "sim", help="lab.experiments.fleet_sim: seconds per policy at a few fleet sizes"
    )
    sim.add_argument(
        "--points", nargs="+", default=["10000x64", "100000x256"], help="REQUESTSxREPLICAS ..."
    )
    blend = sub.add_parser(
        "blend", help="lab.core.passage_cache: five fills of a RAG prompt, time and quality"
    )
    blend.add_argument("--preset", default="smollm2")
    blend.add_argument("--passage-tokens", type=int, default=512)
    blend.add_argument("--prompts", type=int, default=6)
    blend.add_argument("--repeats", type=int, default=5)
    blend.add_argument("--ratio", type=float, default=0.15)
    blend.add_argument("--check-layer", type=int, default=1)
    blend.add_argument("--k", type=int, default=16)
    args = parser.parse_args(argv)
    if args.benchmark == "blend":
        return bench_blend(args)
    if args.benchmark == "sim":
        return bench_sim(args)
    if args.requests < 1 or args.prefix_tokens < 1:
        parser.error("--requests and --prefix-tokens must be positive")
    return bench_mini(args)


if __name__ == "__main__":
    sys.exit(main())
