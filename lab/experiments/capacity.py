"""What prefix caching buys as a function of the hit rate: the bound, the measured gain, an A100 projection,
the hit rate a reported gain implies, and the capacity at a TTFT target.

    generators.shared_fraction_prompts(tokenizer, 100, fraction=0.75, prompt_tokens=1024)   # h ~ 0.75 by construction
    amdahl_bound(0.75)                                                          # 4.0: prefill skipped on 3/4
    hit_rate_for(table, "throughput_gain", 1.82)                                # h that gives +82%
    capacity(sweep, target_ms=500)                                              # highest rate with p99 TTFT <= 500 ms
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from lab.checks import number_in, positive_int
from lab.experiments.measure import run_workload
from lab.serving.engine import make_llm

# The A100 projection of notebook 05: Llama-2-7b-chat in bf16 on one A100 80GB.
A100_PEAK_FLOPS = 312e12  # dense bf16
A100_ACHIEVED = 0.5  # fraction of peak a prefill reaches
A100_HBM_BYTES_PER_S = 2.0e12
LLAMA_7B = {"params": 6.74e9, "layers": 32, "hidden": 4096, "weight_bytes": 13.5e9}
MAX_NUM_SEQS = 256  # vLLM's default batch limit: requests decoded together


class CapacityColumns:
    """The columns of the capacity table (`17_capacity-capacity`, a row per dataset). Notebook 17 builds it with
    `capacity_frame`, `add_searched` and `add_cost_model`; the report and the tests read it by these names, so a
    column is renamed here and nowhere else."""
    DATASET = "dataset"
    UNLOADED_OFF = "unloaded p99 TTFT off (ms)"
    UNLOADED_ON = "unloaded p99 TTFT on (ms)"
    TARGET = "target p99 TTFT (ms)"
    OFF = "capacity off (req/s)"
    ON = "capacity on (req/s)"
    RATIO = "capacity ratio"
    HIT_RATE = "hit rate (on, highest rate)"
    BOUND = "bound 1/(1-h)"
    SEARCHED_OFF = "searched off (req/s)"  # with capacity_repeats: found by bisection, the mean over the repeats
    SEARCHED_ON = "searched on (req/s)"
    SEARCHED_RATIO = "searched ratio"
    RATIO_LOW = "ratio low"
    RATIO_HIGH = "ratio high"
    MODEL_OFF = "cost model off (req/s)"  # the cost model's projected capacity
    MODEL_ON = "cost model on (req/s)"
    MODEL_RATIO = "cost model ratio"


def capacity_row(dataset: str, *, unloaded_off_ms: float, unloaded_on_ms: float, target_ms: float, off: float,
                 on: float, hit_rate: float) -> dict:
    """One dataset's row of the capacity table: capacities off and on at the target, their ratio (infinite when
    caching off met no swept rate), the hit rate and its bound."""
    c = CapacityColumns
    return {c.DATASET: dataset, c.UNLOADED_OFF: unloaded_off_ms, c.UNLOADED_ON: unloaded_on_ms, c.TARGET: target_ms,
            c.OFF: off, c.ON: on, c.RATIO: on / off if off else math.inf, c.HIT_RATE: hit_rate,
            c.BOUND: amdahl_bound(hit_rate)}


def capacity_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """The capacity table from `capacity_row`s, indexed by dataset."""
    return pd.DataFrame(rows, columns=list(capacity_row("", unloaded_off_ms=0, unloaded_on_ms=0, target_ms=0, off=1,
                                                        on=1, hit_rate=0))).set_index(CapacityColumns.DATASET)


def add_searched(table: pd.DataFrame, searched: pd.DataFrame) -> pd.DataFrame:
    """The capacities found by bisection (`searched`: dataset, caching, repeat, capacity): the mean of each setting
    and the ratio's range over the repeats."""
    c = CapacityColumns
    found = searched.pivot_table(index="dataset", columns="caching", values="capacity", aggfunc=["mean", "min", "max"])
    return table.assign(**{c.SEARCHED_OFF: found["mean", "off"], c.SEARCHED_ON: found["mean", "on"],
                           c.SEARCHED_RATIO: found["mean", "on"] / found["mean", "off"],
                           c.RATIO_LOW: found["min", "on"] / found["max", "off"],
                           c.RATIO_HIGH: found["max", "on"] / found["min", "off"]})


