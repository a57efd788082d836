"""lab.tools.cell_times: a run's cells against the canonical run's, by id; a cell over 2x its canonical time is
named, and a small cell is not."""

import shutil

import nbformat
import pytest

from lab import PROJECT_ROOT
from lab.tools import cell_times

CANONICAL = PROJECT_ROOT / "docs" / "lessons"


def slowed_copy(tmp_path, factor: float):
    """05's executed copy with its longest cell `factor` times slower."""
    shutil.copy(CANONICAL / "05_cache_on_vs_off.ipynb", tmp_path / "05_cache_on_vs_off.ipynb")
    nb = nbformat.read(tmp_path / "05_cache_on_vs_off.ipynb", as_version=4)
    ran = [c for c in nb.cells if c.cell_type == "code" and "papermill" in c.metadata]  # not the open exercises
    longest = max(ran, key=lambda c: c.metadata["papermill"]["duration"])
    longest.metadata["papermill"]["duration"] *= factor
    nbformat.write(nb, tmp_path / "05_cache_on_vs_off.ipynb")
    return longest


def test_the_canonical_run_against_itself_has_no_slow_cell():
    lessons, slow = cell_times.compare(CANONICAL, CANONICAL)
    assert len(lessons) == len(list(CANONICAL.glob("[0-9][0-9]_*.ipynb"))) and slow == []
    assert all(seconds == base > 0 for _, seconds, base in lessons)


def test_a_cell_over_twice_its_canonical_time_is_named(tmp_path):
    longest = slowed_copy(tmp_path, 2.5)
    _, slow = cell_times.compare(tmp_path, CANONICAL)
    assert [(c.lesson, round(c.ratio, 2)) for c in slow] == [("05_cache_on_vs_off", 2.5)]
    assert slow[0].first_line == longest.source.strip().split("\n")[0][:80]
    _, slow = cell_times.compare(tmp_path, CANONICAL, factor=3)
    assert slow == []
    with pytest.raises(SystemExit) as exit:
        cell_times.main([str(tmp_path)])
    assert exit.value.code == 1


def test_no_run_to_compare_says_what_to_do(tmp_path):
    with pytest.raises(SystemExit, match="make run"):
        cell_times.compare(tmp_path, CANONICAL)


def test_a_short_cell_is_not_judged_however_it_moved(tmp_path):
    # cells under MIN_SECONDS in both runs moved by up to 7.9x between two canonical runs: noise, not a stall
    shutil.copy(CANONICAL / "05_cache_on_vs_off.ipynb", tmp_path / "05_cache_on_vs_off.ipynb")
    nb = nbformat.read(tmp_path / "05_cache_on_vs_off.ipynb", as_version=4)
    short = next(c for c in nb.cells if c.cell_type == "code" and 2 < c.metadata["papermill"]["duration"] < 3)
    short.metadata["papermill"]["duration"] *= 3  # still under 10 s
    nbformat.write(nb, tmp_path / "05_cache_on_vs_off.ipynb")
    assert cell_times.compare(tmp_path, CANONICAL)[1] == []
    assert len(cell_times.compare(tmp_path, CANONICAL, min_seconds=2)[1]) == 1
