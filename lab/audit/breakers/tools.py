"""Tool definitions that differ between requests only in their order, or in how each is written (its
keys in another order): found in chat requests' `tools`, and sent sorted by name, each written one
way.

The chat template renders the tools (most put them in the system prompt, in the list's order, as
JSON): one list in two orders is two prefixes from the first tool that moved. A template that does
not render tools gives the fix nothing to gain, and the replay says so."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from lab.audit.breakers.requests import Detection, Request, orders_disagree


def _name(tool: dict) -> str:
    function = tool.get("function")
    return str((function if isinstance(function, dict) else tool).get("name", ""))


def _canonical(tool: dict) -> str:
    """The tool's content, whatever the order of its keys."""
    return json.dumps(tool, sort_keys=True, ensure_ascii=False, default=str)


def _written(tool: dict) -> str:
    return json.dumps(tool, ensure_ascii=False, default=str)


def detect(requests: Sequence[Request], renderer=None) -> Detection | None:
    """Tools that requests list in contradicting orders, or write with their keys in different
    orders; None if every request that sends tools sends them in one order and one form."""
    lists = [list(r.tools) for r in requests if r.chat and r.tools]
    if len(lists) < 2:
        return None
    forms: dict[str, Counter[str]] = {}
    first: dict[str, dict] = {}
    for tool in (t for tools in lists for t in tools):
        key = _canonical(tool)
        forms.setdefault(key, Counter())[_written(tool)] += 1
        first.setdefault(_written(tool), tool)
    disordered = orders_disagree([list(dict.fromkeys(map(_canonical, tools))) for tools in lists])
    rewritten = sum(1 for f in forms.values() if len(f) > 1)
    if not disordered and not rewritten:
        return None
    preferred = {key: first[f.most_common(1)[0][0]] for key, f in forms.items()}
    found = (
        [f"{len(lists):,} requests send tools in orders that contradict each other"]
        if disordered
        else []
    )
    found += (
        [f"{rewritten} tool definition(s) written with their keys in different orders"]
        if rewritten
        else []
    )
    return Detection("; ".join(found), "the tools", preferred)


def fix(requests: Sequence[Request], detection: Detection) -> list[Request]:
    """Each request's tools sorted by name (then content), each tool in the form most requests send
    it."""
    preferred = detection.plan
    out = []
    for r in requests:
        if not (r.chat and r.tools):
            out.append(r)
            continue
        tools = [
            preferred.get(_canonical(t), t)
            for t in sorted(r.tools, key=lambda t: (_name(t), _canonical(t)))
        ]
        out.append(
            r
            if list(map(_written, tools)) == list(map(_written, r.tools))
            else r.with_chat(r.messages, tools)
        )
    return out
