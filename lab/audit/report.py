"""An audit (lab.audit) as files: a self-contained HTML page (tables and figures, plotly inlined,
nothing fetched) and a JSON summary, written atomically under new names so no earlier report is
overwritten."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import plotly.express as px

from lab.audit.result import AuditResult
from lab.experiments.results import write_atomically
from lab.paths import folder


def figures(result: AuditResult) -> dict[str, object]:
    """The report's figures: uncached tokens by cause, hit rate by block size, each field's rewrite,
    the fleet."""
    misses = result.misses[result.misses.cause != "cached"]
    figs = {
        "Why prompt tokens missed": px.bar(
            misses,
            x="cause",
            y="tokens",
            text_auto=",",
            hover_data=["meaning"],
            labels={"tokens": "uncached prompt tokens", "cause": ""},
            title=f"Every uncached token, one cause each (block size {result.recommended_block_size})",
        )
    }
    figs["Token hit rate by block size"] = px.bar(
        result.hit_rates,
        x="cache",
        y="hit_rate",
        text_auto=".1%",
        labels={"hit_rate": "token hit rate", "cache": ""},
        title=f"Replayed through a cache of {result.kv_tokens:,} tokens, in arrival order",
    )
    if result.fields:
        steps = pd.DataFrame(
            [{"step": "as written", "hit_rate": result.fields[0].hit_rate_before}]
            + [
                {"step": f"'{short(f.label)}' moved to the end", "hit_rate": f.hit_rate_after}
                for f in result.fields
            ]
        )
        figs["What moving each field does"] = px.bar(
            steps,
            x="step",
            y="hit_rate",
            text_auto=".1%",
            labels={"hit_rate": "token hit rate", "step": ""},
            title="Rewritten and replayed (each step keeps the ones before)",
        )
    figs["Hit rate over time"] = _over_time(result)
    fleet = result.fleet.policies.assign(
        recommended=result.fleet.policies.policy == result.fleet.recommended_policy
    )
    figs["Routing across replicas (simulated)"] = px.bar(
        fleet,
        x="policy",
        y="fleet_hit_rate",
        color="recommended",
        hover_data=["imbalance"],
        text_auto=".1%",
        labels={"fleet_hit_rate": "fleet token hit rate"},
        title=f"{result.fleet.replicas} replicas, lab.experiments.fleet_sim",
    )
    return figs


def _over_time(result: AuditResult):
    """The hit rate per window of the replay (one cache, and the fleet) above the working set
    against the capacity."""
    from plotly.subplots import make_subplots

    t, unit = result.timeline, result.timeline_unit
    x_title = "seconds since the first request" if unit == "seconds" else "requests replayed"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    fig.add_scatter(x=t.start, y=t.hit_rate, name="one cache", mode="lines+markers", row=1, col=1)
    if t.fleet_hit_rate.notna().any():
        fig.add_scatter(
            x=t.start,
            y=t.fleet_hit_rate,
            name=f"{result.fleet.replicas} replicas, routed by {result.fleet.recommended_policy}",
            mode="lines+markers",
            row=1,
            col=1,
        )
    fig.add_scatter(
        x=t.start,
        y=t.working_set_tokens,
        name="working set (distinct blocks touched)",
        row=2,
        col=1,
    )
    fig.add_scatter(
        x=t.start,
        y=t.kv_tokens,
        name="KV capacity (one replica)",
        line={"dash": "dot"},
        row=2,
        col=1,
    )
    fig.update_yaxes(title_text="token hit rate", tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="tokens", row=2, col=1)
    fig.update_xaxes(title_text=x_title, row=2, col=1)
    fig.update_layout(
        title=f"The replay over time, window by window ({int(t.requests.sum()):,} requests; the fleet: "
        f"the first {result.fleet.sample:,})"
    )
    return fig


def short(label: str, width: int = 40) -> str:
    """A label on one line, at most `width` characters (the end kept: it is next to the value)."""
    flat = label.replace("\n", "⏎")
    return flat if len(flat) <= width else "…" + flat[-width:]


def changes_worth_making(result: AuditResult, min_points: float = 1.0, top: int = 2) -> list[str]:
    """The changes that raise the hit rate by `min_points` or more, the largest first, each with
    what it buys."""
    fields = result.fields
    found = (
        [
            (
                100 * (fields[-1].hit_rate_after - fields[0].hit_rate_before),
                "move "
                + " and ".join(f"'{short(f.label)}' ({f.kind})" for f in fields)
                + " to the end of the prompt: "
                f"hit rate {fields[0].hit_rate_before:.1%} -> {fields[-1].hit_rate_after:.1%} (replayed on the first "
                f"{result.field_sample:,} prompts)",
            )
        ]
        if fields
        else []
    )
    found += [
        (
            row.gain_points,
            f"{row.change}: hit rate -> {row.hit_rate:.1%} ({row.gain_points:+.1f} points, "
            f"removes '{row.cause}')",
        )
        for row in result.what_ifs.itertuples()
        if row.cause != "other_prefix"
    ]  # its change is the field move above
    b = result.breakers
    found += [
        (
            r.gain_points,
            f"{r.advice}: hit rate {r.hit_rate_before:.1%} -> {r.hit_rate_after:.1%} "
            f"({r.gain_points:+.1f} points, replayed on the first {r.prompts:,} prompts)",
        )
        for r in (b.recommendations if b else [])
        if not (fields and r.breaker == "leading_field")
    ]
    return [text for points, text in sorted(found, key=lambda f: -f[0]) if points >= min_points][
        :top
    ]


def verdict(result: AuditResult) -> list[str]:
    """What an engineer acts on, in a few lines: the hit rate, the gain, the changes worth making."""
    r, p, c = result, result.projection, result.confirmation
    lines = [
        f"Prefix caching serves {r.hit_rate_by_block_size[r.recommended_block_size]:.1%} of these "
        f"{r.prompts:,} prompts' tokens at block size {r.recommended_block_size} "
        f"(KV capacity {r.kv_tokens:,} tokens)."
    ]
    gains = (
        [f"projected throughput x{p.throughput_gain:.2f}, mean TTFT {p.ttft_change:+.0%}"]
        if p
        else []
    ) + (
        [
            f"measured on the engine (first {c.prompts} prompts): {c.gain_text()}, mean TTFT {c.ttft_change:+.0%}"
        ]
        if c
        else []
    )
    lines += ["With caching on: " + "; ".join(gains) + "."] if gains else []
    lines += [f"Is the projection right? {c.judgement()}"] if c else []
    changes = changes_worth_making(result)
    lines += [f"Worth changing: {c}" for c in changes] or [
        "Nothing worth changing: no change found raises the hit rate by a point or more."
    ]
    return lines


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
.verdict{background:#f3f7ff;border-left:5px solid #3867d6;padding:.6em 1.2em;font-size:1.08em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border-bottom:1px solid #ddd;padding:.3em .7em;text-align:left}
th{background:#fafafa}code{background:#f4f4f4;padding:0 .2em}small{color:#666}"""


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, float_format="{:.4f}".format, border=0, escape=True)


