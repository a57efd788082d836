"""For the whole project (tests/ and the notebooks nbval runs): keep test runs from writing into the project's
figures/, data/results/ and runs/audit/, which hold the outputs of `make run`; what nbval collects; and the order the
files run in (the longest first, by tests/durations.json)."""

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

import lab

lab.setup()  # what a notebook's first cell does: vLLM's environment, before any test imports vllm

# `make test` runs two test files at a time (pytest-xdist workers gw0, gw1). Each worker's engines, servers and
# notebook kernels get a core of their own: two CPU engines each spinning OpenMP threads on both cores slowed
# each other down about eightfold.
_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(int(_worker.removeprefix("gw")) % (os.cpu_count() or 1))
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torch in the kernels (mini-engine, transformers) as well

_scratch = tempfile.mkdtemp(prefix="prefix-cache-lab-tests-")
# Set at import time, before nbval starts kernels, so notebook kernels inherit them.
os.environ.setdefault("LAB_FIGURES_DIR", os.path.join(_scratch, "figures"))
os.environ.setdefault("LAB_RESULTS_DIR", os.path.join(_scratch, "results"))
os.environ.setdefault("LAB_AUDIT_DIR", os.path.join(_scratch, "audit"))
# nbval's kernels run headlessly: a lesson builds no widget there, only its static version (lab/front_end.py)
os.environ.setdefault("LAB_HEADLESS", "1")
# and write each figure's HTML but no PNG: a PNG starts a Chrome for kaleido (about 2 s and 1 s of CPU each, 44 of
# them in a run of the suite); tests/test_plots.py draws PNGs, and `make run` draws every lesson's
os.environ.setdefault("LAB_FIGURE_PNG", "0")


# 00 and the lessons with a widget
IN_BROWSER = {"00_quickstart.ipynb", "01_block_hashing.ipynb", "04_block_size_sweep.ipynb", "05_cache_on_vs_off.ipynb",
              "08_eviction.ipynb", "20_your_workload.ipynb"}


def pytest_ignore_collect(collection_path, config):
    """00_quickstart and the lessons with a widget run cell by cell in a real JupyterLab instead
    (tests/test_browser.py: every cell, no error, their checks passed, the widget working), so nbval does not run
    them a second time, wherever Chromium is there for that."""
    if collection_path.name in IN_BROWSER:
        from lab.experiments.plots import find_chrome

        return find_chrome() is not None or None
    return None


# The longest files first: the two xdist workers take files in this order (the Makefile's --no-loadscope-reorder keeps
# it), so a long file started last cannot leave one worker running alone at the end (the browser tests did, for
# over 2 min). The seconds are measured: tests/durations.json holds each file's, as `make durations` (or any pytest
# run with --store-durations) last wrote them. A file it does not name runs after those it names.
DURATIONS = Path(__file__).parent / "tests" / "durations.json"


def read_durations() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


def pytest_collection_modifyitems(config, items):
    """Every notebook cell nbval runs needs the engine; the longest files run first (cells keep their order)."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.engine)
    seconds = read_durations()
    items.sort(key=lambda item: -seconds.get(item.path.relative_to(config.rootpath).as_posix(), -1))


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write each test file's seconds (its tests' setup, call and teardown summed) into "
                          "tests/durations.json at the end, for later runs to start the longest files first")


def pytest_configure(config):
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):  # xdist's controller, or alone
        config.pluginmanager.register(StoreDurations(config.rootpath), "store-durations")


class StoreDurations:
    """--store-durations: each file's seconds, summed from its tests' reports (with xdist, the controller receives
    every worker's). At the end the files this run measured replace their entries, the others stay while the file
    exists; written to a temporary file beside tests/durations.json and renamed over it."""

    def __init__(self, rootpath: Path):
        self.rootpath = rootpath
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self):
        if not self.seconds:
            return
        measured = read_durations() | {name: round(s, 1) for name, s in self.seconds.items()}
        kept = {name: s for name, s in measured.items() if (self.rootpath / name).is_file()}
        longest_first = dict(sorted(kept.items(), key=lambda item: (-item[1], item[0])))
        with tempfile.NamedTemporaryFile("w", dir=DURATIONS.parent, suffix=".tmp", delete=False) as f:
            f.write(json.dumps(longest_first, indent=1) + "\n")
        os.replace(f.name, DURATIONS)
