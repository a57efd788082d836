"""Findings as data: what a lesson's run concludes, computed in code from that run's numbers, saved
beside its results, and rendered by id wherever else it appears (README, RESULTS, a later lesson),
so that a conclusion has one home and cannot drift from the run that made it.

    found = [Finding("block_size.chat", "Which block size should chat use here?", HOLDS,
                     "chat: block size 256 ...", "mean TTFT by size over 3 repeats: ...")]
    save_findings(found, "04_block_size_sweep", env)     # data/results/04_block_size_sweep-findings-<run>
    print_findings(found)                                # "What it shows", printed from the run
    takeaway("05_cache_on_vs_off", [from_verdict(...), exact(...)], env)  # both, closing a lesson
    answer("04_block_size_sweep", "block_size.chat")     # elsewhere: the canonical run's finding, by id

A verdict is one of three: the run shows the answer (`holds`), shows the opposite (`does not hold`),
or cannot tell them apart at its spread (`cannot tell`); each finding says which test decided it in
its evidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lab.experiments.results import environment, load_latest_full_or_canonical, save_results
from lab.experiments.verdict import TimingCheck, Verdict

HOLDS, DOES_NOT_HOLD, CANNOT_TELL = "holds", "does not hold", "cannot tell"
VERDICTS = (HOLDS, DOES_NOT_HOLD, CANNOT_TELL)


@dataclass(frozen=True)
class Finding:
    """One conclusion of one run: its id (unique within the lesson), the question it answers, the
    verdict, the sentence that states it with the run's numbers, the evidence (the quantities, their
    spread, the test), and the answer's one value where it has one (a block size, a ratio), for the
    pages that render it."""

    id: str
    question: str
    verdict: str
    answer: str
    evidence: str
    value: int | float | str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(
                f"Finding {self.id!r}: verdict={self.verdict!r}; use one of {', '.join(VERDICTS)}"
            )
        if not self.answer.strip():
            raise ValueError(
                f"Finding {self.id!r}: an empty answer; state what the run shows, with its numbers"
            )


def from_verdict(
    verdict: Verdict,
    finding_id: str,
    question: str,
    *,
    expected: str | None = None,
    says: dict[str, str] | None = None,
    value: int | float | str | None = None,
) -> Finding:
    """A verdict of `lab.experiments.verdict` (a rank, a bound, a tolerance) as a finding. It cannot
    tell where the run cannot; otherwise it holds when the run shows `expected` first (the first
    name of the verdict's order: "below", "within", a winner's name) and does not hold when it shows
    another; with no `expected`, any order the run can tell holds. The verdict's sentence, with its
    quantities and spread, is the evidence; `says` gives the plain-words answer for each outcome (by
    default, the verdict's sentence)."""
    if not verdict.can_tell:
        outcome = CANNOT_TELL
    else:
        outcome = HOLDS if expected is None or verdict.order[0] == expected else DOES_NOT_HOLD
    answer = (says or {}).get(outcome, verdict.text)
    return Finding(finding_id, question, outcome, answer, verdict.text, value)


def from_check(
    check: TimingCheck,
    finding_id: str,
    question: str,
    *,
    says: dict[str, str] | None = None,
    value: int | float | str | None = None,
) -> Finding:
    """A one-sided timing check (`timing_check`) as a finding: the claim does not hold where the
    test raises the alarm; this run cannot tell where it raises none but the mean itself lies beyond
    the claim; else it holds. (No alarm is not proof: the check's sentence names its margin and its
    rate.)"""
    outcome = DOES_NOT_HOLD if check.alarm else CANNOT_TELL if check.beyond else HOLDS
    return Finding(
        finding_id, question, outcome, (says or {}).get(outcome, check.text), check.text, value
    )


def exact(
    finding_id: str,
    question: str,
    holds: bool,
    says: dict[str, str],
    evidence: str,
    value: int | float | str | None = None,
) -> Finding:
    """A finding decided by counts or equal outputs, which do not move between runs: it holds or it
    does not. `says` gives the answer for each (keys `holds` and `does not hold`)."""
    outcome = HOLDS if holds else DOES_NOT_HOLD
    if outcome not in says:
        raise ValueError(
            f"Finding {finding_id!r}: says has no sentence for {outcome!r}; give one for "
            f"{HOLDS!r} and {DOES_NOT_HOLD!r}"
        )
    return Finding(finding_id, question, outcome, says[outcome], evidence, value)


def takeaway(lesson: str, findings: Iterable[Finding], env: dict[str, Any] | None = None) -> Path:
    """Close a lesson: save its findings with the run's provenance (`env`, or a bare one naming the
    lesson) and print them, one line each, under the lesson's name. Returns the results file."""
    findings = list(findings)
    if not findings:
        raise ValueError(f"{lesson}: a takeaway needs at least one finding from the run")
    path = save_findings(findings, lesson, env if env is not None else environment(notebook=lesson))
    print(
        f"What this run found ({len(findings)} finding{'s' if len(findings) > 1 else ''}, saved as {path.name}):"
    )
    print_findings(findings)
    return path


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
    """The findings of `lesson`'s newest full-profile run in the results folder in use (during `make
    run`: this run's), else its canonical run's, by id."""
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
        raise KeyError(
            f"{lesson} has no finding {finding_id!r}; its findings: {', '.join(sorted(found))}"
        )
    return found[finding_id]
