"""Write the README's Results section from the latest results files (what `make run` just measured).

    python -m lab.tools.readme_report            # rewrites the part of README.md between the results markers

The numbers are gathered into a context (`results_context()`: plain values and pandas tables) and the prose
is the Jinja2 template `templates/results.md.j2`, so a change of wording touches no code and no test.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pandas as pd

from lab import PROJECT_ROOT
from lab.core.model import describe_model
from lab.experiments import article
from lab.experiments.block_sizes import recommend_block_size
from lab.experiments.results import hardware_line, load_latest
from lab.tools.report_contexts import (
    audit_context,
    capacity_context,
    markdown_table,
    routing_context,
    size_context,
    why_context,
)

README = PROJECT_ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
TEMPLATES = Path(__file__).with_name("templates")
LABELS = {
    "mean_ttft_ms": "mean TTFT (ms)", "p50_ttft_ms": "p50 TTFT (ms)", "p99_ttft_ms": "p99 TTFT (ms)",
    "mean_preprocess_ms": "mean wait before the engine (ms)", "mean_queue_ms": "mean queueing (ms)",
    "mean_prefill_ms": "mean prefill (ms)", "offered_rate_per_s": "arrival rate offered (req/s)", "requests_per_s": "requests/s",
    "hit_rate": "token hit rate", "peak_kv_blocks": "peak KV blocks in use", "peak_process_gib": "peak process memory (GiB)",
}
FIGURES = [("with/without", "05_cache_on_vs_off-changes"), ("TTFT distribution", "05_cache_on_vs_off-ttft_cdf"),
           ("hit rate vs block size", "04_block_size_sweep-hit_rate"), ("TTFT breakdown under load", "03_ttft_breakdown-load")]
OPTIONAL_FIGURES = {  # shown when their notebook has run
    "capacity": [("gain vs hit rate", "12_capacity-gain_vs_hit_rate"), ("TTFT vs offered rate", "12_capacity-ttft_vs_rate")],
    "routing": [("hit rate by routing policy", "10_routing-hit_rate"),
                ("hits against queueing, 64 simulated replicas", "10_routing-sim_tradeoff")],
    "why": [("why prompt tokens missed, by lesson", "11_why_it_missed-causes")],
    "size": [("the same hit rate on models of different size", "13_model_size-gain")],
}


def comparison_table(table: pd.DataFrame, with_article: bool) -> pd.DataFrame:
    rows = []
    for _, row in table.iterrows():
        cells = {"metric": LABELS.get(row.metric, row.metric), "cache off": row["cache off"], "cache on": row["cache on"],
                 "change": "" if pd.isna(row["change_%"]) else f"{row['change_%']:+.0f}%"}
        if with_article:
            reported = row.metric in article.PAIRS
            off, on = article.pair(row.metric) if reported else (None, None)
            cells |= {"article off": off, "article on": on,
                      "article change": f"{article.change_percent(row.metric):+.0f}%" if reported else ""}
        rows.append(cells)
    return pd.DataFrame(rows)


def online_context(online: pd.DataFrame, env: dict, offline: pd.DataFrame) -> dict:
    """The rate the seeded arrivals delivered where the results record it, else the planned mean rate."""
    rows = online.set_index("metric")
    offered = "offered_rate_per_s" in rows.index
    rate = rows.loc["offered_rate_per_s", "cache off"] if offered else env["online_rate"]
    no_cache = offline.set_index("metric").loc["requests_per_s", "cache off"]
    return {"prompts": env["online_prompts"], "offered": offered, "rate": rate, "planned": env["online_rate"],
            "share_of_offline": rate / no_cache}


def claims_context() -> dict:
    """The verdicts of the claims ledger, counted, with what each rests on and the claims under each."""
    ledger = article.claims()
    table = pd.DataFrame([{"verdict": v, "meaning": meaning, "claims": str(int((ledger.verdict == v).sum())),
                           "basis": ", ".join(f"{b} {n}" for b, n in ledger[ledger.verdict == v].basis.value_counts().items()),
                           "which": ", ".join(f"`{n}`" for n in ledger.index[ledger.verdict == v])}
                          for v, meaning in article.VERDICTS.items()])
    return {"total": len(ledger), "table": markdown_table(table)}


def results_context() -> dict:
    """Every number and table the Results section shows, from the latest results files."""
    offline, meta = load_latest("05_cache_on_vs_off-offline")
    model = Path(meta["environment"]["model"])  # a run in another clone: the same model built here describes it
    model = model if model.exists() else PROJECT_ROOT / "models" / model.name
    online, online_meta = load_latest("05_cache_on_vs_off-online")
    sweep, sweep_meta = load_latest("04_block_size_sweep-vllm")
    env, rows = meta["environment"], offline.set_index("metric")
    hit_rate = rows.loc["hit_rate", "cache on"]
    parts = {"capacity": capacity_context(), "routing": routing_context(), "why": why_context(), "size": size_context()}
    figures = FIGURES + [figure for part, shown in OPTIONAL_FIGURES.items() if parts[part] for figure in shown]
    return {"env": env, "run_id": meta["run_id"], "hardware": hardware_line(env), "model": describe_model(model),
            "article_setting": article.SETTING,
            "offline_table": markdown_table(comparison_table(offline, with_article=True)),
            "online_table": markdown_table(comparison_table(online, with_article=False)),
            "gain": rows.loc["requests_per_s", "cache on"] / rows.loc["requests_per_s", "cache off"],
            "hit_rate": hit_rate, "bound": 1 / (1 - hit_rate),
            "article_gain": 1 + article.change_percent("requests_per_s") / 100,
            "online": online_context(online, online_meta["environment"], offline),
            "sweep_run_id": sweep_meta["run_id"], "block_sizes": recommend_block_size(sweep).to_dict(),
            "audit": audit_context(), **parts,
            "claims": claims_context(),
            "figures": [(alt, f"figures/{name}.png") for alt, name in figures]}


def results_section() -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                                     lstrip_blocks=True)
    text = environment.get_template("results.md.j2").render(**results_context())
    return re.sub(r"\n{3,}", "\n\n", text).strip()  # a section left out leaves one blank line, not several


def update_readme() -> None:
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{results_section()}\n{END}{tail}")
    print(f"updated the Results section of {README}")


if __name__ == "__main__":
    update_readme()
