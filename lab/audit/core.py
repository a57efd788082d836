"""Audit your own prompts: what prefix caching will do for them, what breaks their sharing, and what
to change.

    python -m lab.audit prompts.jsonl --replicas 4          # terminal summary, HTML + JSON report in runs/audit/
    result = audit("prompts.jsonl", replicas=4)             # the same from a notebook: result.hit_rates, ...
    result = audit("prompts.jsonl", AuditSettings(replicas=4, confirm=32))   # settings built once (lab.audit.settings)

PROMPTS is JSONL (gzipped or not) or Parquet: one request per line, `{"prompt": "..."}` or
`{"messages": [...]}` (rendered with the model's chat template, as the server renders it),
optionally with `arrival_s` or `timestamp` (requests are replayed in that order), `tenant` (or
`user`) and `cache_salt`. The log is read once, a chunk at a time (lab.audit.trace): every request's
blocks become 64-bit hash arrays, and only the first requests keep their token ids, so memory
follows the number of blocks, not of tokens. Every hit rate is measured by replaying those hashes
through vLLM V1's block pool of a stated capacity, one request at a time in arrival order (the same
replay as the lab's `PrefixCache`, block for block); on the first requests every uncached token is
given its cause (lab.audit.misses); the TTFT and throughput change is the engine's cost model
(lab.experiments.cost_model) applied to each request's cached tokens, and a short run on the real
engine confirms it on a sample when asked (`confirm`: off unless set; only then does an engine
start).

The prefix-breakers (lab.audit.breakers: passages in score order, tools in varying order, a field in
front, a history rewritten or cut, whitespace) are found in the first requests and each fix is
measured by replaying the rewritten requests through the same template and pool.

Each section takes the trace and the settings (and the block size chosen) and returns a small
dataclass; `audit()` runs them in turn and gathers them into an `AuditResult`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lab.audit import cluster
from lab.audit.breakers import Breakers, FixReplay, breakers_in
from lab.audit.fields import (
    Divergence,
    Field,
    breaking_fields,
    move_line_to_end,
    where_prompts_diverge,
)
from lab.audit.misses import Misses, Routes, attribute
from lab.audit.piece_tokens import TokenEncoder
from lab.audit.projection import Confirmation, Projection, confirm_on_engine, project
from lab.audit.prompts import encode, load_tokenizer
from lab.audit.replay import check_capacity, radix_hit_rate
from lab.audit.result import AuditResult, PromptLengths
from lab.audit.routing_advice import FleetAdvice, SaltCost, fleet_policies
from lab.audit.settings import AuditSettings
from lab.audit.timeline import Timeline, timeline
from lab.audit.trace import Trace, read_trace
from lab.audit.what_ifs import divergence_points, what_ifs
from lab.core.block_hash import REPLAY_HASH, kv_blocks
from lab.core.prefix_cache import PrefixCache
from lab.experiments.cost_model import fitted
from lab.serving.engine_settings import accepted_block_sizes


class Laps:
    """`lap(name)`: the seconds since the previous lap, recorded under `name`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        self.seconds[name] = round(time.perf_counter() - self.clock, 2)
        self.clock = time.perf_counter()


@dataclass
class HitRates:
    """The replay per block size over every request, the radix tree's over the first requests, the
    best size."""

    table: pd.DataFrame  # cache, block_size, hit_rate
    by_block_size: dict[int, float]
    radix: float
    best_size: int  # the highest hit rate, to a tenth of a point (ties: the larger block)
    cached: np.ndarray  # each request's cached tokens at the best size


def _replay_at(trace: Trace, kv_tokens: int, block_size: int) -> np.ndarray:
    return trace.replay(block_size, kv_tokens)


def _hit_rates(trace: Trace, settings: AuditSettings) -> HitRates:
    sizes = list(trace.blocks)
    replays = cluster.map_in_order(
        _replay_at,
        sizes,
        shared=(trace, settings.kv_tokens),
        desc="replaying",
        progress=settings.progress,
    )  # a Ray task per block size on a cluster
    cached = dict(zip(sizes, replays))
    rates = {size: int(c.sum()) / int(trace.lengths.sum()) for size, c in cached.items()}
    first = trace.sample.token_ids
    radix = radix_hit_rate(first, settings.kv_tokens)
    sizes = list(rates)
    radix_label = "radix tree (token-granular)"
    if len(first) != trace.requests:
        radix_label += f", first {len(first):,} requests"
    table = pd.DataFrame(
        {
            "cache": [f"blocks of {s}" for s in sizes] + [radix_label],
            "block_size": sizes + [1],
            "hit_rate": list(rates.values()) + [radix],
        }
    )
    best = max(sizes, key=lambda s: (round(rates[s], 3), s))
    return HitRates(table, {int(s): r for s, r in rates.items()}, radix, best, cached[best])


@dataclass
class WhyItMissed:
    """The explained requests' uncached tokens, one cause each; each cause taken away and replayed;
    where prompts stopped sharing text seen again later."""

    misses: Misses
    what_ifs: pd.DataFrame
    divergence_points: pd.DataFrame


