"""The soak of the widget cells (lab.tools.soak): it finds the five lessons' widget cells, runs a cell through both
headless paths in its context, counts a run that never replies as a stall, and sets LAB_HEADLESS as asked."""

import nbformat
import pytest

from lab.front_end import HEADLESS_ENV
from lab.tools import soak


def test_the_five_lessons_with_a_widget_cell_are_found():
    assert soak.widget_lessons() == ["01_block_hashing", "04_block_size_sweep", "05_cache_on_vs_off", "08_eviction",
                                     "20_your_workload"]


def lesson(tmp_path, widget_cell: str):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a lesson"),
        nbformat.v4.new_code_cell("import os\ncontext = 41"),  # the widget cell's context, run once
        nbformat.v4.new_code_cell(widget_cell)])
    path = tmp_path / "99_lesson.ipynb"
    nbformat.write(nb, path)
    return str(path)


@pytest.mark.parametrize("path", soak.PATHS)
def test_a_cell_that_replies_counts_no_stall_and_the_kernel_gets_the_headless_setting(tmp_path, path):
    cell = (f"if has_front_end():\n    pass\nassert context == 41\n"
            f"assert os.environ.get({HEADLESS_ENV!r}) == '1', 'the headless run sets LAB_HEADLESS'")
    count = soak.soak(lesson(tmp_path, "from lab.front_end import has_front_end\n" + cell), path, runs=3, timeout=20,
                      widgets=False)
    assert (count.runs, count.stalls) == (3, 0)
    assert "0 stalls in 3 runs through " + path in count.line()


@pytest.mark.parametrize("path", soak.PATHS)
def test_a_run_with_no_reply_in_time_is_a_stall(tmp_path, path):
    # a cell still busy after the timeout gets no reply in time: the soak counts it, as it would a lost reply
    cell = f"if has_front_end():\n    import time\n    time.sleep(4)\nassert {HEADLESS_ENV!r} not in os.environ"
    count = soak.soak(lesson(tmp_path, "from lab.front_end import has_front_end\n" + cell), path, runs=1, timeout=1,
                      widgets=True)
    assert count.stalls == 1


def test_bad_input_names_the_parameter(tmp_path):
    with pytest.raises(ValueError, match="runs=0"):
        soak.soak("01_block_hashing", "nbval", runs=0, timeout=5, widgets=False)
    with pytest.raises(ValueError, match="path='nbconvert'"):
        soak.soak("01_block_hashing", "nbconvert", runs=1, timeout=5, widgets=False)
    with pytest.raises(SystemExit, match="no lesson"):
        soak.soak("99_missing", "nbval", runs=1, timeout=5, widgets=False)
    no_widget = lesson(tmp_path, "x = 1")
    with pytest.raises(SystemExit, match="no widget cell"):
        soak.soak(no_widget, "nbval", runs=1, timeout=5, widgets=False)
