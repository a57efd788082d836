"""Audit your own prompts: what prefix caching will do for them, what breaks their sharing, and what to change.

    python -m lab.audit prompts.jsonl --replicas 4          # terminal summary, HTML + JSON report in runs/audit/
    result = audit("prompts.jsonl", replicas=4)             # the same from a notebook: result.hit_rates, ...

PROMPTS is JSONL (gzipped or not) or Parquet: one request per line, `{"prompt": "..."}` or `{"messages": [...]}`
(rendered with the model's chat template, as the server renders it), optionally with `arrival_s` or `timestamp`
(requests are replayed in that order), `tenant` (or `user`) and `cache_salt`. The log is read once, a chunk at a
time (lab.audit.trace): every request's blocks become 64-bit hash arrays, and only the first requests keep their
token ids, so memory follows the number of blocks, not of tokens. Every hit rate is measured by replaying those
hashes through vLLM V1's block pool of a stated capacity, one request at a time in arrival order (the same
replay as the lab's `PrefixCache`, block for block); on the first requests every uncached token is given its
cause (lab.audit.misses); the TTFT and throughput change is the engine's cost model
(lab.experiments.cost_model) applied to each request's cached tokens, and a short run on the real engine confirms
it on a sample.
"""


from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lab.audit.fields import Divergence, Field, breaking_fields, move_line_to_end, where_prompts_diverge
from lab.audit.fleet import FleetAdvice, SaltCost, fleet_policies
from lab.audit.misses import attribute
from lab.audit.projection import Confirmation, Projection, confirm_on_engine, project
from lab.audit.prompts import DEFAULT_KV_TOKENS, Prompts, encode, load_tokenizer
from lab.audit.replay import check_capacity, radix_hit_rate
from lab.audit.timeline import timeline
from lab.audit.trace import Trace, read_trace
from lab.audit.what_ifs import divergence_points, what_ifs
from lab.checks import positive_int
from lab.core.block_hash import REPLAY_HASH
from lab.core.prefix_cache import PrefixCache
from lab.experiments.cost_model import fitted
from lab.serving.engine_settings import accepted_block_sizes


@dataclass
class PromptLengths:
    mean: float
    p50: float
    max: int


@dataclass
class AuditResult:
    """Every section of an audit, read by attribute; `to_json()` for the report file."""
    file: str
    prompts: int
    explained: int  # the first requests (arrival order) whose misses, divergences and fleet are worked out
    skipped: list[str]  # one message per bad line skipped (skip_bad)
    tokenizer: str
    prompt_tokens: PromptLengths
    kv_tokens: int
    hit_rates: pd.DataFrame  # cache, block_size, hit_rate: each block size (every request), the radix tree (explained)
    hit_rate_by_block_size: dict[int, float]
    radix_hit_rate: float
    recommended_block_size: int
    divergence: Divergence
    misses: pd.DataFrame  # cause, tokens, share, meaning: every prompt token of the explained requests, cached or why not
    what_ifs: pd.DataFrame  # cause, change, hit_rate, gain_points: each cause taken away, replayed
    divergence_points: pd.DataFrame  # requests, other_prefix_tokens, position, excerpt
    fleet_misses: pd.DataFrame | None  # the same causes across the replicas, routed by the recommended policy
    timeline: pd.DataFrame  # per window: requests, hit_rate, fleet_hit_rate, working_set_tokens, kv_tokens
    timeline_unit: str  # the windows' unit: "seconds" of arrival time, or "requests" when the log gives no times
    fields: list[Field]
    field_sample: int  # prompts the field search read
    projection: Projection | None  # None: no cost model for this model and back-end (and no engine run to fit one)
    after_moving_fields: Projection | None
    cost_model_run: str  # the results run of the cost model projected with
    cost_model_fitted_on: str
    confirmation: Confirmation | None
    fleet: FleetAdvice
    tenant_salt: SaltCost | None
    seconds: dict[str, float]
    replay: str = "one request at a time, in arrival order, least recently used evicted first"
    reading_workers: int = 1  # processes that parsed, tokenized and hashed the log

    def to_json(self) -> dict:
        """Plain values only (tables as lists of records), for a JSON summary."""
        def plain(value):
            if isinstance(value, pd.DataFrame):
                return value.to_dict("records")
            if dataclasses.is_dataclass(value):
                return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        summary = plain(self) | {"skipped_lines": len(self.skipped)}
        if self.confirmation:  # the engine run's word on the projection, as the report says it
            summary["confirmation"]["judgement"] = self.confirmation.judgement().text
        del summary["fleet"]["routes"]  # one entry per prompt: in the report's tables, not its summary
        return summary


def _sample(prompts: Prompts, size: int) -> tuple[list[str], list[list[int]], list[str | None]]:
    """The first `size` prompts (arrival order is what the cache sees, so a sample keeps it)."""
    return prompts.texts[:size], prompts.token_ids[:size], prompts.tenants[:size]


