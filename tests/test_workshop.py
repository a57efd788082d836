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


@pytest.mark.engine
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


@pytest.mark.engine
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


@pytest.mark.slow
def test_the_course_copies_hold_no_solution_and_keep_a_learners_edits(tmp_path):
    """`make lab` opens course/: the lessons with each answer cell emptied and no grading scaffolding; a lesson
    that changed is copied again unless the learner edited the copy."""
    from lab.tools.runner import all_notebooks
    from lab.tools.workshop import build_course

    lessons = all_notebooks()[:2]
    assert build_course(tmp_path, lessons) == [tmp_path / p.name for p in lessons]
    for lesson in lessons:
        copy = nbformat.read(tmp_path / lesson.name, as_version=4)
        sources = [c.source for c in copy.cells]
        assert not any("# SOLUTION" in s or "BEGIN SOLUTION" in s for s in sources), lesson.name
        assert not any(c.cell_type == "raw" for c in copy.cells), "otter's raw cells are out of the learner's way"
        assert any(re.match(r"\w+ = \.\.\.", s.strip()) for s in sources), "an answer cell waits for the learner"
        assert len(copy.cells) > 10, "the lesson itself is there, not only its exercises"
    assert build_course(tmp_path, lessons) == [], "nothing changed: nothing rewritten"
    edited = tmp_path / lessons[0].name
    edited.write_text(edited.read_text().replace("predicted = ...", "predicted = 96"))
    changed_lesson = tmp_path / "changed" / lessons[0].name
    changed_lesson.parent.mkdir()
    changed_lesson.write_text(lessons[0].read_text().replace("Quickstart", "Quick start"))
    assert build_course(tmp_path, [changed_lesson]) == [], "the learner's edited copy is kept"
    assert "predicted = 96" in edited.read_text()


def test_the_workshop_page_names_every_lesson_and_every_exercise():
    """WORKSHOP.md's agenda and homework hold the course as it stands: each lesson, each exercise by its name."""
    from lab import PROJECT_ROOT
    from lab.tools.runner import all_notebooks

    page = (PROJECT_ROOT / "WORKSHOP.md").read_text()
    agenda = page[page.index("## Agenda"):page.index("The exercises sit at the end of each notebook.")]
    names = re.findall(r"# BEGIN QUESTION\s+name:\s*(\w+)", "\n".join(
        c.source for p in all_notebooks() for c in nbformat.read(p, as_version=4).cells if c.cell_type == "raw"))
    assert [n for n in names if f"`{n}`" not in agenda] == [], "an exercise the agenda does not name"
    lessons = [p.name[:2] for p in all_notebooks()]
    assert [n for n in lessons if not re.search(rf"`{n}(_\w+)?`", agenda)] == [], "a lesson the agenda leaves out"
    assert "not yet" not in agenda
