"""An executed lesson older than its source says so to the reader, so a fix to a lesson's code lands
without a rerun.

    python -m lab.tools.stale            mark every executed lesson in docs/lessons/ against notebooks/
    python -m lab.tools.stale --check    exit 1 if a mark is missing, wrong or left over (what CI checks)

The executed copy keeps the outputs, code and prose of the run that made it: they belong together.
When the source's code has changed since, a notice opens the copy: which run it is, which cells
changed since (with a short diff of each), and how to bring it back (`make run`, then `make
promote`). The notice is rebuilt from the two files each time, so it can never describe a change
that is not there; a fresh promote removes it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from lab import PROJECT_ROOT
from lab.tools.runner import NOTEBOOKS_DIR

LESSONS_DIR = PROJECT_ROOT / "docs" / "lessons"  # the executed copies a code host shows
NOTICE_ID = "stale-notice"  # the notice's cell id: found and replaced, never stacked
BANNER_ID = "reader-banner"  # the reader's edition's first cell (lab.tools.promote)
DIFF_LINES = 12  # lines of diff shown per changed cell; the rest is summarised


@dataclass(frozen=True)
class CellChange:
    """One code cell of the source that differs from what ran: `kind` is changed, new or removed."""

    kind: str
    # the cell's number in the notebook it is in (source for changed/new, executed for removed)
    position: int
    diff: str


def lesson_cells(nb) -> list:
    """The lesson's own cells: those before its exercises (a reader's edition leaves the exercises
    out)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## Exercises"):
            break
        cells.append(cell)
    return cells


def _assigned(node: ast.stmt) -> set[str]:
    """The plain names a top-level statement assigns (`x = ...`), none for anything else."""
    return (
        {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.Assign)
        else set()
    )


def overridden_parameters(executed) -> set[str]:
    """The names papermill injected into `executed` (its profile's parameters). The defaults the
    parameters cell gives them never ran, so changing one (a quicker default for a learner's first
    run) changes nothing that ran."""
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    return {
        name
        for cell in injected
        for node in ast.parse(cell.source).body
        for name in _assigned(node)
    }


def without_assignments(source: str, names: set[str]) -> str:
    """`source` less its top-level assignments to `names`, each statement's lines (and their
    comments) whole."""
    try:
        body = ast.parse(source).body
    except SyntaxError:  # not plain Python: compared as it is
        return source
    dropped = {
        line
        for node in body
        if _assigned(node) & names
        for line in range(node.lineno - 1, node.end_lineno)
    }
    return "\n".join(line for i, line in enumerate(source.splitlines()) if i not in dropped)


def _code_cells(nb, overridden: set[str] = frozenset()) -> list[tuple[int, str, str]]:
    """(position, id, source) of each code cell of the lesson, without the parameters papermill
    injected, and without the defaults of `overridden` parameters in its parameters cell."""
    return [
        (
            i,
            c.get("id", ""),
            without_assignments(c.source, overridden)
            if "parameters" in c.metadata.get("tags", [])
            else c.source,
        )
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and "injected-parameters" not in c.metadata.get("tags", [])
        and c in lesson_cells(nb)
    ]


def _diff(old: str, new: str) -> str:
    lines = list(
        difflib.unified_diff(old.splitlines(), new.splitlines(), "ran", "now", n=0, lineterm="")
    )[2:]
    shown = lines[:DIFF_LINES]
    if len(lines) > DIFF_LINES:
        shown.append(f"... and {len(lines) - DIFF_LINES} more changed lines")
    return "\n".join(shown)


def code_changes(executed, source) -> list[CellChange]:
    """The code cells of `source` whose code is not what ran in `executed`, matched by cell id (a
    parameter's default that the run overrode is not code that ran)."""
    overridden = overridden_parameters(executed)
    ran = {cell_id: (i, text) for i, cell_id, text in _code_cells(executed, overridden)}
    now = _code_cells(source, overridden)
    changes = [
        CellChange(
            "new" if cell_id not in ran else "changed", i, _diff(ran.get(cell_id, (0, ""))[1], text)
        )
        for i, cell_id, text in now
        if ran.get(cell_id, (0, None))[1] != text
    ]
    kept = {cell_id for _, cell_id, _ in now}
    changes += [
        CellChange("removed", i, _diff(text, ""))
        for cell_id, (i, text) in ran.items()
        if cell_id not in kept
    ]
    return changes


def notice_text(run: str, changes: list[CellChange], name: str = "NN_topic") -> str:
    parts = [
        f"> **This executed copy is older than the lesson.** Its outputs are those of run `{run}`; the lesson's "
        f"code has changed since in {len(changes)} cell(s), so what the current code prints may differ from what "
        f"you see below. `make run` (or `python -m lab.tools.runner --profile full {name}`) and then "
        "`make promote` bring this copy back to current.",
        "",
    ]
    for change in changes:
        parts += [
            f"**Cell {change.position}, {change.kind}:**",
            "",
            "```diff",
            change.diff,
            "```",
            "",
        ]
    return "\n".join(parts).rstrip()


def with_notice(executed, source, name: str = "NN_topic"):
    """`executed` with its stale notice replaced by one describing how `source` differs (none if it
    does not)."""
    executed.cells = [c for c in executed.cells if c.get("id") != NOTICE_ID]
    lab_meta = executed.metadata.setdefault("lab", {})
    lab_meta.pop("stale", None)
    changes = code_changes(executed, source)
    if changes:
        cell = nbformat.v4.new_markdown_cell(
            notice_text(lab_meta.get("run", "unknown"), changes, name)
        )
        cell["id"] = NOTICE_ID
        executed.cells.insert(0, cell)
        lab_meta["stale"] = {"cells": [f"{c.kind} {c.position}" for c in changes]}
    return executed


def mark(lesson: Path, source: Path) -> bool:
    """Rewrite `lesson`'s notice from `source`; whether the file changed."""
    before = lesson.read_text()
    marked = with_notice(
        nbformat.read(lesson, as_version=4), nbformat.read(source, as_version=4), lesson.stem
    )
    after = nbformat.writes(marked)
    after += "" if after.endswith("\n") else "\n"  # as nbformat.write ends a file
    if after != before:
        lesson.write_text(after)
    return after != before


def is_marked_right(lesson: Path, source: Path) -> bool:
    """Whether `lesson` carries exactly the notice its source calls for (or none, when its code is
    current)."""
    executed = nbformat.read(lesson, as_version=4)
    expected = with_notice(
        nbformat.read(lesson, as_version=4), nbformat.read(source, as_version=4), lesson.stem
    )
    return executed == expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.stale", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="only say which lessons' notices are wrong"
    )
    args = parser.parse_args(argv)
    wrong = []
    for lesson in sorted(LESSONS_DIR.glob("*.ipynb")):
        source = NOTEBOOKS_DIR / lesson.name
        if args.check and not is_marked_right(lesson, source):
            wrong.append(lesson.stem)
        elif not args.check and mark(lesson, source):
            print(f"notice rewritten: {lesson.name}")
    if wrong:
        print(f"stale notices missing or wrong (python -m lab.tools.stale): {', '.join(wrong)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
