"""`python -m lab.tools.cell_times`: each cell of a run against the same cell of the canonical run,
by time.

    python -m lab.tools.cell_times [RUN_DIR] [--against docs/lessons] [--factor 2] [--min-seconds 10]

A run (default: runs/full, what `make run` executed) is compared cell by cell, by the cells' ids,
with the executed copies it is set against (default: docs/lessons, the canonical run). papermill
records each cell's seconds. Printed: every lesson's seconds both ways, and every cell that took
more than `factor` times its canonical seconds; cells under `min_seconds` in both runs are left out,
and so are cells new since the canonical run. Why 10 s: between two canonical runs on the 2-core
machine, cells under 10 s moved by up to 7.9x (02's first forward pass, 0.6 s and 4.7 s: the first
matrix products of a fresh process), cells of 10 s or more by at most 2.1x, and that one in a run
with other work beside it. The stalls this guards against held a cell for 400-1,200 s. Exits 1 where
such a cell exists, so a run that slowed somewhere is never called clean.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from lab.tools.runner import RUNS_DIR
from lab.tools.stale import LESSONS_DIR


@dataclass(frozen=True)
class SlowCell:
    lesson: str
    first_line: str
    seconds: float
    canonical_seconds: float

    @property
    def ratio(self) -> float:
        return self.seconds / max(self.canonical_seconds, 1e-9)


def cell_seconds(path: Path) -> dict[str, tuple[float, str]]:
    """Each code cell's papermill seconds and first line, by cell id."""
    nb = nbformat.read(path, as_version=4)
    return {
        c.id: (
            float(c.metadata.get("papermill", {}).get("duration") or 0.0),
            c.source.strip().split("\n")[0][:80],
        )
        for c in nb.cells
        if c.cell_type == "code"
    }


MIN_SECONDS = (
    10.0  # cells shorter than this in both runs are not judged: their run-to-run spread exceeds 2x
)


def compare(
    run_dir: Path, against: Path, factor: float = 2.0, min_seconds: float = MIN_SECONDS
) -> tuple[list[tuple[str, float, float]], list[SlowCell]]:
    """Per lesson (name, seconds, canonical seconds), and the cells slower than `factor` x
    canonical."""
    lessons, slow = [], []
    for path in sorted(run_dir.glob("[0-9][0-9]_*.ipynb")):
        canonical_path = against / path.name
        if not canonical_path.exists():
            continue
        run, canonical = cell_seconds(path), cell_seconds(canonical_path)
        lessons.append(
            (path.stem, sum(s for s, _ in run.values()), sum(s for s, _ in canonical.values()))
        )
        for cell_id, (seconds, line) in run.items():
            if (
                cell_id not in canonical
            ):  # a cell new since the canonical run has no time to be set against
                continue
            base = canonical[cell_id][0]
            if max(seconds, base) >= min_seconds and seconds > factor * base:
                slow.append(SlowCell(path.stem, line, seconds, base))
    if not lessons:
        raise SystemExit(
            f"no executed lesson in {run_dir} that {against} also holds: run `make run` first"
        )
    return lessons, slow


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", nargs="?", type=Path, default=RUNS_DIR / "full")
    parser.add_argument("--against", type=Path, default=LESSONS_DIR)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--min-seconds", type=float, default=MIN_SECONDS)
    args = parser.parse_args(argv)
    lessons, slow = compare(args.run_dir, args.against, args.factor, args.min_seconds)
    for name, seconds, base in lessons:
        print(
            f"{name:<28} {seconds:7.1f} s   canonical {base:7.1f} s   x{seconds / max(base, 1e-9):.2f}"
        )
    print(
        f"{sum(s for _, s, _ in lessons):.0f} s against {sum(b for *_, b in lessons):.0f} s canonical"
    )
    for cell in slow:
        print(
            f"SLOW: {cell.lesson}, `{cell.first_line}`: {cell.seconds:.1f} s, {cell.ratio:.1f}x its "
            f"canonical {cell.canonical_seconds:.1f} s"
        )
    print(
        f"{len(slow)} cells over {args.factor:g}x their canonical time (cells of {args.min_seconds:g} s or more)"
    )
    sys.exit(1 if slow else 0)


if __name__ == "__main__":
    main()
