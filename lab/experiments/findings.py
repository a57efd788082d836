"""Findings as data: what a lesson's run concludes, computed in code from that run's numbers, saved beside its
results, and rendered by id wherever else it appears (README, RESULTS, a later lesson), so that a conclusion has
one home and cannot drift from the run that made it.

    found = [Finding("block_size.chat", "Which block size should chat use here?", HOLDS,
                     "chat: block size 256 ...", "mean TTFT by size over 3 repeats: ...")]
    save_findings(found, "04_block_size_sweep", env)     # data/results/04_block_size_sweep-findings-<run>
    print_findings(found)                                # "What it shows", printed from the run
    answer("04_block_size_sweep", "block_size.chat")     # elsewhere: the canonical run's finding, by id

A verdict is one of three: the run shows the answer (`holds`), shows the opposite (`does not hold`), or cannot tell
them apart at its spread (`cannot tell`); each finding says which test decided it in its evidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lab.experiments.results import load_latest_full_or_canonical, save_results

HOLDS, DOES_NOT_HOLD, CANNOT_TELL = "holds", "does not hold", "cannot tell"
VERDICTS = (HOLDS, DOES_NOT_HOLD, CANNOT_TELL)


@dataclass(frozen=True)
class Finding:
    """One conclusion of one run: its id (unique within the lesson), the question it answers, the verdict, the
    sentence that states it with the run's numbers, the evidence (the quantities, their spread, the test), and
    the answer's one value where it has one (a block size, a ratio), for the pages that render it."""

    id: str
    question: str
    verdict: str
    answer: str
    evidence: str
    value: int | float | str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Finding {self.id!r}: verdict={self.verdict!r}; use one of {', '.join(VERDICTS)}")
        if not self.answer.strip():
            raise ValueError(f"Finding {self.id!r}: an empty answer; state what the run shows, with its numbers")


def findings_name(lesson: str) -> str:
    return f"{lesson}-findings"


def save_findings(findings: Iterable[Finding], lesson: str, env: dict[str, Any]) -> Path:
    """The findings as a results file of the lesson's run (one row each), with the run's provenance."""
    rows = [asdict(f) for f in findings]
    ids = [row["id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{lesson}: finding ids must be unique, got {sorted(ids)}")
    return save_results(pd.DataFrame(rows), findings_name(lesson), env)


def print_findings(findings: Iterable[Finding]) -> None:
    """Each finding as a line of "What it shows": its verdict and its sentence."""
    for f in findings:
        print(f"- [{f.verdict}] {f.answer}")


def load_findings(lesson: str) -> dict[str, Finding]:
    """The findings of `lesson`'s newest full-profile run in the results folder in use (during `make run`: this
    run's), else its canonical run's, by id."""
    table, _ = load_latest_full_or_canonical(findings_name(lesson))
    records = table.astype(object).where(table.notna(), None).to_dict("records")
    return {row["id"]: Finding(**{**row, "value": _plain(row.get("value"))}) for row in records}


def _plain(value):
    """A value as the CSV gave it back: a whole float as the int it was written as."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def answer(lesson: str, finding_id: str) -> Finding:
    """One finding of `lesson` by id; KeyError naming the ids there are."""
    found = load_findings(lesson)
    if finding_id not in found:
        raise KeyError(f"{lesson} has no finding {finding_id!r}; its findings: {', '.join(sorted(found))}")
    return found[finding_id]
