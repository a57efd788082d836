"""The record of fresh-clone runs of the main job and of CI, as data: each run's numbers are read
from its own log, never typed, and docs/TESTING.md renders them (with each budget's verdict) from
`data/reference/fresh_clone_runs.csv`.

    git clone -q . /tmp/mr && cd /tmp/mr && (time make run) > /tmp/mr.log 2>&1
    python -m lab.tools.run_ledger record /tmp/mr.log --command "make run" --commit 6842b14 \\
        --beside "nothing" --run-dir /tmp/mr/runs/full        # the cells over 2x, against docs/lessons here
    python -m lab.tools.run_ledger record /tmp/ci.log --command ".ci/run" --commit 6842b14 --beside "nothing"

A log must hold the shell's `time` line (`real 41m2.5s`) and the command's own summary: the runner's
`N ok, M failed, S s in all` for `make run`, pytest's last `N passed ... in S s` for `.ci/run`. Rows
recorded before this file existed are marked `transcribed` (from the notes of their day; their logs
were not kept).
"""

from __future__ import annotations

import argparse
import io
import re
import time
from pathlib import Path

import pandas as pd

from lab import PROJECT_ROOT
from lab.experiments.results import write_atomically
from lab.serving.backend import device_name

LEDGER = PROJECT_ROOT / "data" / "reference" / "fresh_clone_runs.csv"
BUDGET_S = {"make run": 40 * 60, ".ci/run": 15 * 60}  # the brief's budgets on the 2-core machine
COLUMNS = [
    "date",
    "commit",
    "command",
    "machine",
    "beside",
    "outcome",
    "clean",
    "wall_s",
    "inner_s",
    "cells_over_2x",
    "source",
]
IN_A_ROW = 3  # the main job's bar: this many clean runs in a row, each within its budget


def wall_seconds(log: str) -> float:
    """The last `real XmY.Zs` line the shell's `time` printed."""
    found = re.findall(r"^real\s+(\d+)m([\d.]+)s", log, flags=re.MULTILINE)
    if not found:
        raise ValueError(
            "the log has no `real XmY.Zs` line: run the command under the shell's `time`"
        )
    minutes, seconds = found[-1]
    return int(minutes) * 60 + float(seconds)


def main_job_summary(log: str) -> tuple[str, bool, float]:
    """(outcome, clean, the notebooks' seconds) from the runner's last summary line."""
    found = re.findall(r"^(\d+) ok, (\d+) failed, (\d+) s in all", log, flags=re.MULTILINE)
    if not found:
        raise ValueError(
            "the log has no runner summary (`N ok, M failed, S s in all`): is it a `make run` log?"
        )
    ok, failed, seconds = (int(x) for x in found[-1])
    clean = failed == 0 and "make: ***" not in log
    return f"{ok} ok, {failed} failed", clean, float(seconds)


def ci_summary(log: str) -> tuple[str, bool, float]:
    """(outcome, clean, pytest's seconds) from the last pytest summary line (the behaviour suite's)."""
    found = re.findall(r"^=+ (.*?) in ([\d.]+)s", log, flags=re.MULTILINE)
    if not found:
        raise ValueError(
            "the log has no pytest summary line (`== N passed ... in S s ==`): is it a CI log?"
        )
    outcome, seconds = found[-1]
    outcome = ", ".join(part for part in outcome.split(", ") if "warning" not in part)
    clean = not re.search(r"\b(failed|error|errors)\b", outcome) and "make: ***" not in log
    return outcome, clean, float(seconds)


def read_ledger(path: Path = LEDGER) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS)
    return pd.read_csv(path, dtype={"commit": str}, keep_default_na=False)


