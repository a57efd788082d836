"""Audit your own prompts: what prefix caching will do for them, what breaks their sharing, and what to change.

    python -m lab.audit prompts.jsonl --replicas 4          # terminal summary, HTML + JSON report in runs/audit/
    result = audit("prompts.jsonl", replicas=4)             # the same from a notebook: result.hit_rates, ...

PROMPTS is JSONL: one request per line, `{"prompt": "..."}` or `{"messages": [...]}` (rendered with the
model's chat template), optionally with `arrival_s` (seconds; requests are replayed in that order) and
`tenant` (or `user`) and `cache_salt`. Every hit rate below is measured by replaying the token ids through the lab's
`PrefixCache` (vLLM V1's block pool) of a stated capacity, one request at a time in arrival order, and every
uncached token is given its cause (lab.audit.misses); the TTFT and throughput change is the engine's cost
model (lab.experiments.cost_model) applied to each request's cached tokens, and a short run on the real
engine confirms it on a sample.
"""


from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lab.audit.fields import Divergence, Field, breaking_fields, move_line_to_end, where_prompts_diverge
from lab.audit.fleet import FleetAdvice, SaltCost, fleet_policies, salt_cost
from lab.audit.misses import attribute
from lab.audit.projection import Confirmation, Projection, confirm_on_engine, project
from lab.audit.prompts import DEFAULT_KV_TOKENS, Prompts, encode, load_tokenizer, read_prompts
from lab.audit.replay import check_capacity, radix_hit_rate, replay_hit_rate
from lab.audit.timeline import timeline
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
    skipped: list[str]  # one message per bad line skipped (skip_bad)
    tokenizer: str
    prompt_tokens: PromptLengths
    kv_tokens: int
    hit_rates: pd.DataFrame  # cache, block_size, hit_rate: each block size and the radix tree
    hit_rate_by_block_size: dict[int, float]
    radix_hit_rate: float
    recommended_block_size: int
    divergence: Divergence
    misses: pd.DataFrame  # cause, tokens, share, meaning: every prompt token, cached or why not (lab.audit.misses)
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


def _hit_rates(prompts: Prompts, block_sizes: Sequence[int] | None, kv_tokens: int, progress: bool):
    """Replayed hit rate per block size and on the radix tree; the best size (ties: the larger block)."""
    from tqdm.auto import tqdm

    sizes = list(block_sizes or accepted_block_sizes())
    rates = {size: replay_hit_rate(prompts.token_ids, size, kv_tokens)
             for size in tqdm(sizes, desc="replaying per block size", disable=not progress, leave=False)}
    radix = radix_hit_rate(prompts.token_ids, kv_tokens)
    table = pd.DataFrame({"cache": [f"blocks of {s}" for s in sizes] + ["radix tree (token-granular)"],
                          "block_size": sizes + [1], "hit_rate": list(rates.values()) + [radix]})
    return table, rates, radix, max(sizes, key=lambda s: (round(rates[s], 3), s))


NO_FIT = {"run_id": "", "environment": {"device": ""}}  # no cost model for this model and back-end