def to_html(result: AuditResult, json_name: str | None = None) -> str:
    """One page: the verdict first, then the evidence (why tokens missed, where prompts diverge,
    what each change does, block sizes, fields, routing), each with its table or figure."""
    r, figs = result, figures(result)
    parts = [
        f"<h1>Prefix-cache audit: {html.escape(Path(r.file).name)}</h1>",
        "<div class='verdict'>"
        + "".join(f"<p>{html.escape(line)}</p>" for line in verdict(r))
        + "</div>",
    ]
    for i, (title, fig) in enumerate(figs.items()):
        parts += [
            f"<h2>{html.escape(title)}</h2>",
            fig.to_html(full_html=False, include_plotlyjs=(i == 0)),
        ]
        if i == 0:
            parts += [
                _table(r.misses),
                "<h3>Where prompts stopped sharing text seen again later</h3>",
                _table(r.divergence_points)
                if len(r.divergence_points)
                else "<p>Nowhere: no text came back behind a different prefix.</p>",
                "<h3>Each cause taken away (replayed)</h3>",
                _table(r.what_ifs) if len(r.what_ifs) else "<p>No cause that a change removes.</p>",
                "<p><small>No miss is blamed on requests in flight: vLLM V1 registers a block when it schedules "
                "it, so a request arriving while another computes the same prefix shares it.</small></p>",
            ]
    if r.fields:
        parts += [
            "<h2>Fields that break sharing</h2>",
            _table(pd.DataFrame([vars(f) for f in r.fields])),
        ]
    if r.breakers:
        parts += _breakers_html(r.breakers)
    parts += ["<h2>Routing policies (simulated)</h2>", _table(r.fleet.policies)]
    if r.fleet_misses is not None:
        parts += [
            f"<h3>Why tokens missed across {r.fleet.replicas} replicas ({html.escape(r.fleet.recommended_policy)})"
            "</h3>",
            _table(r.fleet_misses),
        ]
    parts += ["<h2>Summary</h2>", f"<pre>{html.escape(terminal_summary(r))}</pre>"]
    if json_name:
        parts.append(
            f"<p>Every number above, as JSON: <a href='{html.escape(json_name)}'>{html.escape(json_name)}</a></p>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Prefix-cache audit</title>"
        f"<style>{STYLE}</style></head><body>" + "\n".join(parts) + "</body></html>\n"
    )