def record(
    log_path: Path,
    command: str,
    commit: str,
    beside: str,
    cells_over_2x: int | None = None,
    ledger: Path = LEDGER,
) -> dict:
    """Append one run, read from its log, to the ledger (written atomically); the row as recorded."""
    if command not in BUDGET_S:
        raise ValueError(f"command={command!r}: use one of {sorted(BUDGET_S)}")
    log = Path(log_path).read_text(errors="replace")
    outcome, clean, inner = (main_job_summary if command == "make run" else ci_summary)(log)
    row = {
        "date": time.strftime("%Y-%m-%d", time.localtime(Path(log_path).stat().st_mtime)),
        "commit": commit[:7],
        "command": command,
        "machine": device_name(),
        "beside": beside,
        "outcome": outcome,
        "clean": bool(clean and (cells_over_2x or 0) == 0),
        "wall_s": round(wall_seconds(log)),
        "inner_s": round(inner),
        "cells_over_2x": "" if cells_over_2x is None else int(cells_over_2x),
        "source": "log",
    }
    table = read_ledger(ledger)
    same = table[
        (table.commit == row["commit"])
        & (table.command == command)
        & (table.wall_s.astype(int) == row["wall_s"])
    ]
    if not same.empty:
        raise ValueError(
            f"{ledger.name} already records this run ({command} of {row['commit']}, {row['wall_s']} s)"
        )
    buffer = io.StringIO()
    pd.concat([table, pd.DataFrame([row])], ignore_index=True)[COLUMNS].to_csv(buffer, index=False)
    write_atomically(ledger, buffer.getvalue(), overwrite=True)
    return row


def minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def in_a_row(table: pd.DataFrame, command: str) -> tuple[int, int]:
    """(clean runs within budget among the last IN_A_ROW of `command`, how many of its runs there
    are)."""
    runs = table[table.command == command]
    last = runs.tail(IN_A_ROW)
    good = (last.clean.astype(str) == "True") & (last.wall_s.astype(int) <= BUDGET_S[command])
    return int(good.sum()), len(runs)


def ledger_section(ledger: Path = LEDGER) -> str:
    """docs/TESTING.md's record of fresh-clone runs: one table per command, each row within its
    budget or not, and how many of the last three main-job runs were clean and within budget."""
    table = read_ledger(ledger)
    parts = []
    for command, budget in BUDGET_S.items():
        runs = table[table.command == command]
        if runs.empty:
            continue
        inner = "notebooks" if command == "make run" else "pytest"
        shown = pd.DataFrame(
            {
                "date": runs.date,
                "commit": "`" + runs.commit + "`",
                "machine": runs.machine,
                "beside it on the cores": runs.beside,
                "outcome": runs.outcome,
                "wall, with the install": runs.wall_s.astype(int).map(minutes),
                f"{inner} (s)": runs.inner_s.astype(str),
                "cells over 2x": runs.cells_over_2x.astype(str),
                f"within {budget // 60} min": [
                    ("yes" if int(w) <= budget else "no")
                    + ("" if str(c) == "True" else ", not clean")
                    for w, c in zip(runs.wall_s, runs.clean)
                ],
                "from": runs.source,
            }
        )
        if command != "make run":  # cell times are the main job's
            shown = shown.drop(columns="cells over 2x")
        good, count = in_a_row(table, command)
        parts.append(
            f"`{command}` on a fresh clone ({count} runs; the last {min(IN_A_ROW, count)}: {good} clean and "
            f"within {budget // 60} minutes):\n\n{shown.to_markdown(index=False, tablefmt='pipe', disable_numparse=True)}"
        )
    return "\n\n".join(parts) if parts else "No fresh-clone run recorded yet."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("record", help="append one run, read from its log")
    add.add_argument("log", type=Path)
    add.add_argument("--command", required=True, choices=sorted(BUDGET_S))
    add.add_argument("--commit", required=True, help="the commit the fresh clone ran")
    add.add_argument(
        "--beside", required=True, help="what else ran on the machine meanwhile (e.g. nothing)"
    )
    add.add_argument(
        "--run-dir",
        type=Path,
        help="make run: the clone's runs/full, its cells set against docs/lessons",
    )
    sub.add_parser("show", help="print the section docs/TESTING.md renders")
    args = parser.parse_args(argv)
    if args.action == "show":
        print(ledger_section())
        return
    cells = None
    if args.run_dir is not None:
        from lab.tools.cell_times import compare
        from lab.tools.stale import LESSONS_DIR

        cells = len(compare(args.run_dir, LESSONS_DIR)[1])
    print(record(args.log, args.command, args.commit, args.beside, cells))


if __name__ == "__main__":
    main()
