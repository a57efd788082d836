"""What a hit rate buys: the bound 1 / (1 - h), and the gain measured on one engine with reuse and
without it, alternating; what caching costs when nothing is shared; the hit rate a reported gain
implies.

    amdahl_bound(0.75)                                      # 4.0: prefill skipped on 3/4 of the tokens
    runs = reuse_runs(model_path, {"shared": prompts}, block_size=None, max_tokens=8, repeats=3)
    fastest_gain(runs), repeat_gains(runs)                  # the table's gain, and each repeat's own
    prefill_shares(prefill_share_runs(model_path, ...))    # the share of the work that is prefill
    hit_rate_for(table, "throughput_gain", 1.82)            # the h that gives +82% along a measured curve
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.checks import number_in, positive_int
from lab.experiments.measure import run_workload
from lab.serving.engine import make_llm


def check_fraction(name: str, value: float) -> None:
    number_in(name, value, 0, 1, "a number in [0, 1) (a share of each prompt's tokens)", ends="[)")


def amdahl_bound(hit_rate: float) -> float:
    """The largest speed-up skipping a `hit_rate` share of prefill can give, if prefill were all the
    work."""
    check_fraction("hit_rate", hit_rate)
    return 1.0 / (1.0 - hit_rate)


def warm_engine(
    model_path: str,
    caching: bool,
    block_size: int | None,
    prompts: list[list[int]],
    max_tokens: int,
):
    """A fresh engine that has run `prompts` once, unmeasured (first-run costs), with an empty
    cache."""
    llm = make_llm(model_path, enable_prefix_caching=caching, block_size=block_size)
    run_workload(llm, prompts, max_tokens=max_tokens, mode="offline", progress=False)
    llm.reset_prefix_cache()
    return llm


REUSE_OFF_ON = ((False, False), (True, False))  # (reuse, prefill only): salted, then shared
PREFILL_ONLY = ((False, True),)  # salted, one output token


def reuse_runs(
    model_path: str | None,
    prompts_by_name: dict[str, list[list[int]]],
    *,
    block_size: int | None,
    max_tokens: int,
    repeats: int = 3,
    progress: bool = True,
) -> pd.DataFrame:
    """Every run of `reuse_gain`'s measurement, a row per workload, repeat and setting (`reuse`:
    False with a cache_salt per request, nothing reused) with its summary
    (lab.experiments.measure.WorkloadRun.summary)."""
    llm = _warmed(model_path, prompts_by_name, block_size, max_tokens, repeats)
    return _alternating(llm, prompts_by_name, max_tokens, repeats, REUSE_OFF_ON, progress)


def prefill_share_runs(
    model_path: str | None,
    prompts_by_name: dict[str, list[list[int]]],
    *,
    block_size: int | None,
    max_tokens: int,
    repeats: int = 3,
    progress: bool = True,
) -> pd.DataFrame:
    """`reuse_runs` with a third run in each repeat: every set salted with one output token, in rows
    marked `prefill_only` (`prefill_shares` reads them; the gains leave them out)."""
    llm = _warmed(model_path, prompts_by_name, block_size, max_tokens, repeats)
    settings = REUSE_OFF_ON + PREFILL_ONLY
    return _alternating(llm, prompts_by_name, max_tokens, repeats, settings, progress)


def _warmed(model_path, prompts_by_name, block_size, max_tokens, repeats):
    """The engine both run sets use: caching on, warmed on the first set, `repeats` checked first."""
    positive_int("repeats", repeats)
    return warm_engine(
        model_path, True, block_size, next(iter(prompts_by_name.values())), max_tokens
    )


def _alternating(llm, prompts_by_name, max_tokens, repeats, settings, progress) -> pd.DataFrame:
    """Each repeat runs every set in every setting, in the settings' order on even repeats and the
    reverse on odd ones (so that a drift in the machine's speed falls on all), the cache emptied
    before every run."""
    from tqdm.auto import tqdm

    runs = [
        (r, name, reuse, only)
        for r in range(repeats)
        for name in prompts_by_name
        for reuse, only in (settings if r % 2 == 0 else settings[::-1])
    ]
    rows = []
    for r, name, reuse, only in tqdm(
        runs, desc="reuse off / on", disable=not progress, leave=False
    ):
        llm.reset_prefix_cache()
        summary = run_workload(
            llm,
            prompts_by_name[name],
            max_tokens=1 if only else max_tokens,
            mode="offline",
            progress=False,
            salt_each=None if reuse else "baseline",
        ).summary()
        row = {"workload": name, "repeat": r, "reuse": reuse, "prefill_only": only}
        rows.append(row | summary.to_dict())
    return pd.DataFrame(rows)


def _full_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with every output token (no prefill-only run)."""
    return runs[~runs.prefill_only.astype(bool)] if "prefill_only" in runs else runs


def prefill_shares(runs: pd.DataFrame) -> pd.DataFrame:
    """A row per workload and repeat of `prefill_share_runs`: the share of the
    baseline's time (nothing reused) that its prefill-only run took, the same prompts with one
    output token. One output token still pays one sampling step and the run's fixed costs, so the
    share reads a little above the prefill's own."""
    index = ["workload", "repeat"]
    baseline = runs[~runs.reuse & ~runs.prefill_only].set_index(index)
    prefill = runs[runs.prefill_only].set_index(index)
    share = baseline.requests_per_s / prefill.requests_per_s.loc[baseline.index]
    return share.rename("prefill_share").reset_index()


def gain_at_share(prefill_share: float, hit_rate: float) -> float:
    """The gain a hit rate buys when a `prefill_share` of the work is prefill and a hit skips only
    the prefill of its tokens: 1 / ((1 - p) + p (1 - h)); 1 / (1 - h) at p = 1."""
    check_fraction("hit_rate", hit_rate)
    number_in("prefill_share", prefill_share, 0, 1, "a share of the work, in [0, 1]")
    return 1.0 / ((1.0 - prefill_share) + prefill_share * (1.0 - hit_rate))


def _gains(on: pd.DataFrame, off: pd.DataFrame) -> pd.DataFrame:
    """Reuse against no reuse, row by row of two tables indexed alike."""
    return pd.DataFrame(
        {
            "hit_rate": on.hit_rate,
            "baseline_hit_rate": off.hit_rate,
            "throughput_gain": on.requests_per_s / off.requests_per_s,
            "ttft_change": on.mean_ttft_ms / off.mean_ttft_ms - 1,
            "mean_ttft_ms_off": off.mean_ttft_ms,
            "mean_ttft_ms_on": on.mean_ttft_ms,
        }
    )


def fastest_gain(runs: pd.DataFrame) -> pd.DataFrame:
    """A row per workload of `reuse_runs`: the fastest run of each setting counts (a shared machine
    only ever slows a run down)."""
    runs = _full_runs(runs)
    best = runs.loc[runs.groupby(["workload", "reuse"], sort=False).requests_per_s.idxmax()]
    on, off = (best[best.reuse == reuse].set_index("workload") for reuse in (True, False))
    return _gains(on, off.loc[on.index]).reset_index()


def repeat_gains(runs: pd.DataFrame) -> pd.DataFrame:
    """A row per workload and repeat of `reuse_runs`: each repeat's own gain, its two runs set
    against each other (their spread over the repeats is what a verdict judges by:
    lab.experiments.verdict)."""
    runs = _full_runs(runs)
    on, off = (
        runs[runs.reuse == reuse].set_index(["workload", "repeat"]) for reuse in (True, False)
    )
    return _gains(on, off.loc[on.index]).reset_index()


def reuse_gain(
    model_path: str | None,
    prompts_by_name: dict[str, list[list[int]]],
    *,
    block_size: int | None,
    max_tokens: int,
    repeats: int = 3,
    progress: bool = True,
) -> pd.DataFrame:
    """What prefix reuse does, measured on one warmed engine: each prompt set submitted at once with
    a cache_salt per request (nothing reused: the baseline) and without one (reused), in alternating
    order so that a drift in the machine's speed falls on both, the cache emptied before every run;
    the fastest run of each counts."""
    return fastest_gain(
        reuse_runs(
            model_path,
            prompts_by_name,
            block_size=block_size,
            max_tokens=max_tokens,
            repeats=repeats,
            progress=progress,
        )
    )


def zero_hit_runs(
    model_path: str,
    prompts: list[list[int]],
    *,
    pairs: int,
    block_size: int | None,
    max_tokens: int,
    progress: bool = True,
) -> pd.DataFrame:
    """The same prompt set (nothing shared) submitted at once, caching off and on in alternating
    order (off-on, on-off, ...: drift in the machine's speed falls on both), a fresh engine for
    every run."""
    from tqdm.auto import tqdm

    positive_int("pairs", pairs, "an integer of at least 2 (an interval needs repeats)", minimum=2)
    rows = []
    runs = [
        (pair, caching)
        for pair in range(pairs)
        for caching in ((False, True) if pair % 2 == 0 else (True, False))
    ]
    for pair, caching in tqdm(runs, desc="zero-hit runs", disable=not progress, leave=False):
        llm = warm_engine(model_path, caching, block_size, prompts, max_tokens)
        summary = run_workload(
            llm, prompts, max_tokens=max_tokens, mode="offline", progress=False
        ).summary()
        rows.append(
            {
                "pair": pair,
                "caching": "on" if caching else "off",
                "requests_per_s": summary["requests_per_s"],
                "mean_ttft_ms": summary["mean_ttft_ms"],
                "hit_rate": summary["hit_rate"],
            }
        )
    return pd.DataFrame(rows)


def caching_bookkeeping(
    prompts: list[list[int]], block_size: int, cost_model, repeats: int = 5, output_tokens: int = 8
) -> dict[str, float]:
    """What caching adds per request when nothing is shared, measured directly: the prompts through
    vLLM's own KVCacheManager with caching on and off (hashing and lookup against allocation alone;
    the fastest of `repeats`), set against the engine's time per request for the same prompts
    submitted at once (the cost model, lab.experiments.cost_model)."""
    from lab.serving.vllm_internals import manager_replay

    seconds = {
        on: min(manager_replay(prompts, block_size, enable_caching=on)[1] for _ in range(repeats))
        for on in (True, False)
    }
    _, duration = cost_model.times(
        [len(p) for p in prompts], [0] * len(prompts), [output_tokens] * len(prompts)
    )
    added = (seconds[True] - seconds[False]) / len(prompts)
    return {
        "bookkeeping_us_on": 1e6 * seconds[True] / len(prompts),
        "bookkeeping_us_off": 1e6 * seconds[False] / len(prompts),
        "added_us": 1e6 * added,
        "engine_ms_per_request": 1e3 * duration / len(prompts),
        "added_share": added * len(prompts) / duration,
    }


def hit_rate_for(table: pd.DataFrame, column: str, target: float) -> float:
    """The token hit rate at which `column` (measured against `hit_rate`) reaches `target`, by
    linear interpolation along the measured curve; NaN when the target lies outside what was
    measured."""
    curve = table.sort_values("hit_rate")
    values, rates = curve[column].to_numpy(float), curve["hit_rate"].to_numpy(float)
    if not (min(values) <= target <= max(values)):
        return math.nan
    order = np.argsort(values)
    return float(np.interp(target, values[order], rates[order]))
