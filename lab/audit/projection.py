"""What caching would do to throughput and TTFT: the engine's cost model
(lab.experiments.cost_model) applied to the trace's own cached tokens per request, and a short
confirmation on the real engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from lab.core.block_hash import token_hit_rate
from lab.experiments.cost_model import CostModel
from lab.experiments.gains import amdahl_bound
from lab.experiments.verdict import Spread, Verdict, within_tolerance

TOLERANCE = 0.15  # how close to the engine a projection must come to be called right
WIDEST = 1.3  # the pairs' gains spread wider than this (max/min) cannot judge a 15% tolerance


@dataclass
class Projection:
    """Throughput gain and mean TTFT change the cost model gives for a trace (a projection, not a
    measurement): cached prefill costs nothing and all else (steps, decoding, uncached prefill)
    stays. `naive_bound` is 1 / (1 - hit rate), the gain if prefill were all the work."""

    hit_rate: float
    throughput_gain: float
    ttft_change: float
    naive_bound: float
    prompts: int
    output_tokens: int


@dataclass
class Confirmation:
    """A short run of the first `prompts` prompts on the real engine, `pairs` times over: submitted
    at once with a cache_salt per request (nothing reused: the baseline) and without one.
    `throughput_gain` and `ttft_change` are the medians over the pairs, `gain_low` and `gain_high`
    the range of the pairs' gains: one pair on a shared machine is one noisy draw, so the range says
    how far a measurement this short can be trusted. `gains` holds each pair's gain, in the order
    run (empty in a Confirmation built by hand: then the median and the range stand for them)."""

    prompts: int
    hit_rate: float
    throughput_gain: float
    gain_low: float
    gain_high: float
    ttft_change: float
    pairs: int
    mean_ttft_ms_off: float
    mean_ttft_ms_on: float
    projected: Projection | None = None  # the cost model's projection for these prompts
    gains: tuple[float, ...] = ()

    def judgement(self, tolerance: float = TOLERANCE) -> Verdict:
        """Whether the cost model's projection for these prompts is within `tolerance` of the
        engine's gains."""
        gains = self.gains or (self.gain_low, self.throughput_gain, self.gain_high)
        return judge_projection(
            gains, self.projected.throughput_gain if self.projected else None, tolerance
        )

    def gain_text(self) -> str:
        """The measured gain as it may be quoted: a median with its range, never one ratio alone."""
        verdict = (
            " (no change this short a run can tell)" if self.gain_low <= 1 <= self.gain_high else ""
        )
        return (
            f"x{self.throughput_gain:.2f}, range x{self.gain_low:.2f}-x{self.gain_high:.2f} over {self.pairs} "
            f"pairs{verdict}"
        )


def judge_projection(
    gains: Sequence[float],
    projected: float | None,
    tolerance: float = TOLERANCE,
    widest: float = WIDEST,
) -> Verdict:
    """Whether a projected gain is within `tolerance` of the gains the engine measured, one per
    off/on pair, in so many words: within (every pair), not within (no pair), or that the engine run
    cannot tell, with the range, where the pairs' gains spread wider than `widest` (max/min),
    straddle the band, or are a single pair."""
    measured = Spread("measured gain", tuple(gains), each="pair")
    shown = f"x{measured.low:.2f}-x{measured.high:.2f} over {len(measured.values)} pairs"
    if projected is None:
        return Verdict(
            f"The engine measured a gain of {shown}; there is no projection to judge against it.",
            None,
        )
    cannot = f"The engine run cannot tell whether the projection (x{projected:.2f}) is within {tolerance:.0%}"
    if len(measured.values) < 2:
        return Verdict(
            f"{cannot}: one pair (x{measured.low:.2f}) has no spread; confirm with more pairs.",
            None,
        )
    if measured.high / measured.low > widest:
        return Verdict(
            f"{cannot}: the measured gain ranged {shown} (max/min {measured.high / measured.low:.2f}, "
            f"above {widest}), too wide a range to judge {tolerance:.0%}.",
            None,
        )
    verdict = within_tolerance(
        measured,
        projected,
        tolerance,
        quantity="measured gain (x)",
        reference_name="the projection",
        digits=2,
    )
    if not verdict.can_tell:
        return Verdict(
            f"{cannot}: the measured gain ranged {shown}, partly inside the band and partly outside it "
            f"({verdict.text})",
            None,
        )
    said = "is within" if verdict.order == ("within",) else "is not within"
    return Verdict(
        f"The projection (x{projected:.2f}) {said} {tolerance:.0%} of the engine: {verdict.text}",
        verdict.order,
    )


def project(
    model: CostModel,
    prompt_tokens: Sequence[int],
    cached_tokens: Sequence[int],
    output_tokens: int = 8,
) -> Projection:
    """The cost model's projection for requests all submitted at once, each answering
    `output_tokens`."""
    hit_rate = token_hit_rate(cached_tokens, prompt_tokens)
    p = model.project(prompt_tokens, cached_tokens, output_tokens)
    return Projection(
        hit_rate,
        p["throughput_gain"],
        p["ttft_change"],
        amdahl_bound(hit_rate),
        len(prompt_tokens),
        output_tokens,
    )


def confirm_on_engine(
    token_ids: Sequence[Sequence[int]],
    model: str | None,
    block_size: int,
    sample: int,
    max_tokens: int = 8,
    pairs: int = 3,
) -> Confirmation:
    """A short measured run on the real vLLM engine: the first `sample` prompts in order, submitted
    at once, with a cache_salt per request (the baseline: nothing reused) and without, `pairs` times
    in alternating order on one warmed engine, its cache emptied before every run, so that drift in
    the machine's speed falls on both."""
    from lab.experiments.gains import warm_engine
    from lab.experiments.measure import run_workload

    if pairs < 1:
        raise ValueError(f"pairs={pairs}: the confirmation needs at least one pair of runs, e.g. 3")
    prompts = [list(ids) for ids in token_ids[:sample]]
    llm = warm_engine(model, True, block_size, prompts, max_tokens)
    runs = []
    for pair in range(pairs):
        summary = {}
        for reuse in (False, True) if pair % 2 == 0 else (True, False):
            llm.reset_prefix_cache()
            summary[reuse] = run_workload(
                llm,
                prompts,
                max_tokens=max_tokens,
                mode="offline",
                progress=False,
                salt_each=None if reuse else "baseline",
            ).summary()
        runs.append(
            {
                "gain": summary[True]["requests_per_s"] / summary[False]["requests_per_s"],
                "ttft_change": summary[True]["mean_ttft_ms"] / summary[False]["mean_ttft_ms"] - 1,
                "hit_rate": summary[True]["hit_rate"],
                "off_ms": summary[False]["mean_ttft_ms"],
                "on_ms": summary[True]["mean_ttft_ms"],
            }
        )
    del llm
    frame = pd.DataFrame(runs)
    return Confirmation(
        prompts=len(prompts),
        hit_rate=float(frame.hit_rate.median()),
        throughput_gain=float(frame.gain.median()),
        gain_low=float(frame.gain.min()),
        gain_high=float(frame.gain.max()),
        ttft_change=float(frame.ttft_change.median()),
        pairs=pairs,
        mean_ttft_ms_off=float(frame.off_ms.median()),
        mean_ttft_ms_on=float(frame.on_ms.median()),
        gains=tuple(float(g) for g in frame.gain),
    )