def _why(trace: Trace, settings: AuditSettings, tokenizer, block_size: int) -> WhyItMissed:
    explained = trace.sample.head(settings.explained)
    salts = explained.salts if any(explained.salts) else None
    ids = tqdm(
        explained.token_ids, desc="attributing misses", disable=not settings.progress, leave=False
    )
    misses = attribute(
        ids, block_size=block_size, kv_tokens=settings.kv_tokens, salts=salts, hash_algo=REPLAY_HASH
    )
    changes = what_ifs(explained.token_ids, misses, salts=salts, block_sizes=list(trace.blocks))
    return WhyItMissed(
        misses, changes, divergence_points(explained.token_ids, misses, tokenizer.decode)
    )


@dataclass
class Sharing:
    """Where the first `field_sample` prompts diverge, and the fields that break their sharing."""

    texts: list[str]
    divergence: Divergence
    fields: list[Field]


def _sharing(
    trace: Trace, settings: AuditSettings, encoder: TokenEncoder, block_size: int
) -> Sharing:
    texts = trace.sample.texts[: settings.field_sample]
    if any(
        trace.sample.ids_given[: settings.field_sample]
    ):  # the field search moves lines of text and encodes them
        return Sharing(
            [], where_prompts_diverge(texts), []
        )  # again: token ids given have no text of their own
    fields = breaking_fields(texts, encoder, block_size, settings.kv_tokens)
    return Sharing(texts, where_prompts_diverge(texts), fields)


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
    cost_model: object | None = None  # lab.experiments.cost_model.CostModel, None without one


def _projections(
    trace: Trace,
    settings: AuditSettings,
    misses: Misses,
    sharing: Sharing,
    encoder: TokenEncoder,
    block_size: int,
) -> Projections:
    fit = fitted(settings.model, calibrate_if_missing=settings.confirm > 0)
    cost_model = fit.model if fit else None  # None: no cost model for this model and back-end
    projection = moved = confirmation = None
    if cost_model:
        projection = _project_first(
            cost_model, misses, len(misses.requests), settings.output_tokens
        )
        moved = _after_moving(
            sharing, encoder, block_size, settings.kv_tokens, cost_model, settings.output_tokens
        )
    if settings.confirm:
        confirmation = confirm_on_engine(
            trace.sample.token_ids,
            settings.model,
            block_size,
            settings.confirm,
            max_tokens=settings.output_tokens,
        )
        confirmation.projected = _project_first(
            cost_model, misses, confirmation.prompts, settings.output_tokens
        )
    run_id, device = (fit.run_id, fit.device) if fit else ("", "")
    return Projections(projection, moved, confirmation, run_id, device, cost_model)


def _project_first(cost_model, misses: Misses, prompts: int, output_tokens: int) -> Projection:
    rows = misses.requests.head(prompts)
    return project(cost_model, rows.prompt_tokens, rows.cached_tokens, output_tokens)


def _after_moving(
    sharing: Sharing,
    encoder: TokenEncoder,
    block_size: int,
    kv_tokens: int,
    cost_model,
    output_tokens: int,
) -> Projection | None:
    """The projection for the field search's prompts with every breaking field moved to the end."""
    if not sharing.fields:
        return None
    texts = sharing.texts
    for field in sharing.fields:
        texts = [move_line_to_end(t, field.label) for t in texts]
    ids = encode(encoder, texts)
    pool = PrefixCache(
        num_blocks=kv_blocks(kv_tokens, block_size), block_size=block_size, hash_algo=REPLAY_HASH
    )
    return project(cost_model, list(map(len, ids)), pool.replay(ids), output_tokens)


def _breakers(
    trace: Trace,
    settings: AuditSettings,
    tokenizer,
    encoder: TokenEncoder,
    rates: HitRates,
    cost_model,
) -> Breakers | None:
    """The prefix-breakers found in the first `field_sample` requests (lab.audit.breakers), each fix
    replayed at the chosen block size and capacity through the same template, ranked by measured
    gain (as sent: the hit rates' own replay of those requests). None for a log of token ids: each
    fix edits text and encodes it again."""
    if any(trace.sample.ids_given[: settings.field_sample]):
        return None
    return breakers_in(
        trace.sample,
        tokenizer,
        FixReplay.of(settings, rates.best_size, cost_model),
        count=settings.field_sample,
        encoder=encoder,
        cached=rates.cached,
    )


@dataclass
class FleetSection:
    """The router policies simulated over the explained requests, the causes of the recommended
    one's misses (None on one replica), and the replay over time (every request on one cache; the
    explained on the fleet)."""

    advice: FleetAdvice
    misses: pd.DataFrame | None
    over_time: Timeline


