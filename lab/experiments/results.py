"""Results files with their provenance: the machine and versions beside every table, written
atomically, never over an earlier run.

A run writes under data/results/ (ignored by git). One run per result name, the one docs/RESULTS.md
cites, is kept in data/reference/results/ (committed): `promote` (run by `make promote`,
lab.tools.promote) copies the newest of each name there, replacing the one it held.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from lab import PROJECT_ROOT
from lab.experiments.provenance import current_run
from lab.paths import folder
from lab.serving.backend import hardware

CANONICAL_DIR = PROJECT_ROOT / "data" / "reference" / "results"
RUN_STAMP = re.compile(
    r"\d{8}T\d{6}(-\d+)?"
)  # what save_results puts after a name: its run id, an attempt


def results_dir() -> Path:
    """data/results/ in the project, or LAB_RESULTS_DIR (the tests point it elsewhere)."""
    return folder("results")


def code_version() -> str | None:
    """The lab's commit, `+changes` when the working tree differs from it; None outside a git
    checkout of the lab (installed from a wheel, any repository around it is someone else's)."""
    import subprocess

    from lab import IN_CHECKOUT

    if not IN_CHECKOUT:
        return None

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        return (
            f"{commit}{'+changes' if git('status', '--porcelain', '--untracked-files=no') else ''}"
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def environment(**details: Any) -> dict[str, Any]:
    """Hardware, versions and the lab's commit for a results file; `details` adds run settings
    (block size, ...)."""
    run = (
        {"run": current_run()} if current_run() else {}
    )  # profile and run: set by lab.tools.runner
    return hardware() | {
        "code": code_version(),
        "profile": os.environ.get("LAB_PROFILE", "interactive"),
        **run,
        **details,
    }


def hardware_line(env: dict[str, Any]) -> str:
    return f"{env['device']} | {env['backend']} | {env['vllm']} | torch {env['torch']} | python {env['python']}"


def write_atomically(path: Path, text: str, *, overwrite: bool = False) -> None:
    """Write via a temporary file beside `path`, so readers never see half a file. Without
    `overwrite`, an existing file is never replaced (FileExistsError); with it, the file keeps its
    permissions."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if overwrite:
            if path.exists():  # keep the replaced file's permissions (mkstemp creates 0600)
                os.chmod(tmp, path.stat().st_mode & 0o777)
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if the file exists: an earlier run is never overwritten
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_results(df: pd.DataFrame, name: str, env: dict[str, Any]) -> Path:
    """Write `name`-<run id>.csv and its .json provenance under results_dir(); returns the CSV's
    path."""
    if df.empty:
        raise ValueError(f"refusing to save an empty results table for {name!r}")
    run_id = time.strftime("%Y%m%dT%H%M%S")
    out = results_dir()
    for attempt in range(100):
        stem = f"{name}-{run_id}" + (f"-{attempt}" if attempt else "")
        csv_path = out / f"{stem}.csv"
        try:
            write_atomically(csv_path, df.to_csv(index=False))
        except FileExistsError:
            continue
        write_atomically(
            out / f"{stem}.json",
            json.dumps({"name": name, "run_id": stem, "environment": env}, indent=2, default=str)
            + "\n",
        )
        return csv_path
    raise FileExistsError(f"could not find a free results file name for {name!r} under {out}")


def save_benchmark(table: pd.DataFrame, name: str, env: dict[str, Any]) -> Path:
    """`save_results` for a benchmark's command line: also prints the machine, the lab's commit, the
    table and where it went."""
    path = save_results(table, name, env)
    print(hardware_line(env), f"| lab {env['code']}")
    print(table.to_string(index=False))
    print(f"saved {path}")
    return path


def _run_order(path: Path) -> tuple[str, int]:
    run_id = path.stem.rsplit("-", 2)
    stamp, attempt = (run_id[-2], int(run_id[-1])) if run_id[-1].isdigit() else (run_id[-1], 0)
    return stamp, attempt


def runs_of(name: str, directory: Path) -> list[Path]:
    """The results tables saved under exactly `name`: `name-<run id>.csv`, not a longer name that
    starts with it (`18_model_size-findings-<run id>.csv` is not a run of `18_model_size`)."""
    return [
        csv
        for csv in directory.glob(f"{name}-*.csv")
        if RUN_STAMP.fullmatch(csv.stem[len(name) + 1 :])
    ]


def load_latest(name: str, directory: Path | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The most recent results table saved under `name` (in `directory`, default results_dir()),
    with its provenance. Runs are ordered by the run id in their file name (a timestamp), not by
    file times, which a fresh clone sets all alike."""
    directory = directory or results_dir()
    candidates = sorted(runs_of(name, directory), key=_run_order)
    if not candidates:
        raise FileNotFoundError(
            f"no results named {name!r} under {directory}; run the notebook or `make run` first"
        )
    latest = candidates[-1]
    meta = json.loads(latest.with_suffix(".json").read_text())
    return pd.read_csv(latest), meta


def load_latest_or_canonical(name: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The newest run of `name` in the results folder in use, else the committed canonical one."""
    try:
        return load_latest(name)
    except FileNotFoundError:
        pass
    try:
        return load_latest(name, CANONICAL_DIR)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"no results named {name!r} under {results_dir()} or {CANONICAL_DIR}; run the "
            "notebook or `make run` first"
        ) from error


def load_latest_full_or_canonical(name: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The newest full-profile run of `name` in the results folder in use (during `make run`: this
    run's), else the committed canonical one; a quick run's results never stand in for the canonical
    ones."""
    full = [
        csv
        for csv in sorted(runs_of(name, results_dir()), key=_run_order)
        if json.loads(csv.with_suffix(".json").read_text())["environment"].get("profile") == "full"
    ]
    if full:
        return pd.read_csv(full[-1]), json.loads(full[-1].with_suffix(".json").read_text())
    return load_latest(name, CANONICAL_DIR)


def promote(
    source: Path | None = None, canonical: Path = CANONICAL_DIR, runs: set[str] | None = None
) -> list[Path]:
    """Copy the newest run of each result name in `source` (default results_dir()) into `canonical`,
    removing the run of that name it held; with `runs`, only results those runs wrote
    (lab.tools.runner names them). Returns the CSVs copied."""
    source = source or results_dir()
    newest: dict[str, Path] = {}
    for csv in sorted(source.glob("*.csv"), key=_run_order):
        meta = json.loads(csv.with_suffix(".json").read_text())
        if runs is None or meta["environment"].get("run") in runs:
            newest[meta["name"]] = csv
    canonical.mkdir(parents=True, exist_ok=True)
    for name, csv in newest.items():
        for old in canonical.glob(f"{name}-*.csv"):
            if json.loads(old.with_suffix(".json").read_text())["name"] == name:
                old.unlink()
                old.with_suffix(".json").unlink()
        for suffix in (".csv", ".json"):
            write_atomically(
                canonical / csv.with_suffix(suffix).name, csv.with_suffix(suffix).read_text()
            )
    return [canonical / csv.name for csv in newest.values()]
