"""Write the README's Results section from the latest results files (what `make run` just measured).

    python -m lab.report            # rewrites the part of README.md between the results markers
"""

from __future__ import annotations

import sys

import pandas as pd

from lab import PROJECT_ROOT
from lab.results import hardware_line, load_latest

README = PROJECT_ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
ARTICLE = {  # claim names in data/reference/article_claims.csv for the rows the article reports
    "mean_ttft_ms": ("mean_ttft_no_cache", "mean_ttft_prefix_cache"),
    "requests_per_s": ("throughput_no_cache", "throughput_prefix_cache"),
}
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
    article = pd.read_csv(PROJECT_ROOT / "data" / "reference" / "article_claims.csv").set_index("claim").value
    header = "| metric | cache off | cache on | change |" + (" article off | article on | article change |" if with_article else "")
    lines = [header, "|---" * (7 if with_article else 4) + "|"]
    for _, row in table.iterrows():
        cells = [LABELS.get(row.metric, row.metric), _fmt(row["cache off"]), _fmt(row["cache on"]),
                 "" if pd.isna(row["change_%"]) else f"{row['change_%']:+.0f}%"]
        if with_article:
            off, on = (float(article[c]) for c in ARTICLE[row.metric]) if row.metric in ARTICLE else (None, None)
            cells += [_fmt(off), _fmt(on), f"{(on / off - 1) * 100:+.0f}%"] if off else ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gain_note(offline: pd.DataFrame) -> str:
    rows = offline.set_index("metric")
    hit_rate = rows.loc["hit_rate", "cache on"]
    gain = rows.loc["requests_per_s", "cache on"] / rows.loc["requests_per_s", "cache off"]
    return (f"The throughput gain ({gain:.2f}x) sits below the bound the token hit rate allows, 1 / (1 - "
            f"{hit_rate:.3f}) = {1 / (1 - hit_rate):.2f}x, and is larger than the article's: on the tiny model, "
            "prefill is nearly all of the work, while a 7B model on an A100 also spends time decoding and "
            "scheduling. `04_cache_on_vs_off` projects these token counts to that setting.")


def results_section() -> str:
    offline, meta = load_latest("04_cache_on_vs_off-offline")
    online, online_meta = load_latest("04_cache_on_vs_off-online")
    env = meta["environment"]
    sweep, sweep_meta = load_latest("03_block_size_sweep-vllm")
    recommended = recommend_block_size(sweep)
    parts = [
        f"Measured by `make run` (profile `{env.get('profile')}`), run `{meta['run_id']}`, on: "
        f"{hardware_line(env)}; model: the lab's `tiny` preset (4.4 M parameters, fp32); "
        f"{env['n_prompts']} `article_1000` prompts, {env['max_tokens']} output tokens each, block size {env['block_size']}. "
        "The article's numbers (A100 80GB, Llama-2-7b-chat, 1000 prompts) are labelled as the article's; "
        "its memory row (GPU GB) has no counterpart here, see `04_cache_on_vs_off` for why.",
        "",
        "**Offline** (all requests submitted at once, as in the article's benchmark):",
        "",
        comparison_markdown(offline, with_article=True),
        "",
        _gain_note(offline),
        "",
        f"**Online** ({online_meta['environment']['online_prompts']} requests, Poisson arrivals at "
        f"{online_meta['environment']['online_rate']} requests/s, 80% of the no-cache offline throughput):",
        "",
        comparison_markdown(online, with_article=False),
        "",
        "Block size (`03_block_size_sweep`, vLLM at the sizes this back-end accepts, run "
        f"`{sweep_meta['run_id']}`): largest size keeping 95% of the smallest size's hit rate: "
        + ", ".join(f"{w} {s}" for w, s in recommended.items()) + f"; across all four, **{recommended.min()}**.",
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
