"""The exercises as a reader sees them, in the reader's editions and the book: each question with
its set-up and starter code, the solution taken out as the hand-outs take it out (`make workshop`),
and no checks.

    cells = open_exercises(nbformat.read("notebooks/01_block_hashing.ipynb", as_version=4))

A lesson's exercises are written in otter-grader's format (lab.tools.workshop): raw cells mark each
question, its solution and its tests; a solution line carries `# SOLUTION`. Here a solution line
becomes `...` (an assignment keeps its name: `name = ...`; a `def` line is kept, its body becomes
one `...`), the tests and the raw markers go, and a line says how to check an answer. A marker may
carry a note after it (`# SOLUTION: why`), and a block between `# BEGIN SOLUTION` and `# END
SOLUTION` lines becomes one `...`.
"""

from __future__ import annotations

import re

import nbformat

HEADING = "## Exercises"
MARK = "# SOLUTION"
BEGIN_BLOCK, END_BLOCK = (
    "# BEGIN SOLUTION",
    "# END SOLUTION",
)  # otter's markers of a solution block in a cell
HOW_TO_CHECK = (
    "*To check an answer:* `make lab` opens your own copy of this lesson, whose check cell under each "
    "exercise says right or wrong, with a hint; `make workshop` writes the solutions."
)
# the id of the first cell this module writes: found and replaced, never stacked
OPEN_ID = "open-exercises"


def starter(code: str) -> str:
    """A solution cell as the learner gets it: each `# SOLUTION` line taken out (see the module
    docstring)."""
    kept, in_block, def_indent, body_shown = [], False, None, False
    for line in code.splitlines():
        if line.strip() in (BEGIN_BLOCK, END_BLOCK):  # a whole block of solution: one `...` for it
            if line.strip() == BEGIN_BLOCK:
                kept.append(line[: len(line) - len(line.lstrip())] + "...")
            in_block = line.strip() == BEGIN_BLOCK
            continue
        if in_block:
            continue
        if MARK not in line:
            kept.append(line)
            continue
        text = line[: line.index(MARK)].rstrip()
        indent = len(text) - len(text.lstrip())
        if def_indent is not None and indent > def_indent:  # a solved function's body: one `...`
            if not body_shown:
                kept.append(" " * indent + "...")
                body_shown = True
            continue
        def_indent = None
        if re.match(r"\s*(async\s+)?def\s", text):
            kept.append(text)
            def_indent, body_shown = indent, False
        elif name := re.match(r"\s*([A-Za-z_][\w.\[\]'\"]*)\s*=[^=]", text):
            kept.append(" " * indent + f"{name.group(1)} = ...")
        else:
            kept.append(" " * indent + "...")
    return "\n".join(kept)


def open_exercises(source) -> list:
    """The reader's cells for the exercises of `source` (a notebook): the heading and its text, each
    question's set-up, prompt and starter code, in order; [] where it has none."""
    cells, start = source.cells, None
    for i, cell in enumerate(cells):
        if cell.cell_type == "markdown" and cell.source.startswith(HEADING):
            start = i
            break
    if start is None:
        return []
    shown, part = [], None
    for cell in cells[start:]:
        if cell.cell_type == "raw":
            part = _part(cell.source, part)
            continue
        if part == "TESTS":
            continue
        source_text = starter(cell.source) if part == "SOLUTION" else cell.source
        new = (
            nbformat.v4.new_markdown_cell
            if cell.cell_type == "markdown"
            else nbformat.v4.new_code_cell
        )(source_text)
        new["id"] = f"{OPEN_ID}-{len(shown)}" if shown else OPEN_ID
        shown.append(new)
    shown.insert(1, _how_to_check())
    return shown


def _part(marker: str, current: str | None) -> str | None:
    """Which part of a question the cells after a raw marker belong to."""
    if marker.startswith(("# BEGIN SOLUTION", "# BEGIN TESTS")):
        return marker.split()[2]
    if marker.startswith(("# END SOLUTION", "# END TESTS", "# END QUESTION")):
        return None
    return current


def _how_to_check():
    cell = nbformat.v4.new_markdown_cell(HOW_TO_CHECK)
    cell["id"] = f"{OPEN_ID}-how"
    return cell
