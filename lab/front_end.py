"""Whether a person's front end is attached to this kernel: only then does a lesson build its
widgets.

An ipywidget is a comm between the kernel and a front end. Executed headlessly (papermill, nbval), a
cell that builds one sometimes leaves the executing client waiting for a reply that has already
arrived (nbclient #312, nbconvert #1921), until the cell's timeout. The lab's headless runners
(lab.tools.runner, the test suite, the workshop's grading) set LAB_HEADLESS=1 for their kernels;
there a lesson shows only its static version, which it prints just before. JupyterLab, started by
`make lab`, never has it, so a learner keeps every widget.
"""

from __future__ import annotations

import os

HEADLESS_ENV = "LAB_HEADLESS"


def has_front_end() -> bool:
    """False in a headless run (LAB_HEADLESS set to anything but '' or '0'): build no widget there."""
    return os.environ.get(HEADLESS_ENV, "") in ("", "0")


def front_end_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's) for a JupyterLab a person (or the browser test)
    drives."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != HEADLESS_ENV}
