"""An audit (lab.audit) as files: a self-contained HTML page (tables and figures, plotly inlined, nothing
fetched) and a JSON summary, written atomically under new names so no earlier report is overwritten."""

from __future__ import annotations

import html
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import plotly.express as px

from lab import PROJECT_ROOT
from lab.audit.core import AuditResult
from lab.experiments.results import write_atomically


def figures(result: AuditResult) -> dict[str, object]:
    """The report's figures: hit rate by block size, each field's rewrite, the fleet's policies."""
    figs = {"Token hit rate by block size": px.bar(
        result.hit_rates, x="cache", y="hit_rate", text_auto=".1%", labels={"hit_rate": "token hit rate", "cache": ""},
        title=f"Replayed through a cache of {result.kv_tokens:,} tokens, in arrival order")}
    if result.fields:
        steps = pd.DataFrame([{"step": "as written", "hit_rate": result.fields[0].hit_rate_before}]
                             + [{"step": f"'{f.label}' moved to the end", "hit_rate": f.hit_rate_after}
                                for f in result.fields])
        figs["What moving each field does"] = px.bar(steps, x="step", y="hit_rate", text_auto=".1%",
                                                    labels={"hit_rate": "token hit rate", "step": ""},
                                                    title="Rewritten and replayed (each step keeps the ones before)")
    fleet = result.fleet.policies.assign(recommended=result.fleet.policies.policy == result.fleet.recommended_policy)
    figs["Routing across replicas (simulated)"] = px.bar(
        fleet, x="policy", y="fleet_hit_rate", color="recommended", hover_data=["imbalance"], text_auto=".1%",
        labels={"fleet_hit_rate": "fleet token hit rate"},
        title=f"{result.fleet.replicas} replicas, lab.experiments.fleet_sim")
    return figs


def to_html(result: AuditResult) -> str:
    """One page: the terminal summary, then every section's table and figure."""
    parts = [f"<h1>Prefix-cache audit: {html.escape(Path(result.file).name)}</h1>",
             f"<pre>{html.escape(terminal_summary(result))}</pre>"]
    for i, (title, fig) in enumerate(figures(result).items()):
        parts += [f"<h2>{html.escape(title)}</h2>", fig.to_html(full_html=False, include_plotlyjs=(i == 0))]
    parts += ["<h2>Hit rates</h2>", result.hit_rates.to_html(index=False, float_format="{:.4f}".format)]
    if result.fields:
        parts += ["<h2>What breaks sharing</h2>",
                  pd.DataFrame([vars(f) for f in result.fields]).to_html(index=False, float_format="{:.4f}".format)]
    parts += ["<h2>Routing policies (simulated)</h2>",
              result.fleet.policies.to_html(index=False, float_format="{:.4f}".format),
              "<h2>Summary (JSON)</h2>", f"<pre>{html.escape(json.dumps(result.to_json(), indent=1, default=str))}</pre>"]
    return "<!doctype html><html><head><meta charset='utf-8'><title>Prefix-cache audit</title></head><body>" + \
        "\n".join(parts) + "</body></html>\n"


def audit_dir() -> Path:
    """Where reports go by default: runs/audit/ in the project (ignored by git), or LAB_AUDIT_DIR."""
    return Path(os.environ.get("LAB_AUDIT_DIR", PROJECT_ROOT / "runs" / "audit"))


def write_report(result: AuditResult, out_dir: str | Path | None = None) -> list[Path]:
    """Write `audit-<file>-<UTC time>.html` and `.json` under `out_dir` (default: figures/)."""
    out = Path(out_dir) if out_dir else audit_dir()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"audit-{Path(result.file).stem}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    page, summary = out / f"{stem}.html", out / f"{stem}.json"
    write_atomically(page, to_html(result))
    write_atomically(summary, json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return [page, summary]


def terminal_summary(result: AuditResult) -> str:
    """A short plain-text summary of an audit."""
    r = result
    rates = ", ".join(f"{size}: {rate:.1%}" for size, rate in r.hit_rate_by_block_size.items())
    where = ", ".join(f"'{label}' ({n})" for label, n in r.divergence.labels)
    lines = [f"{r.file}: {r.prompts:,} prompts ({len(r.skipped)} bad lines skipped), {r.prompt_tokens.mean:.0f} tokens "
             f"on average; KV capacity {r.kv_tokens:,} tokens",
             f"  token hit rate by block size: {rates}; radix tree {r.radix_hit_rate:.1%}",
             f"  recommended block size: {r.recommended_block_size}",
             f"  prompts share a median {r.divergence.median_shared_fraction:.0%} of their text with their closest "
             f"neighbour before diverging, most often at: {where}"]
    lines += [f"  breaks sharing: '{f.label}' ({f.kind}, e.g. {f.examples[0]!r}) about {f.median_token_position} tokens "
              f"in, in {f.prompts} prompts; moved to the end: {f.hit_rate_before:.1%} -> {f.hit_rate_after:.1%}"
              for f in r.fields] or ["  breaks sharing: no field whose move to the end raises the hit rate by a point or more"]
    lines.append(_projection_line(r))
    if c := r.confirmation:
        lines.append(f"  measured on the engine, first {c.prompts} prompts: hit rate {c.hit_rate:.1%}, throughput "
                     f"x{c.throughput_gain:.2f}, mean TTFT {c.ttft_change:+.0%} (the curve projects "
                     f"x{c.projected.throughput_gain:.2f}, {c.projected.ttft_change:+.0%} at that hit rate)")
    best = r.fleet.policies.set_index("policy").loc[r.fleet.recommended_policy]
    lines.append(f"  {r.fleet.replicas} replicas (simulated, {r.fleet.sample:,} prompts): recommended "
                 f"{r.fleet.recommended_policy} at {best.fleet_hit_rate:.1%}, imbalance {best.imbalance:.2f}")
    if t := r.tenant_salt:
        lines.append(f"  per-tenant cache_salt ({t.tenants} tenants): hit rate {t.hit_rate_shared:.1%} -> {t.hit_rate_salted:.1%}")
    lines.append("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in r.seconds.items()))
    return "\n".join(lines)


def _projection_line(r: AuditResult) -> str:
    p, a = r.projection, r.after_moving_fields
    return (f"  projection (lab curve {r.curve_run}, {r.curve_measured_on}): throughput x{p.throughput_gain:.2f}, "
            f"mean TTFT {p.ttft_change:+.0%}" + ("" if p.within_measured_range else " (outside the measured range)")
            + (f"; after moving the fields: x{a.throughput_gain:.2f}, {a.ttft_change:+.0%}" if a else ""))
