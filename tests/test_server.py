"""lab.serving.server: the real OpenAI-compatible vLLM server as a subprocess: start, health, failure, clean stop; and
lab.experiments.serving_bench, vLLM's own benchmark client against it: the hit rate from /metrics, bad input rejected
before a benchmark starts. The tests that need a running tiny-model server share one (a server takes about 20 s to
start on one core); the last of them stops it and checks that nothing outlives it."""

import json
import math
import os
import shutil
import socket

import pandas as pd
import pytest

from lab.core.model import ensure_model
from lab.experiments.serving_bench import Search, Sent, bench_serve, export_custom_dataset, sweep_rates, unloaded_run
from lab.serving.client import Sending, complete_concurrently, stream_completion
from lab.serving.metrics import parse_metrics, scraping
from lab.serving.processes import ServerStartError
from lab.serving.server import VLLMServer


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


SHARED = "Answer as the support assistant of a bookshop. " * 40


@pytest.fixture(scope="module")
def server():
    """No caching flag at all (the server caches prefixes by vLLM's own default), and the dev endpoints, so that each
    test can start from an empty cache (reset_prefix_cache)."""
    with VLLMServer(block_size=32, enable_prefix_caching=None, dev_endpoints=True,
                    engine_args={"max_model_len": 1024}) as running:
        yield running


@pytest.fixture
def dataset(tmp_path):
    return export_custom_dataset([f"{SHARED} Question {i}: where is my order?" for i in range(12)], tmp_path / "d.jsonl")


@pytest.mark.engine
def test_serves_streams_and_reports_cached_tokens(server, write_jsonl):
    server.reset_prefix_cache()
    assert not any("prefix-caching" in arg for arg in server.command())
    assert server.healthy() and port_open(server.port)
    client = server.client()
    prompt = "Please summarise the meeting notes in three bullet points. " * 20
    first = stream_completion(client, server.model_name, prompt + "First.", max_tokens=4)
    second = stream_completion(client, server.model_name, prompt + "Second.", max_tokens=4)
    assert first.completion_tokens == 4 and first.ttft_s > 0
    assert first.cached_tokens == 0 and second.cached_tokens > 0
    metrics = server.metrics()
    assert metrics["vllm:prefix_cache_hits_total"] >= second.cached_tokens
    assert metrics["vllm:prefix_cache_queries_total"] >= first.prompt_tokens + second.prompt_tokens
    names = ["vllm:prefix_cache_hits_total", "vllm:request_success_total"]
    with scraping(server, names, interval_s=0.05) as scrapes:
        results = complete_concurrently(client, server.model_name, [prompt + f"Item {i}." for i in range(12)],
                                        Sending(concurrency=6, max_tokens=48, progress=False))
    assert [r.completion_tokens for r in results] == [48] * 12
    assert sum(r.cached_tokens for r in results) > 0
    # what a scrape catches mid-run depends on timing; the first scrape (before any request) and the last
    # (after the block) do not
    assert len(scrapes) >= 2
    assert scrapes[-1]["vllm:request_success_total"] - scrapes[0]["vllm:request_success_total"] == 12
    assert scrapes[-1]["vllm:prefix_cache_hits_total"] - scrapes[0]["vllm:prefix_cache_hits_total"] == \
        sum(r.cached_tokens for r in results), "usage and /metrics agree"
    hits = [row["vllm:prefix_cache_hits_total"] for row in scrapes]
    assert hits == sorted(hits)
    assert_the_audit_renders_a_chat_as_the_server_does(server, client, write_jsonl)


@pytest.mark.engine
def test_a_run_reports_ttft_and_the_servers_hit_rate(server, dataset):
    server.reset_prefix_cache()
    row = bench_serve(server, Sent(dataset_path=dataset, output_tokens=4), request_rate=math.inf, num_prompts=6)
    assert row["completed"] == 6 and row["p99_ttft_ms"] >= row["p50_ttft_ms"] > 0
    assert 0.5 < row["hit_rate"] < 1, "six prompts behind one long shared text"
    server.reset_prefix_cache()
    again = unloaded_run(server, Sent(dataset_path=dataset, output_tokens=4), num_prompts=6)
    assert again["hit_rate"] == pytest.approx(row["hit_rate"]), "after a reset the cache starts empty again"


@pytest.mark.engine
def test_a_sweep_offers_the_rates_asked_for(server, dataset):
    sweep = sweep_rates(server, Sent(dataset_path=dataset, output_tokens=2), [4, 12], seconds_per_rate=0.5,
                        min_prompts=4, progress=False)
    assert sweep.request_rate.tolist() == [4, 12] and sweep.num_prompts.tolist() == [4, 6]
    assert sweep.offered_rate.map(math.isfinite).all(), "arrivals spread over time, not all at once"
    assert (sweep.hit_rate > 0).all(), "the dataset's prompts share a prefix"


