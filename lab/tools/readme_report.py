"""Write the README's Results section from the latest results files (what `make run` just measured).

    python -m lab.tools.readme_report            # rewrites the part of README.md between the results markers
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from lab import PROJECT_ROOT
from lab.core.model import describe_model
from lab.experiments import article
from lab.experiments.block_sizes import recommend_block_size
from lab.experiments.results import hardware_line, load_latest

README = PROJECT_ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
LABELS = {
    "mean_ttft_ms": "mean TTFT (ms)", "p50_ttft_ms": "p50 TTFT (ms)", "p99_ttft_ms": "p99 TTFT (ms)",
    "mean_preprocess_ms": "mean wait before the engine (ms)", "mean_queue_ms": "mean queueing (ms)",
    "mean_prefill_ms": "mean prefill (ms)", "offered_rate_per_s": "arrival rate offered (req/s)", "requests_per_s": "requests/s",
    "hit_rate": "token hit rate",
    "peak_kv_blocks": "peak KV blocks in use", "peak_process_gib": "peak process memory (GiB)",
}


def _fmt(value: float) -> str:
    if pd.isna(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def comparison_markdown(table: pd.DataFrame, with_article: bool) -> str:
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
    return _markdown_table(pd.DataFrame(rows))


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
            f"{theirs:.2f}x, is {against_article}; it does not report its workload's hit rate, on which the gain depends "
            "(`10_capacity` measures how, below).")


def _online_note(online_env: dict, online: pd.DataFrame, offline: pd.DataFrame) -> str:
    """The rate the seeded arrivals delivered where the results record it, else the planned mean rate."""
    rows = online.set_index("metric")
    offered = "offered_rate_per_s" in rows.index
    rate = rows.loc["offered_rate_per_s", "cache off"] if offered else online_env["online_rate"]
    no_cache = offline.set_index("metric").loc["requests_per_s", "cache off"]
    how = f"delivering {rate:.2f} requests/s (planned mean {online_env['online_rate']})" if offered \
        else f"at {rate} requests/s"
    return (f"**Online** ({online_env['online_prompts']} requests, Poisson arrivals {how}, "
            f"{rate / no_cache:.0%} of the no-cache offline throughput of this run):")


def _latest_or_none(name: str):
    try:
        return load_latest(name)
    except FileNotFoundError:
        return None, None


def _markdown_table(df: pd.DataFrame) -> str:
    """Strings as they are, numbers through _fmt, missing values empty."""
    lines = ["| " + " | ".join(df.columns) + " |", "|---" * len(df.columns) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(v if isinstance(v, str) else _fmt(v) for v in row) + " |")
    return "\n".join(lines)


def _capacity_range(sweep: pd.DataFrame, row: pd.Series, caching: str) -> str:
    """'8-16': met the target at 8 req/s, missed it at 16 (the next swept rate); '>= 64' if none missed."""
    runs = sweep[(sweep.dataset == row.dataset) & (sweep.caching == caching)].sort_values("request_rate")
    met = row[f"capacity {caching} (req/s)"]
    missed = runs[runs.p99_ttft_ms > row["target p99 TTFT (ms)"]].request_rate
    if missed.empty:
        return f">= {_fmt(met)}"
    return f"{_fmt(met)}-{_fmt(missed.iloc[0])}" if met else f"< {_fmt(missed.iloc[0])}"


def _capacity_table(cap: pd.DataFrame, sweep: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "dataset": cap.dataset, "target p99 TTFT (ms)": cap["target p99 TTFT (ms)"],
        "capacity off (req/s)": [_capacity_range(sweep, row, "off") for _, row in cap.iterrows()],
        "capacity on (req/s)": [_capacity_range(sweep, row, "on") for _, row in cap.iterrows()],
        "ratio": [f"{v:.2f}x" if v != float("inf") else "off meets no swept rate" for v in cap["capacity ratio"]],
        "hit rate h (on)": cap["hit rate (on, highest rate)"], "bound 1/(1-h)": cap["bound 1/(1-h)"]})


def capacity_section() -> list[str]:
    """Gain vs hit rate, the hit rate the article's numbers imply, capacity at a TTFT target and the cost at
    zero hits, from the latest `10_capacity` run (nothing when it has not run)."""
    gain, meta = _latest_or_none("10_capacity-gain")
    if gain is None:
        return []
    implied, _ = load_latest("10_capacity-implied_hit_rate")
    cap, _ = load_latest("10_capacity-capacity")
    sweep, _ = load_latest("10_capacity-sweep")
    zero, _ = load_latest("10_capacity-zero_hit")
    env = meta["environment"]
    curve = pd.DataFrame({"shared fraction": gain.shared_fraction, "token hit rate h": gain.hit_rate,
                          "bound 1/(1-h)": gain.bound, "throughput gain": gain.throughput_gain,
                          "mean TTFT change": [f"{v:+.0%}" for v in gain.ttft_change]})
    implied_h = implied.drop(columns="model").to_numpy()
    capacity_rows = _capacity_table(cap, sweep)
    ratio, low, high = zero[["ratio", "low", "high"]].iloc[0]
    return [
        "",
        f"**The gain as a function of the hit rate** (`10_capacity`, run `{meta['run_id']}`, "
        f"{env['gain_prompts']} prompts of {env['prompt_tokens']} tokens per point, submitted at once):",
        "",
        _markdown_table(curve),
        "",
        f"Read backwards, the article's +{article.change_percent('requests_per_s'):.0f}% throughput and "
        f"{article.change_percent('mean_ttft_ms'):+.0f}% mean TTFT correspond to a token hit rate of "
        f"{np.nanmin(implied_h):.2f}-{np.nanmax(implied_h):.2f} (this curve and the A100 projection of `04`), against "
        f"{env['article_1000_hit_rate']:.2f} for `article_1000` at block size {env['block_size']}"
        + (": the gap between `04` and the article is what a lower hit rate predicts."
           if np.nanmax(implied_h) < env["article_1000_hit_rate"] else "."),
        "",
        f"**Capacity at a TTFT target** (`vllm bench serve` against the real server, Poisson rates "
        f"{', '.join(str(r) for r in env['rates'])} req/s, about {env['seconds_per_rate']} s each; target: p99 TTFT "
        f"at most {env['target_factor']}x the caching-off p99 with one request in flight):",
        "",
        _markdown_table(capacity_rows),
        "",
        "A capacity lies between the last swept rate that met the target and the first that did not (shown as a "
        "range), so the ratio is only as fine as the sweep. It can exceed 1 / (1 - h): the target is a fixed "
        "latency, and the cached server both serves faster and has more of that latency left for waiting.",
        "",
        f"**The cost at zero hits** ({env['zero_hit_pairs']} off/on pairs in alternating order, "
        f"{env['zero_hit_prompts']} prompts sharing nothing): throughput with caching on / off {ratio:.3f}, 95% interval "
        f"{low:.3f}-{high:.3f}: " + ("not distinguishable from noise on this machine." if low <= 1 <= high
                                    else "a measurable difference on this machine."),
    ]


def routing_section() -> list[str]:
    """The policy table, sim against real, the simulated sweep's headline and the fault run, from the latest
    `09_routing` run (nothing when it has not run)."""
    policies, meta = _latest_or_none("09_routing-policies")
    if policies is None:
        return []
    agreement, _ = load_latest("09_routing-sim_vs_real")
    sweep, _ = load_latest("09_routing-sim_sweep")
    fault, _ = load_latest("09_routing-fault")
    env = meta["environment"]
    rows = pd.DataFrame({"policy": policies.policy, "fleet hit rate": policies.fleet_hit_rate,
                         "TTFT p50 (ms)": policies.p50_ttft_ms, "TTFT p99 (ms)": policies.p99_ttft_ms,
                         "requests per replica": policies.requests_per_replica.astype(str),
                         "imbalance (max / mean)": policies.imbalance})
    largest = sweep[sweep.replicas == sweep.replicas.max()].set_index("policy").fraction_of_ideal
    f = fault.iloc[0]
    kv, _ = _latest_or_none("09_routing-kv_aware")
    kv_line = [] if kv is None else ["", "kv_aware credits only blocks the replicas have reported stored: "
                                     + "; ".join(f"{r['run']}, {int(r['credited nothing'])} of {int(r['decisions'])} "
                                                 f"decisions credited nothing ({int(r.tenants)} tenants), hit rate "
                                                 f"{r['kv_aware hit rate']:.3f} vs cache_aware {r['cache_aware hit rate']:.3f}"
                                                 for _, r in kv.iterrows()) + "."]
    timing, _ = _latest_or_none("09_routing-sim_timing")
    timing_line = [] if timing is None else [
        f" Routing {env['timed_requests']:,} requests over 64 simulated replicas took {timing.seconds.sum():.0f} s for all "
        f"{len(timing)} policies ({', '.join(f'{p} {t:.1f} s' for p, t in zip(timing.policy, timing.seconds))})."]
    return [
        "",
        f"**Routing across real replicas** (`09_routing`, run `{meta['run_id']}`: {env['replicas']} vLLM servers behind "
        f"vllm-router, {env['num_tenants']} tenants with {env['context_tokens']}-token private contexts, "
        f"{env['n_requests']} requests, {env['concurrency']} in flight, {env['kv_blocks']} KV blocks per replica):",
        "",
        _markdown_table(rows),
        "",
        "The simulator (`lab.experiments.fleet_sim`) on the same requests: fleet hit rate sim - real "
        + ", ".join(f"{p} {d:+.3f}" for p, d in zip(agreement.policy, agreement["hit rate difference"]))
        + f". At {int(sweep.replicas.max())} simulated replicas, the share of the ideal reuse kept: "
        + ", ".join(f"{p} {v:.2f}" for p, v in largest.sort_values(ascending=False).items())
        + f" ({env['sim_requests']} requests per point, the whole sweep in {env['sweep_seconds']:.0f} s)."
        + "".join(timing_line),
        "",
        f"A replica killed mid-run: {int(f.sent)} requests sent, {int(f.sent - f.failed)} answered, {int(f.failed)} "
        f"failed; the router logged {int(f.failed_sends_logged)} failed sends and retried them on the survivor.",
        *kv_line,
    ]


def audit_section() -> list[str]:
    """The audit of notebook 11: the customer-service bot, the timestamped template, and the scale run."""
    audit, meta = _latest_or_none("11_your_workload-audit")
    if audit is None:
        return []
    bot, stamped = audit.set_index("workload").loc["customer_service"], audit.set_index("workload").loc["timestamped"]
    scale, scale_meta = _latest_or_none("11_your_workload-scale")
    scale_line = "" if scale is None else (
        f" At scale (run `{scale_meta['run_id']}`): {scale_meta['environment']['prompts']:,} prompts of about "
        f"{scale_meta['environment']['mean_prompt_tokens']:.0f} tokens audited in {scale.seconds.sum():.0f} s ("
        + ", ".join(f"{r.section} {r.seconds:.0f} s" for r in scale.itertuples()) + ").")
    return ["", f"**Audit of a workload** (`lab.audit`, `11_your_workload`, run `{meta['run_id']}`): the customer-service "
            f"bot's {int(bot.prompts)} prompts reach a token hit rate of {bot.hit_rate:.1%} at block size "
            f"{int(bot.recommended_block_size)} (radix tree {bot.radix_hit_rate:.1%}); the lab's curve projects "
            f"x{bot.projected_throughput_gain:.2f} throughput, the engine measured x{bot.measured_throughput_gain:.2f} on "
            f"a sample; recommended routing {bot.recommended_policy}; a salt per customer leaves {bot.salted_hit_rate:.1%}. "
            f"A template with {stamped.fields} in front: {stamped.hit_rate:.1%}, and {stamped.hit_rate_after_moving_fields:.1%} "
            "with those lines moved to the end (rewritten and replayed)." + scale_line]


def claims_section() -> list[str]:
    """The verdicts of the claims ledger, counted, with the claims under each."""
    ledger = article.claims()
    lines = ["", f"**The article's claims** ({len(ledger)} in `data/reference/article_claims.csv`; every verdict but "
                 "`unverifiable` and `not applicable` points to its evidence: a notebook section, a results file or a "
                 "test):", "",
             "| verdict | claims | which |", "|---|---|---|"]
    for verdict in article.VERDICTS:
        names = ledger.index[ledger.verdict == verdict]
        lines.append(f"| {verdict} | {len(names)} | {', '.join(f'`{n}`' for n in names)} |")
    return lines


def results_section() -> str:
    offline, meta = load_latest("04_cache_on_vs_off-offline")
    online, online_meta = load_latest("04_cache_on_vs_off-online")
    env = meta["environment"]
    sweep, sweep_meta = load_latest("03_block_size_sweep-vllm")
    recommended = recommend_block_size(sweep)
    capacity = capacity_section()
    routing = routing_section()
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
        _online_note(online_meta["environment"], online, offline),
        "",
        comparison_markdown(online, with_article=False),
        "",
        "Block size (`03_block_size_sweep`, vLLM at the sizes this back-end accepts, run "
        f"`{sweep_meta['run_id']}`, one request at a time): the size with the lowest mean TTFT (within 5%, the largest): "
        + ", ".join(f"{w} {s}" for w, s in recommended.items()) + f"; across all {len(recommended)}, **{recommended.min()}**.",
        *capacity,
        *routing,
        *audit_section(),
        *claims_section(),
        "",
        "![with/without](figures/04_cache_on_vs_off-changes.png)",
        "![TTFT distribution](figures/04_cache_on_vs_off-ttft_cdf.png)",
        "![hit rate vs block size](figures/03_block_size_sweep-hit_rate.png)",
        "![TTFT breakdown under load](figures/01_ttft_breakdown-load.png)",
        *(["![gain vs hit rate](figures/10_capacity-gain_vs_hit_rate.png)",
           "![TTFT vs offered rate](figures/10_capacity-ttft_vs_rate.png)"] if capacity else []),
        *(["![hit rate by routing policy](figures/09_routing-hit_rate.png)"] if routing else []),
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
