"""The fresh-clone record reads each run from its log: the wall time from the shell's `time`, the outcome from the
command's own summary; it refuses what it cannot read, never records a run twice, and counts the main job's last
three runs as clean and within budget only when they are."""

from pathlib import Path

import pytest

from lab.tools.run_ledger import BUDGET_S, ledger_section, read_ledger, record

MAKE_RUN_LOG = """[24/24] 23_kv_tier (profile full, parameters {})
notebook  seconds  result
24 ok, 0 failed, 2201 s in all
canonical: data/reference/results/...

real\tMINUTESm12.5s
user\t60m1.0s
"""
CI_LOG = """======================== 46 passed in 20.02s ========================
=========== 860 passed, 3 skipped, 3 warnings in 1068.25s (0:17:48) ============

real\t19m26.0s
"""


def main_job_log(minutes: int) -> str:
    return MAKE_RUN_LOG.replace("MINUTES", str(minutes))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_main_job_log_gives_its_outcome_wall_time_and_notebook_seconds(tmp_path):
    ledger = tmp_path / "runs.csv"
    row = record(write(tmp_path, "mr.log", main_job_log(38)), "make run", "6842b14abc", "nothing",
                 cells_over_2x=0, ledger=ledger)
    assert (row["outcome"], row["wall_s"], row["inner_s"], row["clean"], row["commit"]) == \
        ("24 ok, 0 failed", 38 * 60 + 12, 2201, True, "6842b14")
    assert len(read_ledger(ledger)) == 1


def test_a_ci_log_gives_the_behaviour_suites_line_without_its_warnings(tmp_path):
    row = record(write(tmp_path, "ci.log", CI_LOG), ".ci/run", "e709dc8", "nothing", ledger=tmp_path / "runs.csv")
    assert (row["outcome"], row["inner_s"], row["wall_s"], row["clean"]) == ("860 passed, 3 skipped", 1068, 1166, True)


def test_failures_and_slow_cells_are_not_clean(tmp_path):
    ledger = tmp_path / "runs.csv"
    failed = main_job_log(30).replace("24 ok, 0 failed", "23 ok, 1 failed")
    assert not record(write(tmp_path, "a.log", failed), "make run", "a", "nothing", 0, ledger)["clean"]
    assert not record(write(tmp_path, "b.log", main_job_log(31)), "make run", "b", "nothing", 2,
                      ledger)["clean"]
    broken = CI_LOG.replace("860 passed, 3 skipped", "2 failed, 858 passed")
    assert not record(write(tmp_path, "c.log", broken), ".ci/run", "c", "nothing", ledger=ledger)["clean"]


def test_what_it_cannot_read_is_refused_by_name(tmp_path):
    ledger = tmp_path / "runs.csv"
    with pytest.raises(ValueError, match="time"):
        record(write(tmp_path, "a.log", "24 ok, 0 failed, 10 s in all\n"), "make run", "a", "nothing", ledger=ledger)
    with pytest.raises(ValueError, match="runner summary"):
        record(write(tmp_path, "b.log", CI_LOG), "make run", "a", "nothing", ledger=ledger)
    with pytest.raises(ValueError, match="command="):
        record(write(tmp_path, "c.log", CI_LOG), "make test", "a", "nothing", ledger=ledger)
    log = write(tmp_path, "d.log", main_job_log(38))
    record(log, "make run", "a", "nothing", ledger=ledger)
    with pytest.raises(ValueError, match="already records"):
        record(log, "make run", "a", "nothing", ledger=ledger)
    assert len(read_ledger(ledger)) == 1


def test_the_section_counts_the_last_three_main_job_runs_against_the_budget(tmp_path):
    ledger = tmp_path / "runs.csv"
    over = BUDGET_S["make run"] // 60 + 1
    for commit, minutes in [("a", 38), ("b", over), ("c", 36), ("d", 39)]:
        record(write(tmp_path, f"{commit}.log", main_job_log(minutes)), "make run", commit, "nothing",
               0, ledger)
    assert "the last 3: 2 clean and within 40 minutes" in ledger_section(ledger)
    record(write(tmp_path, "e.log", main_job_log(35)), "make run", "e", "nothing", 0, ledger)
    section = ledger_section(ledger)
    assert "(5 runs; the last 3: 3 clean and within 40 minutes)" in section
    assert section.count("| no ") == 1  # b, over the budget, and nothing else
