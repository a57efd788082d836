"""lab.serving.fleet and lab.serving.routing: real vLLM replicas behind the real vllm-router; bad fleets fail before any process
starts."""

import os
import socket

import pytest

import lab.serving.fleet
from lab.experiments.workloads import load_workload
from lab.serving.fleet import Fleet
from lab.serving.routing import route_workload, summarize_routing


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.engine
def test_two_replicas_behind_the_router_serve_count_and_stop_clean():
    records = load_workload("tenants", count=8).records
    with Fleet(replicas=2, policy="round_robin", engine_args={"max_model_len": 4096}) as fleet:
        requests, replicas = route_workload(fleet, records, concurrency=2, progress=False)
        first_router = fleet.router
        fleet.use_policy("cache_aware")
        fleet.reset_prefix_caches()
        _, one_at_a_time = route_workload(fleet, records, concurrency=1, progress=False)
        fleet.use_policy("consistent_hash")
        fleet.reset_prefix_caches()
        by_tenant = sorted(records, key=lambda r: r["tenant"])
        keyed, _ = route_workload(fleet, by_tenant, concurrency=1, progress=False, session_header="X-Session-ID")
        processes = [s.process for s in fleet.servers] + [first_router.process, fleet.router.process]
        ports = [s.port for s in fleet.servers] + [fleet.router.port]
    assert first_router.process.poll() is not None, "switching policy replaced the router"
    assert sorted(one_at_a_time.requests) == [0, 8], "cache_aware, one at a time (loads tied): all to one replica"
    assert one_at_a_time.hits.sum() > 0
    repeats = keyed.tenant.duplicated()
    assert repeats.any() and (keyed.cached_tokens[repeats] > 0).all(), "a session key keeps a tenant on its replica"
    assert replicas.requests.tolist() == [4, 4], "round robin: every other request to each replica"
    assert replicas.queries.sum() == requests.prompt_tokens.sum(), "every prompt token was looked up once"
    assert replicas.hits.sum() == requests.cached_tokens.sum(), "the replicas' counters add up to the usage"
    summary = summarize_routing(requests, replicas)
    assert summary.requests == 8 and summary.imbalance == 1.0 and 0 <= summary.fleet_hit_rate < 1
    assert all(p.poll() is not None for p in processes) and not any(group_alive(p.pid) for p in processes)
    assert not any(port_open(port) for port in ports), "nothing outlives the fleet"


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
    monkeypatch.setattr(lab.serving.fleet.sys, "executable", str(tmp_path / "python"))
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
