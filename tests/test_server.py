"""lab.serving.server: the real OpenAI-compatible vLLM server as a subprocess: start, health, failure, clean stop."""

import json
import os
import shutil
import socket

import pytest

from lab.core.model import ensure_model
from lab.serving.client import complete_concurrently, stream_completion
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


@pytest.mark.engine
def test_serves_streams_reports_cached_tokens_and_stops_cleanly(write_jsonl):
    # no caching flag at all: the server caches prefixes by vLLM's own default
    with VLLMServer(block_size=32, enable_prefix_caching=None) as server:
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
                                            concurrency=6, max_tokens=48, progress=False)
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
        pgid = server.process.pid
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
        complete_concurrently(None, "lab-model", ["a"], concurrency=concurrency)


def test_free_ports_come_from_outside_the_kernels_ephemeral_range():
    """An outgoing connection of any process can take an ephemeral port between choosing it and binding it."""
    from lab.serving import processes

    low = processes._ephemeral_range()[0]
    ports = {processes.free_port() for _ in range(20)}
    assert len(ports) > 1 and all(port < low for port in ports)
