"""Soak the lessons' widget cells: each run many times headlessly, in its lesson's kernel, and its
stalls counted.

    python -m lab.tools.soak [--runs 200] [--timeout 20] [--widgets] [LESSON ...]

A lesson's widget cell is the one that asks `has_front_end()`. For each such lesson, and for each of
the two ways the lab executes notebooks headlessly (papermill's client, as `make run` does, and
nbval's kernel, as `make test` does), a new kernel runs the lesson's cells up to that cell once (its
engine, its tables, its load: the cell's context, each cell allowed 900 s), then the widget cell
`--runs` times, each its own execute request. A run whose reply or whose return to idle does not
arrive within `--timeout` seconds counts as a stall (the cell itself takes well under a second).
`--widgets` starts the kernels without LAB_HEADLESS, so the cell builds its widgets as every
headless run did before lab.front_end: the rate before the fix. docs/TESTING.md records both counts.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

import nbformat
from tqdm import tqdm

from lab.checks import positive_int
from lab.front_end import HEADLESS_ENV
from lab.tools.runner import NOTEBOOKS_DIR as NOTEBOOKS

WIDGET_MARK = "if has_front_end():"
PATHS = ("papermill", "nbval")
CONTEXT_TIMEOUT_S = (
    900.0  # a context cell may run an engine sweep: the nbval cell timeout (pyproject.toml)
)


@dataclass(frozen=True)
class SoakCount:
    lesson: str
    path: str  # "papermill" or "nbval"
    widgets: bool  # built (the kernel without LAB_HEADLESS) or not
    runs: int
    stalls: int
    seconds: float

    def line(self) -> str:
        built = "widgets built" if self.widgets else "headless (LAB_HEADLESS=1)"
        return (
            f"{self.lesson}: {self.stalls} stalls in {self.runs} runs through {self.path}, {built} "
            f"({self.seconds:.0f} s)"
        )


def widget_lessons() -> list[str]:
    """The lessons that hold a widget cell, by name."""
    return [
        p.stem
        for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
        if widget_cell_index(_read(p.stem)) is not None
    ]


def widget_cell_index(nb) -> int | None:
    """The index of the lesson's first widget cell, or None."""
    return next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "code" and WIDGET_MARK in c.source),
        None,
    )


def _path(lesson: str) -> Path:
    """A lesson's notebook, by name, or any notebook by its path."""
    path = Path(lesson) if lesson.endswith(".ipynb") else NOTEBOOKS / f"{lesson}.ipynb"
    if not path.exists():
        raise SystemExit(
            f"no lesson {lesson!r}: one of {', '.join(widget_lessons())}, or a notebook's path"
        )
    return path


def _read(lesson: str):
    return nbformat.read(_path(lesson), as_version=4)


def _soak(lesson: str, run_cell: Callable[[str, float], bool], runs: int, timeout: float) -> int:
    """Run the context once (a failure there is an error), then the widget cell `runs` times, each
    allowed `timeout` seconds; the stalls."""
    nb = _read(lesson)
    index = widget_cell_index(nb)
    if index is None:
        raise SystemExit(f"{lesson} has no widget cell (no code cell calls {WIDGET_MARK})")
    for cell in tqdm(nb.cells[:index], desc=f"{lesson}: its context", leave=False):
        if cell.cell_type == "code" and not run_cell(cell.source, CONTEXT_TIMEOUT_S):
            raise RuntimeError(
                f"{lesson}: a context cell stalled or failed, `{cell.source.splitlines()[0][:80]}`"
            )
    return sum(
        not run_cell(nb.cells[index].source, timeout)
        for _ in tqdm(range(runs), desc=f"{lesson}: its widget cell")
    )


def soak_papermill(lesson: str, runs: int, timeout: float) -> int:
    """Through papermill's notebook client (nbclient underneath), one execute request per cell."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NotebookExecutionManager

    executed = nbformat.v4.new_notebook(
        metadata=_read(lesson).metadata
    )  # the cells run, one appended per run
    where = str(_path(lesson).parent)
    client = PapermillNotebookClient(
        NotebookExecutionManager(executed, progress_bar=False),
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": where}},
    )

    def run_cell(source: str, seconds: float) -> bool:
        executed.cells.append(nbformat.v4.new_code_cell(source))
        client.timeout = seconds
        try:
            client.execute_cell(executed.cells[-1], len(executed.cells) - 1)
        except CellTimeoutError:
            return False
        except CellExecutionError as error:
            raise RuntimeError(f"{lesson}: a cell raised {error.ename}: {error.evalue}") from error
        return True

    with client.setup_kernel(cwd=where):
        return _soak(lesson, run_cell, runs, timeout)


def soak_nbval(lesson: str, runs: int, timeout: float) -> int:
    """Through nbval's RunningKernel, as its cells run: the reply on shell, then IOPub until idle."""
    from nbval.kernel import RunningKernel

    kernel = RunningKernel("python3", cwd=str(_path(lesson).parent))

    def run_cell(source: str, seconds: float) -> bool:
        msg_id = kernel.execute_cell_input(source, allow_stdin=False)
        try:
            kernel.await_reply(msg_id, timeout=seconds)
            kernel.await_idle(msg_id, timeout=seconds)
        except Empty:
            return False
        return True

    try:
        return _soak(lesson, run_cell, runs, timeout)
    finally:
        kernel.stop()


def soak(lesson: str, path: str, *, runs: int, timeout: float, widgets: bool) -> SoakCount:
    """One lesson's widget cell soaked through one path; the kernel inherits LAB_HEADLESS as
    `widgets` says."""
    positive_int("runs", runs)
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {PATHS}")
    saved = os.environ.get(HEADLESS_ENV)
    os.environ.pop(HEADLESS_ENV, None) if widgets else os.environ.update({HEADLESS_ENV: "1"})
    start = time.perf_counter()
    try:
        stalls = (soak_papermill if path == "papermill" else soak_nbval)(lesson, runs, timeout)
    finally:
        os.environ.pop(HEADLESS_ENV, None) if saved is None else os.environ.update(
            {HEADLESS_ENV: saved}
        )
    return SoakCount(lesson, path, widgets, runs, stalls, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "lessons", nargs="*", help="lessons with a widget cell (default: all of them)"
    )
    parser.add_argument(
        "--runs", type=int, default=200, help="runs of each widget cell per path (default 200)"
    )
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="seconds before a run counts as a stall"
    )
    parser.add_argument(
        "--widgets", action="store_true", help="build the widgets (the kernel without LAB_HEADLESS)"
    )
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    args = parser.parse_args(argv)
    counts = []
    for lesson in args.lessons or widget_lessons():
        for path in args.paths:
            counts.append(
                soak(lesson, path, runs=args.runs, timeout=args.timeout, widgets=args.widgets)
            )
            print(counts[-1].line(), flush=True)
    print(f"{sum(c.stalls for c in counts)} stalls in {sum(c.runs for c in counts)} runs")


if __name__ == "__main__":
    main()
