"""What the later notebooks contribute to docs/RESULTS.md's Results section: one context per topic
(routing, the simulator and a replica's failure; why it missed and the cost model; the gain curve
and capacity; model size; the audit), each read from its notebooks' latest results files and None
when they have not run; the course's notebooks with their titles; and how the reports write numbers,
tables and lesson names (`lab.tools.readme_report` renders them). A report names a lesson by the
results file its number came from (`lesson`), never by a typed number."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from lab import PROJECT_ROOT
from lab.experiments import article
from lab.experiments.bench import router_policies_seconds
from lab.experiments.capacity import CapacityColumns, spread_name
from lab.experiments.results import hardware_line, load_latest

LESSONS_DIR = PROJECT_ROOT / "docs" / "lessons"  # the executed copies the notebooks table links
LESSON_OF = re.compile(
    r"^(?P<lesson>(?P<number>\d\d)_[a-z0-9_]+?)(-|$)"
)  # a results name or run id: NN_topic-...
WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def lesson(name: str) -> str:
    """The lesson a results file or run belongs to: `16_gain_vs_hit_rate-gain-2026...` ->
    `16_gain_vs_hit_rate`."""
    found = LESSON_OF.match(name)
    if not found:
        raise ValueError(f"{name!r} is no lesson's results (NN_topic-...)")
    return found["lesson"]


def lesson_number(name: str) -> str:
    """The number of the lesson a results file or run belongs to: `16_gain_vs_hit_rate-gain-2026...`
    -> `16`."""
    return lesson(name)[:2]


def in_words(count: int) -> str:
    """A small count as a word (`4` -> `four`), a larger one in digits."""
    return WORDS[count] if 0 <= count < len(WORDS) else f"{count:,}"


def number(value) -> str:
    """How the reports write a number: thousands with commas, small values to three significant
    digits."""
    if isinstance(value, str):
        return value
    if pd.isna(value):
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def markdown_table(df: pd.DataFrame) -> str:
    return df.map(number).to_markdown(index=False, tablefmt="pipe", disable_numparse=True)


def _latest_or_none(name: str):
    try:
        return load_latest(name)
    except FileNotFoundError:
        return None, None


def _capacity_range(sweep: pd.DataFrame, row: pd.Series, caching: str) -> str:
    """'8-16': met the target at 8 req/s, missed it at 16 (the next swept rate); '>= 64' if none
    missed."""
    runs = sweep[(sweep.dataset == row.dataset) & (sweep.caching == caching)].sort_values(
        "request_rate"
    )
    met = row[CapacityColumns.ON if caching == "on" else CapacityColumns.OFF]
    missed = runs[runs.p99_ttft_ms > row[CapacityColumns.TARGET]].request_rate
    if missed.empty:
        return f">= {number(met)}"
    return f"{number(met)}-{number(missed.iloc[0])}" if met else f"< {number(missed.iloc[0])}"


def zero_hit_verdict(runs: pd.DataFrame):
    """On / off at zero hits judged on every pair (lab.experiments.verdict): below one, above, or
    cannot tell."""
    from lab.experiments.verdict import Spread, against_bound

    paired = runs.pivot(index="pair", columns="caching", values="requests_per_s")
    return against_bound(
        Spread("on / off", tuple(paired["on"] / paired["off"]), each="pair"),
        1.0,
        quantity="the pairs' ratios",
        bound_name="no change",
        digits=3,
    )


def gain_verdict():
    """05's gain against 1/(1-h) judged on its alternating pairs (`05_cache_on_vs_off-gain_pairs`),
    with its run id; (None, None) for a run that predates them."""
    from lab.experiments.verdict import Spread, against_bound

    pairs, meta = _latest_or_none("05_cache_on_vs_off-gain_pairs")
    if pairs is None:
        return None, None
    verdict = against_bound(
        Spread("gain", tuple(pairs.throughput_gain), each="pair"),
        float(pairs.bound.iloc[0]),
        quantity=f"throughput gain over {len(pairs)} pairs of {meta['environment'].get('gain_prompts', '?')} "
        f"prompts at h {pairs.hit_rate.iloc[0]:.2f} (x)",
        bound_name="the bound 1 / (1 - h)",
    )
    return str(verdict), meta["run_id"]


def capacity_context() -> dict | None:
    """The latest `16_gain_vs_hit_rate` and `17_capacity` runs (None until both have run)."""
    gain, meta = _latest_or_none("16_gain_vs_hit_rate-gain")
    cap, capacity_meta = _latest_or_none("17_capacity-capacity")
    if gain is None or cap is None:
        return None
    implied, implied_meta = load_latest("16_gain_vs_hit_rate-implied_hit_rate")
    implied = implied.drop(columns="model").to_numpy()
    sweep = load_latest("17_capacity-sweep")[0]
    zero_runs = load_latest("16_gain_vs_hit_rate-zero_hit")[0]
    zero = zero_runs.iloc[0]
    curve = pd.DataFrame(
        {
            "shared fraction": gain.shared_fraction,
            "token hit rate h": gain.hit_rate,
            "bound 1/(1-h)": gain.bound,
            "throughput gain": gain.throughput_gain,
            "mean TTFT change": [f"{v:+.0%}" for v in gain.ttft_change],
        }
    )
    c = CapacityColumns
    table = pd.DataFrame(
        {
            "dataset": cap[c.DATASET],
            "target p99 TTFT (ms)": cap[c.TARGET],
            "capacity off (req/s)": [
                _capacity_range(sweep, row, "off") for _, row in cap.iterrows()
            ],
            "capacity on (req/s)": [_capacity_range(sweep, row, "on") for _, row in cap.iterrows()],
            "ratio": [
                f"{v:.2f}x" if v != float("inf") else "off meets no swept rate"
                for v in cap[c.RATIO]
            ],
            "hit rate h (on, highest rate)": cap[c.HIT_RATE],
            "its bound 1/(1-h)": cap[c.BOUND],
        }
    )
    if c.SEARCHED_RATIO in cap.columns:  # capacity_repeats: found by bisection, repeated
        table["searched off / on (req/s)"] = [
            f"{off:.1f} / {on:.1f}" for off, on in zip(cap[c.SEARCHED_OFF], cap[c.SEARCHED_ON])
        ]
        table["searched ratio (range)"] = [
            f"{r:.2f}x ({lo:.2f}-{hi:.2f})"
            for r, lo, hi in zip(cap[c.SEARCHED_RATIO], cap[c.RATIO_LOW], cap[c.RATIO_HIGH])
        ]
    if c.MODEL_RATIO in cap.columns:
        table["cost model ratio"] = [f"{r:.2f}x" if pd.notna(r) else "" for r in cap[c.MODEL_RATIO]]
    return {
        "run_id": meta["run_id"],
        "env": meta["environment"],
        "curve": markdown_table(curve),
        "capacity_run_id": capacity_meta["run_id"],
        "capacity_env": capacity_meta["environment"],
        "table": markdown_table(table),
        "implied_run_id": implied_meta["run_id"],
        "implied_low": float(np.nanmin(implied)),
        "implied_high": float(np.nanmax(implied)),
        "article_throughput_change": article.change_percent("requests_per_s"),
        "article_ttft_change": article.change_percent("mean_ttft_ms"),
        "searched": c.SEARCHED_RATIO in cap.columns,
        "zero_ratio": zero.ratio,
        "zero_low": zero.low,
        "zero_high": zero.high,
        "zero_verdict": str(zero_hit_verdict(zero_runs)),
        "zero_spread": spread_name(int(meta["environment"]["zero_hit_pairs"])),
        "zero_added_us": zero.get("added_us"),
        "zero_added_share": zero.get("added_share"),
    }


def routing_context() -> dict | None:
    """The latest `11_routing` run (None when it has not run)."""
    policies, meta = _latest_or_none("11_routing-policies")
    if policies is None:
        return None
    agreement = load_latest("11_routing-sim_vs_real")[0]
    sweep, sim_meta = load_latest("12_fleet_simulator-sim_sweep")
    kv, timing = (
        _latest_or_none("11_routing-kv_aware")[0],
        _latest_or_none("12_fleet_simulator-sim_timing")[0],
    )
    bench, bench_meta = _latest_or_none("bench_sim")  # python -m lab.experiments.bench sim
    table = pd.DataFrame(
        {
            "policy": policies.policy,
            "fleet hit rate": policies.fleet_hit_rate,
            "TTFT p50 (ms)": policies.p50_ttft_ms,
            "TTFT p99 (ms)": policies.p99_ttft_ms,
            "requests per replica": policies.requests_per_replica.astype(str),
            "imbalance (max / mean)": policies.imbalance,
        }
    )
    largest = int(sweep.replicas.max())
    kept = (
        sweep[sweep.replicas == largest]
        .set_index("policy")
        .fraction_of_ideal.sort_values(ascending=False)
    )
    return {
        "run_id": meta["run_id"],
        "env": meta["environment"],
        "table": markdown_table(table),
        "sim_run_id": sim_meta["run_id"],
        "sim_env": sim_meta["environment"],
        "agreement": markdown_table(_agreement_table(agreement)),
        "largest_difference": agreement["hit rate difference"].abs().max(),
        "largest": largest,
        "kept": list(kept.items()),
        "timing": None if timing is None else _timing_rows(timing),
        "bench": None
        if bench is None
        else {
            "run_id": bench_meta["run_id"],
            "rows": _timing_rows(bench),
            "hardware": hardware_line(bench_meta["environment"]),
        },
        "faults": _fault_context(),
        "tradeoff": _table_or_none("12_fleet_simulator-sim_tradeoff", _tradeoff_table),
        "load": _table_or_none("11_routing-load", _load_table),
        "kv": None
        if kv is None
        else [
            {
                "run": r["run"],
                "nothing": int(r["credited nothing"]),
                "decisions": int(r["decisions"]),
                "tenants": int(r["tenants"]),
                "kv_rate": r["kv_aware hit rate"],
                "cache_rate": r["cache_aware hit rate"],
            }
            for _, r in kv.iterrows()
        ],
    }


def _table_or_none(name: str, shape) -> str | None:
    frame = _latest_or_none(name)[0]
    return None if frame is None else markdown_table(shape(frame))


def _agreement_table(agreement: pd.DataFrame) -> pd.DataFrame:
    shape = agreement["shape"] if "shape" in agreement else "tenants"
    return pd.DataFrame(
        {
            "workload": shape,
            "policy": agreement.policy,
            "real hit rate": agreement["real hit rate"],
            "sim hit rate (seeds' median)": agreement["sim hit rate"],
            "sim - real": agreement["hit rate difference"],
            "real TTFT p50 (ms)": agreement.get("real p50 TTFT ms"),
            "sim TTFT p50 (ms)": agreement.get("sim p50 TTFT ms"),
        }
    )


def _timing_rows(timing: pd.DataFrame) -> list[dict]:
    """Per fleet size timed: seconds for vllm-router's five policies (with the shared hashing) and
    for all."""
    rows = []
    for (requests, replicas), t in timing.groupby(["requests", "replicas"], sort=True):
        rows.append(
            {
                "requests": requests,
                "replicas": replicas,
                "router_s": router_policies_seconds(t),
                "all_s": t.seconds.sum(),
                "policies": int((~t.policy.str.startswith("(")).sum()),
            }
        )
    return rows


def _fault_context() -> dict | None:
    (faults, fault_meta), rejoins = (
        _latest_or_none("13_replica_failure-fault"),
        _latest_or_none("13_replica_failure-rejoin")[0],
    )
    if faults is None or "answered" not in faults:
        return None
    table = pd.DataFrame(
        {
            "killed after (answers)": faults.kill_after_answered,
            "sent": faults.sent,
            "answered": faults.answered,
            "resubmitted by the client": faults.resubmitted,
            "sends the router retried": faults.router_retried_sends,
            "extra prefill tokens": faults.extra_prefill_tokens,
            "TTFT p50 resubmitted (ms)": faults.p50_ttft_ms_resubmitted,
            "TTFT p50 rest (ms)": faults.p50_ttft_ms_rest,
            "hits back after (s)": faults.recovery_s,
        }
    )
    return {
        "table": markdown_table(table),
        "run_id": fault_meta["run_id"],
        "env": fault_meta["environment"],
        "rejoin": None
        if rejoins is None
        else list(zip(rejoins.share_of_requests, rejoins.share_of_hits)),
    }


def _tradeoff_table(tradeoff: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "policy": tradeoff.policy,
            "setting": tradeoff.setting,
            "fleet hit rate": tradeoff.fleet_hit_rate,
            "imbalance": tradeoff.imbalance,
            "TTFT p50": tradeoff.p50_ttft,
            "TTFT p99": tradeoff.p99_ttft,
        }
    )


def _load_table(load: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "policy": load.policy,
            "real hit rate": load.fleet_hit_rate,
            "sim hit rate": load["sim hit rate"],
            "real imbalance": load.imbalance,
            "requests per replica": load.requests_per_replica.astype(str),
            "real TTFT p50 (ms)": load.p50_ttft_ms,
            "real TTFT p99 (ms)": load.p99_ttft_ms,
            "sim TTFT p50 (ms)": load["sim p50 TTFT ms"],
            "sim TTFT p99 (ms)": load["sim p99 TTFT ms"],
        }
    )


def audit_context() -> dict | None:
    """The audit of notebook 20: the customer-service bot, the timestamped template, and the runs at
    scale."""
    audit, meta = _latest_or_none("20_your_workload-audit")
    if audit is None:
        return None
    bot, stamped = (
        audit.set_index("workload").loc["customer_service"],
        audit.set_index("workload").loc["timestamped"],
    )
    return {
        "run_id": meta["run_id"],
        "bot": {
            "prompts": int(bot.prompts),
            "hit_rate": bot.hit_rate,
            "block_size": int(bot.recommended_block_size),
            "radix_hit_rate": bot.radix_hit_rate,
            "projected": bot.projected_throughput_gain,
            "measured": bot.measured_throughput_gain,
            "policy": bot.recommended_policy,
            "sample": int(bot.get("sample_prompts", 0) or 0),
            "projected_sample": bot.get("projected_sample_throughput_gain", float("nan")),
            "salted": bot.salted_hit_rate,
        },
        "stamped": {
            "fields": stamped.fields,
            "hit_rate": stamped.hit_rate,
            "after": stamped.hit_rate_after_moving_fields,
        },
        "confirmation": _confirmation(bot),
        "scale": [run for size in (100_000, 1_000_000) if (run := _bench_audit(size))],
    }


def _confirmation(bot: pd.Series) -> dict:
    """How the audit's engine run measured its gain, as its results record it: the range of the
    off/on pairs' gains (None where not recorded) and how many pairs (None where not recorded)."""
    low, high, pairs = (
        bot.get(c, float("nan"))
        for c in ("measured_gain_low", "measured_gain_high", "measured_pairs")
    )
    return {
        "low": None if pd.isna(low) else low,
        "high": None if pd.isna(high) else high,
        "pairs": None if pd.isna(pairs) else int(pairs),
    }


