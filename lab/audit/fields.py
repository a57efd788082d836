"""What breaks sharing: where prompts diverge, the field (a labelled line) whose value differs, and
the hit rate when that line moves to the end of the prompt."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lab.audit.piece_tokens import TokenEncoder
from lab.audit.prompts import encode
from lab.audit.replay import replay_hit_rate
from lab.audit.settings import AuditSettings
from lab.audit.trace import Trace


@dataclass
class Field:
    """A line where prompts of one template first differ: its label, what its values look like, how
    many prompts diverge there, where (tokens into the prompt) and the hit rate with the line moved
    to the end."""

    label: str
    kind: str
    examples: list[str]
    prompts: int
    median_token_position: int
    hit_rate_before: float
    hit_rate_after: float


KINDS = [
    ("timestamp", r"\d{1,2}:\d{2}(:\d{2})?|\d{4}-\d{2}-\d{2}|\b\d{10,13}\b"),
    ("identifier", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-|\b(?=[A-Za-z_-]*\d)[0-9A-Za-z_-]{8,}\b"),
    ("number", r"\b\d+(\.\d+)?\b"),
    ("name", r"^\W*[A-Z][a-z]+( [A-Z][a-z]+)?\W*$"),
]


def value_kind(value: str) -> str:
    """What a field's value looks like: timestamp, identifier, number, name, or text."""
    for kind, pattern in KINDS:
        if re.search(pattern, value):
            return kind
    return "text"


def _common_prefix_length(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on slice equality: C-speed comparisons
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_prefix_lengths(texts: Sequence[str]) -> list[int]:
    """Per prompt, where it stops sharing with the prompt most like it, in characters: the longest
    common prefix with any other prompt, which is always with a neighbour in sorted order."""
    order = sorted(range(len(texts)), key=texts.__getitem__)
    points = [0] * len(texts)
    for a, b in zip(order, order[1:]):
        shared = _common_prefix_length(texts[a], texts[b])
        points[a], points[b] = max(points[a], shared), max(points[b], shared)
    return points


def _line_at(text: str, position: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return start, len(text) if end == -1 else end


def line_label(line_prefix: str) -> str:
    """A field's name: the fixed text of its line up to its label's colon, or the words before the
    value."""
    colon = line_prefix.find(":")
    if colon != -1 and not re.search(r"\d", line_prefix[:colon]):
        return line_prefix[: colon + 1]
    return re.split(r"[\d\W]*$", line_prefix)[0] or "(start of line)"


def move_line_to_end(text: str, label: str) -> str:
    """The prompt with its first line that starts with `label` moved to the end (unchanged if it has
    none, or if that line is already last)."""
    lines = text.split("\n")
    for i, line in enumerate(lines[:-1]):
        if line.startswith(label):
            return "\n".join(lines[:i] + lines[i + 1 :] + [line])
    return text


@dataclass
class BreakingLine:
    """The line label where most prompts diverge: the kind of its values, up to three example
    values, and each diverging prompt's text up to the divergence."""

    label: str
    kind: str
    examples: list[str]
    heads: list[str]


def find_breaking_field(
    texts: Sequence[str], min_share: float = 0.2, moved: Sequence[str] = ()
) -> BreakingLine | None:
    """The most common line label at which prompts diverge, among lines that are not already the
    prompt's last (a field at the end breaks nothing, nor one followed only by lines already `moved`
    there); None when no label covers `min_share` of the prompts."""
    found: Counter[str] = Counter()
    values: dict[str, list[str]] = {}
    where: dict[str, list[str]] = {}
    for text, point in zip(texts, shared_prefix_lengths(texts)):
        start, end = _line_at(text, point)
        if point >= len(text) or all(
            line.startswith(tuple(moved)) for line in text[end + 1 :].split("\n") if line
        ):
            continue
        label = line_label(text[start:point])
        found[label] += 1
        values.setdefault(label, []).append(text[start + len(label) : end].strip())
        where.setdefault(label, []).append(text[:point])
    if not found:
        return None
    label, count = found.most_common(1)[0]
    if count < min_share * len(texts):
        return None
    kind = Counter(map(value_kind, values[label])).most_common(1)[0][0]
    return BreakingLine(label, kind, list(dict.fromkeys(values[label]))[:3], where[label])


@dataclass
class Divergence:
    """Where prompts stop sharing with their closest neighbour."""

    median_shared_fraction: float  # of a prompt's characters, before that point
    labels: list[tuple[str, int]]  # the most common line labels there, with their number of prompts


def where_prompts_diverge(texts: Sequence[str], top: int = 3) -> Divergence:
    """Where prompts stop sharing with the prompt most like them: the median share of a prompt's
    characters that come before that point, and the most common line labels there (with the number
    of prompts)."""
    points = shared_prefix_lengths(texts)
    labels = Counter(
        line_label(t[_line_at(t, p)[0] : p]) for t, p in zip(texts, points) if p < len(t)
    )
    return Divergence(
        float(np.median([p / len(t) for t, p in zip(texts, points)])), labels.most_common(top)
    )


def breaking_fields(
    texts: Sequence[str],
    encoder: TokenEncoder,
    block_size: int,
    kv_tokens: int,
    max_fields: int = 3,
    min_gain: float = 0.01,
) -> list[Field]:
    """Find the line where prompts first diverge, move it to the end of every prompt, replay, and
    repeat up to `max_fields` times (a second field right behind the first hides the first one's
    gain until both have moved). Each field comes with the hit rate before and after its move; moves
    after the last one that raised the hit rate by `min_gain` are dropped."""
    fields: list[Field] = []
    current = list(texts)
    before = replay_hit_rate(encode(encoder, current), block_size, kv_tokens)
    for _ in range(max_fields):
        found = find_breaking_field(current, moved=[f.label for f in fields])
        if found is None:
            break
        current = [move_line_to_end(t, found.label) for t in current]
        after = replay_hit_rate(encode(encoder, current), block_size, kv_tokens)
        position = int(
            np.median([len(ids) for ids in encoder.tokenizer(found.heads[:50])["input_ids"]])
        )
        fields.append(
            Field(
                found.label, found.kind, found.examples, len(found.heads), position, before, after
            )
        )
        before = after
    while (
        fields
        and fields[-1].hit_rate_after
        < max([fields[0].hit_rate_before] + [f.hit_rate_after for f in fields[:-1]]) + min_gain
    ):
        fields.pop()
    return fields


@dataclass
class Sharing:
    """Where the first `field_sample` prompts diverge, and the fields that break their sharing."""

    texts: list[str]
    divergence: Divergence
    fields: list[Field]


def what_breaks_sharing(
    trace: Trace, settings: AuditSettings, encoder: TokenEncoder, block_size: int
) -> Sharing:
    """Where the first `settings.field_sample` prompts diverge and which of their fields break the
    sharing. Token ids given have no text of their own to move lines in: only the divergence then."""
    texts = trace.sample.texts[: settings.field_sample]
    divergence = where_prompts_diverge(texts)
    if any(trace.sample.ids_given[: settings.field_sample]):
        return Sharing([], divergence, [])
    return Sharing(
        texts, divergence, breaking_fields(texts, encoder, block_size, settings.kv_tokens)
    )
