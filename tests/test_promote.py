"""`make promote` (lab.tools.promote): only a finished run of the profile becomes canonical, each figure is taken
from its notebook's finished run and no other, and an executed notebook becomes readable without installing."""

import base64

import nbformat
import plotly.graph_objects as go
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from lab.experiments.plots import find_chrome, save_figure
from lab.tools import promote


def executed(path, run, ok, profile="full"):
    nb = new_notebook(metadata={"lab": {"run": run, "profile": profile, "ok": ok}})
    nbformat.write(nb, path)


def test_only_finished_runs_of_the_profile_count(tmp_path, monkeypatch):
    monkeypatch.setattr(promote, "RUNS_DIR", tmp_path)
    (tmp_path / "full").mkdir()
    executed(tmp_path / "full" / "03_ok.ipynb", "03_ok-full-1", True)
    executed(tmp_path / "full" / "04_failed.ipynb", "04_failed-full-1", False)
    executed(tmp_path / "full" / "05_quick.ipynb", "05_quick-quick-1", True, profile="quick")
    assert promote.finished_runs("full") == {"03_ok": "03_ok-full-1"}


@pytest.mark.skipif(find_chrome() is None, reason="kaleido needs a Chrome for PNGs")
def test_a_committed_figure_is_replaced_only_by_its_notebooks_finished_run(tmp_path, monkeypatch):
    committed, drawn = tmp_path / "figures", tmp_path / "runs"
    committed.mkdir()
    monkeypatch.setenv("LAB_FIGURES_DIR", str(drawn))
    for name, run in (("05_a-x", "05_a-full-1"), ("06_b-y", "06_b-quick-9")):
        monkeypatch.setenv("LAB_RUN_ID", run)
        save_figure(go.Figure(go.Bar(y=[1])), name, png=True)
        (committed / f"{name}.png").write_bytes(b"old")
    copied = promote.promote_figures({"05_a": "05_a-full-1", "06_b": "06_b-full-2"}, drawn, committed)
    assert [p.name for p in copied] == ["05_a-x.png"]
    assert (committed / "06_b-y.png").read_bytes() == b"old", "a quick run's figure never replaces the canonical one"


def test_an_executed_notebook_becomes_a_readers_edition(tmp_path, monkeypatch):
    """A banner that names the run and says how a learner's run differs; figures as PNG; no widget (a frozen
    progress bar), no stderr; the exercises at the end as questions with starter code, without solutions."""
    monkeypatch.setattr(promote, "_plotly_png", lambda figure: base64.b64encode(b"png").decode())
    cell = new_code_cell("x")
    cell.outputs = [
        new_output("stream", name="stderr", text="NUMA binding warning"),
        new_output("stream", name="stdout", text="all checks passed"),
        new_output("display_data", data={promote.PLOTLY_TYPE: {"data": []}, "text/html": "<script>big</script>"}),
        new_output("display_data", data={promote.WIDGET_TYPES[0]: {"model_id": "m"}, "text/plain": "50%|##"}),
        new_output("display_data", data={promote.WIDGET_TYPES[0]: {"model_id": "n"}}),
    ]
    exercises = [new_markdown_cell("## Exercises"), new_raw_cell("# BEGIN QUESTION"), new_raw_cell("# BEGIN SOLUTION"),
                 new_code_cell("answer = 1  # SOLUTION"), new_raw_cell("# END SOLUTION"), new_raw_cell("# BEGIN TESTS"),
                 new_code_cell("assert answer == 1"), new_raw_cell("# END TESTS"), new_raw_cell("# END QUESTION")]
    nb = new_notebook(cells=[cell, *exercises], metadata={"widgets": {"state": "large"},
                                                          "lab": {"run": "05-full-1", "profile": "full", "ok": True}})
    nbformat.write(nb, tmp_path / "run.ipynb")
    lesson = nbformat.read(promote.readable_lesson(tmp_path / "run.ipynb", tmp_path / "lesson.ipynb"), as_version=4)
    assert "widgets" not in lesson.metadata
    assert [c.cell_type for c in lesson.cells] == ["markdown", "code", "markdown", "markdown", "code"], \
        "the banner, the lesson, the exercises' heading, how to check, the starter code"
    assert lesson.cells[-1].source == "answer = ...", "the solution taken out, the raw markers gone"
    assert "run `05-full-1`" in lesson.cells[0].source and "quick profile" in lesson.cells[0].source
    assert [o.get("text") or sorted(o["data"]) for o in lesson.cells[1].outputs] == [
        "all checks passed", ["image/png", "text/plain"]]


