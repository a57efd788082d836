"""The workshop's exercises: otter-grader splits them into student and solution notebooks; the solutions pass
every check, the student versions as handed out fail every check (so no check passes on an empty answer) and
show the hint; a wrong type gets a hint too."""

import re

import nbformat
import pytest
from nbclient import NotebookClient

from lab.tools.workshop import all_exercises, assign, notebooks_with_exercises


def check_outputs(notebook) -> dict[str, str]:
    """Question name -> what its `grader.check` cell printed."""
    results = {}
    for cell in notebook.cells:
        if cell.cell_type == "code" and (m := re.match(r'grader\.check\("(\w+)"\)', cell.source.strip())):
            results[m[1]] = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)
    return results


def execute(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


@pytest.fixture(scope="module")
def handouts(tmp_path_factory):
    return assign(all_exercises(), tmp_path_factory.mktemp("workshop"), name="exercises.ipynb")


def test_every_notebook_ends_with_exercises():
    from lab.tools.runner import all_notebooks

    assert notebooks_with_exercises() == all_notebooks()


def test_solutions_pass_and_student_versions_fail_with_a_hint(handouts):
    student, solution = handouts
    solved, handed_out = check_outputs(execute(solution)), check_outputs(execute(student))
    assert solved.keys() == handed_out.keys() and len(solved) >= 13
    failing = {name: text for name, text in solved.items() if "All test cases passed" not in text}
    assert not failing, f"solutions that fail their checks: {failing}"
    passing = [name for name, text in handed_out.items() if "All test cases passed" in text]
    assert not passing, f"checks that pass on the handed-out (empty) answers: {passing}"
    assert all("message:" in text for text in handed_out.values()), "every failed check shows its hint"
    student_nb = nbformat.read(student, as_version=4)
    assert not any("# SOLUTION" in c.source or "BEGIN SOLUTION" in c.source for c in student_nb.cells), \
        "student versions carry no solutions"


def test_a_wrong_type_gets_the_hint(handouts, tmp_path):
    student, _ = handouts
    nb = nbformat.read(student, as_version=4)
    answer = next(c for c in nb.cells if c.cell_type == "code" and c.source.strip() == "predicted = ...")
    answer.source = 'predicted = "about a hundred"'
    wrong = tmp_path / student.name
    nbformat.write(nb, wrong)
    (tmp_path / ".otter").mkdir(exist_ok=True)
    text = check_outputs(execute(wrong))["predict_cached_tokens"]
    assert "Give a whole number of tokens" in text and "All test cases passed" not in text
