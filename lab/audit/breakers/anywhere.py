"""What reusing a passage wherever it sits would reach on a log, beside what the prefix cache
reaches: the number that tells a fix by reordering (exact) from one that only blending can make
(approximate: lesson 22).

Each request's text is cut into chunks: each retrieved passage (`lab.audit.breakers.passages` finds
them) and the text before, between and after them. Position-independent reuse counts a chunk that
any earlier request held, wherever; prefix reuse, in the same units, counts the leading chunks that
an earlier request began with. Tokens are counted per chunk as the tokenizer encodes it alone, with
no eviction and no block rounding: both are upper estimates, and their difference is what only reuse
beyond prefixes can add.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab.audit.breakers import passages
from lab.audit.breakers.requests import Request

MARGIN_POINTS = (
    2.0  # reordering "captures" position-independent reuse when it comes within this many points
)


@dataclass(frozen=True)
class Anywhere:
    """Chunk by chunk, after the ranked fixes: the share of prompt tokens in chunks an earlier
    request held anywhere (what a passage cache could reuse), and in the leading chunks an earlier
    request began with (what a prefix cache with room for everything reuses), in the same units; and
    the replayed prefix hit rate, for reference."""

    hit_rate: float
    prefix_hit_rate: float
    replayed_prefix_hit_rate: float
    requests: int

    @property
    def gap_points(self) -> float:
        return 100 * (self.hit_rate - self.prefix_hit_rate)

    @property
    def reordering_captures_it(self) -> bool:
        return self.gap_points < MARGIN_POINTS

    def sentence(self) -> str:
        head = (
            f"reusing a passage wherever it sits (a passage cache, lesson 22) would reuse {self.hit_rate:.1%} of "
            f"the prompt tokens, where a prefix cache with room for everything reuses {self.prefix_hit_rate:.1%} "
            f"after the fixes above (both counted chunk by chunk, with no eviction and no block rounding; "
            f"the replay above: {self.replayed_prefix_hit_rate:.1%})"
        )
        if self.reordering_captures_it:
            return (
                head
                + ": reordering, whose reuse is a prefix cache's and so exact, already captures it"
            )
        return (
            head
            + f": only blending reaches the other {self.gap_points:.1f} points, and it is approximate "
            f"({blending_cost()})"
        )


def blending_cost() -> str:
    """What blending cost in answers in the lab's canonical benchmark (`bench blend`), or where to
    measure it."""
    from lab.experiments.results import CANONICAL_DIR, load_latest

    try:
        table, meta = load_latest("bench_blend_quality", CANONICAL_DIR)
    except FileNotFoundError:
        return "lesson 22 measures what it costs against a full prefill"
    right = table.groupby("method", sort=False).exact_match.mean()
    blend = next(m for m in right.index if m.startswith("cacheblend"))
    return (
        f"in the lab's benchmark `{meta['run_id']}` on {meta['environment']['preset']}, {blend} answered "
        f"{right[blend]:.0%} of its questions right where the full prefill answered {right['full']:.0%}; lesson 22 "
        "shows the trade"
    )


def chunks(text: str) -> list[tuple[bool, str]]:
    """The text cut into chunks, in order, each (is a passage, its text): each retrieved passage
    (its text without its marker), and the text before, between and after them."""
    out, pending = [], []
    for kind, _, lines in passages.split_pieces(text):
        if kind == "passage":
            if pending:
                out.append((False, "\n".join(pending)))
                pending = []
            out.append((True, passages.passage_body(lines)))
        else:
            pending += lines
    return out + [(False, "\n".join(pending))] if pending or not out else out


def reuse_by_chunk(requests: Sequence[Request], count_tokens) -> tuple[float, float, bool]:
    """The share of tokens in chunks seen before anywhere, and in leading chunks seen before as a
    lead; and whether any request held a passage. `count_tokens(text)` is a chunk's length in
    tokens."""
    seen, leads = set(), set()
    anywhere = prefix = total = 0
    any_passage = False
    for request in requests:
        cut = [c for content in request.contents() for c in chunks(content)]
        any_passage |= any(is_passage for is_passage, _ in cut)
        pieces = [text for _, text in cut]
        lengths = [count_tokens(c) if c else 0 for c in pieces]
        lead, led = (), True
        for piece, tokens in zip(pieces, lengths):
            lead = (*lead, piece)
            led = led and lead in leads
            prefix += tokens if led else 0
            anywhere += tokens if piece in seen else 0
            leads.add(lead)
            seen.add(piece)
        total += sum(lengths)
    return anywhere / max(total, 1), prefix / max(total, 1), any_passage


def estimate(
    requests: Sequence[Request], tokenizer, replayed_prefix_hit_rate: float
) -> Anywhere | None:
    """The estimate for requests whose text holds retrieved passages; None where none does (nothing
    to move)."""
    anywhere, prefix, any_passage = reuse_by_chunk(
        requests, lambda t: len(tokenizer.encode(t, add_special_tokens=False))
    )
    return (
        Anywhere(anywhere, prefix, replayed_prefix_hit_rate, len(requests)) if any_passage else None
    )
