"""Prefix Cache Lab: helpers for measuring and teaching vLLM's prefix caching.

The package is in layers, each importing only those below it (tests/test_architecture.py checks):

    lab.core         what prefix caching is: block hashes, the block pool, the radix tree, the mini-engine, the model
    lab.serving      the real vLLM: back-end, settings, the adapter for vLLM internals, engine, server, fleet
    lab.experiments  workloads, measurement, capacity, benchmarks, the fleet simulator, results, figures
    lab.audit        `python -m lab.audit`: a user's own prompts, replayed, explained, projected, reported
    lab.tools        repository commands: notebook runner, the generated reports, JupyterLab launcher, workshop

Importing changes nothing in the process; a notebook's first cell calls `lab.setup()`.
"""

import os
import warnings
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Installed from a wheel (`pip install .`), the package has no repository around it: no corpus to
# build the lab's model from, no notebooks, and its outputs go under the working directory instead
# of site-packages.
IN_CHECKOUT = (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "notebooks").is_dir()
DEFAULT_CPU_KVCACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE: the CPU back-end's KV pool, in GiB


def setup() -> None:
    """The environment vLLM needs in a notebook or script, each variable left alone if already set.
    Call it before `import vllm` (vLLM reads its logging level at import); `make_llm` calls it too.
    """
    os.environ.setdefault(
        "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
    )  # engine core in-process: no __main__ guard needed
    os.environ.setdefault(
        "VLLM_LOGGING_LEVEL", "ERROR"
    )  # notebooks show results, not start-up chatter
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
    warnings.filterwarnings(
        "ignore", category=FutureWarning, module=r"vllm\."
    )  # vLLM's own deprecation chatter
