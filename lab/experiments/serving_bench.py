"""vLLM's own benchmark client (`vllm bench serve`) against a lab server: one run, a sweep of
request rates, and the prefix-cache hit rate the benchmark does not report (read from the server's
/metrics).

    with VLLMServer(block_size=32, dev_endpoints=True) as server:     # dev endpoints: the cache is emptied per rate
        path = export_custom_dataset(workload.prompts, tmp / "prompts.jsonl")
        sweep = sweep_rates(server, Sent(dataset_path=path, output_tokens=16), [2, 4, 8], seconds_per_rate=5)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lab.checks import number_in, positive_int
from lab.core.model import tokenizer_for
from lab.experiments.capacity import MIN_PROMPTS, highest_rate_meeting
from lab.experiments.measure import offered_rate
from lab.experiments.results import write_atomically
from lab.serving import vllm_internals
from lab.serving.engine_settings import model_config
from lab.serving.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES
from lab.serving.server import VLLMServer

HITS, QUERIES = PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES
DATASETS = {
    "custom": "a lab workload, see export_custom_dataset",
    "prefix_repetition": "vLLM's synthetic shared prefixes",
    "timed_trace": "a block-hash trace",
}


@dataclass(frozen=True)
class Sent:
    """What vLLM's client sends in every run: the dataset (`custom` reads the prompts at
    `dataset_path`), the output tokens per request, the client's seed and any further `vllm bench
    serve` flags."""

    dataset: str = "custom"
    dataset_path: str | Path | None = None
    output_tokens: int = 16
    seed: int = 0
    extra_args: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(
                f"dataset={self.dataset!r}: use "
                + ", ".join(f"'{k}' ({v})" for k, v in DATASETS.items())
            )
        positive_int("output_tokens", self.output_tokens)

    def with_flags(self, *flags: str) -> Sent:
        return Sent(
            self.dataset,
            self.dataset_path,
            self.output_tokens,
            self.seed,
            [*self.extra_args, *flags],
        )


@dataclass(frozen=True)
class Search:
    """A capacity search (`find_capacity`): the bracket to start from, each run's length, and when
    to stop. `known`: rates already measured (rate -> met the target), e.g. a sweep's bracket ends
    (`bracket_results`)."""

    low: float
    high: float
    seconds_per_rate: float
    tolerance: float = 0.10
    min_prompts: int = MIN_PROMPTS
    max_runs: int = 12
    known: dict[float, bool] | None = None


def export_custom_dataset(
    prompts: Sequence[str], path: str | Path, *, overwrite: bool = False
) -> Path:
    """Prompts as the JSONL that `vllm bench serve --dataset-name custom` reads ({"prompt": ...} per
    line)."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    path = Path(path)
    write_atomically(
        path,
        "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts),
        overwrite=overwrite,
    )
    return path


def check_rate(request_rate: Any) -> None:
    number_in(
        "request_rate",
        request_rate,
        0,
        math.inf,
        "a positive number of requests per second (math.inf: all at once)",
        ends="(]",
    )


def context_length(server: VLLMServer) -> int:
    return int(
        server.settings.engine_args.get("max_model_len")
        or model_config(server.model_path).get("max_position_embeddings")
        or 0
    )


def check_dataset(
    server: VLLMServer, dataset_path: Path, num_prompts: int, output_tokens: int
) -> None:
    """The file holds `num_prompts` prompts (vLLM would repeat prompts to make up a shortfall, and
    repeats hit the cache), and each fits the server's context with room for its output; checked
    before the run."""
    if not dataset_path.is_file():
        raise FileNotFoundError(
            f"dataset_path={str(dataset_path)!r} does not exist; write one with export_custom_dataset"
        )
    lines = dataset_path.read_text(encoding="utf-8").splitlines()
    if len(lines) < num_prompts:
        raise ValueError(
            f"{dataset_path.name} holds {len(lines)} prompts but num_prompts={num_prompts}: vLLM would "
            f"send some twice, and a repeat hits the cache; export at least {num_prompts}"
        )
    tokenizer = tokenizer_for(server.model_path)
    limit = context_length(server)
    for line_number, line in enumerate(lines[:num_prompts], 1):
        length = len(tokenizer.encode(json.loads(line)["prompt"]))
        if limit and length + output_tokens > limit:
            raise ValueError(
                f"{dataset_path.name} line {line_number}: a prompt of {length} tokens plus "
                f"output_tokens={output_tokens} exceeds the server's context of {limit} tokens"
            )


def bench_args(
    server: VLLMServer, sent: Sent, *, num_prompts: int, request_rate: float
) -> list[str]:
    args = [
        "--backend",
        "vllm",
        "--base-url",
        server.url,
        "--model",
        server.model_path,
        "--served-model-name",
        server.model_name,
        "--tokenizer",
        server.model_path,
        "--dataset-name",
        sent.dataset,
        "--num-prompts",
        str(num_prompts),
        "--request-rate",
        str(request_rate),
        "--seed",
        str(sent.seed),
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--save-detailed",
        "--percentile-metrics",
        "ttft,e2el",
        "--metric-percentiles",
        "50,99",
    ]
    if sent.dataset == "custom":
        args += [
            "--dataset-path",
            str(sent.dataset_path),
            "--custom-output-len",
            str(sent.output_tokens),
            "--skip-chat-template",
        ]
    elif sent.dataset == "prefix_repetition":
        args += ["--prefix-repetition-output-len", str(sent.output_tokens)]
    elif (
        sent.dataset == "timed_trace"
    ):  # a block-hash trace: its own lengths and arrival times (lab.audit.trace_engine)
        args += ["--dataset-path", str(sent.dataset_path)]
    return args + list(sent.extra_args)


def bench_serve(
    server: VLLMServer,
    sent: Sent,
    *,
    request_rate: float,
    num_prompts: int,
    allow_failures: bool = False,
) -> dict[str, Any]:
    """One `vllm bench serve` run of `sent` at `request_rate` (Poisson arrivals), as one row: TTFT
    percentiles, throughput, goodput (with `--goodput` in its extra_args) and the token hit rate
    from the server's /metrics. A request that failed raises, unless `allow_failures` (then the row
    counts them in `failed`)."""
    check_rate(request_rate)
    positive_int("num_prompts", num_prompts)
    if not server.healthy():
        raise RuntimeError(
            f"the server at {server.url} is not up; start it first (`with VLLMServer(...) as server:`)"
        )
    if sent.dataset == "custom":
        path = Path(sent.dataset_path) if sent.dataset_path is not None else Path("missing")
        check_dataset(server, path, num_prompts, sent.output_tokens)
    before = server.metrics()
    result, printed = vllm_internals.bench_serve(
        bench_args(server, sent, num_prompts=num_prompts, request_rate=request_rate)
    )
    after = server.metrics()
    sent = len(
        result["input_lens"]
    )  # prefix_repetition makes num_prompts // num_prefixes per prefix
    if result["completed"] < sent and not allow_failures:
        errors = [e for e in result.get("errors", []) if e][:3]
        raise RuntimeError(f"{sent - result['completed']} of {sent} requests failed: {errors}")
    queries = after.get(QUERIES, 0.0) - before.get(QUERIES, 0.0)
    return {
        "request_rate": request_rate,
        "offered_rate": offered_rate(
            result["start_times"]
        ),  # what the client sent, not what was asked
        "sent": sent,
        "completed": result["completed"],
        "failed": sent - result["completed"],
        "duration_s": result["duration"],
        "request_throughput": result["request_throughput"],
        "request_goodput": result.get("request_goodput"),
        "mean_ttft_ms": result["mean_ttft_ms"],  # vLLM's own statistics from here on
        "p50_ttft_ms": result["p50_ttft_ms"],
        "p99_ttft_ms": result["p99_ttft_ms"],
        "p99_e2el_ms": result["p99_e2el_ms"],
        "mean_input_tokens": float(np.mean(result["input_lens"])),
        # with caching off vLLM counts no queries: nothing was looked up, nothing hit
        "hit_rate": (after.get(HITS, 0.0) - before.get(HITS, 0.0)) / queries if queries else 0.0,
    }


def sweep_rates(
    server: VLLMServer,
    sent: Sent,
    rates: Sequence[float],
    *,
    seconds_per_rate: float,
    min_prompts: int = MIN_PROMPTS,
    progress: bool = True,
) -> pd.DataFrame:
    """`bench_serve` at each rate, lowest first, each from an empty prefix cache and lasting about
    `seconds_per_rate` (rate x seconds prompts, at least `min_prompts`); one row per rate."""
    if not rates:
        raise ValueError("rates is empty: give the request rates to sweep, e.g. [1, 2, 4, 8]")
    for rate in rates:
        check_rate(rate)
        if math.isinf(rate):
            raise ValueError("a sweep needs finite request rates; use bench_serve for all-at-once")
    if not seconds_per_rate > 0:
        raise ValueError(f"seconds_per_rate={seconds_per_rate!r} must be positive")
    rows = []
    for rate in tqdm(sorted(rates), desc="request rates", disable=not progress, leave=False):
        server.reset_prefix_cache()
        num_prompts = max(min_prompts, math.ceil(rate * seconds_per_rate))
        rows.append(
            bench_serve(server, sent, request_rate=rate, num_prompts=num_prompts)
            | {"num_prompts": num_prompts}
        )
    return pd.DataFrame(rows)


def unloaded_run(server: VLLMServer, sent: Sent, *, num_prompts: int) -> dict[str, Any]:
    """One `bench_serve` row with one request in flight at a time (no queueing), from an empty
    cache."""
    server.reset_prefix_cache()
    return bench_serve(
        server,
        sent.with_flags("--max-concurrency", "1"),
        request_rate=math.inf,
        num_prompts=num_prompts,
    )


def find_capacity(
    server: VLLMServer, sent: Sent, target_ms: float, search: Search
) -> tuple[float, pd.DataFrame]:
    """The highest request rate whose p99 TTFT meets `target_ms`, to within `search.tolerance`: the
    bracket [`low`, `high`] is first checked (and widened by halving or doubling until `low` meets
    the target and `high` misses it), then split at its geometric middle until high / low <= 1 +
    tolerance. Each run starts from an empty prefix cache and lasts about `seconds_per_rate`; a run
    in which a request failed (vLLM's client reported no first token) misses the target. Returns the
    rate (0.0 if even a rate the size of one request per `seconds_per_rate` misses) and every run.
    The rates in `search.known` are not run again, so a search seeded with a sweep's bracket stays
    inside it and never reports less than a rate the sweep saw pass."""
    number_in(
        "tolerance",
        search.tolerance,
        0,
        1,
        "a fraction, e.g. 0.1 for capacity to within 10%",
        ends="(]",
    )
    runs: list[dict[str, Any]] = []
    known = dict(search.known or {})

    def meets(rate: float) -> bool:
        if rate in known:
            return known[rate]
        if len(runs) >= search.max_runs:
            raise RuntimeError(
                f"no capacity to within {search.tolerance:.0%} after {search.max_runs} runs; widen "
                "max_runs or tolerance"
            )
        server.reset_prefix_cache()
        num_prompts = max(search.min_prompts, math.ceil(rate * search.seconds_per_rate))
        runs.append(
            bench_serve(
                server, sent, request_rate=rate, num_prompts=num_prompts, allow_failures=True
            )
            | {"num_prompts": num_prompts}
        )
        known[rate] = runs[-1]["failed"] == 0 and runs[-1]["p99_ttft_ms"] <= target_ms
        return known[rate]

    found = highest_rate_meeting(
        meets,
        low=search.low,
        high=search.high,
        tolerance=search.tolerance,
        floor=1 / search.seconds_per_rate,
    )
    return found, pd.DataFrame(runs)


def bracket_results(sweep: pd.DataFrame, target_ms: float) -> dict[float, bool]:
    """The sweep's own verdict at the ends of its capacity bracket (`capacity_bracket`) that it
    measured: the rate that met the target before the first miss, and that first miss. A search
    seeded with them stays between them."""
    low, high = capacity_bracket(sweep, target_ms)
    measured = sweep.set_index("request_rate").p99_ttft_ms
    return {
        rate: bool(measured[rate] <= target_ms) for rate in (low, high) if rate in measured.index
    }


def capacity_bracket(sweep: pd.DataFrame, target_ms: float) -> tuple[float, float]:
    """From a sweep (one setting), the rates that bracket its capacity: the highest that met the
    target before the first miss (half the lowest rate if none did) and the first that missed (twice
    the highest if none did)."""
    rows = sweep.sort_values("request_rate")
    met = rows.p99_ttft_ms <= target_ms
    first_miss = int(np.argmin(met.to_numpy())) if not met.all() else len(rows)
    low = rows.request_rate.iloc[first_miss - 1] if first_miss else rows.request_rate.iloc[0] / 2
    high = (
        rows.request_rate.iloc[first_miss]
        if first_miss < len(rows)
        else rows.request_rate.iloc[-1] * 2
    )
    return float(low), float(high)
