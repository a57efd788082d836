"""For the whole project (tests/ and the notebooks nbval runs): keep test runs from writing into the project's
figures/, data/results/ and runs/audit/, which hold the outputs of `make run`; and what nbval collects."""

import os
import tempfile

import pytest

import lab

lab.setup()  # what a notebook's first cell does: vLLM's environment, before any test imports vllm

_scratch = tempfile.mkdtemp(prefix="prefix-cache-lab-tests-")
# Set at import time, before nbval starts kernels, so notebook kernels inherit them.
os.environ.setdefault("LAB_FIGURES_DIR", os.path.join(_scratch, "figures"))
os.environ.setdefault("LAB_RESULTS_DIR", os.path.join(_scratch, "results"))
os.environ.setdefault("LAB_AUDIT_DIR", os.path.join(_scratch, "audit"))


IN_BROWSER = {"00_quickstart.ipynb", "02_block_hashing.ipynb"}


def pytest_ignore_collect(collection_path, config):
    """00_quickstart and 02_block_hashing run cell by cell in a real JupyterLab instead (tests/test_browser.py:
    every cell, no error, their checks passed), so nbval does not run them a second time, wherever Chromium is
    there for that."""
    if collection_path.name in IN_BROWSER:
        from lab.experiments.plots import find_chrome

        return find_chrome() is not None or None
    return None


def pytest_collection_modifyitems(config, items):
    """Every notebook cell nbval runs needs the engine."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.engine)
