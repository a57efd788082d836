import json

import pandas as pd
import pytest

from lab.experiments.results import (
    CANONICAL_DIR,
    environment,
    hardware_line,
    load_latest,
    load_latest_or_canonical,
    promote,
    save_results,
)
from lab.serving.backend import backend, vllm_distribution, vllm_version


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    return tmp_path


def test_saved_results_carry_their_environment(results_dir):
    env = environment(block_size=32)
    path = save_results(pd.DataFrame({"ttft_ms": [1.0, 2.0]}), "demo", env)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["environment"]["block_size"] == 32
    assert meta["environment"]["vllm"] == f"{vllm_distribution()} {vllm_version()}"
    df, loaded = load_latest("demo")
    assert df["ttft_ms"].tolist() == [1.0, 2.0] and loaded == meta
    assert f"| {backend()} |" in hardware_line(env)


def test_a_second_run_never_overwrites_the_first(results_dir):
    env = environment()
    first = save_results(pd.DataFrame({"x": [1]}), "demo", env)
    second = save_results(pd.DataFrame({"x": [2]}), "demo", env)
    assert first != second
    assert pd.read_csv(first)["x"].tolist() == [1]
    assert not list(results_dir.glob(".*.tmp")), "no temporary files left behind"


def test_empty_results_and_missing_results_are_named(results_dir):
    with pytest.raises(ValueError, match="empty results table"):
        save_results(pd.DataFrame(), "demo", {})
    with pytest.raises(FileNotFoundError, match="no results named 'nothing'"):
        load_latest("nothing")
    assert not list(results_dir.iterdir())


def test_the_latest_run_is_found_by_its_run_id_not_by_file_times(results_dir):
    import os

    for stem, value in [("demo-20260101T000000", 1), ("demo-20260102T000000", 2), ("demo-20260102T000000-1", 3)]:
        (results_dir / f"{stem}.csv").write_text(f"x\n{value}\n")
        (results_dir / f"{stem}.json").write_text(json.dumps({"run_id": stem}))
    for path in results_dir.iterdir():
        os.utime(path, (0, 0))  # as a fresh clone leaves them: all alike
    assert load_latest("demo")[0]["x"].tolist() == [3]


def test_promote_keeps_one_run_per_name_and_replaces_the_older_one(results_dir, tmp_path_factory):
    canonical = tmp_path_factory.mktemp("canonical")
    env = environment()
    save_results(pd.DataFrame({"x": [1]}), "demo", env)
    save_results(pd.DataFrame({"x": [2]}), "demo", env)
    save_results(pd.DataFrame({"y": [9]}), "demo-other", env)  # a name that starts like another
    promote(results_dir, canonical)
    assert sorted(p.stem.split("-2")[0] for p in canonical.glob("*.csv")) == ["demo", "demo-other"]
    assert load_latest("demo", canonical)[0]["x"].tolist() == [2]
    save_results(pd.DataFrame({"x": [3]}), "demo", env)
    promote(results_dir, canonical)
    assert len(list(canonical.glob("*.csv"))) == 2 and load_latest("demo", canonical)[0]["x"].tolist() == [3]


def test_every_canonical_result_is_one_run_per_name_with_its_provenance():
    names = [json.loads(p.read_text())["name"] for p in CANONICAL_DIR.glob("*.json")]
    assert names and len(names) == len(set(names)) == len(list(CANONICAL_DIR.glob("*.csv")))


def test_without_a_run_here_the_canonical_run_is_read(results_dir):
    df, meta = load_latest_or_canonical("16_gain_vs_hit_rate-gain")
    assert meta["name"] == "16_gain_vs_hit_rate-gain" and meta["run_id"].startswith("16_gain_vs_hit_rate-gain-")
    canonical = CANONICAL_DIR / f"{meta['run_id']}.csv"
    assert canonical.is_file() and len(df) == len(pd.read_csv(canonical)), "the committed canonical table, whole"
    with pytest.raises(FileNotFoundError, match="no results named 'nothing'"):
        load_latest_or_canonical("nothing")


def test_promote_can_take_only_the_results_of_named_runs(results_dir, tmp_path_factory, monkeypatch):
    canonical = tmp_path_factory.mktemp("canonical")
    monkeypatch.setenv("LAB_RUN_ID", "05_demo-full-1")
    save_results(pd.DataFrame({"x": [1]}), "demo", environment())
    monkeypatch.setenv("LAB_RUN_ID", "05_demo-quick-2")
    save_results(pd.DataFrame({"x": [2]}), "demo", environment())
    promote(results_dir, canonical, runs={"05_demo-full-1"})
    frame, meta = load_latest("demo", canonical)
    assert frame["x"].tolist() == [1] and meta["environment"]["run"] == "05_demo-full-1"


def test_a_quick_run_never_stands_in_for_the_canonical_results(results_dir, monkeypatch, tmp_path_factory):
    from lab.experiments import results as results_module

    canonical = tmp_path_factory.mktemp("canonical")
    monkeypatch.setattr(results_module, "CANONICAL_DIR", canonical)
    monkeypatch.setenv("LAB_PROFILE", "full")
    save_results(pd.DataFrame({"x": [1]}), "demo", environment())
    promote(results_dir, canonical)
    monkeypatch.setenv("LAB_PROFILE", "quick")
    save_results(pd.DataFrame({"x": [2]}), "demo", environment())
    assert results_module.load_latest_full_or_canonical("demo")[0]["x"].tolist() == [1], "the quick run is ignored"
    monkeypatch.setenv("LAB_PROFILE", "full")
    save_results(pd.DataFrame({"x": [3]}), "demo", environment())
    assert results_module.load_latest_full_or_canonical("demo")[0]["x"].tolist() == [3], "a newer full run counts"


def test_a_name_that_starts_another_does_not_read_its_files(results_dir):
    save_results(pd.DataFrame({"gain": [2.9]}), "18_model_size", {"notebook": "18"})
    save_results(pd.DataFrame({"id": ["model_size.noticeably_closer"]}), "18_model_size-findings", {"notebook": "18"})
    table, meta = load_latest("18_model_size")
    assert list(table.columns) == ["gain"] and meta["name"] == "18_model_size"
    assert list(load_latest("18_model_size-findings")[0].columns) == ["id"]
