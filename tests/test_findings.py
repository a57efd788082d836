"""Findings as data: saved with a run, read back by id unchanged, and refused when they cannot be a finding."""

from pathlib import Path

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


def test_sizes_the_run_cannot_tell_apart_are_settled_by_their_exact_hit_rates():
    """32 and 64 overlap, 128 lies above 32 only: TTFT leaves "32 or 64", and the hit rate picks one."""
    runs = pd.DataFrame({"workload": "w", "block_size": [32, 64, 128] * 2, "vllm_hit_rate": [0.6, 0.7, 0.8] * 2,
                         "mean_ttft_ms": [5.0, 5.1, 6.0, 5.2, 6.5, 6.2]})
    (finding,) = block_size_findings(runs)
    assert (finding.verdict, finding.value) == (HOLDS, "64"), "64 caches more than 32; 128 is shown slower"
    assert "cannot tell 32 or 64 apart" in finding.answer and "128 shown slower than 32" in finding.answer
    assert "64 caches the most (hit rate 32: 0.600, 64: 0.700)" in finding.answer
    (equal,) = block_size_findings(runs.assign(vllm_hit_rate=0.5))
    assert equal.value == "32", "at equal hit rates, the smaller block: the finer sharing"


def test_a_verdict_becomes_a_finding_that_holds_fails_or_cannot_tell():
    from lab.experiments.findings import DOES_NOT_HOLD, from_verdict
    from lab.experiments.verdict import Spread, against_bound

    below = against_bound(Spread("gain", (2.6, 2.7), "pair"), 3.3, quantity="gain", bound_name="the bound")
    above = against_bound(Spread("gain", (3.6, 3.7), "pair"), 3.3, quantity="gain", bound_name="the bound")
    astride = against_bound(Spread("gain", (3.0, 3.6), "pair"), 3.3, quantity="gain", bound_name="the bound")
    says = {HOLDS: "Below the bound.", DOES_NOT_HOLD: "Above the bound."}
    assert from_verdict(below, "g", "Below?", expected="below", says=says).verdict == HOLDS
    wrong = from_verdict(above, "g", "Below?", expected="below", says=says)
    assert (wrong.verdict, wrong.answer) == (DOES_NOT_HOLD, "Above the bound.")
    unsure = from_verdict(astride, "g", "Below?", expected="below", says=says)
    assert unsure.verdict == CANNOT_TELL and unsure.answer == astride.text == unsure.evidence
    assert from_verdict(above, "g", "Which side?").verdict == HOLDS, "no expectation: any order the run tells holds"


def test_a_timing_check_and_an_exact_count_become_findings():
    from lab.experiments.findings import DOES_NOT_HOLD, exact, from_check
    from lab.experiments.verdict import timing_check

    passes = timing_check([2.6, 2.7, 2.65], "at_most", 3.3, quantity="gain", bound_name="the bound")
    alarm = timing_check([4.6, 4.7, 4.65], "at_most", 3.3, quantity="gain", bound_name="the bound")
    assert from_check(passes, "g", "At most?").verdict == HOLDS
    assert from_check(alarm, "g", "At most?").verdict == DOES_NOT_HOLD and "ALARM" in from_check(alarm, "g", "?").answer
    says = {HOLDS: "Equal outputs.", DOES_NOT_HOLD: "Outputs differ."}
    assert exact("same", "Equal?", True, says, "3 of 3 prompts").answer == "Equal outputs."
    assert exact("same", "Equal?", False, says, "2 of 3 prompts").verdict == DOES_NOT_HOLD
    with pytest.raises(ValueError, match="says has no sentence for 'does not hold'"):
        exact("same", "Equal?", False, {HOLDS: "Equal outputs."}, "2 of 3")


def test_a_takeaway_saves_and_prints_the_lessons_findings(tmp_path, monkeypatch, capsys):
    from lab.experiments.findings import takeaway

    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("LAB_PROFILE", "full")  # as `make run` sets it: only a full run's findings are read back
    found = [Finding("a", "Does it?", HOLDS, "It does: 3 of 3.", "exact")]
    path = takeaway("99_lesson", found)
    assert path.name.startswith("99_lesson-findings-") and load_findings("99_lesson") == {"a": found[0]}
    assert "- [holds] It does: 3 of 3." in capsys.readouterr().out
    with pytest.raises(ValueError, match="at least one finding"):
        takeaway("99_lesson", [])


def test_the_results_page_lists_each_lessons_saved_findings_and_names_those_without(tmp_path, monkeypatch):
    from lab.tools import findings_report

    monkeypatch.setattr(findings_report, "all_notebooks", lambda: [Path("01_one.ipynb"), Path("02_two.ipynb")])
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    save_findings([Finding("same", "Equal?", HOLDS, "All 3 outputs equal.", "3 prompts"),
                   Finding("gain", "Below?", CANNOT_TELL, "The pairs straddle it.", "2 pairs")], "01_one", {})
    section = findings_report.findings_section(tmp_path)
    assert section.startswith("2 findings from 1 lessons (1 holds, 0 does not hold, 1 cannot tell)")
    assert "- `same` **holds**: All 3 outputs equal." in section and "**`01_one`** (run `01_one-findings-" in section
    assert section.endswith("No findings saved yet by `02_two`.")


@pytest.mark.repo
def test_every_lesson_closes_with_a_takeaway_that_saves_its_own_findings():
    import json

    from lab import PROJECT_ROOT
    from lab.tools.runner import all_notebooks

    missing = []
    for lesson in (path.stem for path in all_notebooks()):
        cells = json.loads((PROJECT_ROOT / "notebooks" / f"{lesson}.ipynb").read_text())["cells"]
        sources = ["".join(c["source"]) for c in cells]
        heading = next((i for i, s in enumerate(sources) if s.startswith("## Takeaway")), None)
        exercises = next((i for i, s in enumerate(sources) if s.startswith("## Exercises")), len(sources))
        if heading is None or heading > exercises or f'takeaway("{lesson}"' not in sources[heading + 1]:
            missing.append(lesson)
    assert not missing, f"lessons without a takeaway cell calling takeaway(\"<lesson>\", ...) before the exercises: {missing}"
