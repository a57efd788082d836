"""Two breakers of the text itself: a field whose value changes from request to request in front of
shared text (the field search of lab.audit.fields: a timestamp, a request id, a user's name, a
per-request setting), moved to the end; and whitespace that code paths write differently (line ends,
trailing or repeated spaces, blank lines, no-break spaces), written one way."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import partial

from lab.audit.breakers.passages import MARKER
from lab.audit.breakers.requests import Detection, Request
from lab.audit.fields import find_breaking_field, move_line_to_end

MAX_FIELDS = 3  # the field search's own limit


def detect_fields(requests: Sequence[Request], renderer=None) -> Detection | None:
    """The labelled lines where prompts first diverge (lab.audit.fields.find_breaking_field) in the
    first half of the prompt, up to MAX_FIELDS, each found after moving the ones before it (not a
    retrieved passage's line); None if there is none, or none that a fix can move (a line the chat
    template writes, outside every message, or a whole message: a user's own words)."""
    texts = [r.text for r in requests]
    labels: list[str] = []
    examples: list[str] = []
    for _ in range(MAX_FIELDS):
        found = find_breaking_field(texts, moved=labels)
        if found is None or not _early(texts, found.label) or _passage(texts, found.label):
            break
        labels.append(found.label)
        examples.append(f"'{found.label}' ({found.kind}, e.g. {found.examples[0][:40]!r})")
        texts = [move_line_to_end(t, found.label) for t in texts]
    movable = [
        k
        for k, label in enumerate(labels)
        if any(
            _line_with(c, label) is not None and "\n" in c.strip()
            for r in requests
            for c in r.contents()
        )
    ]
    if not movable:
        return None
    what = " and ".join(examples[k] for k in movable)
    where = (
        "its last message"
        if all(r.chat for r in requests)
        else "the prompt (a chat: of its last message)"
    )
    return Detection(
        f"prompts diverge at {what}, in front of text they share",
        f"{what} to the end of {where}",
        [labels[k] for k in movable],
    )


def _early(texts: Sequence[str], label: str) -> bool:
    """Whether the line starting with `label` comes in the first half of most prompts that hold it
    (a field in front of the text prompts share, not one next to their end)."""
    places = [at / len(t) for t in texts if (at := _offset(t, label)) is not None]
    return bool(places) and sorted(places)[len(places) // 2] < 0.5


def _passage(texts: Sequence[str], label: str) -> bool:
    """Whether the line starting with `label` opens a retrieved passage (lab.audit.breakers.passages
    orders those: they are not a field to move)."""
    text = next(t for t in texts if _offset(t, label) is not None)
    return MARKER.match(text[_offset(text, label) :]) is not None


def _offset(text: str, label: str) -> int | None:
    """Where the first line that starts with `label` starts, in characters."""
    if text.startswith(label):
        return 0
    at = text.find("\n" + label)
    return None if at == -1 else at + 1


def _line_with(text: str, label: str) -> int | None:
    """The first line of `text` that starts with `label`, if any."""
    return next((i for i, line in enumerate(text.split("\n")) if line.startswith(label)), None)


def _move_in_chat(request: Request, label: str) -> Request:
    """The chat with the first line that starts with `label` moved to the end of the last message
    (the per-request part of a conversation); unchanged if no message's text holds one."""
    messages = [dict(m) for m in request.messages]
    last = messages[-1]
    if not isinstance(last.get("content"), str):
        return request
    for m in messages:
        at = _line_with(m["content"], label) if isinstance(m.get("content"), str) else None
        if at is None:
            continue
        if (
            "\n" not in m["content"].strip()
        ):  # the whole message: a user's own words, not a field in a template
            return request
        lines = m["content"].split("\n")
        if m is last:
            last["content"] = move_line_to_end(last["content"], label)
        else:
            m["content"] = "\n".join(lines[:at] + lines[at + 1 :])
            last["content"] += "\n" + lines[at]
        return (
            request
            if messages == list(request.messages)
            else request.with_chat(messages, request.tools)
        )
    return request


def fix_fields(requests: Sequence[Request], detection: Detection) -> list[Request]:
    """Each field moved to the end: of the prompt, or of a chat's last message."""
    out = []
    for r in requests:
        fixed = r
        for label in detection.plan:
            fixed = (
                _move_in_chat(fixed, label)
                if r.chat
                else fixed.rewritten(partial(move_line_to_end, label=label))
            )
        out.append(fixed)
    return out


_TRAILING = re.compile(r"[ \t]+$", re.M)
_REPEATED = re.compile(r"(?<=\S)[ \t]{2,}(?=\S)")
_BLANKS = re.compile(r"\n{3,}")
_ODD = (
    "\r",
    "\u00a0",
    "\n\n\n",
    " \n",
    "\t\n",
    "  ",
    "\t\t",
    " \t",
    "\t ",
)  # where normalise may change a text


def normalise(text: str, ends: bool = True) -> str:
    """`text` written one way: NFC, line ends as \\n, no-break spaces as spaces, no trailing spaces,
    one space between words, at most one blank line, no whitespace at its start, and at its end
    (`ends`; else its end is kept as it is: a prompt's last characters are never shared, and they
    steer the answer)."""
    body = text if ends else text.rstrip()
    if (
        not any(odd in body for odd in _ODD)
        and unicodedata.is_normalized("NFC", body)
        and not body[:1].isspace()
        and not body[-1:].isspace()
    ):
        return text
    body = (
        unicodedata.normalize("NFC", body)
        .replace("\r\n", "\n")
        .replace("\r", "\n")
        .replace("\u00a0", " ")
    )
    body = _BLANKS.sub("\n\n", _REPEATED.sub(" ", _TRAILING.sub("", body))).strip()
    return body if ends else body + text[len(text.rstrip()) :]


def _normalised(request: Request) -> Request:
    return request.rewritten(normalise if request.chat else lambda t: normalise(t, ends=False))


def detect_whitespace(requests: Sequence[Request], renderer=None) -> Detection | None:
    """Requests whose whitespace another code path would write differently; None if every request is
    written one way already."""
    touched = sum(1 for r in requests if _normalised(r) is not r)
    if not touched:
        return None
    return Detection(
        f"{touched:,} of {len(requests):,} requests hold whitespace written another way than the rest "
        "can be (\\r\\n line ends, trailing or repeated spaces, extra blank lines, no-break spaces)",
        "the whitespace",
    )


def fix_whitespace(requests: Sequence[Request], detection: Detection) -> list[Request]:
    return [_normalised(r) for r in requests]
