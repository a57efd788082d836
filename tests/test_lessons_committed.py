"""What the repository shows was made by the canonical run it cites: every lesson's executed copy in docs/lessons/
(readable on a code host without installing) ran every cell without an error, in the full profile, and is the
same run that wrote the notebook's canonical results; every committed figure records that run in its PNG."""

import json
from pathlib import Path

import nbformat
import pytest
from whole_tree import failures

from lab import PROJECT_ROOT
from lab.experiments.plots import COMMITTED_FIGURES_DIR
from lab.experiments.provenance import png_text
from lab.experiments.results import CANONICAL_DIR
from lab.tools.promote import LESSONS_DIR, PLOTLY_TYPE, WIDGET_TYPES
from lab.tools.runner import all_notebooks

pytestmark = pytest.mark.repo  # the repository's content, not behaviour: make check-repo

LESSON_BUDGET_MB = 1.0  # one executed lesson, its figures as PNG (the largest: 0.4 MB)
ALL_LESSONS_BUDGET_MB = 6.0  # all of them (3.4 MB)


def canonical_runs() -> dict[str, set[str]]:
    """notebook -> the named runs (lab.tools.runner) its canonical results files record. Results made outside a
    named run (a benchmark, the audit's scale run, a cost-model fit) carry their own provenance and no run name."""
    runs: dict[str, set[str]] = {}
    for meta in CANONICAL_DIR.glob("*.json"):
        env = json.loads(meta.read_text())["environment"]
        if env.get("run"):
            runs.setdefault(env.get("notebook", ""), set()).add(env["run"])
    return runs


def saves_results(notebook: str) -> bool:
    return "save_results(" in (PROJECT_ROOT / "notebooks" / f"{notebook}.ipynb").read_text()


def test_every_lesson_has_an_executed_copy_and_they_fit_the_budget():
    lessons = {p.stem for p in LESSONS_DIR.glob("*.ipynb")}
    assert lessons == {p.stem for p in all_notebooks()}, "make promote after make run writes one per lesson"
    sizes = {p.name: p.stat().st_size / 1e6 for p in LESSONS_DIR.glob("*.ipynb")}
    assert max(sizes.values()) <= LESSON_BUDGET_MB, sizes
    assert sum(sizes.values()) <= ALL_LESSONS_BUDGET_MB, sizes


def ran_clean_in_the_canonical_run(lesson: Path) -> None:
    nb = nbformat.read(lesson, as_version=4)
    meta = nb.metadata.get("lab", {})
    assert meta.get("ok") is True and meta.get("profile") == "full", meta
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs, "an executed lesson shows its outputs"
    assert not [o for o in outputs if o.output_type == "error"], "no cell raised"
    assert not any(kind in o.get("data", {}) for o in outputs for kind in (*WIDGET_TYPES, PLOTLY_TYPE)), \
        "figures as PNG, no widget state: what a code host can show"
    assert "widgets" not in nb.metadata
    if saves_results(lesson.stem):  # its canonical results are this very run's
        runs = canonical_runs().get(lesson.stem)
        assert runs == {meta["run"]}, f"{lesson.stem}: canonical results from {runs}, executed copy from {meta['run']}"


def test_an_executed_lesson_ran_clean_in_the_canonical_run():
    assert failures(ran_clean_in_the_canonical_run, sorted(LESSONS_DIR.glob("*.ipynb")), lambda p: p.stem) == {}


def is_the_lesson_or_says_what_changed(lesson: Path) -> None:
    """A copy whose code is current has the source's prose (`python -m lab.tools.promote --prose` brings it over). A
    copy whose code is older opens with a notice naming each changed cell (`python -m lab.tools.stale` writes it):
    a fix to a lesson's code lands with its fast checks, and the reader is told the outputs are an older run's."""
    from lab.tools.promote import stale_prose
    from lab.tools.stale import is_marked_right

    source = PROJECT_ROOT / "notebooks" / lesson.name
    assert is_marked_right(lesson, source), "the stale notice is missing, wrong or left over: python -m lab.tools.stale"
    assert stale_prose(lesson, source) in ({}, None), "the prose changed: python -m lab.tools.promote --prose"


def test_an_executed_lesson_is_the_lesson_as_it_stands_or_says_what_changed():
    assert failures(is_the_lesson_or_says_what_changed, sorted(LESSONS_DIR.glob("*.ipynb")), lambda p: p.stem) == {}


def drawn_by_the_cited_run(figure: Path) -> None:
    text = png_text(figure)
    notebook = figure.name.split("-")[0]
    assert text.get("lab:profile") == "full", f"{figure.name} was drawn by a {text.get('lab:profile')} run"
    assert text.get("lab:figure") == figure.stem
    assert canonical_runs().get(notebook) == {text["lab:run"]}, \
        f"{figure.name}: drawn by {text['lab:run']}, the results cited are {canonical_runs().get(notebook)}"
    results_md = (PROJECT_ROOT / "docs" / "RESULTS.md").read_text()
    assert f"../figures/{figure.name}" in results_md, "a committed figure is one the results page shows"


def test_a_committed_figure_was_drawn_by_the_run_its_notebooks_results_cite():
    assert failures(drawn_by_the_cited_run, sorted(COMMITTED_FIGURES_DIR.glob("*.png")), lambda p: p.stem) == {}
