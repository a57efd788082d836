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

`audit()` is the pipeline, one stage a module, each taking the trace and the settings (and the block
size chosen) and returning a small dataclass, gathered into an `AuditResult`: read (lab.audit.trace),
replay (lab.audit.replay.hit_rates), explain (lab.audit.what_ifs.why_it_missed), find what breaks
sharing (lab.audit.fields.what_breaks_sharing, lab.audit.breakers.breakers_for), project
(lab.audit.projection.project_and_confirm), advise a fleet (lab.audit.routing_advice); the report
(lab.audit.report) renders the result.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import pandas as pd

from lab.audit import cluster
from lab.audit.breakers import breakers_for
from lab.audit.fields import what_breaks_sharing
from lab.audit.piece_tokens import TokenEncoder
from lab.audit.projection import project_and_confirm
from lab.audit.prompts import load_tokenizer
from lab.audit.replay import hit_rates
from lab.audit.result import AuditResult, PromptLengths
from lab.audit.routing_advice import fleet_section, salt_cost
from lab.audit.settings import AuditSettings
from lab.audit.trace import read_trace
from lab.audit.what_ifs import why_it_missed
from lab.serving.engine_settings import accepted_block_sizes


class Laps:
    """`lap(name)`: the seconds since the previous lap, recorded under `name`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.clock = time.perf_counter()

    def __call__(self, name: str) -> None:
        self.seconds[name] = round(time.perf_counter() - self.clock, 2)
        self.clock = time.perf_counter()


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
    with on_ray as reading_workers:
        lap = Laps()
        tokenizer = load_tokenizer(settings.model)
        trace = read_trace(
            path,
            tokenizer,
            block_sizes=settings.block_sizes or accepted_block_sizes(),
            sample=max(settings.explained, settings.field_sample),
            settings=settings,
        )
        trace.check_capacity(settings.kv_tokens)
        lap("read and tokenize")
        rates = hit_rates(trace, settings)
        block_size = rates.best_size
        lap("hit rates")
        why = why_it_missed(trace, settings, tokenizer, block_size)
        lap("why it missed")
        # the field search, the projection and the breakers encode the same prompts
        encoder = TokenEncoder(tokenizer)
        sharing = what_breaks_sharing(trace, settings, encoder, block_size)
        lap("what breaks sharing")
        projections = project_and_confirm(trace, settings, why.misses, sharing, encoder, block_size)
        lap("projection and confirmation")
        breakers = breakers_for(trace, settings, tokenizer, encoder, rates, projections.cost_model)
        lap("prefix-breakers")
        fleet = fleet_section(trace, settings, block_size, rates.cached)
        lap("fleet")
        salt = salt_cost(trace, settings, block_size, shared=rates.by_block_size[block_size])
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