@pytest.mark.engine
def test_bad_input_fails_before_the_benchmark(server, dataset, tmp_path):
    with pytest.raises(ValueError, match="request_rate=0"):
        bench_serve(server, Sent(dataset_path=dataset), request_rate=0, num_prompts=2)
    with pytest.raises(ValueError, match="dataset='sharegpt'"):
        Sent(dataset="sharegpt")
    with pytest.raises(ValueError, match="output_tokens"):
        Sent(dataset_path=dataset, output_tokens=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bench_serve(server, Sent(dataset_path=tmp_path / "none.jsonl"), request_rate=1, num_prompts=2)
    with pytest.raises(ValueError, match="holds 12 prompts but num_prompts=20"):
        bench_serve(server, Sent(dataset_path=dataset), request_rate=1, num_prompts=20)
    long = export_custom_dataset(["word " * 2000], tmp_path / "long.jsonl")
    with pytest.raises(ValueError, match=r"long.jsonl line 1: a prompt of \d+ tokens .* context of 1024"):
        bench_serve(server, Sent(dataset_path=long), request_rate=1, num_prompts=1)
    with pytest.raises(ValueError, match="rates is empty"):
        sweep_rates(server, Sent(dataset_path=dataset), [], seconds_per_rate=1)


@pytest.mark.engine
def test_the_server_stops_cleanly(server):
    """The last test on the shared server: stopping it leaves no process, no open port, no process group."""
    pgid = server.process.pid
    server.stop()
    assert server.process.poll() is not None
    assert not port_open(server.port) and not process_group_alive(pgid), "nothing outlives the server"


def assert_the_audit_renders_a_chat_as_the_server_does(server, client, write_jsonl, model: str | None = None) -> None:
    """The audit caches what the server caches only if it renders a log's `messages` as the server does: the same
    messages through the server's chat endpoint give the same prompt tokens as the audit's reading of them."""
    import tempfile
    from pathlib import Path

    from lab.audit.prompts import load_tokenizer, read_prompts

    chats = [[{"role": "user", "content": "Where is my parcel?"}],
             [{"role": "system", "content": "You answer for an online bookshop."},
              {"role": "user", "content": "Can I return a book?"},
              {"role": "assistant", "content": "Yes, within thirty days."},
              {"role": "user", "content": "And an e-book?"}]]
    log = write_jsonl(Path(tempfile.mkdtemp()) / "chats.jsonl", [{"messages": m} for m in chats])
    audited = read_prompts(log, load_tokenizer(model), progress=False)
    for messages, ids in zip(chats, audited.token_ids):
        reply = client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=1)
        assert reply.usage.prompt_tokens == len(ids), messages


@pytest.mark.engine
def test_the_audit_renders_smollm2_chats_as_its_server_does(write_jsonl):
    """The real model's template (SmolLM2's ChatML, which adds its own system prompt to a chat that has none): the
    audit counts the prompt tokens the server does, with and without a system message."""
    smollm2 = str(ensure_model("smollm2"))
    with VLLMServer(smollm2, block_size=32, engine_args={"max_model_len": 2048}) as server:
        assert_the_audit_renders_a_chat_as_the_server_does(server, server.client(), write_jsonl, model=smollm2)


