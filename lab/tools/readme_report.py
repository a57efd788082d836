"""Write the generated parts of README.md and docs/RESULTS.md from the latest results files (what
`make run` just measured).

    python -m lab.tools.readme_report    # rewrites, between their markers, README.md's headline and summary
                                         # and docs/RESULTS.md's notebooks table and Results section

The numbers are gathered into one context (`results_context()`: plain values and pandas tables) and
the prose is in Jinja2 templates (`templates/headline.md.j2`, `summary.md.j2`, `results.md.j2`,
`notebooks.md.j2`), so a change of wording touches no code and no test. Nothing that can change is
typed in them: a lesson is named by the results file its number came from (the `lesson` and
`lesson_number` filters), a count is counted, and the table of notebooks is each notebook's own
title cell. Every part is rendered and every marker found before either file is written, and each
file is replaced atomically: a failure leaves both as they were.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pandas as pd

from lab import PROJECT_ROOT
from lab.core.model import MODELS_DIR, describe_model
from lab.experiments import article
from lab.experiments.findings import answer
from lab.experiments.gains import amdahl_bound
from lab.experiments.results import CANONICAL_DIR, hardware_line, load_latest, write_atomically
from lab.tools.benchmark_report import benchmark_rows, cluster_lines
from lab.tools.course_map import lessons
from lab.tools.findings_report import FINDINGS, findings_section
from lab.tools.quick_times import minutes_by_lesson, provenance, workshop_section
from lab.tools.report_contexts import (
    audit_context,
    capacity_context,
    gain_verdict,
    in_words,
    lesson,
    lesson_number,
    markdown_table,
    notebook_rows,
    number,
    routing_context,
    size_context,
    why_context,
)
from lab.tools.run_ledger import ledger_section
from lab.tools.runner import all_notebooks

README = PROJECT_ROOT / "README.md"
RESULTS = PROJECT_ROOT / "docs" / "RESULTS.md"
TESTING = PROJECT_ROOT / "docs" / "TESTING.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"  # docs/RESULTS.md
HEADLINE = (
    "<!-- headline:start -->",
    "<!-- headline:end -->",
)  # README.md: the one headline figure
SUMMARY = (
    "<!-- summary:start -->",
    "<!-- summary:end -->",
)  # README.md: the headline results, a few lines
CLUSTER = (
    "<!-- cluster:start -->",
    "<!-- cluster:end -->",
)  # README.md: the audit on Ray, measured and projected
NOTEBOOKS = (
    "<!-- notebooks:start -->",
    "<!-- notebooks:end -->",
)  # docs/RESULTS.md: the course's notebooks
BENCHMARKS = (
    "<!-- benchmarks:start -->",
    "<!-- benchmarks:end -->",
)  # docs/TESTING.md: the canonical benchmarks
FRESH_RUNS = (
    "<!-- fresh-runs:start -->",
    "<!-- fresh-runs:end -->",
)  # docs/TESTING.md: fresh-clone runs, from their logs
WORKSHOP = PROJECT_ROOT / "WORKSHOP.md"
LESSON_TIMES = (
    "<!-- lesson-times:start -->",
    "<!-- lesson-times:end -->",
)  # WORKSHOP.md: the canonical run's times
QUICK_TIMES = (
    "<!-- quick-times:start -->",
    "<!-- quick-times:end -->",
)  # WORKSHOP.md: each lesson's quick time
LESSONS = (
    "<!-- lessons:start -->",
    "<!-- lessons:end -->",
)  # README.md: the course's lessons, from the lessons
LESSONS_DIR = PROJECT_ROOT / "docs" / "lessons"
FIGURES_FROM_RESULTS = "../figures"  # docs/RESULTS.md links the figures relative to docs/
TEMPLATES = Path(__file__).with_name("templates")
LABELS = {
    "mean_ttft_ms": "mean TTFT (ms)",
    "p50_ttft_ms": "p50 TTFT (ms)",
    "p99_ttft_ms": "p99 TTFT (ms)",
    "mean_preprocess_ms": "mean wait before the engine (ms)",
    "mean_queue_ms": "mean queueing (ms)",
    "mean_prefill_ms": "mean prefill (ms)",
    "offered_rate_per_s": "arrival rate offered (req/s)",
    "requests_per_s": "requests/s",
    "hit_rate": "token hit rate",
    "peak_kv_blocks": "peak KV blocks in use",
    "peak_process_gib": "peak process memory (GiB)",
}
FIGURES = [
    ("with/without", "05_cache_on_vs_off-changes"),
    ("TTFT distribution", "05_cache_on_vs_off-ttft_cdf"),
    ("hit rate vs block size", "04_block_size_sweep-hit_rate"),
    ("TTFT breakdown under load", "03_ttft_breakdown-load"),
]
OPTIONAL_FIGURES = {  # shown when their notebook has run
    "capacity": [
        ("gain vs hit rate", "16_gain_vs_hit_rate-gain_vs_hit_rate"),
        ("TTFT vs offered rate", "17_capacity-ttft_vs_rate"),
    ],
    "routing": [
        ("hit rate by routing policy", "11_routing-hit_rate"),
        ("hits against queueing, 64 simulated replicas", "12_fleet_simulator-sim_tradeoff"),
    ],
    "why": [("why prompt tokens missed, by lesson", "14_why_it_missed-causes")],
    "size": [("the same hit rate on models of different size", "18_model_size-gain")],
    "traffic": [("hit rate against KV capacity on Mooncake's traces", "21_real_traffic-capacity")],
}


def traffic_context() -> dict | None:
    """Notebook 21: Kimi's hour against the KV capacity, the fleet, and the engine's slice (None
    until it has run)."""
    from lab.tools.report_contexts import _latest_or_none

    curve, meta = _latest_or_none("21_real_traffic-capacity")
    if curve is None:
        return None
    kimi = curve[curve.trace.str.startswith("Kimi")]
    fleet, engine = (
        load_latest("21_real_traffic-fleet")[0],
        load_latest("21_real_traffic-engine")[0],
    )
    at = dict(zip(kimi.kv_tokens, kimi.hit_rate))
    near = {
        want: min(at, key=lambda tokens: abs(tokens - want)) for want in (3_000_000, 50_000_000)
    }
    return {
        "run_id": meta["run_id"],
        "maximum": float(kimi.max_hit_rate.iloc[0]),
        "near": {want: (tokens, at[tokens]) for want, tokens in near.items()},
        "pooled": float(fleet.hit_rate.iloc[-1]),
        "local": markdown_table(fleet.round(3)),
        "engine": engine.set_index("concurrency"),
    }


def comparison_table(table: pd.DataFrame, with_article: bool) -> pd.DataFrame:
    rows = []
    for _, row in table.iterrows():
        cells = {
            "metric": LABELS.get(row.metric, row.metric),
            "cache off": row["cache off"],
            "cache on": row["cache on"],
            "change": "" if pd.isna(row["change_%"]) else f"{row['change_%']:+.0f}%",
        }
        if with_article:
            reported = row.metric in article.PAIRS
            off, on = article.pair(row.metric) if reported else (None, None)
            cells |= {
                "article off": off,
                "article on": on,
                "article change": f"{article.change_percent(row.metric):+.0f}%" if reported else "",
            }
        rows.append(cells)
    return pd.DataFrame(rows)


def online_context(online: pd.DataFrame, env: dict, offline: pd.DataFrame) -> dict:
    """The rate the seeded arrivals delivered where the results record it, else the planned mean
    rate."""
    rows = online.set_index("metric")
    offered = "offered_rate_per_s" in rows.index
    rate = rows.loc["offered_rate_per_s", "cache off"] if offered else env["online_rate"]
    no_cache = offline.set_index("metric").loc["requests_per_s", "cache off"]
    return {
        "prompts": env["online_prompts"],
        "offered": offered,
        "rate": rate,
        "planned": env["online_rate"],
        "share_of_offline": rate / no_cache,
    }


def claims_context() -> dict:
    """The verdicts of the claims ledger, counted, with what each rests on and the claims under
    each."""
    ledger = article.claims()
    table = pd.DataFrame(
        [
            {
                "verdict": v,
                "meaning": meaning,
                "claims": str(int((ledger.verdict == v).sum())),
                "basis": ", ".join(
                    f"{b} {n}" for b, n in ledger[ledger.verdict == v].basis.value_counts().items()
                ),
                "which": ", ".join(f"`{n}`" for n in ledger.index[ledger.verdict == v]),
            }
            for v, meaning in article.VERDICTS.items()
        ]
    )
    return {
        "total": len(ledger),
        "table": markdown_table(table),
        "counts": {v: int((ledger.verdict == v).sum()) for v in article.VERDICTS},
    }


def headline_context(offline: pd.DataFrame, online: pd.DataFrame) -> dict:
    """Notebook 05's mean TTFT and throughput offline, caching off and on, beside the article's own
    pair; and its mean TTFT online."""

    def measured(table: pd.DataFrame, metric: str) -> dict:
        row = table.set_index("metric").loc[metric]
        return {"off": row["cache off"], "on": row["cache on"], "change": row["change_%"]}

    return {
        "ttft": measured(offline, "mean_ttft_ms")
        | {
            "article": article.pair("mean_ttft_ms"),
            "article_change": article.change_percent("mean_ttft_ms"),
        },
        "rps": measured(offline, "requests_per_s"),
        "online_ttft": measured(online, "mean_ttft_ms"),
    }


def block_size_answers(findings: pd.DataFrame) -> dict[str, str]:
    """04's block-size findings as the pages show them: one size, sizes the run could not tell apart
    ("32 or 64"), or "cannot tell" where the run named none."""

    def shown(value) -> str:
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return "cannot tell"
        return str(int(value)) if isinstance(value, (int, float)) else str(value)

    return {row.id.removeprefix("block_size."): shown(row.value) for row in findings.itertuples()}


def finding_sentence(lesson: str, finding_id: str) -> str | None:
    """A lesson's finding as the pages show it, "[verdict] sentence", by id (None where its run
    saved none)."""
    try:
        found = answer(lesson, finding_id)
    except (FileNotFoundError, KeyError):
        return None
    return f"[{found.verdict}] {found.answer}"


def results_context() -> dict:
    """Every number and table the Results section shows, from the latest results files."""
    offline, meta = load_latest("05_cache_on_vs_off-offline")
    model = Path(
        meta["environment"]["model"]
    )  # a run in another clone: the same model built here describes it
    model = model if model.exists() else MODELS_DIR / model.name
    online, online_meta = load_latest("05_cache_on_vs_off-online")
    sizes, sweep_meta = load_latest(
        "04_block_size_sweep-findings"
    )  # 04's findings: its block size, one answer
    sizes = sizes[sizes.id.str.startswith("block_size.")]
    env, rows = meta["environment"], offline.set_index("metric")
    hit_rate = rows.loc["hit_rate", "cache on"]
    parts = {
        "capacity": capacity_context(),
        "routing": routing_context(),
        "why": why_context(),
        "size": size_context(),
        "traffic": traffic_context(),
    }
    figures = FIGURES + [
        figure for part, shown in OPTIONAL_FIGURES.items() if parts[part] for figure in shown
    ]
    return {
        "env": env,
        "run_id": meta["run_id"],
        "online_run_id": online_meta["run_id"],
        "hardware": hardware_line(env),
        "model": describe_model(model),
        "article_setting": article.SETTING,
        "offline_table": markdown_table(comparison_table(offline, with_article=True)),
        "online_table": markdown_table(comparison_table(online, with_article=False)),
        "gain": rows.loc["requests_per_s", "cache on"] / rows.loc["requests_per_s", "cache off"],
        "hit_rate": hit_rate,
        "bound": amdahl_bound(hit_rate),
        **dict(zip(("gain_verdict", "gain_verdict_run"), gain_verdict())),
        "article_gain": 1 + article.change_percent("requests_per_s") / 100,
        "online": online_context(online, online_meta["environment"], offline),
        "sweep_run_id": sweep_meta["run_id"],
        "block_sizes": block_size_answers(sizes),
        "audit": audit_context(),
        **parts,
        "size_finding": finding_sentence("18_model_size", "model_size.closer"),
        "size_margin": finding_sentence("18_model_size", "model_size.noticeably_closer"),
        "size_prefill": finding_sentence("18_model_size", "model_size.prefill_share"),
        "claims": claims_context(),
        "headline": headline_context(offline, online),
        "figures": [(alt, f"{FIGURES_FROM_RESULTS}/{name}.png") for alt, name in figures],
    }


def render(template: str, context: dict | None = None) -> str:
    """One template rendered with the results context (read afresh unless given)."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        lstrip_blocks=True,
    )
    environment.filters |= {
        "number": number,
        "lesson": lesson,
        "lesson_number": lesson_number,
        "in_words": in_words,
    }
    text = environment.get_template(template).render(**(context or results_context()))
    return re.sub(
        r"\n{3,}", "\n\n", text
    ).strip()  # a section left out leaves one blank line, not several


