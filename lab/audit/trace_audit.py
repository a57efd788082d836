"""`python -m lab.audit TRACE.jsonl`: the audit of a block-hash trace (lab.audit.block_trace), which
has reuse but no text. It reports what applies: the token hit rate at the KV capacity and at
infinite capacity, the capacity curve, the hit rate per window of arrival time, and the fleet (local
caches against one pooled cache). The sections that read the prompts' text (why each token missed,
the fields that break sharing, the block size, the projection on this model, the engine
confirmation) are named as needing text.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from lab.audit import cluster
from lab.audit.block_trace import (
    BlockTrace,
    cached_tokens,
    capacity_curve,
    first_requests,
    read_block_trace,
)
from lab.audit.settings import AuditSettings
from lab.audit.trace_fleet import fleet_table
from lab.core.block_hash import token_hit_rate
from lab.experiments.results import write_atomically
from lab.paths import folder

CURVE_TOKENS = (
    np.logspace(4, 9, 16).round(-3).astype(int)
)  # 1e4 to 1e9 tokens, as Mooncake's Figure 9
CURVE_REQUESTS = (
    20_000  # the curve and the fleet replay the first requests: every request of the shipped traces
)
WINDOWS = 12
NEEDS_TEXT = (
    "why each token missed (causes are told apart by the text)",
    "fields that break sharing",
    "the block size to use (a trace fixes its block size)",
    "the projection on a model",
    "the engine confirmation",
)


@dataclass(frozen=True)
class TraceAudit:
    """What a block-hash trace shows at the settings' KV capacity and replicas."""

    source: str
    format: str
    block_tokens: int
    requests: int
    input_tokens: int
    span_s: float
    kv_tokens: int
    hit_rate: float
    max_hit_rate: float
    curve: pd.DataFrame
    curve_requests: int
    windows: pd.DataFrame
    fleet: pd.DataFrame

    def to_json(self) -> dict:
        return {
            "kind": "block-hash trace",
            "file": self.source,
            "format": self.format,
            "block_tokens": self.block_tokens,
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "span_s": self.span_s,
            "kv_tokens": self.kv_tokens,
            "hit_rate": self.hit_rate,
            "max_hit_rate": self.max_hit_rate,
            "curve_requests": self.curve_requests,
            "curve": self.curve.to_dict("records"),
            "windows": self.windows.to_dict("records"),
            "fleet": self.fleet.to_dict("records"),
            "needs_text": list(NEEDS_TEXT),
        }


def windows(trace: BlockTrace, cached: np.ndarray, count: int = WINDOWS) -> pd.DataFrame:
    """The token hit rate per window of arrival time (equal widths over the trace's span)."""
    span = float(trace.arrival_s[-1]) or 1.0
    window = np.minimum((trace.arrival_s / span * count).astype(int), count - 1)
    frame = pd.DataFrame({"window": window, "input": trace.input_tokens, "cached": cached})
    table = (
        frame.groupby("window")
        .agg(
            requests=("input", "size"),
            input_tokens=("input", "sum"),
            cached_tokens=("cached", "sum"),
        )
        .reset_index()
    )
    return table.assign(
        start_s=table.window * span / count, hit_rate=table.cached_tokens / table.input_tokens
    )


# the settings a block-hash trace is audited with; the others need the prompts' text or tokens
TRACE_SETTINGS = ("kv_tokens", "replicas", "progress", "ray", "workers")


def ignored_settings(settings: AuditSettings) -> list[str]:
    """The settings changed from their defaults that a block-hash trace has no use for, as the flags
    that set them."""
    default = AuditSettings()
    return [
        f"--{f.name.replace('_', '-')}"
        for f in dataclasses.fields(AuditSettings)
        if f.name not in TRACE_SETTINGS and getattr(settings, f.name) != getattr(default, f.name)
    ]


def audit_trace(path: str | Path, settings: AuditSettings | None = None) -> TraceAudit:
    """Audit a block-hash trace at `settings.kv_tokens` (per node) and `settings.replicas` nodes."""
    settings = settings or AuditSettings()
    if settings.ray:
        with cluster.connected(settings.ray, settings.workers):
            return _audit_trace(path, settings)
    return _audit_trace(path, settings)


def _audit_trace(path: str | Path, settings: AuditSettings) -> TraceAudit:
    trace = read_block_trace(path)
    cached = cached_tokens(trace, settings.kv_tokens)
    head = first_requests(trace, CURVE_REQUESTS)
    curve = capacity_curve(head, CURVE_TOKENS, progress=settings.progress)
    return TraceAudit(
        source=str(path),
        format=trace.format,
        block_tokens=trace.block_tokens,
        requests=len(trace),
        input_tokens=int(trace.input_tokens.sum()),
        span_s=float(trace.arrival_s[-1]),
        kv_tokens=settings.kv_tokens,
        hit_rate=token_hit_rate(cached, trace.input_tokens),
        max_hit_rate=float(curve.max_hit_rate.iloc[0]),
        curve=curve,
        curve_requests=len(head),
        windows=windows(trace, cached),
        fleet=fleet_table(head, settings.replicas, settings.kv_tokens),
    )


def summary(result: TraceAudit) -> str:
    r = result
    lines = [
        f"{r.source}: a block-hash trace ({r.format}, {r.block_tokens}-token blocks, no text): {r.requests:,} "
        f"requests, {r.input_tokens:,} input tokens over {r.span_s / 60:.1f} min",
        f"  token hit rate at {r.kv_tokens:,} tokens of KV: {r.hit_rate:.1%}; with a cache that never evicts "
        f"({'the first ' + format(r.curve_requests, ',') + ' requests' if r.curve_requests < r.requests else 'every request'}): "
        f"{r.max_hit_rate:.1%}",
        "  capacity curve: "
        + ", ".join(f"{row.kv_tokens:.0e} {row.hit_rate:.1%}" for row in r.curve.itertuples())
        + _raised(r.curve),
        "  per window of arrival time: "
        + ", ".join(f"{row.hit_rate:.0%}" for row in r.windows.itertuples()),
    ]
    lines += [
        f"  {row.setup}: hit rate {row.hit_rate:.1%}, prefill tokens {row.prefill_tokens:,}"
        + (
            ""
            if pd.isna(row.busiest_node_load)
            else f", busiest node x{row.busiest_node_load:.2f} an even share"
        )
        for row in r.fleet.itertuples()
    ]
    lines.append("  needs the prompts' text, so not in this report: " + "; ".join(NEEDS_TEXT))
    return "\n".join(lines)


def _raised(curve: pd.DataFrame) -> str:
    raised = curve[curve.pool_tokens > curve.kv_tokens]
    return (
        f" (below {raised.pool_tokens.max():,} tokens the pool is raised to hold the longest request)"
        if len(raised)
        else ""
    )


def write(result: TraceAudit, out_dir: str | Path | None = None) -> Path:
    """The result as `audit-<file>-<UTC time>.json` under `out_dir` (default: the audit folder),
    never over another."""
    out = Path(out_dir) if out_dir else folder("audit")
    out.mkdir(parents=True, exist_ok=True)
    path = (
        out
        / f"audit-{Path(result.source).name.split('.')[0]}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.json"
    )
    write_atomically(path, json.dumps(result.to_json(), indent=1, default=float) + "\n")
    return path