def add_cost_model(table: pd.DataFrame, dataset: str, off: float, on: float) -> pd.DataFrame:
    """The cost model's projected capacities for one dataset, beside the measured ones."""
    c = CapacityColumns
    table = table.copy()
    table.loc[dataset, [c.MODEL_OFF, c.MODEL_ON, c.MODEL_RATIO]] = [off, on, on / off if off else math.inf]
    return table


def highest_rate_meeting(meets: Callable[[float], bool], *, low: float, high: float, tolerance: float,
                         floor: float) -> float:
    """The highest rate for which `meets(rate)` holds, to within `tolerance`: the bracket [`low`, `high`] is halved
    or doubled until `low` meets and `high` misses, then split at its geometric middle until
    high / low <= 1 + tolerance. 0.0 when even a rate below `floor` misses. Used for the engine's measured capacity
    (`serving_bench.find_capacity`) and the cost model's projected one (`CostModel.capacity`)."""
    while not meets(low):
        high, low = low, low / 2
        if low < floor:
            return 0.0
    while meets(high):
        low, high = high, high * 2
    while high / low > 1 + tolerance:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def check_fraction(name: str, value: float) -> None:
    number_in(name, value, 0, 1, "a number in [0, 1) (a share of each prompt's tokens)", high_open=True)


def amdahl_bound(hit_rate: float) -> float:
    """The largest speed-up skipping a `hit_rate` share of prefill can give, if prefill were all the work."""
    check_fraction("hit_rate", hit_rate)
    return 1.0 / (1.0 - hit_rate)


def warm_engine(model_path: str, caching: bool, block_size: int | None, prompts: list[list[int]],
                 max_tokens: int):
    """A fresh engine that has run `prompts` once, unmeasured (first-run costs), with an empty cache."""
    llm = make_llm(model_path, enable_prefix_caching=caching, block_size=block_size)
    run_workload(llm, prompts, max_tokens=max_tokens, mode="offline", progress=False)
    llm.reset_prefix_cache()
    return llm


def reuse_runs(model_path: str | None, prompts_by_name: dict[str, list[list[int]]], *, block_size: int | None,
               max_tokens: int, repeats: int = 3, progress: bool = True) -> pd.DataFrame:
    """Every run of `reuse_gain`'s measurement, a row per workload, repeat and setting (`reuse`: False with a
    cache_salt per request, nothing reused) with its summary (lab.experiments.measure.WorkloadRun.summary)."""
    from tqdm.auto import tqdm

    positive_int("repeats", repeats)
    llm = warm_engine(model_path, True, block_size, next(iter(prompts_by_name.values())), max_tokens)
    runs = [(r, name, reuse) for r in range(repeats) for name in prompts_by_name
            for reuse in ((False, True) if r % 2 == 0 else (True, False))]
    rows = []
    for r, name, reuse in tqdm(runs, desc="reuse off / on", disable=not progress, leave=False):
        llm.reset_prefix_cache()
        summary = run_workload(llm, prompts_by_name[name], max_tokens=max_tokens, mode="offline", progress=False,
                               salt_each=None if reuse else "baseline").summary()
        rows.append({"workload": name, "repeat": r, "reuse": reuse, **summary.to_dict()})
    return pd.DataFrame(rows)


def _gains(on: pd.DataFrame, off: pd.DataFrame) -> pd.DataFrame:
    """Reuse against no reuse, row by row of two tables indexed alike."""
    return pd.DataFrame({"hit_rate": on.hit_rate, "baseline_hit_rate": off.hit_rate,
                         "throughput_gain": on.requests_per_s / off.requests_per_s,
                         "ttft_change": on.mean_ttft_ms / off.mean_ttft_ms - 1,
                         "mean_ttft_ms_off": off.mean_ttft_ms, "mean_ttft_ms_on": on.mean_ttft_ms})


