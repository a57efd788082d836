"""`make promote`: the canonical run becomes what the repository shows, each piece tied to the run
that made it.

    python -m lab.tools.promote [--profile full]

For every notebook whose latest run of the profile (runs/<profile>/NAME.ipynb) finished without an
error:
- its results files from that run go to data/reference/results/ (replacing the ones of the same
  name);
- its figures the docs show (the PNGs committed in figures/) are copied from that run, which each
  PNG records;
- the executed notebook goes to docs/lessons/, readable on a code host without installing anything:
  plotly figures become PNG images, progress-bar widgets their text, and logs on stderr are left
  out. A notebook whose latest run failed keeps what it had.

    python -m lab.tools.promote --prose

brings each executed lesson's markdown up to its source after an edit to the prose alone; a lesson
whose code changed is named and left as it is (it needs a new run).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
from pathlib import Path

import nbformat

from lab import PROJECT_ROOT
from lab.experiments.plots import COMMITTED_FIGURES_DIR, figures_dir, find_chrome
from lab.experiments.provenance import png_text
from lab.experiments.results import CANONICAL_DIR, promote, results_dir
from lab.tools import course_map
from lab.tools.open_exercises import open_exercises
from lab.tools.runner import NOTEBOOKS_DIR, RUNS_DIR
from lab.tools.stale import BANNER_ID, LESSONS_DIR, code_changes, lesson_cells, mark

WIDGET_TYPES = (
    "application/vnd.jupyter.widget-view+json",
    "application/vnd.jupyter.widget-state+json",
)
PLOTLY_TYPE = "application/vnd.plotly.v1+json"


def finished_runs(profile: str = "full") -> dict[str, str]:
    """notebook -> run name, for each executed notebook of `profile` that ran every cell without an
    error."""
    runs = {}
    for executed in sorted((RUNS_DIR / profile).glob("[0-9][0-9]_*.ipynb")):
        meta = nbformat.read(executed, as_version=4).metadata.get("lab", {})
        if meta.get("ok") and meta.get("profile") == profile:
            runs[executed.stem] = meta["run"]
    return runs


def _plotly_png(figure_json: dict) -> str:
    import plotly.io

    figure = plotly.io.from_json(json.dumps(figure_json))
    return base64.b64encode(figure.to_image(format="png", width=900, height=500)).decode()


def readable_output(output: dict) -> dict | None:
    """One output as a code host shows it: a plotly figure as a PNG; no widget (a progress bar's
    frozen text, a slider that cannot move), no stderr logs."""
    if output.get("output_type") == "stream":
        return output if output.get("name") == "stdout" else None
    data = output.get("data")
    if data is None:
        return output
    if PLOTLY_TYPE in data:
        output["data"] = {
            "image/png": _plotly_png(data[PLOTLY_TYPE]),
            "text/plain": "<plotly figure>",
        }
        return output
    if any(kind in data for kind in WIDGET_TYPES):
        return None
    if "<script" in data.get("text/html", ""):
        data.pop("text/html")
    return output if data else None


EXERCISE_NOTE = (
    "The exercises at the end show each question and its starter code; `make lab` gives you a copy whose "
    "checks grade your answer, `make workshop` the solutions."
)


def banner(nb, name: str) -> nbformat.NotebookNode:
    """The reader's edition's first cell: which run this is, and how a learner's own run differs."""
    from lab.serving.backend import hardware

    meta, machine = nb.metadata.get("lab", {}), hardware()
    cell = nbformat.v4.new_markdown_cell(
        f"> **Reader's edition.** Lesson `{name}` as it ran in run `{meta.get('run', 'unknown')}`: the "
        f"`{meta.get('profile', 'full')}` profile of `notebooks/profiles.yaml`, on {machine['device']} with "
        f"{machine['vllm']}. Every measured number below was printed by that run. Your own run (`make lab`) starts from the "
        "quick profile's smaller parameters, so its numbers differ, and the verdicts it prints follow its own numbers. "
        + EXERCISE_NOTE
    )
    cell["id"] = BANNER_ID
    return cell


def readable_lesson(executed: Path, target: Path) -> Path:
    """The executed notebook as a reader's edition: the banner, the lesson's cells with readable
    outputs, and the exercises' questions and starter code without their solutions or checks
    (lab.tools.open_exercises)."""
    nb = nbformat.read(executed, as_version=4)
    nb.metadata.pop("widgets", None)
    exercises = open_exercises(nb)
    nb.cells = [banner(nb, executed.stem), *lesson_cells(nb)]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [
                out for out in (readable_output(o) for o in cell.outputs) if out is not None
            ]
    nb.cells += exercises
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


def stale_prose(lesson: Path, source: Path) -> dict[str, str] | None:
    """The markdown of `source` that the executed `lesson` lacks or words differently (cell id ->
    source's text), if every code cell is the one that ran; None when the code differs (the lesson
    needs a new run)."""
    executed, current = nbformat.read(lesson, as_version=4), nbformat.read(source, as_version=4)
    if code_changes(executed, current):
        return None
    have = {c.get("id"): c.source for c in executed.cells if c.cell_type == "markdown"}
    reworded = {
        c.get("id"): c.source
        for c in current.cells
        if c.cell_type == "markdown" and c.get("id") in have and have[c.get("id")] != c.source
    }
    added = {
        c.get("id"): c.source
        for c in lesson_cells(current)
        if c.cell_type == "markdown" and c.get("id") not in have
    }
    return reworded | added