def results_section() -> str:
    """docs/RESULTS.md's generated Results section."""
    return render("results.md.j2")


def headline_section() -> str:
    """README.md's headline: notebook 05's TTFT change beside the article's."""
    return render("headline.md.j2")


def summary_section() -> str:
    """README.md's headline results: a few lines, each pointing to its full table in
    docs/RESULTS.md."""
    return render("summary.md.j2")


def notebooks_section() -> str:
    """docs/RESULTS.md's table of the notebooks: every notebook of the course, with its title and
    question."""
    return render("notebooks.md.j2", {"notebooks": markdown_table(notebook_rows(all_notebooks()))})


def benchmarks_section() -> str:
    """docs/TESTING.md's table of the canonical benchmarks, each with the machine and the lab's
    commit it timed."""
    table = benchmark_rows(CANONICAL_DIR)
    return (
        "Each benchmark's canonical run (`data/reference/results/bench_*`), with the machine and the lab's commit it "
        "timed:\n\n" + markdown_table(table)
    )


def lessons_section() -> str:
    """README.md's table of lessons: each lesson's own question and needs (its first cell), its
    quick-profile minutes (data/reference/quick_times.csv) and its executed copy."""
    minutes = minutes_by_lesson()
    rows = [
        f"| `{lesson.name}` | {lesson.question} | {minutes.get(lesson.name, 'not timed')} | "
        f"{', '.join(lesson.needs) or 'nothing'} | [executed](docs/lessons/{lesson.name}.ipynb) |"
        for lesson in lessons().values()
    ]
    source = f"from {provenance()}" if minutes else "not timed yet (`make quick-times` times them)"
    return (
        f"Minutes: the machine's time for a lesson with its own defaults (the `quick` profile), {source}; "
        "reading along takes longer.\n\n| notebook | the question it answers | minutes | needs first | read it |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows)
    )