def fastest_gain(runs: pd.DataFrame) -> pd.DataFrame:
    """A row per workload of `reuse_runs`: the fastest run of each setting counts (a shared machine only ever slows
    a run down)."""
    best = runs.loc[runs.groupby(["workload", "reuse"], sort=False).requests_per_s.idxmax()]
    on, off = (best[best.reuse == reuse].set_index("workload") for reuse in (True, False))
    return _gains(on, off.loc[on.index]).reset_index()


def repeat_gains(runs: pd.DataFrame) -> pd.DataFrame:
    """A row per workload and repeat of `reuse_runs`: each repeat's own gain, its two runs set against each other
    (their spread over the repeats is what a verdict judges by: lab.experiments.verdict)."""
    on, off = (runs[runs.reuse == reuse].set_index(["workload", "repeat"]) for reuse in (True, False))
    return _gains(on, off.loc[on.index]).reset_index()


def reuse_gain(model_path: str | None, prompts_by_name: dict[str, list[list[int]]], *, block_size: int | None,
               max_tokens: int, repeats: int = 3, progress: bool = True) -> pd.DataFrame:
    """What prefix reuse does, measured on one warmed engine: each prompt set submitted at once with a cache_salt
    per request (nothing reused: the baseline) and without one (reused), in alternating order so that a drift in
    the machine's speed falls on both, the cache emptied before every run; the fastest run of each counts."""
    return fastest_gain(reuse_runs(model_path, prompts_by_name, block_size=block_size, max_tokens=max_tokens,
                                   repeats=repeats, progress=progress))


def zero_hit_runs(model_path: str, prompts: list[list[int]], *, pairs: int, block_size: int | None,
                  max_tokens: int, progress: bool = True) -> pd.DataFrame:
    """The same prompt set (nothing shared) submitted at once, caching off and on in alternating order
    (off-on, on-off, ...: drift in the machine's speed falls on both), a fresh engine for every run."""
    from tqdm.auto import tqdm

    positive_int("pairs", pairs, "an integer of at least 2 (an interval needs repeats)", minimum=2)
    rows = []
    runs = [(pair, caching) for pair in range(pairs) for caching in ((False, True) if pair % 2 == 0 else (True, False))]
    for pair, caching in tqdm(runs, desc="zero-hit runs", disable=not progress, leave=False):
        llm = warm_engine(model_path, caching, block_size, prompts, max_tokens)
        summary = run_workload(llm, prompts, max_tokens=max_tokens, mode="offline", progress=False).summary()
        rows.append({"pair": pair, "caching": "on" if caching else "off", "requests_per_s": summary["requests_per_s"],
                     "mean_ttft_ms": summary["mean_ttft_ms"], "hit_rate": summary["hit_rate"]})
    return pd.DataFrame(rows)


def caching_bookkeeping(prompts: list[list[int]], block_size: int, cost_model, repeats: int = 5,
                        output_tokens: int = 8) -> dict[str, float]:
    """What caching adds per request when nothing is shared, measured directly: the prompts through vLLM's own
    KVCacheManager with caching on and off (hashing and lookup against allocation alone; the fastest of
    `repeats`), set against the engine's time per request for the same prompts submitted at once (the cost
    model, lab.experiments.cost_model)."""
    from lab.serving.vllm_internals import manager_replay

    seconds = {on: min(manager_replay(prompts, block_size, enable_caching=on)[1] for _ in range(repeats))
               for on in (True, False)}
    _, duration = cost_model.times([len(p) for p in prompts], [0] * len(prompts), [output_tokens] * len(prompts))
    added = (seconds[True] - seconds[False]) / len(prompts)
    return {"bookkeeping_us_on": 1e6 * seconds[True] / len(prompts), "bookkeeping_us_off": 1e6 * seconds[False] / len(prompts),
            "added_us": 1e6 * added, "engine_ms_per_request": 1e3 * duration / len(prompts),
            "added_share": added * len(prompts) / duration}


