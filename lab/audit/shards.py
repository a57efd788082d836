"""A log given as many files, read as one: a file, a folder of files, or a glob pattern (quoted, so
that the shell leaves it to us), its files in name order. The readers number records across the
shards in that order and name each bad line by its shard and line."""

from __future__ import annotations

import glob
from pathlib import Path


class AuditInputError(ValueError):
    """A prompts file, or a line in it, that cannot be audited; the message names the file, the line
    and a fix."""


LOG_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def shard_paths(spec: str | Path) -> list[Path]:
    """The files of the log `spec` names, in name order; AuditInputError where it names none."""
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(LOG_SUFFIXES))
        where = f"{path}: a folder with no log files"
    elif any(ch in str(spec) for ch in "*?["):
        found = sorted(Path(p) for p in glob.glob(str(spec)) if Path(p).is_file())
        where = f"{spec}: no file matches the pattern"
    else:
        raise AuditInputError(
            f"{spec}: no such file, folder or pattern; pass a JSONL file of prompts, one "
            '{"prompt": ...} per line (or Parquet, or a folder or glob of such shards)'
        )
    if not found:
        raise AuditInputError(f"{where} ({', '.join(LOG_SUFFIXES)})")
    return found
