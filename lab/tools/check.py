"""`python -m lab.tools.check`: is this machine (or this container) ready for the course? Prints
`ready`, or each thing that is missing with what fixes it, and exits 0 or 1. The check a learner
runs at home before a workshop.

    python -m lab.tools.check            the packages, both models, memory and disk, then one request on the engine
    python -m lab.tools.check --quick    the same without starting the engine (seconds)
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from collections.abc import Callable

from lab import PROJECT_ROOT

MEMORY_GB, DISK_GB = (
    6.0,
    2.0,
)  # the course's peak (00_quickstart in the container: 4.93 GiB) with room; run outputs
PACKAGES = ("torch", "vllm", "transformers", "jupyterlab", "papermill", "otter", "plotly")


def _python() -> str | None:
    return (
        None
        if sys.version_info[:2] == (3, 11)
        else f"Python {sys.version.split()[0]}: the course is locked for Python 3.11 (the container has it)"
    )


def _packages() -> str | None:
    missing = []
    for name in PACKAGES:
        try:
            importlib.import_module(name)
        except (
            Exception
        ) as error:  # a broken install raises more than ImportError (e.g. torchvision's operators)
            missing.append(f"{name} ({type(error).__name__})")
    return (
        f"packages that do not import: {', '.join(missing)}; run `make setup`" if missing else None
    )


def _models() -> str | None:
    from lab.core.model import built_model

    missing = [preset for preset in ("tiny", "smollm2") if built_model(preset) is None]
    return (
        f"models not built: {', '.join(missing)}; run `make setup` (or `python -m lab.core.model --preset NAME`)"
        if missing
        else None
    )


def _memory_and_disk() -> str | None:
    import psutil

    memory = psutil.virtual_memory().total / 1e9
    disk = shutil.disk_usage(PROJECT_ROOT).free / 1e9
    problems = []
    if memory < MEMORY_GB:
        problems.append(
            f"{memory:.1f} GB of memory, the course needs about {MEMORY_GB:.0f} (give Docker or Podman more)"
        )
    if disk < DISK_GB:
        problems.append(f"{disk:.1f} GB of free disk, runs need about {DISK_GB:.0f}")
    return "; ".join(problems) or None


def _engine() -> str | None:
    import lab

    lab.setup()
    from lab.core.model import built_model
    from lab.serving.engine import make_llm

    try:
        llm = make_llm(str(built_model("tiny")), enable_prefix_caching=True)
        out = llm.generate(["a prompt to check the engine with"], use_tqdm=False)
    except Exception as error:
        return f"the engine did not answer: {type(error).__name__}: {error}"
    return None if out and out[0].outputs[0].token_ids else "the engine answered nothing"


def checks(quick: bool) -> list[tuple[str, Callable[[], str | None]]]:
    found = [
        ("python", _python),
        ("packages", _packages),
        ("models", _models),
        ("memory and disk", _memory_and_disk),
    ]
    return found if quick else [*found, ("engine", _engine)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="do not start the engine")
    args = parser.parse_args(argv)
    problems = []
    for name, check in checks(args.quick):
        problem = check()
        print(f"{name}: {'ok' if problem is None else problem}", flush=True)
        problems += [problem] if problem else []
    print("ready" if not problems else f"not ready: {len(problems)} thing(s) above to fix")
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