def _why(prompts: Prompts, tokenizer, block_size: int, kv_tokens: int, block_sizes: Sequence[int] | None,
         sample: int, progress: bool):
    """Every uncached token's cause (all prompts), each cause's what-if and the divergence points (the first
    `sample` prompts: each what-if replays them again)."""
    salts = prompts.salts if any(prompts.salts) else None
    misses = attribute(prompts.token_ids, block_size=block_size, kv_tokens=kv_tokens, salts=salts, progress=progress,
                       hash_algo=REPLAY_HASH)
    ids = prompts.token_ids[:sample]
    sampled = misses if len(ids) == len(prompts.token_ids) else attribute(
        ids, block_size=block_size, kv_tokens=kv_tokens, salts=salts[:sample] if salts else None, hash_algo=REPLAY_HASH)
    changes = what_ifs(ids, sampled, salts=salts[:sample] if salts else None,
                       block_sizes=block_sizes or accepted_block_sizes())
    return misses, changes, divergence_points(prompts.token_ids, misses, tokenizer.decode)


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
          fleet_sample: int = 20_000, output_tokens: int = 8, skip_bad: bool = False,
          progress: bool = True) -> AuditResult:
    """Every section of the report for one prompts file (see the module docstring). `confirm` prompts run
    on the real engine (0: no engine; with an engine, a cost model is fitted first if this model and back-end
    have none); the field search, the fleet simulation and the projection use the first `field_sample`,
    `fleet_sample` and `fleet_sample` prompts, and say so. Projections assume `output_tokens` per answer."""
    for name, value, example in (("replicas", replicas, "4"), ("output_tokens", output_tokens, "8"),
                                 ("kv_tokens", kv_tokens, "your engine's KV capacity, 100000")):
        positive_int(name, value, f"a positive number, e.g. {example}")
    lap = Laps()
    tokenizer = load_tokenizer(model)
    prompts = read_prompts(path, tokenizer, skip_bad=skip_bad, progress=progress)
    check_capacity(prompts.token_ids, kv_tokens, prompts.lines, prompts.path)
    lap("read and tokenize")
    hit_rates, rates, radix, best_size = _hit_rates(prompts, block_sizes, kv_tokens, progress)
    lap("hit rates")
    misses, changes, points = _why(prompts, tokenizer, best_size, kv_tokens, block_sizes, fleet_sample, progress)
    lap("why it missed")
    texts, ids, tenants = _sample(prompts, field_sample)
    divergence = where_prompts_diverge(texts)
    fields = breaking_fields(texts, tokenizer, best_size, kv_tokens)
    lap("what breaks sharing")
    cost_model, fit_meta = fitted(model, calibrate_if_missing=confirm > 0) or (None, NO_FIT)
    projection = moved = confirmation = None
    if cost_model:
        projection = _project_first(cost_model, misses, fleet_sample, output_tokens)
        moved = _after_moving(fields, texts, tokenizer, best_size, kv_tokens, cost_model, output_tokens)
    if confirm:
        confirmation = confirm_on_engine(prompts.token_ids, model, best_size, confirm, max_tokens=output_tokens)
        confirmation.projected = _project_first(cost_model, misses, confirmation.prompts, output_tokens)
    lap("projection and confirmation")
    _, fleet_ids, fleet_tenants = _sample(prompts, fleet_sample)
    fleet = fleet_policies(fleet_ids, fleet_tenants, replicas, best_size, kv_tokens, progress=progress)
    fleet_attribution = attribute(fleet_ids, block_size=best_size, kv_tokens=kv_tokens, replicas=replicas,
                                  replica_of=fleet.routes, hash_algo=REPLAY_HASH) if replicas > 1 else None
    fleet_misses = fleet_attribution.table() if fleet_attribution else None
    over_time, unit = timeline(fleet_ids, prompts.arrivals or [None] * len(prompts.token_ids), misses.requests,
                               fleet_attribution.requests if fleet_attribution else None, block_size=best_size,
                               kv_tokens=kv_tokens)
    lap("fleet")
    salt = salt_cost(prompts.token_ids, prompts.tenants, best_size, kv_tokens, shared=rates[best_size])
    lap("tenant salt")
    lengths = pd.Series(list(map(len, prompts.token_ids)))
    return AuditResult(
        file=prompts.path, prompts=len(prompts.token_ids), skipped=prompts.skipped, tokenizer=str(model or "the lab's model"),
        prompt_tokens=PromptLengths(float(lengths.mean()), float(lengths.median()), int(lengths.max())),
        kv_tokens=kv_tokens, hit_rates=hit_rates, hit_rate_by_block_size={int(s): r for s, r in rates.items()},
        radix_hit_rate=radix, recommended_block_size=best_size, divergence=divergence, misses=misses.table(),
        what_ifs=changes, divergence_points=points, fleet_misses=fleet_misses, timeline=over_time, timeline_unit=unit,
        fields=fields,
        field_sample=len(texts), projection=projection, after_moving_fields=moved,
        cost_model_run=fit_meta["run_id"], cost_model_fitted_on=fit_meta["environment"]["device"],
        confirmation=confirmation, fleet=fleet, tenant_salt=salt, seconds=lap.seconds)