def hit_rate_for(table: pd.DataFrame, column: str, target: float) -> float:
    """The token hit rate at which `column` (measured against `hit_rate`) reaches `target`, by linear
    interpolation along the measured curve; NaN when the target lies outside what was measured."""
    curve = table.sort_values("hit_rate")
    values, rates = curve[column].to_numpy(float), curve["hit_rate"].to_numpy(float)
    if not (min(values) <= target <= max(values)):
        return math.nan
    order = np.argsort(values)
    return float(np.interp(target, values[order], rates[order]))


def a100_projection(prompt_tokens: Sequence[int], cached_tokens: Sequence[int], output_tokens: Sequence[int]) -> dict:
    """Seconds an A100 would spend on these requests submitted together: prefill by FLOPs (weights plus
    attention over cached and new keys) at half of peak, decode by reading the weights once per step
    with up to MAX_NUM_SEQS requests per step. A rough model, for the order of magnitude."""
    uncached = np.asarray(prompt_tokens, float) - np.asarray(cached_tokens, float)
    cached = np.asarray(cached_tokens, float)
    m = LLAMA_7B
    flops = (2 * m["params"] * uncached + 4 * m["layers"] * m["hidden"] * (uncached**2 / 2 + uncached * cached)).sum()
    prefill_s = flops / (A100_PEAK_FLOPS * A100_ACHIEVED)
    decode_steps = math.ceil(len(uncached) / MAX_NUM_SEQS) * max(output_tokens)
    decode_s = decode_steps * m["weight_bytes"] / A100_HBM_BYTES_PER_S
    return {"prefill_s": prefill_s, "decode_s": decode_s, "requests_per_s": len(uncached) / (prefill_s + decode_s)}


def a100_curve(prompt_tokens: Sequence[int], output_tokens: Sequence[int], hit_rates: Sequence[float]) -> pd.DataFrame:
    """The projected throughput gain at each token hit rate for these prompt lengths. In a batch submitted
    at once, mean TTFT scales with the time to work through it, so its change is about 1 / gain - 1."""
    prompt = np.asarray(prompt_tokens)
    off = a100_projection(prompt, np.zeros_like(prompt), output_tokens)["requests_per_s"]
    rows = []
    for h in hit_rates:
        on = a100_projection(prompt, np.floor(h * prompt), output_tokens)["requests_per_s"]
        rows.append({"hit_rate": h, "throughput_gain": on / off, "ttft_change": off / on - 1})
    return pd.DataFrame(rows)


def capacity(sweep: pd.DataFrame, target_ms: float, column: str = "p99_ttft_ms") -> float:
    """The highest offered rate whose `column` stays at or under `target_ms`, among the rates of one sweep
    (0.0 when even the lowest rate misses the target). Rates above the first miss do not count."""
    if not target_ms > 0:
        raise ValueError(f"target_ms={target_ms!r} must be a positive number of milliseconds")
    best = 0.0
    for _, row in sweep.sort_values("request_rate").iterrows():
        if row[column] > target_ms:
            break
        best = float(row["request_rate"])
    return best


MIN_BOOTSTRAP = 10  # fewer ratios than this: a bootstrap interval is only their range, so report the range


def ratio_interval(ratios: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                   seed: int = 0) -> tuple[float, float, float]:
    """Mean of paired ratios and its bootstrap (percentile) confidence interval; with fewer than MIN_BOOTSTRAP
    ratios, the lowest and the highest (`spread_name` says which it was)."""
    values = np.asarray(ratios, float)
    if len(values) < 2:
        raise ValueError(f"{len(values)} ratio(s): an interval needs at least two repeats")
    if len(values) < MIN_BOOTSTRAP:
        return float(values.mean()), float(values.min()), float(values.max())
    means = np.random.default_rng(seed).choice(values, (resamples, len(values))).mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(values.mean()), float(low), float(high)


def spread_name(count: int, confidence: float = 0.95) -> str:
    """What ratio_interval's low and high are for `count` ratios."""
    return f"{confidence:.0%} bootstrap interval of {count}" if count >= MIN_BOOTSTRAP else f"range of {count}"
