"""For the whole project (tests/ and the notebooks nbval runs): keep test runs from writing into the project's
figures/, data/results/ and runs/audit/, which hold the outputs of `make run`; and what nbval collects."""

import os
import tempfile

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


IN_BROWSER = {"00_quickstart.ipynb", "01_block_hashing.ipynb"}


def pytest_ignore_collect(collection_path, config):
    """00_quickstart and 01_block_hashing run cell by cell in a real JupyterLab instead (tests/test_browser.py:
    every cell, no error, their checks passed), so nbval does not run them a second time, wherever Chromium is
    there for that."""
    if collection_path.name in IN_BROWSER:
        from lab.experiments.plots import find_chrome

        return find_chrome() is not None or None
    return None


# The longest files first (seconds each in `make test` on 2 cores, 2026-12-02): the two xdist workers take files in
# this order (the Makefile's --no-loadscope-reorder keeps it), so a long file started last cannot leave one worker
# running alone at the end (the browser tests did, for over 2 min).
LONGEST_FIRST = ("notebooks/18_model_size.ipynb",  # 267 s with 16 prompts; 8 since
                 "tests/test_browser.py",  # 135
                 "notebooks/11_routing.ipynb",  # 118
                 "notebooks/17_capacity.ipynb",  # 95
                 "notebooks/05_cache_on_vs_off.ipynb", "notebooks/04_block_size_sweep.ipynb",  # 89, 84
                 "tests/test_smollm2_vllm.py", "notebooks/03_ttft_breakdown.ipynb",  # 83, 82
                 "notebooks/13_replica_failure.ipynb", "notebooks/14_why_it_missed.ipynb",  # 69, 66
                 "notebooks/16_gain_vs_hit_rate.ipynb", "notebooks/09_serving_and_metrics.ipynb",  # 64, 63
                 "tests/test_server.py", "notebooks/08_eviction.ipynb", "notebooks/06_prompt_design.ipynb",  # 62, 62, 60
                 "notebooks/10_timing_side_channel.ipynb", "notebooks/20_your_workload.ipynb",  # 57, 57
                 "notebooks/07_cache_warmup.ipynb", "notebooks/12_fleet_simulator.ipynb",  # 56, 54
                 "tests/test_workshop.py", "tests/test_packaged_model.py", "tests/test_parity_vllm.py")  # 52, 41, 38


def pytest_collection_modifyitems(config, items):
    """Every notebook cell nbval runs needs the engine; the longest files run first (cells keep their order)."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.engine)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank)))
