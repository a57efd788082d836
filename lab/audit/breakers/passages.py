"""Retrieved passages in an order that varies between requests that share them (retrieval score
order): found in a prompt's text or in a chat message's content, and put in one stable order.

A passage starts at a line that opens with a marker: `[doc 3]`, `[Document 3]`, `[passage 7]`,
`[source 2]`, `[chunk 5]`, `[3]`, or `Document 3:` / `Passage 3.`; it runs to the next marker, a
blank line, or a labelled line such as `Question:`. Passages next to each other (blank lines between
them allowed) form a run, and a fix reorders passages only within their run. Where a marker's id
names one text throughout the log, the id is the passage's identity and the whole passage moves
(sorted by id); where the markers only number positions (`[1]`, `[2]` in every request, with
different texts), the markers stay and the texts move (sorted by text).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from lab.audit.breakers.requests import Detection, Request, orders_disagree

_WORD = r"(?:doc|document|passage|source|chunk|context|ref)"
MARKER = re.compile(
    rf"\s*(?:\[\s*(?:{_WORD}\s*#?\s*([\w.-]+)|(\d+))\s*\]|{_WORD}\s*#?\s*(\d+)\s*[:.)])", re.I
)
LABEL = re.compile(r"\s*[A-Z][\w' -]{0,30}:(\s|$)")  # a labelled line ends a passage


@dataclass(frozen=True)
class Plan:
    """How a log's passages are told apart: by their ids (`lines`: each id's passage length in
    lines, `default` for an id seen once), or by their texts under position markers (`by_id` False:
    one-line passages only)."""

    by_id: bool
    lines: dict[str, int] | None = None
    default: int = 1


def split_pieces(text: str, plan: Plan | None = None) -> list[tuple[str, str | None, list[str]]]:
    """The text's lines grouped: ("passage", id, lines) per passage, ("blank" | "text", None,
    [line]) otherwise. A passage runs to the next marker, blank or labelled line, and under an id
    plan to its id's length at most."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if not marker:
            out.append(("text" if lines[i].strip() else "blank", None, [lines[i]]))
            i += 1
            continue
        ident, j = next(g for g in marker.groups() if g), i + 1
        while (
            j < len(lines)
            and lines[j].strip()
            and not MARKER.match(lines[j])
            and not LABEL.match(lines[j])
        ):
            j += 1
        if plan is not None and plan.lines is not None:
            j = min(j, i + plan.lines.get(ident, plan.default))
        out.append(("passage", ident, lines[i:j]))
        i = j
    return out


def _runs(pieces) -> list[list[int]]:
    """The positions (in `pieces`) of each run of two or more passages with only blank lines between
    them."""
    runs, current = [], []
    for k, (kind, _, _) in enumerate(pieces):
        if kind == "passage":
            current.append(k)
        elif kind == "text":
            runs, current = runs + [current], []
    return [run for run in runs + [current] if len(run) > 1]


def passage_body(lines: list[str]) -> str:
    """A passage's text without its marker."""
    return "\n".join([lines[0][MARKER.match(lines[0]).end() :]] + lines[1:])


def _natural(identity: str) -> tuple:
    return (0, int(identity), "") if identity.isdigit() else (1, 0, identity.lower())


def _reorder(text: str, plan: Plan) -> str:
    """`text` with every run of passages in the stable order (by id, or by text under fixed
    markers)."""
    pieces = split_pieces(text, plan)
    for run in _runs(pieces):
        passages = [pieces[k] for k in run]
        ordered = sorted(
            passages, key=lambda p: _natural(p[1]) if plan.by_id else passage_body(p[2])
        )
        for k, old, new in zip(run, passages, ordered):
            if plan.by_id:
                pieces[k] = new
            else:  # the slot keeps its marker, the text moves
                marker = old[2][0][: MARKER.match(old[2][0]).end()]
                pieces[k] = ("passage", old[1], (marker + passage_body(new[2])).split("\n"))
    return "\n".join(line for _, _, lines in pieces for line in lines)


def _orders(
    requests: Sequence[Request], plan: Plan | None = None
) -> list[list[tuple[str, tuple[str, ...]]]]:
    """Every run of passages in the requests, each passage as (id, its lines)."""
    found = []
    for request in requests:
        for content in request.contents():
            if "\n" in content:
                pieces = split_pieces(content, plan)
                found += [
                    [(pieces[k][1], tuple(pieces[k][2])) for k in run] for run in _runs(pieces)
                ]
    return found


def _common_lines(versions: list[tuple[str, ...]]) -> int:
    """How many first lines every version of one passage has in common (at least its marker line)."""
    n = min(map(len, versions))
    return next((k for k in range(1, n) if len({v[k] for v in versions}) > 1), n)


def _plan(orders) -> Plan:
    """Position markers where every run numbers its one-line passages 1, 2, 3... and one number
    holds different texts; else ids, each passage cut to the lines all its occurrences share."""
    versions: dict[str, set[tuple[str, ...]]] = {}
    seen: Counter[str] = Counter()
    for ident, lines in (p for order in orders for p in order):
        versions.setdefault(ident, set()).add(lines)
        seen[ident] += 1
    numbered = all(
        order[0][0].isdigit()
        and [i for i, _ in order] == [str(int(order[0][0]) + k) for k in range(len(order))]
        for order in orders
    )
    if (
        numbered
        and all(len(lines) == 1 for order in orders for _, lines in order)
        and any(len(v) > 1 for v in versions.values())
    ):
        return Plan(False)
    lines = {ident: _common_lines(list(v)) for ident, v in versions.items()}
    shared = [lines[i] for i in versions if seen[i] > 1]
    return Plan(True, lines, min(shared, default=1))


def detect(requests: Sequence[Request], renderer=None) -> Detection | None:
    """Runs of passages that requests sharing them hold in different orders; None where one order of
    the passages is kept by every run."""
    orders = _orders(requests)
    if not orders:
        return None
    plan = _plan(orders)
    if plan.by_id:
        orders = _orders(requests, plan)
    keys = [
        list(
            dict.fromkeys(
                ident if plan.by_id else passage_body(list(lines)) for ident, lines in order
            )
        )
        for order in orders
    ]
    if not orders_disagree(keys):
        return None
    how = "by id" if plan.by_id else "by text, the position markers kept"
    marker = MARKER.match(orders[0][0][1][0]).group().strip()
    return Detection(
        f"{len(orders):,} runs of retrieved passages (markers like {marker}) come in orders "
        f"that contradict each other (no one order of the passages is kept); sorted {how}",
        "the passages",
        plan,
    )


def fix(requests: Sequence[Request], detection: Detection) -> list[Request]:
    """Every run of passages in the stable order the detection chose."""
    return [r.rewritten(lambda text: _reorder(text, detection.plan)) for r in requests]