@pytest.mark.engine
def test_a_model_the_server_cannot_load_fails_with_its_log(tmp_path):
    broken = tmp_path / "broken-model"
    shutil.copytree(ensure_model(), broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["NotARealForCausalLM"]
    (broken / "config.json").write_text(json.dumps(config))
    server = VLLMServer(broken, startup_timeout_s=240)
    with pytest.raises(ServerStartError, match=r"(?s)exited with code .*end of its log.*NotARealForCausalLM"):
        server.start()
    assert server.process.poll() is not None


def test_bad_arguments_fail_before_any_process_starts(tmp_path, on_backend):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VLLMServer(tmp_path / "missing")
    with pytest.raises(ValueError, match="block_size=0 must be a positive integer"):
        VLLMServer(block_size=0)
    on_backend("cpu")
    with pytest.raises(ValueError, match="multiple of 32"):
        VLLMServer(block_size=16)


def test_the_command_carries_the_engine_settings():
    server = VLLMServer(block_size=64, enable_prefix_caching=False, engine_args={"max_model_len": 512})
    command = server.command()
    assert command[command.index("--port") + 1] == str(server.port)
    assert command[-len(server.settings.server_args()):] == server.settings.server_args()
    assert {"--no-enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(command)
    assert command[command.index("--max-model-len") + 1] == "512"


def test_parse_metrics_sums_label_sets():
    text = (
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 96.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 4.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
    )
    assert parse_metrics(text) == {"vllm:prefix_cache_hits_total": 100.0, "vllm:kv_cache_usage_perc": 0.25}


@pytest.mark.parametrize("concurrency", [0, -2, 1.5, True])
def test_concurrency_must_be_a_positive_count(concurrency):
    with pytest.raises(ValueError, match=r"concurrency=.*positive number of requests in flight"):
        Sending(concurrency=concurrency)


def test_free_ports_come_from_outside_the_kernels_ephemeral_range():
    """An outgoing connection of any process can take an ephemeral port between choosing it and binding it."""
    from lab.serving import processes

    low = processes._ephemeral_range()[0]
    ports = {processes.free_port() for _ in range(20)}
    assert len(ports) > 1 and all(port < low for port in ports)


@pytest.mark.engine
def test_a_server_that_is_not_up_is_named(dataset):
    idle = VLLMServer(block_size=32)
    with pytest.raises(RuntimeError, match="is not up"):
        bench_serve(idle, Sent(dataset_path=dataset), request_rate=1, num_prompts=2)
    with pytest.raises(RuntimeError, match="dev_endpoints=True"):
        idle.reset_prefix_cache()


def test_the_exported_dataset_is_what_vllm_reads(dataset):
    lines = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert len(lines) == 12 and set(lines[0]) == {"prompt"}
    with pytest.raises(FileExistsError):
        export_custom_dataset(["x"], dataset)


def test_find_capacity_bisects_to_within_the_tolerance(monkeypatch):
    """The search alone (bench_serve replaced by a p99 that grows with the rate: 10 ms per request/s); the real
    benchmark runs in notebooks/17_capacity.ipynb."""
    import lab.experiments.serving_bench as serving_bench

    class Server:
        resets = 0

        def reset_prefix_cache(self):
            Server.resets += 1

    calls = []
    monkeypatch.setattr(serving_bench, "bench_serve", lambda server, sent, request_rate, num_prompts, **_:
                        calls.append(request_rate) or {"p99_ttft_ms": 10.0 * request_rate, "failed": 0})
    rate, runs = serving_bench.find_capacity(Server(), Sent(), 137.0, Search(low=4, high=8, seconds_per_rate=1))
    assert 13.7 / 1.1 <= rate <= 13.7 and len(runs) == len(calls) == Server.resets
    assert len(set(calls)) == len(calls), "no rate is run twice"
    assert serving_bench.find_capacity(Server(), Sent(), 5.0, Search(low=4, high=8, seconds_per_rate=1))[0] == 0.0


def test_the_bracket_comes_from_the_sweeps_first_miss():
    from lab.experiments.serving_bench import capacity_bracket

    sweep = pd.DataFrame({"request_rate": [2, 4, 8, 16], "p99_ttft_ms": [10, 20, 90, 30]})
    assert capacity_bracket(sweep, 50) == (4, 8), "a meeting rate after the first miss does not count"
    assert capacity_bracket(sweep, 5) == (1, 2) and capacity_bracket(sweep, 100) == (16, 32)


def test_a_search_seeded_with_the_sweeps_bracket_stays_inside_it(monkeypatch):
    """A noisy machine: the rate the sweep saw pass now misses in every re-run. Seeded with the sweep's verdicts,
    the search never re-runs the bracket's ends, never leaves [low, high] and never reports 0 where the sweep
    passed; unseeded, the same noise drives it down to 0."""
    import lab.experiments.serving_bench as serving_bench
    from lab.experiments.serving_bench import bracket_results

    class Server:
        def reset_prefix_cache(self):
            pass

    calls = []
    monkeypatch.setattr(serving_bench, "bench_serve", lambda server, sent, request_rate, num_prompts, **_:
                        calls.append(request_rate) or {"p99_ttft_ms": 1e9, "failed": 0})
    sweep = pd.DataFrame({"request_rate": [4, 8, 16], "p99_ttft_ms": [10, 20, 90]})
    known = bracket_results(sweep, 50)
    assert known == {8: True, 16: False}
    rate, _ = serving_bench.find_capacity(Server(), Sent(), 50, Search(low=8, high=16, seconds_per_rate=1, known=known))
    assert rate == 8 and 8 not in calls and 16 not in calls and all(8 < r < 16 for r in calls)
    assert serving_bench.find_capacity(Server(), Sent(), 50, Search(low=8, high=16, seconds_per_rate=1))[0] == 0.0
    assert bracket_results(sweep, 5) == {4: False}, "an end the sweep did not run is not a verdict"
