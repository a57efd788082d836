"""One example of what a fix does: two prompts that it brings closer, and where they first differ,
in context, before the fix and after it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

SEARCHED = 500  # rewritten prompts searched for the example
WIDTH = 8  # tokens shown either side of the point


@dataclass
class Example:
    """Two prompts (by their lines in the file) and the token where they first differ, with the text
    around it (the point marked ⟦), as the log sent them and as the fix rewrote them."""

    lines: tuple[int, int]
    before_token: int
    before: tuple[str, str]
    after_token: int
    after: tuple[str, str]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def around(
    ids: Sequence[int], at: int, decode: Callable[[list[int]], str], width: int = WIDTH
) -> str:
    """The text of `width` tokens either side of token `at`, on one line, the point marked ⟦."""
    head, tail = decode(list(ids[max(0, at - width) : at])), decode(list(ids[at : at + width]))
    text = ("…" if at > width else "") + head + "⟦" + tail + ("…" if at + width < len(ids) else "")
    return text.replace("\n", "⏎")


def _closest_pair(
    before: Sequence[Sequence[int]], after: Sequence[Sequence[int]], touched: Sequence[int]
) -> tuple[int, int] | None:
    """Among the rewritten prompts and their nearest neighbours once rewritten (neighbours in sorted
    order share the longest prefixes), the pair whose shared prefix the fix lengthened most, two
    that still differ before two that became the same prompt."""
    order = sorted(range(len(after)), key=after.__getitem__)
    place = {i: k for k, i in enumerate(order)}
    best, pair = (False, 0), None
    for i in touched[:SEARCHED]:
        k = place[i]
        for j in order[max(0, k - 1) : k] + order[k + 1 : k + 2]:
            score = (
                after[i] != after[j],
                common_prefix(after[i], after[j]) - common_prefix(before[i], before[j]),
            )
            if score[1] > 0 and score > best:
                best, pair = score, (min(i, j), max(i, j))
    return pair


def example(
    before: Sequence[Sequence[int]],
    after: Sequence[Sequence[int]],
    touched: Sequence[int],
    decode: Callable[[list[int]], str],
    lines: Sequence[int] = (),
) -> Example | None:
    """The example for a fix that rewrote the prompts at `touched` (None when it lengthened no
    shared prefix)."""
    pair = _closest_pair(before, after, touched)
    if pair is None:
        return None
    i, j = pair
    was, now = common_prefix(before[i], before[j]), common_prefix(after[i], after[j])
    return Example(
        (lines[i], lines[j]) if len(lines) else (i + 1, j + 1),
        was,
        (around(before[i], was, decode), around(before[j], was, decode)),
        now,
        (around(after[i], now, decode), around(after[j], now, decode)),
    )
