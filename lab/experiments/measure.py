"""Run a workload through the real engine and record, per request, where its time to first token
went.

Per request, from vLLM's own timestamps: preprocessing (arrival to queued: tokenization, input
checks, and in online runs any wait for the engine loop to take the request in), queueing (queued to
first scheduled), prefill (scheduled to first token), TTFT (arrival to first token) and end-to-end
latency. Offline mode submits every request at once (the article's batch test); online mode submits
them at Poisson arrival times, so TTFT is what a user would see; sequential mode sends one request
at a time (no queueing: TTFT is preprocessing plus prefill).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lab.core.block_hash import token_hit_rate
from lab.serving import vllm_internals
from lab.serving.engine import check_prompts
from lab.serving.metrics import NUM_PREEMPTIONS

if TYPE_CHECKING:
    import vllm

MODES = ("offline", "online", "sequential")


@dataclass(frozen=True)
class Poisson:
    """Online arrivals: requests submitted at Poisson arrival times, `rate` per second on average
    (seeded)."""

    rate: float
    seed: int = 0

    def __post_init__(self) -> None:
        if (
            isinstance(self.rate, bool)
            or not isinstance(self.rate, int | float)
            or not self.rate > 0
        ):
            raise ValueError(
                f"rate={self.rate!r}: online mode needs a positive arrival rate in requests per second"
            )


def arrival_times(n: int, mode: str | Poisson) -> list[float]:
    """Seconds after the start at which each request is submitted: all at 0 for "offline" and
    "sequential"."""
    if isinstance(mode, Poisson):
        gaps = np.random.default_rng(mode.seed).exponential(1.0 / mode.rate, size=n)
        return np.concatenate([[0.0], np.cumsum(gaps[1:])]).tolist()
    if mode not in ("offline", "sequential"):
        raise ValueError(
            f"mode={mode!r}: use 'offline' (all at once), Poisson(rate=..., seed=...) (online "
            "arrivals) or 'sequential' (one at a time)"
        )
    return [0.0] * n


def process_memory_gib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30


@dataclass(frozen=True)
class RunFacts:
    """What a run measured as a whole, beside its per-request rows."""

    mode: str  # one of MODES
    rate: float | None  # the planned arrival rate of an online run (requests/s)
    max_tokens: int
    peak_kv_blocks: int  # KV blocks in use at the busiest step
    kv_blocks: int  # usable KV blocks in the engine's pool
    peak_process_gib: float  # this process's resident memory at its peak
    preemptions: int  # requests the engine preempted during the run


@dataclass(frozen=True)
class WorkloadRun:
    """One `run_workload` call: a row per request (in prompt order) and the run's facts."""

    rows: pd.DataFrame
    facts: RunFacts

    def summary(self) -> pd.Series:
        return summarize(self.rows, self.facts)


@dataclass(frozen=True)
class _Driven:
    """What stepping the engine through a run collected, in prompt order."""

    outputs: list
    submitted: list[float]  # when each request's TTFT clock started (s after the run's start)
    sent: list[float]  # when each was handed to the engine
    peak_kv_blocks: int
    peak_process_gib: float
    kv_blocks: int


def run_workload(
    llm: vllm.LLM,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_tokens: int = 16,
    mode: str | Poisson = "offline",
    progress: bool = True,
    salt_each: str | None = None,
) -> WorkloadRun:
    """A row per request (in prompt order) and the run's facts (peak KV blocks in use, peak process
    memory, preemptions). `mode`: "offline", "sequential" or `Poisson(rate, seed)` (online).
    `salt_each`: every request gets its own cache_salt (`salt_each` and its number), so none reuses
    another's blocks: a no-reuse baseline on the same engine."""
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError(
            "prompts is empty: pass a non-empty list of prompts (e.g. load_workload(...).prompts)"
        )
    arrivals = arrival_times(len(prompts), mode)
    token_ids = check_prompts(
        llm, prompts, max_tokens
    )  # every prompt is checked before any is sent
    preempted_before = preemptions(llm)
    driven = _drive(
        llm,
        token_ids,
        arrivals,
        max_tokens,
        progress,
        one_at_a_time=mode == "sequential",
        salt_each=salt_each,
    )
    rows = [
        _row(i, out, driven.submitted[i]) | {"sent_s": driven.sent[i]}
        for i, out in enumerate(driven.outputs)
    ]
    online = isinstance(mode, Poisson)
    facts = RunFacts(
        mode="online" if online else mode,
        rate=mode.rate if online else None,
        max_tokens=max_tokens,
        peak_kv_blocks=driven.peak_kv_blocks,
        kv_blocks=driven.kv_blocks,
        peak_process_gib=round(driven.peak_process_gib, 3),
        preemptions=preemptions(llm) - preempted_before,
    )
    return WorkloadRun(pd.DataFrame(rows), facts)


def preemptions(llm) -> int:
    """vLLM's count of requests preempted so far (their KV freed under memory pressure, recomputed
    later)."""
    return int(sum(m.value for m in llm.get_metrics() if m.name == NUM_PREEMPTIONS))


