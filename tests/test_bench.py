import pandas as pd
import pytest
from transformers import AutoTokenizer

from lab.core.model import ensure_model
from lab.experiments.bench import summarize_mini
from lab.experiments.generators import shared_prefix_workload


def test_workload_is_deterministic_and_shares_prefixes():
    tokenizer = AutoTokenizer.from_pretrained(ensure_model())
    prompts = shared_prefix_workload(tokenizer, n_requests=12, prefix_tokens=300, n_prefixes=2)
    assert prompts == shared_prefix_workload(tokenizer, n_requests=12, prefix_tokens=300, n_prefixes=2)
    assert len({tuple(p[:300]) for p in prompts}) == 2
    assert all(len(p) > 300 and p[0] == tokenizer.bos_token_id for p in prompts)


def test_summary_weights_hit_rate_by_tokens():
    df = pd.DataFrame({
        "engine": ["mini"] * 2, "caching": [True] * 2, "request": [0, 1],
        "prompt_tokens": [100, 300], "cached_tokens": [0, 200], "ttft_ms": [10.0, 30.0], "lookup_ms": [1.0, 1.0],
    })
    row = summarize_mini(df).loc[("mini", True)]
    assert row["hit_rate"] == 0.5 and row["lookup_share"] == 0.05 and row["mean_ttft_ms"] == 20.0


def test_the_simulator_benchmark_times_every_policy_on_one_hashing(tmp_path, monkeypatch):
    from lab.experiments.bench import SimPoint, main, router_policies_seconds, time_sim_policies
    from lab.experiments.fleet_sim import SIM_POLICIES, SIMULATED_ROUTER_POLICIES

    timing = time_sim_policies(SimPoint(requests=60, replicas=4))
    assert timing.policy.tolist() == ["(hashing the trace once)", *SIM_POLICIES]
    assert timing.seconds.gt(0).all() and (timing.requests == 60).all() and (timing.replicas == 4).all()
    seconds = dict(zip(timing.policy, timing.seconds))
    router = seconds["(hashing the trace once)"] + sum(seconds[policy] for policy in SIMULATED_ROUTER_POLICIES)
    assert router_policies_seconds(timing) == pytest.approx(router), "vllm-router's five and the hashing they share"
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    assert main(["sim", "--points", "40x2"]) == 0
    assert list(tmp_path.glob("bench_sim-*.csv"))
    with pytest.raises(SystemExit, match="REQUESTSxREPLICAS"):
        main(["sim", "--points", "ten"])


@pytest.mark.slow
def test_the_audit_benchmark_writes_a_timestamped_log_out_of_order_and_records_its_run(tmp_path, capsys):
    import gzip
    import json

    from lab.audit.scale_bench import main as audit_bench
    from lab.experiments.results import load_latest

    log = tmp_path / "log.jsonl.gz"
    assert audit_bench(["--prompts", "600", "--log", str(log), "--workers", "2"]) == 0
    with gzip.open(log, "rt") as f:
        records = [json.loads(line) for line in f]
    stamps = [r["timestamp"] for r in records]
    assert len(records) == 600 and stamps != sorted(stamps), "three sources, out of time order in the file"
    assert {r["source"] for r in records} == {"intent", "rewrite", "final"}
    stages, meta = load_latest("bench_audit-600")
    assert set(stages.stage) >= {"read and tokenize", "hit rates", "tenant salt"}
    env = meta["environment"]
    assert env["prompts"] == env["explained"] == 600 and env["block_sizes"] == [32, 64, 128] and env["workers"] == 2
    assert env["peak_memory_gib"] == max(env["peak_rss_gib"], env["peak_total_pss_gib"]) and env["peak_total_pss_gib"] > 0
    assert "600 prompts of" in capsys.readouterr().out
