"""The catalogue of prefix-breakers: the ways real applications stop their prompts from sharing a
prefix, each with a detector (finds it in the log's requests), a fix (rewrites the requests it
affects) and what the fix changes in what the model sees."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab.audit.breakers import history, passages, text, tools
from lab.audit.breakers.requests import Detection, Request


@dataclass(frozen=True)
class Breaker:
    """One prefix-breaker. `advice` names the fix (`{what}`: the detection's words for the thing to
    change); `changes_what_the_model_sees` is False only where the model reads the same words in the
    same order; `caveat` says what it sees differently."""

    name: str
    advice: str
    changes_what_the_model_sees: bool
    caveat: str
    detect: Callable[[Sequence[Request], object], Detection | None]
    fix: Callable[[Sequence[Request], Detection], list[Request]]


REORDERED = (
    "a model can weigh text by its position, so check the answers on a sample before and after"
)

CATALOGUE: tuple[Breaker, ...] = (
    Breaker(
        "passage_order",
        "put the passages in a stable order (by document id, not by retrieval score)",
        True,
        f"the model reads the same passages in another order; {REORDERED}",
        passages.detect,
        passages.fix,
    ),
    Breaker(
        "tool_order",
        "send the tools sorted by name, each tool written the same way every time",
        True,
        f"the model reads the same tools in another order; {REORDERED}",
        tools.detect,
        tools.fix,
    ),
    Breaker(
        "leading_field",
        "move {what}",
        True,
        f"the model reads the field after the shared text instead of before it; {REORDERED}",
        text.detect_fields,
        text.fix_fields,
    ),
    Breaker(
        "history_rewritten",
        "send earlier turns as the turn before sent them (do not rewrite the history)",
        True,
        "the model reads earlier turns as it read them the turn before (their reasoning, whole replies): longer "
        "prompts",
        history.detect_rewritten,
        history.fix_rewritten,
    ),
    Breaker(
        "history_truncated",
        "keep the whole history (or cut it rarely, many turns at once, not a turn per request)",
        True,
        "the model reads the turns that were cut: longer prompts, within the model's context",
        history.detect_truncated,
        history.fix_truncated,
    ),
    Breaker(
        "template_rewrites_history",
        "strip earlier turns' reasoning before sending, so that the chat template "
        "renders every turn as it did the turn before",
        True,
        "the model no longer reads the reasoning of its latest turn",
        history.detect_template,
        history.fix_template,
    ),
    Breaker(
        "whitespace",
        "write whitespace one way on every code path (\\n line ends, no trailing or repeated "
        "spaces, at most one blank line)",
        False,
        "only whitespace changes: the same words in the same order",
        text.detect_whitespace,
        text.fix_whitespace,
    ),
)
