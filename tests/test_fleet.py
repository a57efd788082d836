"""lab.serving.fleet and lab.serving.routing: bad fleets fail before any process starts. The real fleet (two replicas
behind the real vllm-router, counted, switched between policies, stopped clean) runs in notebook 11, whose checks
nbval runs in CI."""

import os
import sys

import pytest

import lab.serving.fleet
from lab.serving.fleet import Fleet
from lab.serving.routing import summarize_routing


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "least_busy"}, r"policy='least_busy': vllm-router's policies are random, round_robin, cache_aware"),
    ({"replicas": 0}, r"replicas=0 must be a positive number"),
    ({"kv_blocks": 0}, r"kv_blocks=0 must be a positive number"),
    ({"kv_blocks": 10, "block_size": 32}, r"kv_blocks=10 x block_size=32 = 320 tokens cannot hold one prompt of "
                                         r"max_model_len=4096: use kv_blocks >= 128"),
])
def test_a_fleet_the_router_or_the_pool_cannot_run_is_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Fleet(**kwargs)


def test_more_cpu_replicas_than_cores_is_refused(monkeypatch):
    monkeypatch.setattr(lab.serving.fleet, "backend", lambda: "cpu")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"replicas=3: this CPU has 2 cores .* use at most 2"):
        Fleet(replicas=3)


def test_a_missing_router_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ImportError, match=r"vllm-router is not installed .* `pip install vllm-router==0.1.17`"):
        Fleet()


def test_routing_summary_on_hand_made_counters():
    import pandas as pd

    requests = pd.DataFrame({"ttft_ms": [10.0, 20.0, None, 40.0], "error": [None, None, "APIConnectionError: gone", None]})
    replicas = pd.DataFrame({"requests": [3.0, 0.0], "queries": [300.0, 0.0], "hits": [150.0, 0.0]})
    summary = summarize_routing(requests, replicas)
    assert summary.failed == 1 and summary.fleet_hit_rate == 0.5
    assert summary.imbalance == 2.0 and summary.requests_per_replica == "3/0"
    assert summary.p50_ttft_ms == 20.0, "failed requests have no TTFT"


def test_kv_aware_decisions_are_read_from_the_router_log():
    from lab.serving.routing import kv_aware_decisions

    log = ('\x1b[2m2026\x1b[0m DEBUG vllm_router_rs::policies::kv_aware: KV prefix decision outcome="prefix_cost" '
           'worker="http://127.0.0.1:1" input_tokens=2035 new_prefill_tokens=2035 credited_prefix_tokens=0 x\n'
           'DEBUG other line credited_prefix_tokens=5\n'
           'DEBUG KV prefix decision outcome="prefix_cost" worker="w" \x1b[3minput_tokens\x1b[0m\x1b[2m=\x1b[0m2046 new_prefill_tokens=30 '
           'credited_prefix_tokens=2016 used_binding=false\n')
    decisions = kv_aware_decisions(log)
    assert decisions.to_dict("list") == {"input_tokens": [2035, 2046], "credited_prefix_tokens": [0, 2016]}
