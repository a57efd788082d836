"""A cost model of the engine in use, fitted on a short calibration run, that projects what caching
does to a trace from the trace's own cached tokens per request.

    model = calibrate(model_path)                     # ~10 calibration batches on the real engine, then a fit
    model.project(prompt_tokens, cached_tokens, output_tokens=8)   # throughput gain, mean TTFT change, ...

vLLM works in steps. Each step, the scheduler (V1: running requests first, then waiting ones in
order, chunked prefill, at most `max_num_batched_tokens` tokens and `max_num_seqs` requests) picks
tokens to compute, and the step takes

    fixed + per_sequence x sequences + per_token x tokens + per_attention x (tokens x the context each attends to)

seconds. `schedule()` replays that scheduler for requests all submitted at once (prompt length,
cached tokens, output tokens each) and sums each term's quantity up to every request's first token
and to the end. Since every time is then a dot product of those sums with the four costs, a
calibration run of batches of known shapes fits the costs by least squares (kept non-negative), on
each request's TTFT and each batch's duration. Projections compare the trace as the replay serves it
(its cached tokens) with the same trace uncached. The fit is saved as a results file named per model
and back-end, and reused (`fitted()`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

# What runs an engine, builds prompts or touches results files is imported inside the functions that
# do so: the audit imports this module for its arithmetic alone, and those modules bring torch
# (seconds at start-up) with them.

TERMS = (
    "fixed",
    "per_sequence",
    "per_token",
    "per_attention",
)  # per step; attention in thousands of token pairs


@dataclass(frozen=True)
class Schedule:
    """The quantities of each term summed over the steps until each request's first token, and until
    the end."""

    to_first_token: np.ndarray  # requests x TERMS
    to_end: np.ndarray  # TERMS


def _attention(start: int, tokens: int) -> float:
    """Thousands of (token, earlier token) pairs when `tokens` new tokens follow `start` computed
    ones."""
    return (tokens * start + tokens * (tokens + 1) / 2) / 1000


def _pick(
    running: list[int],
    waiting: deque,
    done: list[int],
    prompt_tokens: Sequence[int],
    budget: int,
    max_num_seqs: int,
) -> list[tuple[int, int]]:
    """One step of vLLM V1's scheduler: (request, tokens) for the running requests first (a decode
    token, or the next chunk of an unfinished prefill), then waiting ones in order while the token
    budget and seats last. Requests taken from `waiting` join `running`."""
    picked = []
    for i in running:
        if budget == 0:
            break
        left = prompt_tokens[i] - done[i]
        picked.append((i, min(left, budget) if left > 0 else 1))
        budget -= picked[-1][1]
    while waiting and budget > 0 and len(running) < max_num_seqs:
        i = waiting.popleft()
        running.append(i)
        picked.append((i, min(prompt_tokens[i] - done[i], budget)))
        budget -= picked[-1][1]
    return picked


def _advance(
    picked: list[tuple[int, int]],
    done: list[int],
    produced: list[int],
    prompt_tokens: Sequence[int],
) -> tuple[np.ndarray, list[int]]:
    """Compute the picked tokens: the step's quantity of each term, and the requests that got a
    first token."""
    quantities = np.array(
        [1, len(picked), sum(t for _, t in picked), sum(_attention(done[i], t) for i, t in picked)]
    )
    firsts = []
    for i, tokens in picked:
        done[i] += tokens
        if done[i] >= prompt_tokens[i]:  # a prefill that completed, or a decode, samples one token
            produced[i] += 1
            firsts += [i] if produced[i] == 1 else []
    return quantities, firsts


def schedule(
    prompt_tokens: Sequence[int],
    cached_tokens: Sequence[int],
    output_tokens: Sequence[int],
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> Schedule:
    """Replay vLLM V1's scheduler over requests all waiting at the start (see the module docstring)."""
    n = len(prompt_tokens)
    done, produced = list(cached_tokens), [0] * n  # tokens with K/V, tokens sampled
    waiting, running = deque(range(n)), []
    totals, first = np.zeros(len(TERMS)), np.zeros((n, len(TERMS)))
    while waiting or running:
        picked = _pick(running, waiting, done, prompt_tokens, max_num_batched_tokens, max_num_seqs)
        quantities, firsts = _advance(picked, done, produced, prompt_tokens)
        totals += quantities
        first[firsts] = totals
        running[:] = [i for i in running if produced[i] < output_tokens[i]]
    return Schedule(first, totals)


