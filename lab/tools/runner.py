"""Execute the lab's notebooks headlessly with papermill, with per-notebook parameters per profile.

    python -m lab.tools.runner [--profile quick|full] [NOTEBOOK ...]

Parameters come from notebooks/profiles.yaml; executed copies go to runs/<profile>/.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab import PROJECT_ROOT
from lab.front_end import HEADLESS_ENV
from lab.tools.watched_client import ENGINE_NAME, STALL_S

NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"
PROFILES_FILE = NOTEBOOKS_DIR / "profiles.yaml"
RUNS_DIR = PROJECT_ROOT / "runs"


@dataclass
class Outcome:
    notebook: str
    seconds: float
    ok: bool
    error: str = ""


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, dict[str, dict]]:
    profiles = yaml.safe_load(path.read_text()) or {}
    return {name: (notebooks or {}) for name, notebooks in profiles.items()}


def all_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def resolve_notebooks(names: list[str]) -> list[Path]:
    """Notebook paths for names given as `00_quickstart`, `00_quickstart.ipynb` or a path."""
    if not names:
        return all_notebooks()
    paths = []
    for name in names:
        candidates = [Path(name), NOTEBOOKS_DIR / name, NOTEBOOKS_DIR / f"{name}.ipynb"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            known = ", ".join(p.stem for p in all_notebooks())
            raise SystemExit(f"notebook {name!r} not found under {NOTEBOOKS_DIR}; known: {known}")
        paths.append(found.resolve())
    return paths


def run_name(notebook: Path, profile: str) -> str:
    """The name of one notebook run, recorded by its results, figures and executed notebook."""
    return f"{notebook.stem}-{profile}-{time.strftime('%Y%m%dT%H%M%S')}"


def record_run(executed: Path, run: str, ok: bool) -> None:
    """The executed notebook says which run it is, and whether every cell ran (`make promote` reads
    both)."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    nb.metadata["lab"] = {
        "run": run,
        "profile": os.environ.get("LAB_PROFILE", "interactive"),
        "ok": ok,
    }
    nbformat.write(nb, executed)


# no cell of the full profile takes half of this; a cell that hangs fails instead of waiting
CELL_TIMEOUT_S = 1200


def execute(
    notebook: Path,
    parameters: dict,
    out_dir: Path,
    cell_timeout_s: float = CELL_TIMEOUT_S,
    stall_s: float = STALL_S,
) -> Outcome:
    """Run one notebook with papermill, headlessly (its kernel builds no widget: lab/front_end.py).
    A cell still running after `cell_timeout_s` fails the notebook; so does one whose kernel went
    idle with no reply for `stall_s` (lab/tools/watched_client.py)."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ[HEADLESS_ENV] = "1"  # the kernel inherits it
    run = os.environ["LAB_RUN_ID"] = run_name(
        notebook, os.environ.get("LAB_PROFILE", "interactive")
    )
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(notebook),
            str(out_dir / notebook.name),
            parameters=parameters,
            cwd=str(notebook.parent),
            progress_bar=True,
            execution_timeout=cell_timeout_s,
            engine_name=ENGINE_NAME,
            stall_s=stall_s,
        )
    except Exception as exc:  # papermill raises PapermillExecutionError with the failing cell
        from nbclient.exceptions import CellTimeoutError
        from papermill.exceptions import PapermillExecutionError

        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        # a cell's error ends with its exception line; a stall, a timeout or a dead kernel says what
        # happened first
        error = lines[-1] if isinstance(exc, PapermillExecutionError) else lines[0]
        if not isinstance(exc, PapermillExecutionError | CellTimeoutError):
            error = f"{type(exc).__name__}: {error}"
        outcome = Outcome(notebook.stem, time.perf_counter() - start, False, error[:200])
    else:
        outcome = Outcome(notebook.stem, time.perf_counter() - start, True)
    finally:
        del os.environ["LAB_RUN_ID"]
    if (out_dir / notebook.name).exists():
        record_run(out_dir / notebook.name, run, outcome.ok)
    return outcome


def summary(outcomes: list[Outcome]) -> str:
    width = max(len(o.notebook) for o in outcomes)
    lines = [f"{'notebook':<{width}}  seconds  result"]
    for o in outcomes:
        result = "ok" if o.ok else f"FAILED: {o.error}"
        lines.append(f"{o.notebook:<{width}}  {o.seconds:7.1f}  {result}")
    lines.append(
        f"{sum(o.ok for o in outcomes)} ok, {sum(not o.ok for o in outcomes)} failed, "
        f"{sum(o.seconds for o in outcomes):.0f} s in all"
    )
    return "\n".join(lines)


def parse_overrides(items: list[str], parser: argparse.ArgumentParser) -> dict:
    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            parser.error(f"-p {item!r}: write NAME=VALUE, e.g. -p block_size=64")
        overrides[name] = yaml.safe_load(value)
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile", default="quick", help="a profile in notebooks/profiles.yaml (quick, full)"
    )
    parser.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a parameter in every notebook run (VALUE is read as YAML), "
        "e.g. -p model=/models/Llama-2-7b-chat-hf",
    )
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: all, in order)")
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.parameter, parser)

    profiles = load_profiles()
    if args.profile not in profiles:
        parser.error(
            f"--profile {args.profile!r} is not in {PROFILES_FILE.name}; choose one of {sorted(profiles)}"
        )
    notebooks = resolve_notebooks(args.notebooks)
    os.environ["LAB_PROFILE"] = args.profile  # kernels inherit it; results files record it
    out_dir = RUNS_DIR / args.profile

    outcomes = []
    for i, notebook in enumerate(notebooks, 1):
        parameters = profiles[args.profile].get(notebook.stem, {}) | overrides
        print(
            f"[{i}/{len(notebooks)}] {notebook.stem} (profile {args.profile}, parameters {parameters})",
            flush=True,
        )
        outcomes.append(execute(notebook, parameters, out_dir))
    print(summary(outcomes))
    print(f"executed notebooks: {out_dir}")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
