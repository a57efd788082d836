"""A lesson's minutes come from a recorded quick run: papermill's seconds per executed lesson, saved with the machine
and commit; a run under another profile, or with a failed lesson, is refused; the pages render what was recorded."""

import nbformat
import pytest

from lab.tools.quick_times import load_quick_times, minutes_by_lesson, record_quick_times, workshop_section


def executed(folder, name, seconds, profile="quick", ok=True):
    nb = nbformat.v4.new_notebook()
    nb.metadata["papermill"] = {"duration": seconds}
    nb.metadata["lab"] = {"run": f"{name}-{profile}-20261205T000000", "profile": profile, "ok": ok}
    nbformat.write(nb, folder / f"{name}.ipynb")


def test_a_quick_run_is_recorded_and_rendered_in_minutes(tmp_path):
    run = tmp_path / "quick"
    run.mkdir()
    executed(run, "00_quickstart", 53.24)
    executed(run, "01_block_hashing", 19.0)
    out = record_quick_times(run, tmp_path / "times.csv")
    table = load_quick_times(out)
    assert list(table.notebook) == ["00_quickstart", "01_block_hashing"] and list(table.seconds) == [53.2, 19.0]
    assert {"machine", "vllm", "code", "date"} <= set(table.columns)
    assert minutes_by_lesson(out) == {"00_quickstart": "0.9", "01_block_hashing": "0.3"}
    section = workshop_section(out)
    assert "`00_quickstart`" in section and "53 s" in section and "19 s" in section


def test_a_run_under_another_profile_or_with_a_failed_lesson_is_refused(tmp_path):
    run = tmp_path / "full"
    run.mkdir()
    executed(run, "00_quickstart", 300.0, profile="full")
    with pytest.raises(ValueError, match="profile 'full'"):
        record_quick_times(run, tmp_path / "times.csv")
    failed = tmp_path / "quick"
    failed.mkdir()
    executed(failed, "00_quickstart", 50.0, ok=False)
    with pytest.raises(SystemExit, match="00_quickstart failed"):
        record_quick_times(failed, tmp_path / "times.csv")
    assert not (tmp_path / "times.csv").exists()
