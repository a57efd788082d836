"""What caching would do to throughput and TTFT: a projection from the lab's measured gain curve, and a short
confirmation on the real engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class Projection:
    """Throughput gain and mean TTFT change the lab's curve gives at `hit_rate` (a projection, not a measurement)."""
    hit_rate: float
    throughput_gain: float
    ttft_change: float
    within_measured_range: bool


@dataclass
class Confirmation:
    """A short run of the first `prompts` prompts on the real engine, caching off and then on."""
    prompts: int
    hit_rate: float
    throughput_gain: float
    ttft_change: float
    mean_ttft_ms_off: float
    mean_ttft_ms_on: float
    projected: Projection | None = None  # what the curve gives at this run's hit rate


def gain_curve() -> tuple[pd.DataFrame, dict]:
    """The lab's measured throughput gain and TTFT change against the token hit rate: notebook 10's newest
    results in the results folder in use, else the committed canonical run."""
    from lab.experiments.results import load_latest_or_canonical

    return load_latest_or_canonical("10_capacity-gain")


def project(hit_rate: float, curve: pd.DataFrame) -> Projection:
    """Throughput gain and mean TTFT change at `hit_rate`, interpolated along the measured curve (its
    ends held beyond the measured range, and said so)."""
    curve = curve.sort_values("hit_rate")
    rates = curve.hit_rate.to_numpy(float)
    return Projection(hit_rate, float(np.interp(hit_rate, rates, curve.throughput_gain.to_numpy(float))),
                      float(np.interp(hit_rate, rates, curve.ttft_change.to_numpy(float))),
                      bool(rates.min() <= hit_rate <= rates.max()))


def confirm_on_engine(token_ids: Sequence[Sequence[int]], model: str | None, block_size: int, sample: int,
                      max_tokens: int = 8) -> Confirmation:
    """A short measured run on the real vLLM engine: the first `sample` prompts in order, submitted at once
    with caching off and then on (a fresh engine each, warmed on the same prompts, cache emptied)."""
    from lab.experiments.capacity import warm_engine
    from lab.experiments.measure import run_workload, summarize

    prompts = [list(ids) for ids in token_ids[:sample]]
    summaries = {}
    for caching in (False, True):
        llm = warm_engine(model, caching, block_size, prompts, max_tokens)
        summaries[caching] = summarize(run_workload(llm, prompts, max_tokens=max_tokens, mode="offline", progress=False))
        del llm
    off, on = summaries[False], summaries[True]
    return Confirmation(prompts=len(prompts), hit_rate=float(on["hit_rate"]),
                        throughput_gain=float(on["requests_per_s"] / off["requests_per_s"]),
                        ttft_change=float(on["mean_ttft_ms"] / off["mean_ttft_ms"] - 1),
                        mean_ttft_ms_off=float(off["mean_ttft_ms"]), mean_ttft_ms_on=float(on["mean_ttft_ms"]))