def _bench_audit(prompts: int) -> dict | None:
    """One `python -m lab.audit.scale_bench` run: its size, seconds, peak memory and seconds per
    stage."""
    stages, meta = _latest_or_none(f"bench_audit-{prompts}")
    if stages is None:
        return None
    e = meta["environment"]
    rss, pss = e.get("peak_rss_gib"), e.get("peak_total_pss_gib")
    return {
        "run_id": meta["run_id"],
        "prompts": e["prompts"],
        "mean_tokens": e["mean_prompt_tokens"],
        "total": e["seconds"],
        "peak_gib": e["peak_memory_gib"],
        "peak_gb": e["peak_memory_gib"] * 2**30 / 1e9,
        "rss_gib": rss,
        "pss_gib": pss,
        "processes": e.get("processes", 1),
        # the peak shown is the larger of this process's resident peak and all processes' sampled
        # PSS
        "peak_is": None if rss is None or pss is None else "rss" if rss >= pss else "pss",
        "workers": e.get("workers", 1),
        "explained": e["explained"],
        "sections": list(zip(stages.stage, stages.seconds)),
    }


def why_context() -> dict | None:
    """Notebooks 14 and 15: the attribution against the engine, and the cost model's projection
    against measured runs."""
    checks, meta = _latest_or_none("14_why_it_missed-reconcile")
    if checks is None:
        return None
    validation, validation_meta = _latest_or_none("15_cost_model-projection")
    return {
        "run_id": meta["run_id"],
        "checks": markdown_table(checks),
        "validation": None
        if validation is None
        else {
            "run_id": validation_meta["run_id"],
            "cost_model": validation_meta["environment"]["cost_model"],
            "workloads": len(validation),
            "repeats": validation_meta["environment"].get("repeats"),
            "worst_gain": validation.gain_error.abs().max(),
            "worst_ttft": validation.ttft_error.abs().max(),
            "table": markdown_table(
                validation[
                    [
                        "workload",
                        "prompts",
                        "hit_rate",
                        "naive_bound",
                        "projected_gain",
                        "throughput_gain",
                        "gain_error",
                        "projected_ttft_change",
                        "ttft_change",
                        "ttft_error",
                    ]
                ]
            ),
        },
    }