def with_prose(executed, current, prose: dict[str, str]):
    """`executed` with `prose` applied: a cell it has is reworded, a new one goes after the cell it
    follows in `current`."""
    for cell in executed.cells:
        if cell.cell_type == "markdown" and cell.get("id") in prose:
            cell.source = prose[cell.get("id")]
    order = [c.get("id") for c in current.cells]
    for cell_id in [
        i for i in order if i in prose and i not in {c.get("id") for c in executed.cells}
    ]:
        before = order[order.index(cell_id) - 1]
        at = next((k + 1 for k, c in enumerate(executed.cells) if c.get("id") == before), None)
        if at is None:
            raise SystemExit(
                f"{cell_id}: a new markdown cell after {before}, which the executed copy lacks: rerun it"
            )
        new = nbformat.v4.new_markdown_cell(prose[cell_id])
        new["id"] = cell_id
        executed.cells.insert(at, new)
    return executed


def refresh_prose(lesson: Path, source: Path) -> bool | None:
    """Bring the executed `lesson`'s markdown up to `source` (stale_prose); None when the code
    differs, else whether anything changed."""
    stale = stale_prose(lesson, source)
    if stale:
        executed = with_prose(
            nbformat.read(lesson, as_version=4), nbformat.read(source, as_version=4), stale
        )
        nbformat.write(executed, lesson)
    return None if stale is None else bool(stale)


def promote_figures(
    runs: dict[str, str], source: Path, committed: Path = COMMITTED_FIGURES_DIR
) -> list[Path]:
    """Replace each committed figure by the same figure from its notebook's finished run, if that
    run drew it."""
    copied = []
    for shown in sorted(committed.glob("*.png")):
        candidate = source / shown.name
        notebook = shown.name.split("-")[0]
        if candidate.exists() and png_text(candidate).get("lab:run") == runs.get(notebook):
            shutil.copy(candidate, shown)
            copied.append(shown)
    return copied


def require_chrome() -> None:
    """Promoting draws each lesson's plotly figures as PNG (kaleido drives a Chrome): without one,
    say so before anything is copied, and before `make run` spends half an hour on notebooks it
    could not promote."""
    if find_chrome() is None:
        raise SystemExit(
            "make run / make promote: the canonical lessons show their figures as PNG, drawn by kaleido "
            "with Chromium, and none was found (BROWSER_PATH, or chromium, chromium-browser, "
            "google-chrome or chrome on the PATH). Debian: `apt-get install chromium`; or `make run PROFILE=quick`, "
            "which promotes nothing."
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.promote", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--profile", default="full", help="the profile whose runs become canonical (default: full)"
    )
    parser.add_argument(
        "--prose", action="store_true", help="only bring the executed lessons' markdown up to date"
    )
    parser.add_argument(
        "--check", action="store_true", help="only check that promoting can run here (a Chrome)"
    )
    args = parser.parse_args(argv)
    if args.prose:
        return refresh_all_prose()
    require_chrome()
    if args.check:
        return 0
    profile = args.profile
    runs = finished_runs(profile)
    if not runs:
        raise SystemExit(
            f"no finished run under {RUNS_DIR / profile}: run `make run` (profile {profile}) first"
        )
    for path in promote(results_dir(), CANONICAL_DIR, runs=set(runs.values())):
        print(f"canonical: {path.relative_to(PROJECT_ROOT)}")
    for path in promote_figures(runs, figures_dir()):
        print(f"figure: {path.relative_to(PROJECT_ROOT)}")
    for notebook in runs:
        lesson = readable_lesson(
            RUNS_DIR / profile / f"{notebook}.ipynb", LESSONS_DIR / f"{notebook}.ipynb"
        )
        print(f"lesson: {lesson.relative_to(PROJECT_ROOT)} ({lesson.stat().st_size / 1e6:.1f} MB)")
    return refresh_all_prose()


def refresh_exercises(lesson: Path, source: Path) -> bool:
    """Show `source`'s exercises at the end of the executed `lesson`, as a reader's edition shows
    them (the exercises are not part of what ran: they never make a copy stale); whether anything
    changed."""
    executed = nbformat.read(lesson, as_version=4)
    wanted = open_exercises(nbformat.read(source, as_version=4))
    first = executed.cells[0]
    note = (
        re.sub(r"The exercises .*$", EXERCISE_NOTE, first.source)
        if first.get("id") == BANNER_ID
        else first.source
    )
    if [c.source for c in executed.cells[len(lesson_cells(executed)) :]] == [
        c.source for c in wanted
    ] and note == first.source:
        return False
    first.source = note
    executed.cells = lesson_cells(executed) + wanted
    nbformat.write(executed, lesson)
    return True


def refresh_all_prose() -> int:
    """Bring each executed lesson's prose up to its source where its code is current; where the code
    changed, the copy keeps the prose it ran with and opens with a notice of what changed since
    (lab.tools.stale)."""
    stale = []
    for lesson in sorted(LESSONS_DIR.glob("*.ipynb")):
        source = NOTEBOOKS_DIR / lesson.name
        refresh_exercises(lesson, source)
        changed = refresh_prose(lesson, source)
        if changed is None:
            stale.append(lesson.stem)
        elif changed:
            print(f"prose: {lesson.relative_to(PROJECT_ROOT)}")
        mark(lesson, source)
    if stale:
        print(
            f"code changed since the canonical run, marked as older than the lesson (make run brings them back): "
            f"{', '.join(stale)}"
        )
    if not course_map.write():
        print(
            f"course map: {course_map.MAP.relative_to(PROJECT_ROOT)}, its tracks from the lessons"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
