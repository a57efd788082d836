"""Prefix-breakers: the ways real applications stop their prompts from sharing a prefix, each found
in the log and its fix measured by replaying the rewritten log through the same chat template and
the same block pool.

    found = breakers_in(prompts, tokenizer, FixReplay(block_size=32, kv_tokens=100_000))  # prompts: lab.audit.prompts.Prompts
    for r in found.recommendations:                                              # ranked by measured gain
        print(r.advice, r.hit_rate_before, "->", r.hit_rate_after)

requests (a request as sent, rendered again after a fix), passages, tools, text (a leading field,
whitespace), history (rewritten, cut, or re-rendered turns), catalogue (every breaker: detector,
fix, what the model sees), example (two prompts where they diverge, before and after), measure (the
fixes replayed and ranked).
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.audit.breakers.catalogue import CATALOGUE, Breaker
from lab.audit.breakers.example import Example
from lab.audit.breakers.measure import Breakers, FixReplay, NotWorth, Recommendation, find_breakers
from lab.audit.breakers.requests import Renderer, Request, requests_of
from lab.audit.piece_tokens import TokenEncoder
from lab.audit.prompts import Prompts
from lab.audit.replay import HitRates
from lab.audit.settings import AuditSettings
from lab.audit.trace import Trace
from lab.experiments.cost_model import CostModel


def breakers_in(
    sample: Prompts,
    tokenizer,
    judged: FixReplay,
    *,
    count: int | None = None,
    encoder: TokenEncoder | None = None,
    cached: Sequence[int] | None = None,
) -> Breakers:
    """The breakers found in the first `count` requests of `sample` (default: all), their fixes
    replayed and ranked as `judged` says (lab.audit.breakers.measure.find_breakers), rendered
    through `tokenizer`'s chat template."""
    renderer = Renderer(tokenizer, encoder or TokenEncoder(tokenizer))
    return find_breakers(sample, renderer, judged, count=count, cached=cached)


def breakers_for(
    trace: Trace,
    settings: AuditSettings,
    tokenizer,
    encoder: TokenEncoder,
    rates: HitRates,
    cost_model: CostModel | None,
) -> Breakers | None:
    """The audit's breakers stage: those found in the first `settings.field_sample` requests, each
    fix replayed at the best block size and capacity through the same template, ranked by measured
    gain (as sent: the hit rates' own replay of those requests). None for a log of token ids: each
    fix edits text and encodes it again."""
    if any(trace.sample.ids_given[: settings.field_sample]):
        return None
    return breakers_in(
        trace.sample,
        tokenizer,
        FixReplay.of(settings, rates.best_size, cost_model),
        count=settings.field_sample,
        encoder=encoder,
        cached=rates.cached,
    )


__all__ = [
    "CATALOGUE",
    "Breaker",
    "Breakers",
    "Example",
    "FixReplay",
    "NotWorth",
    "Recommendation",
    "Renderer",
    "Request",
    "breakers_for",
    "breakers_in",
    "find_breakers",
    "requests_of",
]
