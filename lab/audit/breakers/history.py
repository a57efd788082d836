"""Conversations whose history changes between turns, so that a turn's prompt does not start with
the one before: the client rewrites earlier turns (their reasoning stripped, a reply shortened), the
client cuts the oldest turns off the front, or the chat template renders earlier turns differently
from how it rendered them last turn (one that shows only the latest reasoning). Read from chat
requests (`messages`): a turn's previous turn is the latest earlier request of the same conversation
(the same system and first user message) with fewer messages, the same roles and the same user and
system messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from lab.audit.breakers.requests import Detection, Renderer, Request

LOOK_BACK = 50  # earlier requests of one conversation searched for a turn's previous one
REASONING = re.compile(r"<(think|thinking|reasoning)>.*?</\1>\s*", re.S)
REASONING_KEYS = ("reasoning_content", "reasoning")


def _key(message: dict) -> tuple[str, str]:
    content = message.get("content")
    return str(message.get("role")), content if isinstance(content, str) else json.dumps(
        content, default=str
    )


def _lead(messages: Sequence[dict]) -> int:
    """How many messages open the conversation before its turns: the system (or developer) messages."""
    return next(
        (i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")),
        len(messages),
    )


def _same_turns(earlier: Sequence[dict], later: Sequence[dict]) -> bool:
    """Whether `later` opens with `earlier`'s roles and its messages other than the assistant's."""
    return all(
        a.get("role") == b.get("role") and (a.get("role") == "assistant" or a == b)
        for a, b in zip(earlier, later)
    )


def previous_turns(requests: Sequence[Request]) -> dict[int, int]:
    """Each chat request's previous turn in the log (position -> position), where there is one."""
    groups: dict[tuple, list[int]] = {}
    links = {}
    for i, r in enumerate(requests):
        if not r.chat:
            continue
        opening = tuple(_key(m) for m in r.messages[: _lead(r.messages) + 1])
        group = groups.setdefault(opening, [])
        for p in reversed(group[-LOOK_BACK:]):
            earlier = requests[p].messages
            if len(earlier) < len(r.messages) and _same_turns(earlier, r.messages):
                links[i] = p
                break
        group.append(i)
    return links


def _rewritten(earlier: Sequence[dict], later: Sequence[dict]) -> bool:
    """Whether the later turn sends an earlier assistant message changed (one holds the other:
    reasoning stripped, a reply cut), and nothing else."""
    changed = [(a, b) for a, b in zip(earlier, later) if a != b]
    return bool(changed) and all(
        isinstance(a.get("content"), str)
        and isinstance(b.get("content"), str)
        and (a["content"].strip() in b["content"] or b["content"].strip() in a["content"])
        for a, b in changed
    )


def detect_rewritten(requests: Sequence[Request], renderer=None) -> Detection | None:
    """Turns that send an earlier turn's assistant message other than the previous turn sent it."""
    links = {
        r: p
        for r, p in previous_turns(requests).items()
        if _rewritten(requests[p].messages, requests[r].messages[: len(requests[p].messages)])
    }
    if not links:
        return None
    return Detection(
        f"{len(links):,} turns send earlier assistant messages changed from how the turn before sent "
        "them (reasoning stripped, replies cut)",
        "the history",
        links,
    )


def fix_rewritten(requests: Sequence[Request], detection: Detection) -> list[Request]:
    """Each such turn's history as its previous turn sent it (that turn's own history kept in turn)."""
    out = list(requests)
    for r in sorted(detection.plan):
        p = detection.plan[r]
        earlier = out[p].messages
        out[r] = requests[r].with_chat(
            earlier + requests[r].messages[len(earlier) :], requests[r].tools
        )
    return out


