import pandas as pd
import pytest

import lab.report
from lab.model import ensure_model
from lab.report import recommend_block_size, results_section, update_readme
from lab.results import environment, save_results


def test_recommendation_keeps_95_percent_of_the_best_hit_rate():
    sweep = pd.DataFrame({"workload": ["a"] * 3 + ["b"] * 3, "block_size": [32, 64, 128] * 2,
                          "vllm_hit_rate": [0.80, 0.79, 0.70, 0.60, 0.50, 0.40]})
    assert recommend_block_size(sweep).to_dict() == {"a": 64, "b": 32}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    env = environment(n_prompts=10, max_tokens=4, block_size=32, online_rate=8.0, online_prompts=5,
                      model=str(ensure_model("tiny")))
    table = pd.DataFrame({"metric": ["mean_ttft_ms", "requests_per_s", "hit_rate"],
                          "cache off": [200.0, 10.0, 0.0], "cache on": [100.0, 15.0, 0.5],
                          "change_%": [-50.0, 50.0, float("nan")]})
    save_results(table, "04_cache_on_vs_off-offline", env)
    save_results(table, "04_cache_on_vs_off-online", env)
    save_results(pd.DataFrame({"workload": ["a", "a"], "block_size": [32, 64], "vllm_hit_rate": [0.5, 0.49]}),
                 "03_block_size_sweep-vllm", env)


def test_results_section_shows_ours_beside_the_articles(results):
    text = results_section()
    assert "| mean TTFT (ms) | 200 | 100 | -50% | 2,350 | 1,270 | -46% |" in text
    assert "| requests/s | 10 | 15 | +50% | 12.5 | 22.8 | +82% |" in text
    assert "1 / (1 - 0.500) = 2.00x" in text and "**64**" in text


def test_the_prose_follows_the_numbers(results):
    text = results_section()
    assert "Throughput rose 1.50x" in text and "is 75% of the bound" in text
    assert "The article's gain, 1.82x, is smaller" not in text and "1.82x, is larger" in text
    assert "80% of the no-cache offline throughput" in text, "8 of the 10 requests/s measured without cache"
    assert "the lab's `tiny` preset (" in text and " M parameters, float32)" in text


def test_readme_is_rewritten_only_between_the_markers(results, tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{lab.report.START}\nold\n{lab.report.END}\noutro\n")
    monkeypatch.setattr(lab.report, "README", readme)
    update_readme()
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text and "| mean TTFT" in text