def _ttfts_with_arrivals(
    costs: Sequence[float],
    prompt_tokens: Sequence[int],
    cached_tokens: Sequence[int],
    output_tokens: Sequence[int],
    arrivals_s: Sequence[float],
    limits: tuple[int, int],
) -> np.ndarray:
    """Each request's TTFT (seconds) when requests arrive at `arrivals_s` (in order) and each step
    costs `costs` (one per TERMS) times its quantities: the same scheduler, now on a clock."""
    n = len(prompt_tokens)
    done, produced, ttft = list(cached_tokens), [0] * n, np.zeros(n)
    arriving, waiting, running, now, theta = deque(range(n)), deque(), [], 0.0, np.asarray(costs)
    max_num_batched_tokens, max_num_seqs = limits
    while arriving or waiting or running:
        while arriving and arrivals_s[arriving[0]] <= now:
            waiting.append(arriving.popleft())
        if not waiting and not running:
            now = arrivals_s[arriving[0]]
            continue
        picked = _pick(running, waiting, done, prompt_tokens, max_num_batched_tokens, max_num_seqs)
        quantities, firsts = _advance(picked, done, produced, prompt_tokens)
        now += float(quantities @ theta)
        ttft[firsts] = now - np.asarray(arrivals_s)[firsts]
        running[:] = [i for i in running if produced[i] < output_tokens[i]]
    return ttft


