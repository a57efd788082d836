"""Committed notebooks follow the lab's conventions (docs/ARCHITECTURE.md): stripped outputs, a parameters
cell, a kernelspec for papermill, NN_topic names, a final check, and a profile entry for every notebook."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
import pytest
from whole_tree import failures

from lab.tools.runner import NOTEBOOKS_DIR, all_notebooks, load_profiles

pytestmark = pytest.mark.repo  # the repository's content, not behaviour: make check-repo

NOTEBOOKS = all_notebooks()


def test_the_runner_sees_every_notebook_in_the_folder():
    """A notebook whose name does not match NN_topic would be skipped by `make run` and by CI without a word."""
    on_disk = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))
    assert on_disk == [p.name for p in NOTEBOOKS] and len(on_disk) >= 9


def outputs_stripped(path) -> None:
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs or execution counts; strip them before committing"


def test_outputs_are_stripped():
    assert failures(outputs_stripped, NOTEBOOKS, lambda p: p.stem) == {}


def follows_conventions(path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert re.fullmatch(r"\d\d_[a-z0-9_]+", path.stem), "notebooks are named NN_topic.ipynb"
    assert nb.metadata.get("kernelspec", {}).get("name"), "papermill needs a kernelspec"
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "describe_backend()" in code[0], "the first code cell prints versions and the back-end"
    checks = [node for node in ast.walk(ast.parse(code[-1])) if isinstance(node, ast.Assert)]
    assert checks, "the last code cell checks the key result with assert statements"
    assert all(not isinstance(node.test, ast.Constant) for node in checks), "an assert on a constant checks nothing"


def test_conventions():
    assert failures(follows_conventions, NOTEBOOKS, lambda p: p.stem) == {}


def opens_with_number_question_prediction(path) -> None:
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {path.name[:2]} · "), "its title, numbered"
    assert "**The question.**" in first.source and "**Predict, then run.**" in first.source


def test_a_lesson_opens_with_its_number_its_question_and_a_prediction():
    assert failures(opens_with_number_question_prediction, NOTEBOOKS, lambda p: p.stem) == {}


def test_every_profile_names_real_notebooks_and_parameters():
    profiles = load_profiles()
    assert {"quick", "full"} <= set(profiles)
    stems = {p.stem: p for p in NOTEBOOKS}
    for profile, notebooks in profiles.items():
        for stem, parameters in notebooks.items():
            assert stem in stems, f"profile {profile!r} names {stem!r}, which is not a notebook"
            declared = papermill.inspect_notebook(str(stems[stem]))
            unknown = set(parameters) - set(declared)
            assert not unknown, f"profile {profile!r} sets {unknown} that {stem} does not declare"
    assert set(stems) <= set(profiles["full"]), "`make run` (full) covers every notebook"


def exercises_run_alone(path, tmp_path) -> None:
    """`make workshop` hands the exercises out alone: every name they use is defined or imported in them
    (ruff's undefined-name check on their code cells, test-config headers left out)."""
    cells = nbformat.read(path, as_version=4).cells
    start = next((i for i, c in enumerate(cells) if "ASSIGNMENT CONFIG" in c.source), None)
    if start is None:
        return  # no exercises
    code = [re.sub(r'^"""\s*# BEGIN TEST CONFIG.*?# END TEST CONFIG\n', "", c.source, flags=re.S)
            for c in cells[start:] if c.cell_type == "code"]
    (tmp_path / "exercises.py").write_text("\n\n".join(code) + "\n")
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    out = subprocess.run([ruff, "check", "--isolated", "--select", "F821", "--output-format", "concise", "exercises.py"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_exercises_run_on_their_own(tmp_path):
    assert failures(lambda path: exercises_run_alone(path, tmp_path), NOTEBOOKS, lambda p: p.stem) == {}


def tokenizes_with_its_model(path) -> None:
    """Token ids decide blocks and hits, and they differ between models: a lesson's tokenizer is the engine's own
    (`llm.get_tokenizer()`) or `tokenizer_for` the model the lesson runs, never a fixed one. (The exercises run no
    engine, so they may use the lab's tokenizer: `tokenizer_for(None)`.)"""
    cells = nbformat.read(path, as_version=4).cells
    start = next((i for i, c in enumerate(cells) if "ASSIGNMENT CONFIG" in c.source), len(cells))
    lesson = "\n".join(c.source for c in cells[:start] if c.cell_type == "code")
    assert "AutoTokenizer" not in lesson and "generators import tokenizer" not in lesson
    arguments = set(re.findall(r"tokenizer_for\(([^)]*)\)", lesson))
    assert arguments <= {"model_path", "model", "path"}, f"{path.stem} tokenizes with {arguments}"
    exercises = "\n".join(c.source for c in cells[start:] if c.cell_type == "code")
    assert set(re.findall(r"tokenizer_for\(([^)]*)\)", exercises)) <= {"None"}


def test_a_lesson_tokenizes_with_the_model_it_runs():
    assert failures(tokenizes_with_its_model, NOTEBOOKS, lambda p: p.stem) == {}