def test_prose_is_brought_up_to_the_source_only_where_the_code_is_the_one_that_ran(tmp_path):
    from nbformat.v4 import new_markdown_cell

    def notebook(prose, code):
        nb = new_notebook(cells=[new_markdown_cell(prose), new_code_cell(code)])
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"c{i}"
        return nb

    ran = notebook("# 05 · old title", "x = 1")
    ran.cells[1].outputs = [new_output("stream", name="stdout", text="1")]
    nbformat.write(ran, tmp_path / "lesson.ipynb")
    nbformat.write(notebook("# 05 · new title", "x = 1"), tmp_path / "source.ipynb")
    assert promote.refresh_prose(tmp_path / "lesson.ipynb", tmp_path / "source.ipynb") is True
    refreshed = nbformat.read(tmp_path / "lesson.ipynb", as_version=4)
    assert refreshed.cells[0].source == "# 05 · new title" and refreshed.cells[1].outputs[0]["text"] == "1"
    nbformat.write(notebook("# 05 · new title", "x = 2"), tmp_path / "source.ipynb")
    assert promote.refresh_prose(tmp_path / "lesson.ipynb", tmp_path / "source.ipynb") is None, "code changed: a new run"


def test_a_one_line_code_fix_marks_the_executed_copy_and_a_fresh_run_clears_it(tmp_path):
    """A lesson's code changes by one line: its executed copy opens with a notice naming that cell and its diff,
    which the check accepts; the notice is rewritten, not stacked; a copy whose code is current carries none."""
    import nbformat

    from lab.tools import stale

    executed, source, nb = executed_and_source(tmp_path)
    ran = nbformat.read(executed, as_version=4)  # the lesson as it ran
    nbformat.write(nb, source)
    assert stale.mark(executed, source) is False and stale.is_marked_right(executed, source), "current: no notice"
    fixed = next(c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", []))
    fixed.source += "\nprint('a one-line fix')"
    nbformat.write(nb, source)
    assert not stale.is_marked_right(executed, source), "a changed lesson with no notice fails the check"
    assert stale.mark(executed, source) is True and stale.is_marked_right(executed, source)
    marked = nbformat.read(executed, as_version=4)
    assert marked.cells[0].id == stale.NOTICE_ID and "+print('a one-line fix')" in marked.cells[0].source
    assert marked.metadata["lab"]["stale"] == {"cells": [f"changed {nb.cells.index(fixed)}"]}
    assert "older than the lesson" in marked.cells[0].source and marked.metadata["lab"]["run"] in marked.cells[0].source
    assert stale.mark(executed, source) is False, "marking twice changes nothing"
    fixed.source = fixed.source.removesuffix("\nprint('a one-line fix')")
    nbformat.write(nb, source)
    assert stale.mark(executed, source) is True
    assert [c.id for c in nbformat.read(executed, as_version=4).cells] == [c.id for c in ran.cells], "and it goes"


def test_promoting_without_a_chrome_stops_before_anything_is_copied(monkeypatch, tmp_path):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chrome"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium, chromium-browser or google-chrome on it
    with pytest.raises(SystemExit, match="apt-get install chromium"):
        promote.main(["--check"])
    with pytest.raises(SystemExit, match="none was found"):
        promote.main([])  # before it looks for runs, copies results or figures


def executed_and_source(tmp_path):
    """05's executed copy as it ran, and a source that matches it (the injected parameters left out)."""
    import nbformat

    from lab.tools import stale

    ran = nbformat.read(next(promote.LESSONS_DIR.glob("05_*.ipynb")), as_version=4)
    ran.cells = [c for c in ran.cells if c.id != stale.NOTICE_ID]
    ran.metadata["lab"].pop("stale", None)
    executed, source = tmp_path / "lesson.ipynb", tmp_path / "source.ipynb"
    nbformat.write(ran, executed)
    nb = nbformat.read(executed, as_version=4)
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    return executed, source, nb


def test_a_quicker_default_that_the_run_overrode_changes_nothing_that_ran(tmp_path):
    import nbformat

    from lab.tools import stale

    executed, source, nb = executed_and_source(tmp_path)
    overridden = stale.overridden_parameters(nbformat.read(executed, as_version=4))
    assert "n_prompts" in overridden and "model" not in overridden, "the full profile sets n_prompts, not model"
    parameters = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    parameters.source = parameters.source.replace("n_prompts = ", "n_prompts = 3 * ", 1)
    nbformat.write(nb, source)
    assert stale.code_changes(nbformat.read(executed, as_version=4), nb) == [], "n_prompts was injected: never ran"
    assert promote.stale_prose(executed, source) == {}, "so a prose fix still lands without a rerun"
    parameters.source += "\nseed = 1"
    nbformat.write(nb, source)
    assert [c.kind for c in stale.code_changes(nbformat.read(executed, as_version=4), nb)] == ["changed"]
    assert promote.stale_prose(executed, source) is None


def test_a_new_paragraph_lands_after_the_cell_it_follows(tmp_path):
    import nbformat

    executed, source, nb = executed_and_source(tmp_path)
    figure = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "save_figure" in c.source)
    said = nbformat.v4.new_markdown_cell("**What to see.** The bars.")
    said["id"] = "what-to-see"
    nb.cells.insert(figure + 1, said)
    nbformat.write(nb, source)
    assert promote.refresh_prose(executed, source) is True
    cells = nbformat.read(executed, as_version=4).cells
    at = [c.get("id") for c in cells].index("what-to-see")
    assert cells[at - 1].get("id") == nb.cells[figure].get("id") and cells[at - 1].outputs, "after its figure, kept"
    assert promote.refresh_prose(executed, source) is False, "and only once"
