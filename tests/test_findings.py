"""Findings as data: saved with a run, read back by id unchanged, and refused when they cannot be a finding."""

import pandas as pd
import pytest

from lab.experiments.block_sizes import block_size_findings
from lab.experiments.findings import CANNOT_TELL, HOLDS, Finding, answer, load_findings, save_findings


def test_findings_round_trip_through_their_results_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    found = [Finding("a", "Does it?", HOLDS, "It does: 3 of 3.", "exact", 3),
             Finding("b", "Which size?", CANNOT_TELL, "This run cannot tell.", "ranges overlap")]
    save_findings(found, "99_lesson", {"profile": "full"})
    assert load_findings("99_lesson") == {"a": found[0], "b": found[1]}
    assert answer("99_lesson", "a").value == 3
    with pytest.raises(KeyError, match="99_lesson has no finding 'c'; its findings: a, b"):
        answer("99_lesson", "c")


def test_a_finding_needs_a_known_verdict_an_answer_and_a_unique_id(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="verdict='probably'; use one of holds, does not hold, cannot tell"):
        Finding("a", "q", "probably", "x", "e")
    with pytest.raises(ValueError, match="an empty answer"):
        Finding("a", "q", HOLDS, " ", "e")
    with pytest.raises(ValueError, match="finding ids must be unique"):
        save_findings([Finding("a", "q", HOLDS, "x", "e")] * 2, "99_lesson", {})


def test_the_block_size_finding_says_cannot_tell_on_one_run_and_names_a_size_on_two():
    one = pd.DataFrame({"workload": "w", "block_size": [32, 64], "vllm_hit_rate": 0.5, "mean_ttft_ms": [5.0, 9.0]})
    (finding,) = block_size_findings(one)
    assert finding.verdict == CANNOT_TELL and finding.value is None and "cannot tell" in finding.answer
    two = pd.concat([one, one.assign(mean_ttft_ms=[5.1, 9.2])])
    (finding,) = block_size_findings(two)
    assert (finding.id, finding.verdict, finding.value) == ("block_size.w", HOLDS, "32")
    assert "block size 32" in finding.answer and "32 (5.00-5.10 ms)" in finding.evidence


def test_sizes_the_run_cannot_tell_apart_are_both_the_answer_and_the_finding_cannot_tell():
    """32 and 64 overlap, 128 lies above 32 only: the answer is "32 or 64", and the verdict says the run cannot tell."""
    runs = pd.DataFrame({"workload": "w", "block_size": [32, 64, 128] * 2, "vllm_hit_rate": 0.5,
                         "mean_ttft_ms": [5.0, 5.1, 6.0, 5.2, 6.5, 6.2]})
    (finding,) = block_size_findings(runs)
    assert (finding.verdict, finding.value) == (CANNOT_TELL, "32 or 64")
    assert "cannot tell 32 or 64 apart" in finding.answer and "128 shown slower than 32" in finding.answer