def _drive(
    llm, token_ids, arrivals, max_tokens, progress, one_at_a_time, salt_each=None
) -> _Driven:
    """Submit requests at their arrival times (or each when the previous one finished) and step the
    engine until all have finished."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = vllm_internals.engine_loop(llm)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    run = uuid.uuid4().hex[:8]
    pending = deque(enumerate(arrivals))
    outputs: dict[int, object] = {}
    submitted: dict[int, float] = {}  # when each request's TTFT clock starts
    sent: dict[int, float] = {}  # when it was handed to the engine
    peak_blocks, usable = vllm_internals.kv_blocks_in_use(llm), vllm_internals.num_kv_blocks(llm)
    peak_memory = process_memory_gib()
    start, start_wall = time.monotonic(), time.time()
    with tqdm(total=len(token_ids), desc="requests", disable=not progress, leave=False) as bar:
        while len(outputs) < len(token_ids):
            now = time.monotonic() - start
            while (
                pending
                and pending[0][1] <= now
                and not (one_at_a_time and engine.has_unfinished_requests())
            ):
                i, planned = pending.popleft()
                # A request that arrived while the engine was busy with a step is added late; its
                # planned arrival time still starts its TTFT clock, so that wait counts as the user
                # would see it.
                arrived = now if one_at_a_time else planned
                salt = {"cache_salt": f"{salt_each}-{i}"} if salt_each else {}
                engine.add_request(
                    f"{run}-{i}",
                    TokensPrompt(prompt_token_ids=token_ids[i], **salt),
                    params,
                    arrival_time=start_wall + arrived,
                )
                submitted[i], sent[i] = arrived, time.monotonic() - start
            if not engine.has_unfinished_requests():
                time.sleep(min(0.01, max(0.0, pending[0][1] - now)))
                continue
            for out in engine.step():
                if out.finished:
                    outputs[int(out.request_id.rsplit("-", 1)[1])] = out
                    bar.update()
            peak_blocks = max(peak_blocks, vllm_internals.kv_blocks_in_use(llm))
            peak_memory = max(peak_memory, process_memory_gib())
    order = range(len(token_ids))
    return _Driven(
        [outputs[i] for i in order],
        [submitted[i] for i in order],
        [sent[i] for i in order],
        peak_blocks,
        peak_memory,
        usable,
    )


def _row(i: int, out, arrival_s: float) -> dict:
    m = out.metrics
    ttft = m.first_token_latency
    return {
        "request": i,
        "prompt_tokens": len(out.prompt_token_ids),
        "cached_tokens": out.num_cached_tokens or 0,
        "output_tokens": len(out.outputs[0].token_ids),
        "arrival_s": arrival_s,
        "ttft_s": ttft,
        "preprocess_s": max(
            0.0, ttft - (m.first_token_ts - m.queued_ts)
        ),  # incl. any wait to be added
        "queue_s": m.scheduled_ts - m.queued_ts,
        "prefill_s": m.first_token_ts - m.scheduled_ts,
        "e2e_s": ttft + (m.last_token_ts - m.first_token_ts),
        "output_token_ids": tuple(out.outputs[0].token_ids),
    }


def summarize(df: pd.DataFrame, facts: RunFacts | None = None) -> pd.Series:
    """Latency percentiles, throughput and token-weighted hit rate (hits / queries, as vLLM counts)
    of a run's rows; with its facts, also the offered rate of an online run and the peaks of KV
    blocks and memory."""
    if df.empty:
        raise ValueError("summarize() needs at least one request row")
    makespan = (df.arrival_s + df.e2e_s).max() - df.arrival_s.min()
    ttft_ms = df.ttft_s * 1e3
    summary = {
        "requests": len(df),
        "mean_ttft_ms": ttft_ms.mean(),
        "p50_ttft_ms": ttft_ms.quantile(0.5),
        "p90_ttft_ms": ttft_ms.quantile(0.9),
        "p99_ttft_ms": ttft_ms.quantile(0.99),
        "mean_preprocess_ms": df.preprocess_s.mean() * 1e3,
        "mean_queue_ms": df.queue_s.mean() * 1e3,
        "mean_prefill_ms": df.prefill_s.mean() * 1e3,
        "requests_per_s": len(df) / makespan,
        "prompt_tokens_per_s": df.prompt_tokens.sum() / makespan,
        "output_tokens_per_s": df.output_tokens.sum() / makespan,
        "hit_rate": token_hit_rate(df.cached_tokens, df.prompt_tokens),
    }
    if facts is not None:
        if facts.mode == "online" and len(df) > 1:
            summary["offered_rate_per_s"] = offered_rate(df.arrival_s)
        summary |= {
            "peak_kv_blocks": facts.peak_kv_blocks,
            "peak_kv_usage": facts.peak_kv_blocks / facts.kv_blocks,
            "peak_process_gib": facts.peak_process_gib,
        }
    return pd.Series(summary, name="value")


def offered_rate(arrivals: Sequence[float]) -> float:
    """Requests per second that arrival (or send) times actually delivered, (n - 1) over their span:
    a seeded Poisson draw is not its mean rate. Infinite when they all came at once, NaN for fewer
    than two."""
    times = np.asarray(arrivals, dtype=float)
    if len(times) < 2:
        return float("nan")
    span = times.max() - times.min()
    return (len(times) - 1) / span if span > 0 else float("inf")


def compare(off: pd.Series, on: pd.Series) -> pd.DataFrame:
    """The with/without table: both values and the % change from off to on."""
    table = pd.DataFrame({"cache off": off, "cache on": on})
    table["change_%"] = (
        (table["cache on"] - table["cache off"])
        / table["cache off"].where(table["cache off"] != 0)
        * 100
    )
    return table