class Laps:
    """`lap(name)`: the seconds since the previous lap, recorded under `name`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        self.seconds[name] = round(time.perf_counter() - self.clock, 2)
        self.clock = time.perf_counter()


def _hit_rates(trace: Trace, sample: Prompts, kv_tokens: int, progress: bool):
    """Replayed hit rate per block size over every request, and on the radix tree over the sample; the best size
    (ties: the larger block) and each request's cached tokens at it."""
    cached = {size: trace.replay(size, kv_tokens, progress=progress) for size in trace.blocks}
    rates = {size: int(c.sum()) / int(trace.lengths.sum()) for size, c in cached.items()}
    radix = radix_hit_rate(sample.token_ids, kv_tokens)
    sizes = list(rates)
    radix_label = "radix tree (token-granular)" + ("" if len(sample.token_ids) == trace.requests
                                                   else f", first {len(sample.token_ids):,} requests")
    table = pd.DataFrame({"cache": [f"blocks of {s}" for s in sizes] + [radix_label],
                          "block_size": sizes + [1], "hit_rate": list(rates.values()) + [radix]})
    best = max(sizes, key=lambda s: (round(rates[s], 3), s))
    return table, rates, radix, best, cached[best]


NO_FIT = {"run_id": "", "environment": {"device": ""}}  # no cost model for this model and back-end


def _why(prompts: Prompts, tokenizer, block_size: int, kv_tokens: int, block_sizes: Sequence[int],
         sample: int, progress: bool):
    """Every uncached token's cause (the explained requests), each cause's what-if and the divergence points (the
    first `sample` of them: each what-if replays them again)."""
    salts = prompts.salts if any(prompts.salts) else None
    misses = attribute(prompts.token_ids, block_size=block_size, kv_tokens=kv_tokens, salts=salts, progress=progress,
                       hash_algo=REPLAY_HASH)
    ids = prompts.token_ids[:sample]
    sampled = misses if len(ids) == len(prompts.token_ids) else attribute(
        ids, block_size=block_size, kv_tokens=kv_tokens, salts=salts[:sample] if salts else None, hash_algo=REPLAY_HASH)
    changes = what_ifs(ids, sampled, salts=salts[:sample] if salts else None, block_sizes=block_sizes)
    return misses, changes, divergence_points(prompts.token_ids, misses, tokenizer.decode)


def _projections(cost_model, misses, fields, texts, prompts: Prompts, tokenizer, model, block_size: int,
                 kv_tokens: int, confirm: int, output_tokens: int):
    """The projection for the explained requests, for the sampled ones with the breaking fields moved, and the
    engine's confirmation on the first `confirm` (None where there is no cost model, or no engine run)."""
    projection = moved = confirmation = None
    if cost_model:
        projection = _project_first(cost_model, misses, len(misses.requests), output_tokens)
        moved = _after_moving(fields, texts, tokenizer, block_size, kv_tokens, cost_model, output_tokens)
    if confirm:
        confirmation = confirm_on_engine(prompts.token_ids, model, block_size, confirm, max_tokens=output_tokens)
        confirmation.projected = _project_first(cost_model, misses, confirmation.prompts, output_tokens)
    return projection, moved, confirmation


def _fleet(trace: Trace, explained: Prompts, cached, replicas: int, block_size: int, kv_tokens: int, progress: bool):
    """The policies simulated over the explained requests, the causes of the recommended one's misses, and the replay
    over time (every request on one cache; the explained ones on the fleet)."""
    fleet = fleet_policies(explained.token_ids, explained.tenants, replicas, block_size, kv_tokens, progress=progress)
    routed = attribute(explained.token_ids, block_size=block_size, kv_tokens=kv_tokens, replicas=replicas,
                       replica_of=fleet.routes, hash_algo=REPLAY_HASH) if replicas > 1 else None
    one_cache = pd.DataFrame({"prompt_tokens": trace.lengths, "cached_tokens": cached})
    over_time, unit = timeline(trace.arrivals, one_cache, routed.requests if routed else None,
                               lambda window: trace.block_hash_sets(block_size, window), block_size=block_size,
                               kv_tokens=kv_tokens)
    return fleet, routed.table() if routed else None, over_time, unit


def _salt_cost(trace: Trace, block_size: int, kv_tokens: int, shared: float, progress: bool) -> SaltCost | None:
    """The hit rate with one shared cache and with a `cache_salt` per tenant (which closes the timing side channel
    between tenants, and stops them sharing); None when the log names no tenants."""
    if not any(t is not None for t in trace.tenants):
        return None
    salted = trace.replay(block_size, kv_tokens, salts=trace.tenants, progress=progress)
    return SaltCost(len(set(trace.tenants)), shared, int(salted.sum()) / int(trace.lengths.sum()))


