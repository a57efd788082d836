"""What caching would do to throughput and TTFT: the engine's cost model
(lab.experiments.cost_model) applied to the trace's own cached tokens per request, and a short
confirmation on the real engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from lab.audit.fields import Sharing, move_line_to_end
from lab.audit.misses import Misses
from lab.audit.piece_tokens import TokenEncoder
from lab.audit.prompts import encode
from lab.audit.settings import AuditSettings
from lab.audit.trace import Trace
from lab.core.block_hash import REPLAY_HASH, kv_blocks, token_hit_rate
from lab.core.prefix_cache import PrefixCache
from lab.experiments.cost_model import CostModel, fitted
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


@dataclass
class Projections:
    """The cost model's projection for the explained requests and for the field search's prompts
    with the breaking fields moved (None without a cost model), and the engine's confirmation (None
    unless asked)."""

    projection: Projection | None
    after_moving_fields: Projection | None
    confirmation: Confirmation | None
    cost_model_run: str  # the results run of the cost model projected with
    cost_model_fitted_on: str
    cost_model: CostModel | None = None  # None: no cost model for this model and back-end


def project_and_confirm(
    trace: Trace,
    settings: AuditSettings,
    misses: Misses,
    sharing: Sharing,
    encoder: TokenEncoder,
    block_size: int,
) -> Projections:
    """The audit's projection stage: the cost model fitted for `settings.model` (calibrated first
    when missing, only if `settings.confirm` asks for the engine) applied to the explained requests
    and to the prompts with their breaking fields moved; then, if asked, the engine's own run."""
    fit = fitted(settings.model, calibrate_if_missing=settings.confirm > 0)
    cost_model = fit.model if fit else None
    projection = moved = confirmation = None
    if cost_model:
        projection = _project_first(cost_model, misses, len(misses.requests), settings)
        moved = _after_moving(sharing, encoder, block_size, cost_model, settings)
    if settings.confirm:
        confirmation = confirm_on_engine(
            trace.sample.token_ids,
            settings.model,
            block_size,
            settings.confirm,
            max_tokens=settings.output_tokens,
        )
        confirmation.projected = _project_first(cost_model, misses, confirmation.prompts, settings)
    run_id, device = (fit.run_id, fit.device) if fit else ("", "")
    return Projections(projection, moved, confirmation, run_id, device, cost_model)


def _project_first(
    cost_model: CostModel, misses: Misses, prompts: int, settings: AuditSettings
) -> Projection:
    rows = misses.requests.head(prompts)
    return project(cost_model, rows.prompt_tokens, rows.cached_tokens, settings.output_tokens)


def _after_moving(
    sharing: Sharing,
    encoder: TokenEncoder,
    block_size: int,
    cost_model: CostModel,
    settings: AuditSettings,
) -> Projection | None:
    """The projection for the field search's prompts with every breaking field moved to the end."""
    if not sharing.fields:
        return None
    texts = sharing.texts
    for field in sharing.fields:
        texts = [move_line_to_end(t, field.label) for t in texts]
    ids = encode(encoder, texts)
    pool = PrefixCache(
        num_blocks=kv_blocks(settings.kv_tokens, block_size),
        block_size=block_size,
        hash_algo=REPLAY_HASH,
    )
    return project(cost_model, list(map(len, ids)), pool.replay(ids), settings.output_tokens)
