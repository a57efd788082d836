"""docs/RESULTS.md's findings, lesson by lesson: what each lesson's last cell printed in the
canonical run, read from the findings it saved (`data/reference/results/<lesson>-findings-<run>`),
never retyped.

    python -m lab.tools.readme_report      # renders this section with the rest of the generated pages
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.experiments.findings import CANNOT_TELL, DOES_NOT_HOLD, HOLDS, findings_name
from lab.experiments.results import CANONICAL_DIR, load_latest
from lab.tools.runner import all_notebooks

FINDINGS = (
    "<!-- findings:start -->",
    "<!-- findings:end -->",
)  # docs/RESULTS.md: every lesson's findings


def lesson_findings(
    lesson: str, directory: Path = CANONICAL_DIR
) -> tuple[pd.DataFrame, str] | None:
    """A lesson's findings in `directory` and the run that saved them, or None where it saved none
    there."""
    try:
        table, meta = load_latest(findings_name(lesson), directory)
    except FileNotFoundError:
        return None
    return table, meta["run_id"]


def findings_section(directory: Path = CANONICAL_DIR) -> str:
    """Each lesson's findings as a list under its name, with its verdict, and a count of the
    verdicts."""
    blocks, verdicts, missing = [], [], []
    for lesson in (path.stem for path in all_notebooks()):
        found = lesson_findings(lesson, directory)
        if found is None:
            missing.append(f"`{lesson}`")
            continue
        table, run = found
        verdicts += list(table.verdict)
        lines = [f"- `{row.id}` **{row.verdict}**: {row.answer}" for row in table.itertuples()]
        blocks.append(f"**`{lesson}`** (run `{run}`)\n\n" + "\n".join(lines))
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in (HOLDS, DOES_NOT_HOLD, CANNOT_TELL))
    head = (
        f"{len(verdicts)} findings from {len(blocks)} lessons ({counts}), each printed by its lesson's takeaway "
        "cell in the canonical run and saved with its results:"
    )
    tail = f"\n\nNo findings saved yet by {', '.join(missing)}." if missing else ""
    return head + "\n\n" + "\n\n".join(blocks) + tail
