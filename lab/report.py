"""Write the README's Results section from the latest results files (what `make run` just measured).

    python -m lab.report            # rewrites the part of README.md between the results markers
"""

from __future__ import annotations

import sys

import pandas as pd

from lab import PROJECT_ROOT, article
from lab.model import describe_model
from lab.results import hardware_line, load_latest

README = PROJECT_ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
LABELS = {
    "mean_ttft_ms": "mean TTFT (ms)", "p50_ttft_ms": "p50 TTFT (ms)", "p99_ttft_ms": "p99 TTFT (ms)",
    "mean_queue_ms": "mean queueing (ms)", "requests_per_s": "requests/s", "hit_rate": "token hit rate",
    "peak_kv_blocks": "peak KV blocks in use", "peak_process_gib": "peak process memory (GiB)",
}


def recommend_block_size(engine_sweep: pd.DataFrame, keep: float = 0.95) -> pd.Series:
    """Per workload: the largest measured block size keeping `keep` of the smallest size's hit rate."""
    def largest_good(rows: pd.DataFrame) -> int:
        rows = rows.sort_values("block_size")
        return int(rows[rows.vllm_hit_rate >= keep * rows.vllm_hit_rate.iloc[0]].block_size.max())

    return engine_sweep.groupby("workload").apply(largest_good, include_groups=False).rename("recommended block size")


def _fmt(value: float) -> str:
    if pd.isna(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def comparison_markdown(table: pd.DataFrame, with_article: bool) -> str:
    header = "| metric | cache off | cache on | change |" + (" article off | article on | article change |" if with_article else "")
    lines = [header, "|---" * (7 if with_article else 4) + "|"]
    for _, row in table.iterrows():
        cells = [LABELS.get(row.metric, row.metric), _fmt(row["cache off"]), _fmt(row["cache on"]),
                 "" if pd.isna(row["change_%"]) else f"{row['change_%']:+.0f}%"]
        if with_article:
            off, on = article.pair(row.metric) if row.metric in article.PAIRS else (None, None)
            cells += [_fmt(off), _fmt(on), f"{article.change_percent(row.metric):+.0f}%"] if off else ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gain_note(offline: pd.DataFrame) -> str:
    rows = offline.set_index("metric")
    hit_rate = rows.loc["hit_rate", "cache on"]
    gain = rows.loc["requests_per_s", "cache on"] / rows.loc["requests_per_s", "cache off"]
    bound = 1 / (1 - hit_rate)
    theirs = 1 + article.change_percent("requests_per_s") / 100
    against_bound = ("reaches" if gain >= 0.95 * bound else f"is {gain / bound:.0%} of") + " the bound"
    against_article = "smaller" if gain > theirs else "larger"
    return (f"Throughput rose {gain:.2f}x with caching on; with a token hit rate of {hit_rate:.3f} it {against_bound} "
            f"that skipping cached prefill allows, 1 / (1 - {hit_rate:.3f}) = {bound:.2f}x. The article's gain, "
            f"{theirs:.2f}x, is {against_article}; it does not report its workload's hit rate, on which the gain depends.")


def _online_note(online_env: dict, offline: pd.DataFrame) -> str:
    rate = online_env["online_rate"]
    no_cache = offline.set_index("metric").loc["requests_per_s", "cache off"]
    return (f"**Online** ({online_env['online_prompts']} requests, Poisson arrivals at {rate} requests/s, "
            f"{rate / no_cache:.0%} of the no-cache offline throughput of this run):")


def results_section() -> str:
    offline, meta = load_latest("04_cache_on_vs_off-offline")
    online, online_meta = load_latest("04_cache_on_vs_off-online")
    env = meta["environment"]
    sweep, sweep_meta = load_latest("03_block_size_sweep-vllm")
    recommended = recommend_block_size(sweep)
    parts = [
        f"Measured by `make run` (profile `{env.get('profile')}`), run `{meta['run_id']}`, on: "
        f"{hardware_line(env)}; model: {describe_model(env['model'])}; "
        f"{env['n_prompts']} `article_1000` prompts, {env['max_tokens']} output tokens each, block size {env['block_size']}. "
        f"The article's numbers ({article.SETTING}) are labelled as the article's; "
        "its memory row (GPU GB) has no counterpart here, see `04_cache_on_vs_off` for why.",
        "",
        "**Offline** (all requests submitted at once, as in the article's benchmark):",
        "",
        comparison_markdown(offline, with_article=True),
        "",
        _gain_note(offline),
        "",
        _online_note(online_meta["environment"], offline),
        "",
        comparison_markdown(online, with_article=False),
        "",
        "Block size (`03_block_size_sweep`, vLLM at the sizes this back-end accepts, run "
        f"`{sweep_meta['run_id']}`): largest size keeping 95% of the smallest size's hit rate: "
        + ", ".join(f"{w} {s}" for w, s in recommended.items()) + f"; across all {len(recommended)}, **{recommended.min()}**.",
        "",
        "![with/without](figures/04_cache_on_vs_off-changes.png)",
        "![TTFT distribution](figures/04_cache_on_vs_off-ttft_cdf.png)",
        "![hit rate vs block size](figures/03_block_size_sweep-hit_rate.png)",
        "![TTFT breakdown under load](figures/01_ttft_breakdown-load.png)",
    ]
    return "\n".join(parts)


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
    sys.exit(0)