def _project_first(cost_model, misses, prompts: int, output_tokens: int) -> Projection:
    rows = misses.requests.head(prompts)
    return project(cost_model, rows.prompt_tokens, rows.cached_tokens, output_tokens)


def _after_moving(fields: list[Field], texts: list[str], tokenizer, block_size: int, kv_tokens: int,
                  cost_model, output_tokens: int) -> Projection | None:
    """The projection for the sampled prompts with every breaking field moved to the end."""
    if not fields:
        return None
    for field in fields:
        texts = [move_line_to_end(t, field.label) for t in texts]
    ids = encode(tokenizer, texts)
    cached = PrefixCache(num_blocks=kv_tokens // block_size, block_size=block_size, hash_algo=REPLAY_HASH).replay(ids)
    return project(cost_model, list(map(len, ids)), cached, output_tokens)


def audit(path: str | Path, *, model: str | None = None, kv_tokens: int = DEFAULT_KV_TOKENS,
          block_sizes: Sequence[int] | None = None, replicas: int = 4, confirm: int = 32, field_sample: int = 2000,
          fleet_sample: int = 5_000, output_tokens: int = 8, skip_bad: bool = False,
          progress: bool = True, workers: int = 1) -> AuditResult:
    """Every section of the report for one prompts file (see the module docstring). The hit rates per block size,
    the replay over time and the per-tenant salt cover every request; the causes of the misses, the fleet
    simulation and the projection the first `fleet_sample` requests in arrival order, and the field search the
    first `field_sample`, and say so. `confirm` prompts run on the real engine (0: no engine; with one, a cost model
    is fitted first if none is), projections assume `output_tokens` per answer, `workers` processes read the log."""
    for name, value, example in (("replicas", replicas, "4"), ("output_tokens", output_tokens, "8"),
                                 ("kv_tokens", kv_tokens, "your engine's KV capacity, 100000"),
                                 ("fleet_sample", fleet_sample, "5000"), ("field_sample", field_sample, "2000")):
        positive_int(name, value, f"a positive number, e.g. {example}")
    lap = Laps()
    tokenizer = load_tokenizer(model)
    sizes = list(block_sizes or accepted_block_sizes())
    trace = read_trace(path, tokenizer, block_sizes=sizes, sample=max(fleet_sample, field_sample), skip_bad=skip_bad,
                       progress=progress, workers=workers)
    prompts = trace.sample
    check_capacity(trace.lengths, kv_tokens, trace.lines, trace.path)
    lap("read and tokenize")
    hit_rates, rates, radix, best_size, cached = _hit_rates(trace, prompts, kv_tokens, progress)
    lap("hit rates")
    explained = prompts.head(fleet_sample)
    misses, changes, points = _why(explained, tokenizer, best_size, kv_tokens, sizes, fleet_sample, progress)
    lap("why it missed")
    texts, ids, tenants = _sample(prompts, field_sample)
    divergence = where_prompts_diverge(texts)
    fields = breaking_fields(texts, tokenizer, best_size, kv_tokens)
    lap("what breaks sharing")
    cost_model, fit_meta = fitted(model, calibrate_if_missing=confirm > 0) or (None, NO_FIT)
    projection, moved, confirmation = _projections(cost_model, misses, fields, texts, prompts, tokenizer, model,
                                                   best_size, kv_tokens, confirm, output_tokens)
    lap("projection and confirmation")
    fleet, fleet_misses, over_time, unit = _fleet(trace, explained, cached, replicas, best_size, kv_tokens, progress)
    lap("fleet")
    salt = _salt_cost(trace, best_size, kv_tokens, shared=rates[best_size], progress=progress)
    lap("tenant salt")
    lengths = pd.Series(trace.lengths)
    return AuditResult(
        file=trace.path, prompts=trace.requests, explained=len(explained.token_ids), skipped=trace.skipped,
        tokenizer=str(model or "the lab's model"),
        prompt_tokens=PromptLengths(float(lengths.mean()), float(lengths.median()), int(lengths.max())),
        kv_tokens=kv_tokens, hit_rates=hit_rates, hit_rate_by_block_size={int(s): r for s, r in rates.items()},
        radix_hit_rate=radix, recommended_block_size=best_size, divergence=divergence, misses=misses.table(),
        what_ifs=changes, divergence_points=points, fleet_misses=fleet_misses, timeline=over_time, timeline_unit=unit,
        fields=fields,
        field_sample=len(texts), projection=projection, after_moving_fields=moved,
        cost_model_run=fit_meta["run_id"], cost_model_fitted_on=fit_meta["environment"]["device"],
        confirmation=confirmation, fleet=fleet, tenant_salt=salt, seconds=lap.seconds, reading_workers=workers)
