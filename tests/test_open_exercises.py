"""The exercises in the open: a reader's edition (and so the book) shows every exercise's question and starter
code, with the solution taken out as the hand-outs take it out, and no check."""

import ast

import nbformat
import pytest
from whole_tree import failures

from lab.tools.open_exercises import open_exercises, starter
from lab.tools.promote import LESSONS_DIR
from lab.tools.runner import NOTEBOOKS_DIR


def test_a_solution_becomes_its_starter():
    code = ("import math\n"
            "answer = 42  # SOLUTION\n"
            "def f(x):  # SOLUTION\n"
            "    y = x * 2  # SOLUTION\n"
            "    return y  # SOLUTION\n"
            "salt = f'tenant:{t}'  # SOLUTION: from what the server knows\n"
            "# BEGIN SOLUTION\n"
            "hidden = 1\n"
            "# END SOLUTION")
    assert starter(code) == "import math\nanswer = ...\ndef f(x):\n    ...\nsalt = ...\n..."


def shows_every_exercise_without_its_solution(lesson) -> None:
    shown = nbformat.read(lesson, as_version=4).cells
    source = nbformat.read(NOTEBOOKS_DIR / lesson.name, as_version=4)
    wanted = [c.source for c in open_exercises(source)]
    assert wanted, f"{lesson.name}: its lesson has no exercises"
    assert [c.source for c in shown[len(shown) - len(wanted):]] == wanted, "the exercises are not shown as they stand"
    for cell in shown:
        assert "# SOLUTION" not in cell.source and "BEGIN TESTS" not in cell.source, "a solution or check is shown"
        if cell.cell_type == "code":
            ast.parse(cell.source)


@pytest.mark.repo
def test_every_readers_edition_shows_its_exercises_without_solutions():
    assert failures(shows_every_exercise_without_its_solution, sorted(LESSONS_DIR.glob("*.ipynb")),
                    lambda p: p.stem) == {}