def audit_dir() -> Path:
    """Where reports go by default: runs/audit/ in the project (ignored by git), or LAB_AUDIT_DIR."""
    return folder("audit", create=False)


def write_report(result: AuditResult, out_dir: str | Path | None = None) -> list[Path]:
    """Write `audit-<file>-<UTC time>.html` and `.json` under `out_dir` (default: figures/)."""
    out = Path(out_dir) if out_dir else audit_dir()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"audit-{Path(result.file).stem}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    page, summary = out / f"{stem}.html", out / f"{stem}.json"
    write_atomically(page, to_html(result, summary.name))
    write_atomically(summary, json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return [page, summary]


def terminal_summary(result: AuditResult) -> str:
    """A short plain-text summary of an audit: the verdict, then the evidence."""
    r = result
    rates = ", ".join(f"{size}: {rate:.1%}" for size, rate in r.hit_rate_by_block_size.items())
    lines = verdict(r) + [
        "",
        f"{r.file}: {r.prompts:,} prompts ({len(r.skipped)} bad lines skipped), {r.prompt_tokens.mean:.0f} tokens "
        f"on average; KV capacity {r.kv_tokens:,} tokens",
        f"  token hit rate by block size: {rates}; radix tree {r.radix_hit_rate:.1%}",
        f"  recommended block size: {r.recommended_block_size}",
        "  why the rest missed: "
        + ", ".join(
            f"{row.cause} {row.share:.1%}"
            for row in r.misses.itertuples()
            if row.cause != "cached" and row.tokens
        ),
    ]
    lines += [
        f"    with {row.change}: {row.hit_rate:.1%} ({row.gain_points:+.1f} points)"
        for row in r.what_ifs.itertuples()
    ]
    lines += [
        f"  stopped sharing at token {row.position} in {row.requests} prompts: {row.excerpt}"
        for row in r.divergence_points.itertuples()
    ]
    lines.append(
        f"  prompts share a median {r.divergence.median_shared_fraction:.0%} of their text with their closest "
        "neighbour before diverging"
    )
    lines += [
        f"  breaks sharing: '{short(f.label)}' ({f.kind}, e.g. {short(f.examples[0])!r}) about "
        f"{f.median_token_position} tokens in, in {f.prompts} prompts; moved to the end: {f.hit_rate_before:.1%} "
        f"-> {f.hit_rate_after:.1%}"
        for f in r.fields
    ] or [
        "  breaks sharing: not searched (the log gives token ids, and the field search moves lines of text)"
        if r.field_sample == 0
        else "  breaks sharing: no field whose move to the end raises the hit rate by a point or more"
    ]
    lines += breaker_lines(r.breakers) if r.breakers else []
    lines.append(_projection_line(r))
    if c := r.confirmation:
        lines.append(
            f"  measured on the engine, first {c.prompts} prompts: hit rate {c.hit_rate:.1%}, throughput "
            f"{c.gain_text()}, mean TTFT {c.ttft_change:+.0%} (the cost model projects "
            f"x{c.projected.throughput_gain:.2f}, {c.projected.ttft_change:+.0%} for them)"
        )
    best = r.fleet.policies.set_index("policy").loc[r.fleet.recommended_policy]
    lines.append(
        f"  {r.fleet.replicas} replicas (simulated, {r.fleet.sample:,} prompts): recommended "
        f"{r.fleet.recommended_policy} at {best.fleet_hit_rate:.1%}, imbalance {best.imbalance:.2f}: "
        f"{r.fleet.reason}"
    )
    lines.append(_over_time_line(r))
    if t := r.tenant_salt:
        lines.append(
            f"  per-tenant cache_salt ({t.tenants} tenants): hit rate {t.hit_rate_shared:.1%} -> {t.hit_rate_salted:.1%}"
        )
    lines.append("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in r.seconds.items()))
    return "\n".join(lines)


def _over_time_line(r: AuditResult) -> str:
    t = r.timeline
    over = int((t.working_set_tokens > t.kv_tokens).sum())
    unit = (
        "of arrival time"
        if r.timeline_unit == "seconds"
        else "of requests, in file order (no timestamps)"
    )
    return (
        f"  over time ({len(t)} windows {unit}): hit rate {t.hit_rate.iloc[0]:.1%} in the first window, "
        f"{t.hit_rate.iloc[-1]:.1%} in the last (lowest {t.hit_rate.min():.1%}); the working set exceeds one "
        f"replica's KV capacity in {over} of them"
    )


def _projection_line(r: AuditResult) -> str:
    p, a = r.projection, r.after_moving_fields
    if p is None:
        return (
            "  projection: no cost model for this model on this back-end; audit with --confirm N (it fits one "
            "first, about a minute) or run notebook 15"
        )
    return (
        f"  projection (cost model {r.cost_model_run}, {r.cost_model_fitted_on}; first {p.prompts:,} prompts, "
        f"{p.output_tokens} output tokens each): throughput x{p.throughput_gain:.2f}, mean TTFT {p.ttft_change:+.0%} "
        f"(1/(1 - hit rate) would say x{p.naive_bound:.2f})"
        + (
            f"; after moving the fields: x{a.throughput_gain:.2f}, {a.ttft_change:+.0%}"
            if a
            else ""
        )
    )


def _projected(r) -> str:
    a, b = r.projected_before, r.projected_after
    if a is None or b is None:
        return "projected: no cost model for this model on this back-end"
    return (
        f"projected throughput x{a.throughput_gain:.2f} -> x{b.throughput_gain:.2f}, mean TTFT {a.ttft_change:+.0%} "
        f"-> {b.ttft_change:+.0%} (against no caching)"
    )


def _example(r) -> str:
    e = r.example
    if e is None:
        return "no pair of prompts shares a longer prefix because of it alone"
    return (
        f"lines {e.lines[0]} and {e.lines[1]} first differed at token {e.before_token:,}: {e.before[0]!r} / "
        f"{e.before[1]!r}; after the fix at token {e.after_token:,}: {e.after[0]!r} / {e.after[1]!r}"
    )


def breaker_lines(b) -> list[str]:
    """The prefix-breakers in the terminal summary: the fixes ranked by measured gain, then those
    not worth it."""
    head = (
        f"the first {b.prompts:,} prompts replayed at block size {b.block_size}, KV capacity {b.kv_tokens:,} "
        "tokens"
    )
    if not b.recommendations:
        lines = [
            f"  prefix-breakers: no fix found that gains {b.min_gain_points:.0f} point or more ({head}; checked "
            f"{', '.join(b.checked)})"
        ]
    else:
        lines = [
            f"  prefix-breakers, ranked by measured gain ({head}; each on top of the ones above):"
        ]
    for r in b.recommendations:
        sees = (
            "changes what the model sees"
            if r.changes_what_the_model_sees
            else "the model sees the same text"
        )
        lines += [
            f"    {r.rank}. {r.advice}: {r.requests:,} requests rewritten; hit rate {r.hit_rate_before:.1%} -> "
            f"{r.hit_rate_after:.1%} ({r.gain_points:+.1f} points)",
            f"       found: {r.found}",
            f"       {_projected(r)}",
            f"       {sees}: {r.caveat}",
            f"       e.g. {_example(r)}",
        ]
    lines += [
        f"    found, not worth changing: {n.breaker} ({n.found}): {n.reason}" for n in b.not_worth
    ]
    return lines + ([f"    beyond prefixes: {b.anywhere.sentence()}"] if b.anywhere else [])


def _breakers_html(b) -> list[str]:
    """The prefix-breakers section of the page: the ranked fixes, then those found but not worth
    making."""
    parts = [
        "<h2>Prefix-breakers, ranked by measured gain</h2>",
        f"<p>Each fix rewrites the first {b.prompts:,} prompts and replays them through the same chat template "
        f"and block pool (block size {b.block_size}, KV capacity {b.kv_tokens:,} tokens), on top of the fixes "
        f"ranked above it; only a fix that gains {b.min_gain_points:.0f} point or more is listed. Checked: "
        f"{html.escape(', '.join(b.checked))}.</p>",
    ]
    if b.recommendations:
        parts.append(
            _table(
                pd.DataFrame(
                    [
                        {
                            "rank": r.rank,
                            "change": r.advice,
                            "found": r.found,
                            "requests rewritten": r.requests,
                            "hit rate before": r.hit_rate_before,
                            "hit rate after": r.hit_rate_after,
                            "gain (points)": round(r.gain_points, 1),
                            "projection": _projected(r),
                            "changes what the model sees": (
                                "yes: " if r.changes_what_the_model_sees else "no: "
                            )
                            + r.caveat,
                            "example": _example(r),
                        }
                        for r in b.recommendations
                    ]
                )
            )
        )
    else:
        parts.append("<p>No fix gains enough: nothing to change here.</p>")
    if b.not_worth:
        parts += [
            "<h3>Found, not worth changing</h3>",
            _table(pd.DataFrame([vars(n) for n in b.not_worth])),
        ]
    if b.anywhere:
        parts += [
            "<h3>Beyond prefixes</h3>",
            f"<p>{html.escape(b.anywhere.sentence()[0].upper() + b.anywhere.sentence()[1:])}.</p>",
        ]
    return parts