def size_context() -> dict | None:
    """Notebook 18: one workload at one hit rate on models of different size, the A100 projection,
    the article."""
    table, meta = _latest_or_none("18_model_size")
    columns = [
        "model",
        "parameters",
        "source",
        "hit_rate",
        "bound",
        "throughput_gain",
        "share_of_bound",
        "ttft_change",
    ]
    return (
        table is not None
        and {
            "run_id": meta["run_id"],
            "hardware": hardware_line(meta["environment"]),
            "table": markdown_table(table[columns]),
        }
        or None
    )


def notebook_rows(notebooks: list[Path]) -> pd.DataFrame:
    """One row per notebook: its name (linked, from docs/, to its executed copy in docs/lessons/
    where there is one) and the title and question of its title cell (`# NN · Title`, then a
    paragraph opening `**The question.**`)."""
    rows = []
    for path in notebooks:
        cell = json.loads(path.read_text())["cells"][0]
        text = "".join(cell["source"])
        title = re.match(r"#\s*\d\d\s*·\s*(?P<title>.+)", text.splitlines()[0])
        question = re.search(r"\*\*The question\.\*\*\s*(?P<q>.+?)(\n\s*\n|$)", text, re.S)
        if cell["cell_type"] != "markdown" or not title or not question:
            raise ValueError(
                f"{path.name}: its first cell is not `# NN · Title` with a `**The question.**` paragraph"
            )
        name = f"`{path.stem}`"
        rows.append(
            {
                "notebook": f"[{name}](lessons/{path.name})"
                if (LESSONS_DIR / path.name).is_file()
                else name,
                "title": title["title"].strip(),
                "the question it answers": " ".join(question["q"].split()),
            }
        )
    return pd.DataFrame(rows).replace(r"\|", r"\\|", regex=True)  # a pipe in a cell would split it