def _fit_non_negative(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Least squares on relative error, dropping any term that comes out negative and fitting again."""
    weights = 1 / targets
    active = list(range(features.shape[1]))
    while True:
        solution, *_ = np.linalg.lstsq(
            features[:, active] * weights[:, None], targets * weights, rcond=None
        )
        if (solution >= 0).all():
            costs = np.zeros(features.shape[1])
            costs[active] = solution
            return costs
        active.pop(int(np.argmin(solution)))


@dataclass
class CostModel:
    """Seconds per step for each of TERMS, and the scheduler limits of the engine they were fitted
    on."""

    costs: dict[str, float]
    max_num_batched_tokens: int
    max_num_seqs: int
    fit_error: float  # median relative error over the calibration's TTFTs and durations

    def times(self, prompt_tokens, cached_tokens, output_tokens) -> tuple[np.ndarray, float]:
        """Each request's TTFT and the whole batch's duration, all submitted at once (seconds)."""
        plan = schedule(
            prompt_tokens,
            cached_tokens,
            output_tokens,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )
        theta = np.array([self.costs[t] for t in TERMS])
        return plan.to_first_token @ theta, float(plan.to_end @ theta)

    def project(
        self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int], output_tokens: int = 8
    ) -> dict:
        """Throughput gain and mean TTFT change of the trace with its cached tokens against none
        cached."""
        outputs = [output_tokens] * len(prompt_tokens)
        ttft_on, end_on = self.times(prompt_tokens, cached_tokens, outputs)
        ttft_off, end_off = self.times(prompt_tokens, [0] * len(prompt_tokens), outputs)
        return {
            "throughput_gain": end_off / end_on,
            "ttft_change": float(ttft_on.mean() / ttft_off.mean() - 1),
            "mean_ttft_ms_off": 1e3 * float(ttft_off.mean()),
            "mean_ttft_ms_on": 1e3 * float(ttft_on.mean()),
        }

    def p99_ttft_ms(
        self, prompt_tokens, cached_tokens, output_tokens: int, rate: float, seed: int = 0
    ) -> float:
        """p99 TTFT (ms) with Poisson arrivals at `rate` requests per second, as the engine runs get
        them (`lab.experiments.measure.arrival_times`: the first request at t = 0)."""
        from lab.experiments.measure import Poisson, arrival_times

        arrivals = arrival_times(len(prompt_tokens), Poisson(rate, seed))
        ttft = self.ttfts_with_arrivals(
            prompt_tokens, cached_tokens, [output_tokens] * len(prompt_tokens), arrivals
        )
        return 1e3 * float(np.quantile(ttft, 0.99))

    def ttfts_with_arrivals(
        self,
        prompt_tokens: Sequence[int],
        cached_tokens: Sequence[int],
        output_tokens: Sequence[int],
        arrivals_s: Sequence[float],
    ) -> np.ndarray:
        """Each request's TTFT (seconds) when requests arrive at `arrivals_s` (in order) and each
        step costs what the fit says: the same scheduler as `project`, now on a clock."""
        return _ttfts_with_arrivals(
            [self.costs[t] for t in TERMS],
            prompt_tokens,
            cached_tokens,
            output_tokens,
            arrivals_s,
            (self.max_num_batched_tokens, self.max_num_seqs),
        )

    def capacity(
        self,
        prompt_tokens,
        cached_tokens,
        output_tokens: int,
        target_ms: float,
        *,
        seconds: float | None = None,
    ) -> float:
        """The highest Poisson rate whose projected p99 TTFT meets `target_ms` (bisection to within
        2%). With `seconds`, a run at rate r sends the first max(MIN_PROMPTS, r x seconds) prompts,
        as a benchmark run of that length does (a short run ends before its queue reaches a steady
        state); else all of them."""
        from lab.experiments.capacity import MIN_PROMPTS, highest_rate_meeting

        def p99(rate: float) -> float:
            n = len(prompt_tokens)
            if seconds is not None:
                n = min(n, max(MIN_PROMPTS, math.ceil(rate * seconds)))
            return self.p99_ttft_ms(prompt_tokens[:n], cached_tokens[:n], output_tokens, rate)

        return highest_rate_meeting(
            lambda rate: p99(rate) <= target_ms, low=1.0, high=2.0, tolerance=0.02, floor=1e-3
        )

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"term": list(TERMS), "seconds": [self.costs[t] for t in TERMS]})


def fit(
    batches: Sequence[pd.DataFrame], max_num_batched_tokens: int, max_num_seqs: int
) -> CostModel:
    """Costs from measured batches (lab.experiments.measure.run_workload rows, offline: all
    submitted at once)."""
    features, targets = [], []
    for rows in batches:
        plan = schedule(
            rows.prompt_tokens.tolist(),
            rows.cached_tokens.tolist(),
            rows.output_tokens.tolist(),
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        )
        features += list(plan.to_first_token) + [plan.to_end] * len(
            rows
        )  # the duration weighs as much as the TTFTs
        targets += rows.ttft_s.tolist() + [
            float((rows.arrival_s + rows.e2e_s).max() - rows.arrival_s.min())
        ] * len(rows)
    features, targets = np.array(features), np.array(targets)
    costs = _fit_non_negative(features, targets)
    error = float(np.median(np.abs(features @ costs - targets) / targets))
    return CostModel(
        dict(zip(TERMS, map(float, costs))), max_num_batched_tokens, max_num_seqs, error
    )


# (batch size, prompt tokens, of which a shared prefix, output tokens): short and long, cold and
# warm, 1-32 outputs
CALIBRATION = (
    (1, 1024, 0, 1),
    (4, 2048, 0, 1),
    (8, 256, 0, 16),
    (32, 128, 0, 8),
    (8, 1024, 768, 8),
    (16, 2048, 1792, 4),
    (32, 512, 256, 32),
    (64, 64, 0, 16),
    (16, 600, 512, 1),
    (4, 96, 0, 64),
)


def calibration_prompts(
    tokenizer, batch: int, tokens: int, shared: int, seed: int
) -> list[list[int]]:
    """`batch` prompts of `tokens` token ids whose first `shared` are the same
    (lab.experiments.generators)."""
    from lab.experiments.generators import shared_fraction_prompts

    return shared_fraction_prompts(tokenizer, batch, shared / tokens, tokens, seed=seed)


def calibrate(
    model_path: str | None = None, block_size: int | None = None, progress: bool = True
) -> CostModel:
    """Run CALIBRATION's batches on a fresh engine (caching on; the cache emptied before each batch,
    and its shared prefix computed once before it is timed) and fit the costs."""
    from tqdm.auto import tqdm

    from lab.experiments.measure import run_workload
    from lab.serving import vllm_internals
    from lab.serving.engine import make_llm

    llm = make_llm(model_path, block_size=block_size)
    tokenizer = llm.get_tokenizer()
    run_workload(
        llm, calibration_prompts(tokenizer, 8, 512, 0, seed=99), max_tokens=8, progress=False
    )  # first-run costs
    batches = []
    for k, (batch, tokens, shared, outputs) in enumerate(
        tqdm(CALIBRATION, desc="calibrating", disable=not progress)
    ):
        prompts = calibration_prompts(tokenizer, batch, tokens, shared, seed=k)
        llm.reset_prefix_cache()
        if shared:
            run_workload(llm, [prompts[0][:shared] + [prompts[0][0]]], max_tokens=1, progress=False)
        batches.append(run_workload(llm, prompts, max_tokens=outputs, progress=False).rows)
    return fit(
        batches,
        vllm_internals.tuning(llm, "max_num_batched_tokens"),
        vllm_internals.tuning(llm, "max_num_seqs"),
    )


def results_name(model_path: str | None = None) -> str:
    """The results name a fit is saved under: one per model and back-end."""
    from lab.serving.backend import backend
    from lab.serving.engine_settings import resolve_model

    return f"cost-model-{Path(resolve_model(model_path)).name}-{backend()}"


def save(model: CostModel, model_path: str | None = None, **details) -> str:
    """Save a fit as a results file (its costs, limits and fit error, with the hardware and
    `details`, e.g. the notebook whose run made it); returns the run id."""
    from lab.experiments.results import environment, save_results

    env = environment(
        max_num_batched_tokens=model.max_num_batched_tokens,
        max_num_seqs=model.max_num_seqs,
        fit_error=model.fit_error,
        calibration=[list(c) for c in CALIBRATION],
        **details,
    )
    return save_results(model.table(), results_name(model_path), env).stem


class Fit(NamedTuple):
    """A saved cost model and where it came from (its results file's metadata); unpacks as
    `model, meta`."""

    model: CostModel
    meta: dict

    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    @property
    def device(self) -> str:
        """The machine it was fitted on."""
        return self.meta["environment"]["device"]


def fitted(model_path: str | None = None, *, calibrate_if_missing: bool = False) -> Fit | None:
    """The newest fit for this model and back-end (results in use, else the canonical run) with its
    provenance; if there is none, a calibration saved now (`calibrate_if_missing`), or None."""
    from lab.experiments.results import load_latest_or_canonical

    try:  # a model directory the back-end cannot name is a missing fit too
        name = results_name(model_path)
        table, meta = load_latest_or_canonical(name)
    except FileNotFoundError:
        if not calibrate_if_missing:
            return None
        save(calibrate(model_path, progress=False), model_path)
        table, meta = load_latest_or_canonical(results_name(model_path))
    env = meta["environment"]
    costs = dict(zip(table.term, map(float, table.seconds)))
    model = CostModel(
        costs, int(env["max_num_batched_tokens"]), int(env["max_num_seqs"]), float(env["fit_error"])
    )
    return Fit(model, meta)
