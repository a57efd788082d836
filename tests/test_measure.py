import dataclasses
import math

import pandas as pd
import pytest

from lab.experiments.measure import Poisson, RunFacts, arrival_times, compare, run_workload, summarize
from lab.experiments.workloads import generate_workload
from lab.serving import vllm_internals


@pytest.fixture(scope="module")
def prompts():
    return generate_workload("article_1000", 24).prompts


def test_offline_rows_are_sane(llm, prompts):
    run = run_workload(llm, prompts, max_tokens=4, progress=False)
    df, facts = run.rows, run.facts
    assert len(df) == len(prompts) and df.request.tolist() == list(range(len(prompts)))
    assert (df.ttft_s > 0).all() and (df.e2e_s >= df.ttft_s).all()
    assert (df.cached_tokens <= df.prompt_tokens - 1).all() and df.cached_tokens.sum() > 0
    assert (df.output_tokens == 4).all()
    assert (df.queue_s >= 0).all() and (df.prefill_s > 0).all()
    assert 0 < facts.peak_kv_blocks <= facts.kv_blocks and facts.mode == "offline" and facts.max_tokens == 4
    assert facts.preemptions == 0, "a pool far larger than the batch never preempts"
    summary = run.summary()
    assert summary["peak_kv_usage"] == facts.peak_kv_blocks / facts.kv_blocks and summary["requests"] == len(prompts)


def test_online_requests_reach_the_engine_at_their_arrival_times(llm, prompts):
    rate = 8.0
    df = run_workload(llm, prompts[:8], max_tokens=2, mode=Poisson(rate, seed=1), progress=False).rows
    assert df.arrival_s.tolist() == arrival_times(8, Poisson(rate, seed=1)), "the TTFT clock starts at the plan"
    late = df.sent_s - df.arrival_s
    assert (late >= 0).all(), "no request is sent before it arrives"
    assert df.sent_s.iloc[-1] >= df.arrival_s.iloc[-1] > 0.3, "the run lasts as long as the schedule"
    assert df.sent_s.is_monotonic_increasing, "sent in arrival order"
    assert df.sent_s.iloc[0] < df.arrival_s.iloc[-1], "the first request went out before the last one was due"
    assert (df.ttft_s >= late).all(), "waiting to be sent counts in TTFT"


def test_bad_input_is_named_and_nothing_is_sent(llm):
    before = llm.get_metrics()
    queries = next(m.value for m in before if m.name == "vllm:prefix_cache_queries")
    with pytest.raises(ValueError, match="prompts is empty"):
        run_workload(llm, [])
    with pytest.raises(ValueError, match=r"rate=0.*positive arrival rate"):
        run_workload(llm, ["a"], mode=Poisson(rate=0))
    with pytest.raises(ValueError, match=r"mode='online'.*Poisson\(rate"):
        run_workload(llm, ["a"], mode="online")
    with pytest.raises(ValueError, match="mode=.batch.*sequential"):
        run_workload(llm, ["a"], mode="batch")
    limit = vllm_internals.max_model_len(llm)
    with pytest.raises(ValueError, match=rf"prompts\[1\] has .*max_model_len={limit}"):
        run_workload(llm, ["short", list(range(5, limit + 100))])
    after = next(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_queries")
    assert after == queries, "a rejected workload sends no request"


def hand_made(ttft, cached, prompt):
    n = len(ttft)
    return pd.DataFrame({"request": range(n), "prompt_tokens": prompt, "cached_tokens": cached,
                         "output_tokens": [1] * n, "arrival_s": [0.0] * n, "ttft_s": ttft,
                         "preprocess_s": [0.0] * n, "queue_s": [0.0] * n, "prefill_s": ttft, "e2e_s": ttft})


def test_summarize_and_compare_on_hand_made_frames():
    off = summarize(hand_made([1.0, 2.0, 3.0, 4.0], [0, 0, 0, 0], [100] * 4))
    on = summarize(hand_made([0.5, 0.5, 1.0, 2.0], [0, 50, 50, 100], [100] * 4))
    assert off["mean_ttft_ms"] == 2500 and off["p50_ttft_ms"] == 2500 and off["requests_per_s"] == 1.0
    assert on["hit_rate"] == 0.5 and on["requests_per_s"] == 2.0
    table = compare(off, on)
    assert table.loc["mean_ttft_ms", "change_%"] == -60.0
    assert table.loc["requests_per_s", "change_%"] == 100.0
    assert pd.isna(table.loc["hit_rate", "change_%"]), "no % change from zero"
    with pytest.raises(ValueError):
        summarize(pd.DataFrame())


def test_online_summary_reports_the_rate_the_arrivals_delivered():
    df = hand_made([0.1] * 5, [0] * 5, [100] * 5).assign(arrival_s=[0.0, 0.5, 1.0, 3.0, 4.0])
    facts = RunFacts(mode="online", rate=2.0, max_tokens=1, peak_kv_blocks=3, kv_blocks=12, peak_process_gib=1.0,
                     preemptions=0)
    summary = summarize(df, facts)
    assert summary["offered_rate_per_s"] == 1.0, "4 gaps in 4 s, whatever rate was planned"
    assert summary["peak_kv_usage"] == 0.25
    assert "offered_rate_per_s" not in summarize(df, dataclasses.replace(facts, mode="offline"))
    assert "offered_rate_per_s" not in summarize(df) and "peak_kv_blocks" not in summarize(df)


def test_arrival_times_are_seeded_poisson():
    times = arrival_times(2000, Poisson(rate=10.0, seed=3))
    assert times == arrival_times(2000, Poisson(rate=10.0, seed=3))
    assert abs(times[-1] / 1999 - 0.1) < 0.01


def test_sequential_mode_never_queues(llm, prompts):
    df = run_workload(llm, prompts[:6], max_tokens=2, mode="sequential", progress=False).rows
    assert df.arrival_s.is_monotonic_increasing
    assert (df.arrival_s.iloc[1:].values >= (df.arrival_s + df.e2e_s).iloc[:-1].values - 0.01).all(), \
        "each request is sent after the previous one finished"


def test_the_offered_rate_is_what_the_times_delivered():
    """One definition for the engine's arrivals and the benchmark client's send times."""
    from lab.experiments.measure import offered_rate

    assert offered_rate([0.0, 1.0, 2.0, 4.0]) == 0.75
    assert offered_rate([3.0, 3.0]) == float("inf"), "all at once"
    assert math.isnan(offered_rate([1.0]))
