"""Committed notebooks follow the lab's conventions (DESIGN.md): stripped outputs, a parameters cell,
a kernelspec for papermill, NN_topic names, and a profile entry for every notebook."""

import re

import nbformat
import papermill
import pytest

from lab.runner import NOTEBOOKS_DIR, all_notebooks, load_profiles

NOTEBOOKS = all_notebooks()


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no NN_topic.ipynb under {NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs or execution counts; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_conventions(path):
    nb = nbformat.read(path, as_version=4)
    assert re.fullmatch(r"\d\d_[a-z0-9_]+", path.stem), "notebooks are named NN_topic.ipynb"
    assert nb.metadata.get("kernelspec", {}).get("name"), "papermill needs a kernelspec"
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged `parameters`"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "describe_backend()" in code[0], "the first code cell prints versions and the back-end"
    assert "assert " in code[-1], "the last code cell checks the key result"


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
