"""Where the lab writes: each output folder, and the environment variable that moves it (the tests
point them all into a scratch folder). Read when asked, so that a variable set after import counts.
"""

from __future__ import annotations

import os
from pathlib import Path

from lab import IN_CHECKOUT, PROJECT_ROOT

FOLDERS: dict[
    str, tuple[str, str]
] = {  # name: (variable, default under the project; installed: under the cwd)
    "results": (
        "LAB_RESULTS_DIR",
        "data/results",
    ),  # results files of every run (lab.experiments.results)
    "figures": (
        "LAB_FIGURES_DIR",
        "runs/figures",
    ),  # a run's figures; figures/ is written by `make promote` only
    "audit": ("LAB_AUDIT_DIR", "runs/audit"),  # audit reports and the audit benchmark's logs
    "workloads": ("LAB_WORKLOADS_DIR", "data/workloads"),  # generated workload files
    "models": ("LAB_MODELS_DIR", "models"),  # the local models the lab builds
}


def folder(name: str, *, create: bool = True) -> Path:
    """The folder `name` (one of FOLDERS), created unless `create` is False."""
    if name not in FOLDERS:
        raise ValueError(f"folder {name!r} is not one of the lab's: {sorted(FOLDERS)}")
    variable, default = FOLDERS[name]
    path = Path(os.environ.get(variable, (PROJECT_ROOT if IN_CHECKOUT else Path.cwd()) / default))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
