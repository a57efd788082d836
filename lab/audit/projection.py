"""What caching would do to throughput and TTFT: the engine's cost model (lab.experiments.cost_model) applied to
the trace's own cached tokens per request, and a short confirmation on the real engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab.experiments.cost_model import CostModel


@dataclass
class Projection:
    """Throughput gain and mean TTFT change the cost model gives for a trace (a projection, not a measurement):
    cached prefill costs nothing and all else (steps, decoding, uncached prefill) stays. `naive_bound` is
    1 / (1 - hit rate), the gain if prefill were all the work."""
    hit_rate: float
    throughput_gain: float
    ttft_change: float
    naive_bound: float
    prompts: int
    output_tokens: int


@dataclass
class Confirmation:
    """A short run of the first `prompts` prompts on the real engine, caching off and then on."""
    prompts: int
    hit_rate: float
    throughput_gain: float
    ttft_change: float
    mean_ttft_ms_off: float
    mean_ttft_ms_on: float
    projected: Projection | None = None  # the cost model's projection for these prompts


def project(model: CostModel, prompt_tokens: Sequence[int], cached_tokens: Sequence[int],
            output_tokens: int = 8) -> Projection:
    """The cost model's projection for requests all submitted at once, each answering `output_tokens`."""
    hit_rate = sum(cached_tokens) / sum(prompt_tokens)
    p = model.project(prompt_tokens, cached_tokens, output_tokens)
    return Projection(hit_rate, p["throughput_gain"], p["ttft_change"], 1 / max(1 - hit_rate, 1e-9),
                      len(prompt_tokens), output_tokens)


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