def lesson_times_section(lessons_dir: Path = LESSONS_DIR) -> str:
    """WORKSHOP.md's seconds per lesson in the full profile, read from the executed copies the
    canonical run left (papermill's own timing of each; a copy marked older than its lesson says
    so)."""
    import json

    rows = []
    for path in sorted(lessons_dir.glob("*.ipynb")):
        metadata = json.loads(path.read_text())["metadata"]
        run = metadata.get("lab", {})
        rows.append(
            {
                "notebook": f"`{path.stem}`",
                "full profile (s)": round(metadata["papermill"]["duration"]),
                "run": f"`{run.get('run', '?')}`"
                + (" (its lesson changed since)" if "stale" in run else ""),
            }
        )
    table = pd.DataFrame(rows)
    total = table["full profile (s)"].sum()
    return (
        "The canonical executed lessons, each from its latest full-profile run (named in its row), "
        "lesson by lesson (seconds to execute every cell, as papermill timed them; "
        f"{total:,} s in all, {total / 60:.0f} min):\n\n" + markdown_table(table)
    )


def between(text: str, markers: tuple[str, str], body: str, name: str) -> str:
    """`text` with what lies between the two markers replaced by `body`; SystemExit when a marker is
    missing."""
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"{name} has no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def update_reports() -> None:
    """Rewrite the generated parts of README.md and docs/RESULTS.md: all rendered and checked first,
    then each file replaced atomically, so a failure (a missing results file, a missing marker)
    changes neither."""
    context = results_context()
    readme = between(README.read_text(), HEADLINE, render("headline.md.j2", context), README.name)
    readme = between(readme, SUMMARY, render("summary.md.j2", context), README.name)
    readme = between(readme, CLUSTER, cluster_lines(CANONICAL_DIR), README.name)
    readme = between(readme, LESSONS, lessons_section(), README.name)
    results = between(
        RESULTS.read_text(), (START, END), render("results.md.j2", context), "docs/RESULTS.md"
    )
    results = between(results, NOTEBOOKS, notebooks_section(), "docs/RESULTS.md")
    results = between(results, FINDINGS, findings_section(), "docs/RESULTS.md")
    testing = between(TESTING.read_text(), BENCHMARKS, benchmarks_section(), "docs/TESTING.md")
    testing = between(testing, FRESH_RUNS, ledger_section(), "docs/TESTING.md")
    workshop = between(WORKSHOP.read_text(), LESSON_TIMES, lesson_times_section(), WORKSHOP.name)
    workshop = between(workshop, QUICK_TIMES, workshop_section(), WORKSHOP.name)
    write_atomically(WORKSHOP, workshop, overwrite=True)
    write_atomically(RESULTS, results, overwrite=True)
    write_atomically(README, readme, overwrite=True)
    write_atomically(TESTING, testing, overwrite=True)
    print(
        f"updated the headline and summary of {README}, the notebooks and Results sections of {RESULTS} and the "
        f"benchmarks and fresh-clone runs of {TESTING} and the lesson times of {WORKSHOP}"
    )


if __name__ == "__main__":
    update_reports()