def _fleet(
    trace: Trace, settings: AuditSettings, block_size: int, cached: np.ndarray
) -> FleetSection:
    explained, kv_tokens, replicas = (
        trace.sample.head(settings.explained),
        settings.kv_tokens,
        settings.replicas,
    )
    advice = fleet_policies(
        explained.token_ids,
        explained.tenants,
        replicas,
        block_size,
        kv_tokens,
        progress=settings.progress,
    )
    routed = None
    if replicas > 1:
        routed = attribute(
            explained.token_ids,
            block_size=block_size,
            kv_tokens=kv_tokens,
            routes=Routes(advice.routes, replicas),
            hash_algo=REPLAY_HASH,
        )
    one_cache = pd.DataFrame({"prompt_tokens": trace.lengths, "cached_tokens": cached})

    def tokens_touched(window):
        return {w: n * block_size for w, n in trace.block_hash_sets(block_size, window).items()}

    over_time = timeline(
        trace.arrivals,
        one_cache,
        routed.requests if routed else None,
        tokens_touched,
        kv_tokens=kv_tokens,
    )
    return FleetSection(advice, routed.table() if routed else None, over_time)


def _salt_cost(
    trace: Trace, settings: AuditSettings, block_size: int, shared: float
) -> SaltCost | None:
    """The hit rate with one shared cache and with a `cache_salt` per tenant (which closes the
    timing side channel between tenants, and stops them sharing); None when the log names no
    tenants."""
    if not any(t is not None for t in trace.tenants):
        return None
    salted = trace.replay(
        block_size, settings.kv_tokens, salts=trace.tenants, progress=settings.progress
    )
    return SaltCost(len(set(trace.tenants)), shared, int(salted.sum()) / int(trace.lengths.sum()))


def _read(path: str | Path, settings: AuditSettings, tokenizer) -> Trace:
    """The log read once, hashed at every block size asked for (default: the back-end's), the first
    requests kept whole; refused when the KV capacity cannot hold its longest prompt."""
    trace = read_trace(
        path,
        tokenizer,
        block_sizes=settings.block_sizes or accepted_block_sizes(),
        sample=max(settings.explained, settings.field_sample),
        settings=settings,
    )
    check_capacity(trace.lengths, settings.kv_tokens, trace.lines, trace.path)
    return trace


def audit(path: str | Path, settings: AuditSettings | None = None, **overrides) -> AuditResult:
    """Every section of the report for one prompts file (see the module docstring), as `settings`
    say (default: AuditSettings()), with `overrides` in place of its fields: `audit(path,
    replicas=8)` is `audit(path, AuditSettings(replicas=8))`. Only `confirm` above 0 starts an
    engine."""
    settings = AuditSettings.build(settings, **overrides)
    on_ray = (
        cluster.connected(settings.ray, settings.workers)
        if settings.ray
        else nullcontext(settings.workers)
    )
    with on_ray as width:
        return _audit(path, settings, reading_workers=width)


def _audit(path: str | Path, settings: AuditSettings, reading_workers: int) -> AuditResult:
    lap = Laps()
    tokenizer = load_tokenizer(settings.model)
    trace = _read(path, settings, tokenizer)
    lap("read and tokenize")
    rates = _hit_rates(trace, settings)
    block_size = rates.best_size
    lap("hit rates")
    why = _why(trace, settings, tokenizer, block_size)
    lap("why it missed")
    encoder = TokenEncoder(
        tokenizer
    )  # the field search and the projection re-tokenize the same prompts
    sharing = _sharing(trace, settings, encoder, block_size)
    lap("what breaks sharing")
    projections = _projections(trace, settings, why.misses, sharing, encoder, block_size)
    lap("projection and confirmation")
    breakers = _breakers(trace, settings, tokenizer, encoder, rates, projections.cost_model)
    lap("prefix-breakers")
    fleet = _fleet(trace, settings, block_size, rates.cached)
    lap("fleet")
    salt = _salt_cost(trace, settings, block_size, shared=rates.by_block_size[block_size])
    lap("tenant salt")
    lengths = pd.Series(trace.lengths)
    return AuditResult(
        file=trace.path,
        prompts=trace.requests,
        explained=len(why.misses.requests),
        skipped=trace.skipped,
        tokenizer=str(settings.model or "the lab's model"),
        prompt_tokens=PromptLengths(
            float(lengths.mean()), float(lengths.median()), int(lengths.max())
        ),
        kv_tokens=settings.kv_tokens,
        hit_rates=rates.table,
        hit_rate_by_block_size=rates.by_block_size,
        radix_hit_rate=rates.radix,
        recommended_block_size=block_size,
        divergence=sharing.divergence,
        misses=why.misses.table(),
        what_ifs=why.what_ifs,
        divergence_points=why.divergence_points,
        fleet_misses=fleet.misses,
        timeline=fleet.over_time.table,
        timeline_unit=fleet.over_time.unit,
        fields=sharing.fields,
        field_sample=len(sharing.texts),
        projection=projections.projection,
        after_moving_fields=projections.after_moving_fields,
        cost_model_run=projections.cost_model_run,
        cost_model_fitted_on=projections.cost_model_fitted_on,
        confirmation=projections.confirmation,
        fleet=fleet.advice,
        tenant_salt=salt,
        seconds=lap.seconds,
        reading_workers=reading_workers,
        breakers=breakers,
    )
