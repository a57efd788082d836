"""Hand-outs for a workshop: each notebook's exercises (written in Otter Assign's format at its end)
split by otter-grader's `otter assign` into a student version (answer cells hold `...`; each check
says right or wrong, with a hint) and a solution version.

    python -m lab.tools.workshop                     # what `make workshop` runs: workshop/student/, workshop/solutions/
    build_course()                             # what `make lab` opens: course/, every lesson, no solutions
    exercises_only(path)                       # a notebook of just its exercises (they are self-contained)
    all_exercises()                            # every notebook's exercises in one notebook
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat

from lab import PROJECT_ROOT
from lab.experiments.results import write_atomically
from lab.serving.processes import executable_beside_python
from lab.tools.runner import all_notebooks

CONFIG_MARKER = "# ASSIGNMENT CONFIG"


def has_exercises(notebook: Path) -> bool:
    nb = nbformat.read(notebook, as_version=4)
    return any(c.cell_type == "raw" and c.source.startswith(CONFIG_MARKER) for c in nb.cells)


def notebooks_with_exercises() -> list[Path]:
    return [p for p in all_notebooks() if has_exercises(p)]


def exercises_only(notebook: Path) -> nbformat.NotebookNode:
    """The notebook cut to its exercises: the cell before the assignment config (their introduction)
    onward."""
    nb = nbformat.read(notebook, as_version=4)
    start = next(
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "raw" and c.source.startswith(CONFIG_MARKER)
    )
    nb.cells = nb.cells[max(start - 1, 0) :]
    return nb


def all_exercises() -> nbformat.NotebookNode:
    """Every notebook's exercises in one notebook, under one assignment config (for a single check
    run)."""
    parts = [exercises_only(p) for p in notebooks_with_exercises()]
    combined = parts[0]
    for part in parts[1:]:
        combined.cells += [
            c
            for c in part.cells
            if not (c.cell_type == "raw" and c.source.startswith(CONFIG_MARKER))
        ]
    return combined


def otter_executable() -> str:
    if found := executable_beside_python("otter"):
        return found
    raise FileNotFoundError("otter-grader is not installed: run `make setup` (the lock pins it)")


def assign(
    master: Path | nbformat.NotebookNode, out_dir: Path, name: str | None = None
) -> tuple[Path, Path]:
    """Run `otter assign` on one master notebook (a path, or a notebook object named `name`);
    returns the student and solution notebooks, written as out_dir/student/NAME.ipynb and
    out_dir/solutions/NAME.ipynb."""
    with tempfile.TemporaryDirectory(prefix="otter-") as tmp:
        if isinstance(master, Path):
            name = master.name
            source = master
        else:
            source = Path(tmp) / name
            nbformat.write(master, source)
        result = subprocess.run(
            [
                otter_executable(),
                "assign",
                "--no-run-tests",
                "--no-pdfs",
                str(source),
                str(Path(tmp) / "dist"),
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode:
            raise RuntimeError(
                f"otter assign failed on {name}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        written = []
        for version, folder in (("student", "student"), ("autograder", "solutions")):
            target = out_dir / folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / "dist" / version / name, target)
            written.append(target)
    return written[0], written[1]


COURSE_DIR = PROJECT_ROOT / "course"
# the hash of each copy as written, to tell a learner's edits from a stale copy
GENERATED = ".generated.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def grader_below_the_lesson(path: Path) -> None:
    """otter puts its "Initialize Otter" cell first, above the lesson's title: move it to the top of
    the exercises, which are the only cells that use it (they run on their own, below the lesson).
    """
    nb = nbformat.read(path, as_version=4)
    init = next(
        (
            c
            for c in nb.cells
            if c.cell_type == "code" and c.source.startswith("# Initialize Otter")
        ),
        None,
    )
    exercises = next(
        (c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Exercises")),
        None,
    )
    if init is None or exercises is None:
        return
    nb.cells.remove(init)
    nb.cells.insert(nb.cells.index(exercises) + 1, init)
    nbformat.write(nb, path)


def build_course(
    out: Path = COURSE_DIR, notebooks: list[Path] | None = None, progress: bool = False
) -> list[Path]:
    """The learner's copies of the lessons: each exercise's answer cell holds `...`, its check reads
    `grader.check(...)`, and no solution is inside. A copy is (re)written when it is missing, or
    when its lesson changed and the learner has not edited the copy; an edited copy is kept, with a
    note. Returns what it wrote. `progress`: a bar over the lessons (a first build takes a few
    seconds a lesson)."""
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    record_path = out / GENERATED
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    written = []
    lessons = all_notebooks() if notebooks is None else notebooks
    for notebook in tqdm(
        lessons, desc="your copies of the lessons", unit="lesson", disable=not progress
    ):
        target, source_digest = out / notebook.name, _digest(notebook)
        entry = record.get(notebook.name, {})
        if target.exists() and entry.get("source") == source_digest:
            continue
        if target.exists() and entry.get("copy") != _digest(target):
            print(
                f"kept your edited {target.name}; its lesson changed since: delete the copy to get the new one"
            )
            continue
        with tempfile.TemporaryDirectory(
            prefix=".course-", dir=out
        ) as tmp:  # hidden from the file browser
            copy = (
                Path(tmp) / notebook.name
            )  # finished here, then moved in at once: JupyterLab may be serving `out`
            if has_exercises(notebook):
                shutil.move(assign(notebook, Path(tmp) / "assigned")[0], copy)
                grader_below_the_lesson(copy)
            else:
                shutil.copy(notebook, copy)
            os.replace(copy, target)
        record[notebook.name] = {"source": source_digest, "copy": _digest(target)}
        write_atomically(
            record_path, json.dumps(record, indent=1), overwrite=True
        )  # after each copy: an interrupted
        written.append(target)  # build still knows its copies
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.workshop", description="student and solution notebooks"
    )
    parser.add_argument("--out", default=str(PROJECT_ROOT / "workshop"), help="default: workshop/")
    out = Path(parser.parse_args(argv).out)
    for notebook in notebooks_with_exercises():
        student, solution = assign(notebook, out)
        print(f"{notebook.name}: {student} and {solution}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
