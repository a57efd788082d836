"""What an audit found (lab.audit.core): every section, read by attribute, and `to_json()` for the
report file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from lab.audit.breakers import Breakers
from lab.audit.fields import Divergence, Field
from lab.audit.projection import Confirmation, Projection
from lab.audit.routing_advice import FleetAdvice, SaltCost


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
    explained: (
        int  # the first requests (arrival order) whose misses, divergences and fleet are worked out
    )
    skipped: list[str]  # one message per bad line skipped (skip_bad)
    tokenizer: str
    prompt_tokens: PromptLengths
    kv_tokens: int
    hit_rates: (
        pd.DataFrame
    )  # cache, block_size, hit_rate: each block size (every request), the radix tree (explained)
    hit_rate_by_block_size: dict[int, float]
    radix_hit_rate: float
    recommended_block_size: int
    divergence: Divergence
    # cause, tokens, share, meaning: every prompt token of the explained requests, cached or why not
    misses: pd.DataFrame
    what_ifs: pd.DataFrame  # cause, change, hit_rate, gain_points: each cause taken away, replayed
    divergence_points: pd.DataFrame  # requests, other_prefix_tokens, position, excerpt
    fleet_misses: (
        pd.DataFrame | None
    )  # the same causes across the replicas, routed by the recommended policy
    timeline: (
        pd.DataFrame
    )  # per window: requests, hit_rate, fleet_hit_rate, working_set_tokens, kv_tokens
    # the windows' unit: "seconds" of arrival time, or "requests" when the log gives no times
    timeline_unit: str
    fields: list[Field]
    field_sample: int  # prompts the field search read
    projection: (
        Projection | None
    )  # None: no cost model for this model and back-end (and no engine run to fit one)
    after_moving_fields: Projection | None
    cost_model_run: str  # the results run of the cost model projected with
    cost_model_fitted_on: str
    confirmation: Confirmation | None
    fleet: FleetAdvice
    tenant_salt: SaltCost | None
    seconds: dict[str, float]
    replay: str = "one request at a time, in arrival order, least recently used evicted first"
    reading_workers: int = 1  # processes (or Ray actors) that parsed, tokenized and hashed the log
    breakers: Breakers | None = (
        None  # the prefix-breakers found, their fixes replayed and ranked by measured gain
    )

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
        del summary["fleet"][
            "routes"
        ]  # one entry per prompt: in the report's tables, not its summary
        return summary
