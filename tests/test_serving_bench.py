"""lab.experiments.serving_bench: vLLM's own benchmark client against the real server; the hit rate from /metrics; bad
input rejected before a benchmark starts."""

import json
import math

import pandas as pd
import pytest

from lab.experiments.serving_bench import (
    bench_serve,
    export_custom_dataset,
    sweep_rates,
    unloaded_run,
)
from lab.serving.server import VLLMServer

SHARED = "Answer as the support assistant of a bookshop. " * 40


@pytest.fixture(scope="module")
def server():
    with VLLMServer(block_size=32, dev_endpoints=True, engine_args={"max_model_len": 1024}) as running:
        yield running


@pytest.fixture
def dataset(tmp_path):
    return export_custom_dataset([f"{SHARED} Question {i}: where is my order?" for i in range(12)], tmp_path / "d.jsonl")


@pytest.mark.engine
def test_a_run_reports_ttft_and_the_servers_hit_rate(server, dataset):
    server.reset_prefix_cache()
    row = bench_serve(server, request_rate=math.inf, num_prompts=6, output_tokens=4, dataset_path=dataset)
    assert row["completed"] == 6 and row["p99_ttft_ms"] >= row["p50_ttft_ms"] > 0
    assert 0.5 < row["hit_rate"] < 1, "six prompts behind one long shared text"
    server.reset_prefix_cache()
    again = unloaded_run(server, num_prompts=6, output_tokens=4, dataset_path=dataset)
    assert again["hit_rate"] == pytest.approx(row["hit_rate"]), "after a reset the cache starts empty again"


@pytest.mark.engine
def test_a_sweep_offers_the_rates_asked_for(server, dataset):
    sweep = sweep_rates(server, [4, 12], seconds_per_rate=0.5, min_prompts=4, output_tokens=2, dataset_path=dataset,
                        progress=False)
    assert sweep.request_rate.tolist() == [4, 12] and sweep.num_prompts.tolist() == [4, 6]
    assert sweep.offered_rate.map(math.isfinite).all(), "arrivals spread over time, not all at once"
    assert (sweep.hit_rate > 0).all(), "the dataset's prompts share a prefix"


@pytest.mark.engine
def test_bad_input_fails_before_the_benchmark(server, dataset, tmp_path):
    with pytest.raises(ValueError, match="request_rate=0"):
        bench_serve(server, request_rate=0, num_prompts=2, dataset_path=dataset)
    with pytest.raises(ValueError, match="dataset='sharegpt'"):
        bench_serve(server, request_rate=1, num_prompts=2, dataset="sharegpt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bench_serve(server, request_rate=1, num_prompts=2, dataset_path=tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="holds 12 prompts but num_prompts=20"):
        bench_serve(server, request_rate=1, num_prompts=20, dataset_path=dataset)
    long = export_custom_dataset(["word " * 2000], tmp_path / "long.jsonl")
    with pytest.raises(ValueError, match=r"long.jsonl line 1: a prompt of \d+ tokens .* context of 1024"):
        bench_serve(server, request_rate=1, num_prompts=1, dataset_path=long)
    with pytest.raises(ValueError, match="rates is empty"):
        sweep_rates(server, [], seconds_per_rate=1, dataset_path=dataset)


@pytest.mark.engine
def test_a_server_that_is_not_up_is_named(dataset):
    idle = VLLMServer(block_size=32)
    with pytest.raises(RuntimeError, match="is not up"):
        bench_serve(idle, request_rate=1, num_prompts=2, dataset_path=dataset)
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
    monkeypatch.setattr(serving_bench, "bench_serve", lambda server, request_rate, num_prompts, **bench:
                        calls.append(request_rate) or {"p99_ttft_ms": 10.0 * request_rate, "failed": 0})
    rate, runs = serving_bench.find_capacity(Server(), 137.0, low=4, high=8, seconds_per_rate=1)
    assert 13.7 / 1.1 <= rate <= 13.7 and len(runs) == len(calls) == Server.resets
    assert len(set(calls)) == len(calls), "no rate is run twice"
    assert serving_bench.find_capacity(Server(), 5.0, low=4, high=8, seconds_per_rate=1)[0] == 0.0


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
    monkeypatch.setattr(serving_bench, "bench_serve", lambda server, request_rate, num_prompts, **bench:
                        calls.append(request_rate) or {"p99_ttft_ms": 1e9, "failed": 0})
    sweep = pd.DataFrame({"request_rate": [4, 8, 16], "p99_ttft_ms": [10, 20, 90]})
    known = bracket_results(sweep, 50)
    assert known == {8: True, 16: False}
    rate, _ = serving_bench.find_capacity(Server(), 50, low=8, high=16, seconds_per_rate=1, known=known)
    assert rate == 8 and 8 not in calls and 16 not in calls and all(8 < r < 16 for r in calls)
    assert serving_bench.find_capacity(Server(), 50, low=8, high=16, seconds_per_rate=1)[0] == 0.0
    assert bracket_results(sweep, 5) == {4: False}, "an end the sweep did not run is not a verdict"
