"""How long each lesson keeps a learner waiting with its own defaults (the `quick` profile), as
data: read from one headless run of every lesson, saved with the machine and commit that ran them,
and rendered wherever a time is shown (WORKSHOP.md's times, the README's table of lessons), so that
no page types a minute.

    make quick-times     # python -m lab.tools.runner --profile quick, then python -m lab.tools.quick_times
    python -m lab.tools.quick_times [RUN_DIR]   # record a quick run's times (default runs/quick)
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import pandas as pd

from lab import PROJECT_ROOT
from lab.experiments.results import code_version, write_atomically
from lab.serving.backend import device_name, hardware
from lab.tools.runner import RUNS_DIR

QUICK_TIMES = PROJECT_ROOT / "data" / "reference" / "quick_times.csv"


def quick_run_times(run_dir: Path) -> pd.DataFrame:
    """Each executed lesson's seconds (papermill's, kernel start excluded) and whether every cell
    ran."""
    rows = []
    for path in sorted(run_dir.glob("[0-9][0-9]_*.ipynb")):
        metadata = json.loads(path.read_text())["metadata"]
        lab = metadata.get("lab", {})
        if lab.get("profile") != "quick":
            raise ValueError(
                f"{path.name} ran under profile {lab.get('profile')!r}; record a `--profile quick` run"
            )
        rows.append(
            {
                "notebook": path.stem,
                "seconds": round(float(metadata["papermill"]["duration"]), 1),
                "ok": bool(lab.get("ok")),
                "run": lab.get("run", ""),
            }
        )
    if not rows:
        raise SystemExit(
            f"no executed lesson in {run_dir}: run `python -m lab.tools.runner --profile quick` first"
        )
    return pd.DataFrame(rows)


def record_quick_times(run_dir: Path = RUNS_DIR / "quick", out: Path = QUICK_TIMES) -> Path:
    """The quick run's times, with the machine, vLLM, the lab's commit and the date, written
    atomically; a run with a failed lesson is refused (its time is not the lesson's)."""
    table = quick_run_times(run_dir)
    if not table.ok.all():
        raise SystemExit(
            f"not recorded: {', '.join(table.notebook[~table.ok])} failed in {run_dir}"
        )
    env = hardware()
    table = table.drop(columns="ok").assign(
        machine=device_name(),
        vllm=env["vllm"],
        code=code_version(),
        date=time.strftime("%Y-%m-%d"),
        source="run",
    )
    buffer = io.StringIO()
    table.to_csv(buffer, index=False)
    write_atomically(out, buffer.getvalue(), overwrite=True)
    return out


def load_quick_times(path: Path = QUICK_TIMES) -> pd.DataFrame:
    """The recorded times, one row per lesson (an empty table where none are recorded)."""
    if not path.exists():
        return pd.DataFrame(
            columns=["notebook", "seconds", "run", "machine", "vllm", "code", "date", "source"]
        )
    return pd.read_csv(path, keep_default_na=False)


def minutes_by_lesson(path: Path = QUICK_TIMES) -> dict[str, str]:
    """Each recorded lesson's quick time in minutes, one decimal ("0.9"), by notebook name."""
    table = load_quick_times(path)
    return {row.notebook: f"{row.seconds / 60:.1f}" for row in table.itertuples()}


def provenance(path: Path = QUICK_TIMES) -> str:
    """Where the times come from, in words: the machine, vLLM, the commit, the date; or that they
    were transcribed from the notes of earlier runs (before this file existed), as such."""
    table = load_quick_times(path)
    if table.empty:
        return "no quick run recorded yet"
    first = table.iloc[0]
    if first.source == "transcribed":
        return (
            f"runs of each lesson on {first.machine}, {first.vllm}, {first.date}, transcribed from the notes of "
            f"those days (their commits were not recorded; `make quick-times` replaces them with one run)"
        )
    return (
        f"one headless run of every lesson with its own defaults (`make quick-times`), {first.date}, "
        f"{first.machine}, {first.vllm}, the lab at `{first.code}`"
    )


def workshop_section(path: Path = QUICK_TIMES) -> str:
    """WORKSHOP.md's table of quick times, with where they come from."""
    table = load_quick_times(path)
    if table.empty:
        return "No quick run recorded yet: `make quick-times` records one."
    shown = pd.DataFrame(
        {
            "notebook": "`" + table.notebook + "`",
            "quick (a room)": table.seconds.map(lambda s: f"{s:.0f} s"),
        }
    )
    return (
        f"Seconds to execute every cell (kernel start not included), from {provenance(path)}:\n\n"
        + shown.to_markdown(index=False, tablefmt="pipe", disable_numparse=True)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", nargs="?", type=Path, default=RUNS_DIR / "quick")
    args = parser.parse_args(argv)
    print(f"quick times: {record_quick_times(args.run_dir)}")


if __name__ == "__main__":
    main()