def _truncations(requests: Sequence[Request]) -> dict[int, tuple[int, int]]:
    """Each chat request that repeats an earlier request's turns without that request's first ones:
    position -> (the earlier request, how many of its turns it keeps at its start); at least two
    kept, and one added."""
    seen: dict[tuple[str, str], list[tuple[int, int]]] = {}
    found = {}
    for i, r in enumerate(requests):
        if not r.chat:
            continue
        lead = _lead(r.messages)
        turns = [_key(m) for m in r.messages[lead:]]
        for p, j in reversed(seen.get(turns[0], [])[-LOOK_BACK:]) if turns else ():
            earlier = requests[p].messages
            kept = len(earlier) - _lead(earlier) - j
            if (
                2 <= kept < len(turns)
                and earlier[: _lead(earlier)] == r.messages[:lead]
                and [_key(m) for m in earlier[len(earlier) - kept :]] == turns[:kept]
            ):
                found[i] = (p, kept)
                break
        for j, key in enumerate(turns[1:], start=1):
            seen.setdefault(key, []).append((i, j))
    return found


def detect_truncated(requests: Sequence[Request], renderer=None) -> Detection | None:
    """Turns whose history was cut at the front: they open with the previous turn's later messages."""
    cuts = _truncations(requests)
    if not cuts:
        return None
    return Detection(
        f"{len(cuts):,} turns send their conversation with its oldest turns cut off the front",
        "the whole history",
        cuts,
    )


def fix_truncated(requests: Sequence[Request], detection: Detection) -> list[Request]:
    """Each cut turn with the whole history: its previous turn's (whole, in turn) and then its own
    new messages."""
    out = list(requests)
    for r in sorted(detection.plan):
        p, kept = detection.plan[r]
        lead = _lead(requests[r].messages)
        whole = out[p].messages[_lead(out[p].messages) :]
        out[r] = requests[r].with_chat(
            requests[r].messages[:lead] + whole + requests[r].messages[lead + kept :],
            requests[r].tools,
        )
    return out


def detect_template(requests: Sequence[Request], renderer: Renderer) -> Detection | None:
    """Turns that send their previous turn's messages unchanged, yet whose rendered prompt does not
    start with that turn's rendering: the chat template renders earlier turns differently (for one,
    showing only the latest reasoning). The fix, reasoning stripped from every assistant message
    before sending, applies where the messages hold reasoning."""
    pairs = [
        (r, p)
        for r, p in previous_turns(requests).items()
        if requests[r].messages[: len(requests[p].messages)] == requests[p].messages
    ]
    rewritten = [
        r
        for r, p in pairs
        if not requests[r].text.startswith(renderer.text(requests[p], add_generation_prompt=False))
    ]
    if not rewritten:
        return None
    reasoning = any(_holds_reasoning(m) for r in requests if r.chat for m in r.messages)
    return Detection(
        f"{len(rewritten):,} turns send their previous turn's messages unchanged, and the chat template "
        "renders those earlier turns differently"
        + (
            "; the messages hold reasoning"
            if reasoning
            else "; no rewrite of the messages changes that"
        ),
        "earlier turns' reasoning",
        reasoning,
    )


def _holds_reasoning(message: dict) -> bool:
    return message.get("role") == "assistant" and (
        any(message.get(k) for k in REASONING_KEYS)
        or (
            isinstance(message.get("content"), str)
            and REASONING.search(message["content"]) is not None
        )
    )


def fix_template(requests: Sequence[Request], detection: Detection) -> list[Request]:
    """Reasoning taken out of every assistant message (its text and its reasoning fields)."""
    if not detection.plan:
        return list(requests)
    out = []
    for r in requests:
        if not (r.chat and any(map(_holds_reasoning, r.messages))):
            out.append(r)
            continue
        messages = [
            {k: v for k, v in m.items() if k not in REASONING_KEYS}
            | (
                {"content": REASONING.sub("", m["content"])}
                if isinstance(m.get("content"), str)
                else {}
            )
            if _holds_reasoning(m)
            else m
            for m in r.messages
        ]
        out.append(r.with_chat(messages, r.tools))
    return out
