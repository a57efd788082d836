"""The course map's tracks, rendered from the lessons themselves: each lesson's title, its question
(the "**The question.**" paragraph) and what it needs first (its "*Needs first:*" line), so that the
map cannot drift from the lessons.

    python -m lab.tools.course_map            write the tracks into docs/COURSE_MAP.md (between its markers)
    python -m lab.tools.course_map --check    exit 1 if the map is not what the lessons render

Which track a lesson belongs to is the map's own structure (TRACKS); each track says which lessons
from outside it come first, from the needs of its lessons. A lesson needs only earlier lessons, and
every earlier lesson its prose cites before "What it shows" is one it needs, directly or through
another (tests/test_course_map.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from lab import PROJECT_ROOT
from lab.tools.runner import all_notebooks

MAP = PROJECT_ROOT / "docs" / "COURSE_MAP.md"
START, END = "<!-- tracks:start -->", "<!-- tracks:end -->"
NEEDS = "*Needs first:*"
# (heading, what the track is about, its lessons in reading order); a track needs only earlier ones
TRACKS = [
    (
        "The core track: the mechanism",
        "One engine, one cache: how a prefix is recognised, what a hit skips, what "
        "decides the hit rate.",
        ["00", "01", "02", "03", "04", "05", "06", "07", "08"],
    ),
    (
        "The operations track: serving it, sharing it, routing it",
        "A server, tenants, a fleet: what you watch, what "
        "can leak, where requests go, and why a token missed.",
        ["09", "10", "11", "12", "13", "14"],
    ),
    (
        "What the hits are worth",
        "From a hit rate to a gain: a cost model, the gain curve, capacity at a TTFT "
        "target, and model size.",
        ["15", "16", "17", "18"],
    ),
    ("Checking the article", "The claims the course began from, one by one.", ["19"]),
    (
        "The capstone: your workload, then real traffic",
        "Your own prompts, audited with what the tracks built; then "
        "an hour of real production traffic, and the course in one page.",
        ["20", "21"],
    ),
    (
        "Beyond prefixes",
        "A prefix cache stops at the first token that differs. This lesson builds reuse that does "
        "not, in the mini-engine, and measures what it costs.",
        ["22"],
    ),
    (
        "Beyond one machine's memory",
        "A pool forgets what it evicts. This lesson keeps evicted blocks in a slower "
        "tier, keeps every computed prompt's K/V on disk across a restart with vLLM's own connector, and measures when "
        "reading a block back beats computing it again.",
        ["23"],
    ),
]


@dataclass(frozen=True)
class Lesson:
    number: str
    name: str  # the notebook's file name without .ipynb
    title: str
    question: str
    needs: tuple[str, ...]


def read_lesson(path: Path) -> Lesson:
    """A lesson's title, question and needs, from its first markdown cell."""
    opening = nbformat.read(path, as_version=4).cells[0].source
    title = re.match(r"# (\d\d) · (.+)", opening)
    question = re.search(r"\*\*The question\.\*\* (.+?)(?:\n\s*\n|$)", opening, re.S)
    needs = next((line for line in opening.splitlines() if line.startswith(NEEDS)), None)
    if not (title and question and needs):
        raise ValueError(
            f"{path.name}: its first cell needs a '# NN · Title' line, a '**The question.**' "
            f"paragraph and a '{NEEDS}' line (lesson numbers, or 'nothing')"
        )
    return Lesson(
        title.group(1),
        path.stem,
        title.group(2),
        " ".join(question.group(1).split()),
        tuple(re.findall(r"\[(\d\d) ·", needs)),
    )


def lessons() -> dict[str, Lesson]:
    return {lesson.number: lesson for lesson in map(read_lesson, all_notebooks())}


def closure(number: str, by_number: dict[str, Lesson]) -> set[str]:
    """Every lesson `number` needs, directly or through another."""
    found, todo = set(), list(by_number[number].needs)
    while todo:
        if (need := todo.pop()) not in found:
            found.add(need)
            todo += by_number[need].needs
    return found


def _link(lesson: Lesson) -> str:
    return f"[{lesson.number} · {lesson.title}](lessons/{lesson.name}.ipynb)"


def render(by_number: dict[str, Lesson] | None = None) -> str:
    """The tracks as the map shows them: per track, what it needs from outside it and a table of its
    lessons."""
    by_number = by_number or lessons()
    parts = []
    for heading, about, numbers in TRACKS:
        outside = sorted({n for k in numbers for n in by_number[k].needs} - set(numbers))
        assumes = (
            " From earlier tracks it needs "
            + ", ".join(f"[{n}](lessons/{by_number[n].name}.ipynb)" for n in outside)
            + "."
            if outside
            else ""
        )
        rows = [
            f"| {_link(by_number[k])} | {by_number[k].question} | "
            f"{', '.join(by_number[k].needs) or 'nothing'} |"
            for k in numbers
        ]
        parts.append(
            f"## {heading}\n\n{about}{assumes}\n\n| lesson | its question | needs first |\n|---|---|---|\n"
            + "\n".join(rows)
        )
    return "\n\n".join(parts)


def write(check: bool = False) -> bool:
    """Put the rendered tracks between the map's markers; with `check`, only say whether they are
    already there."""
    text = MAP.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    wanted = f"{head}{START}\n{render()}\n{END}{tail}"
    if not check and wanted != text:
        MAP.write_text(wanted)
    return wanted == text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.course_map", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/COURSE_MAP.md is not what it renders"
    )
    args = parser.parse_args(argv)
    if write(check=args.check):
        print(f"{MAP.relative_to(PROJECT_ROOT)}: the tracks are the lessons' own")
        return 0
    print(
        f"{MAP.relative_to(PROJECT_ROOT)}: "
        + (
            "out of date: run python -m lab.tools.course_map"
            if args.check
            else "tracks written from the lessons"
        )
    )
    return 1 if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
