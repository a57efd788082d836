"""Prefix-breakers: the ways real applications stop their prompts from sharing a prefix, each found in the log and
its fix measured by replaying the rewritten log through the same chat template and the same block pool.

    found = breakers_in(prompts, tokenizer, block_size=32, kv_tokens=100_000)   # prompts: lab.audit.prompts.Prompts
    for r in found.recommendations:                                              # ranked by measured gain
        print(r.advice, r.hit_rate_before, "->", r.hit_rate_after)

requests (a request as sent, rendered again after a fix), passages, tools, text (a leading field, whitespace),
history (rewritten, cut, or re-rendered turns), catalogue (every breaker: detector, fix, what the model sees),
example (two prompts where they diverge, before and after), measure (the fixes replayed and ranked).
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.audit.breakers.catalogue import CATALOGUE, Breaker
from lab.audit.breakers.example import Example
from lab.audit.breakers.measure import Breakers, NotWorth, Recommendation, find_breakers
from lab.audit.breakers.requests import Renderer, Request, requests_of
from lab.audit.piece_tokens import TokenEncoder
from lab.audit.prompts import Prompts


def breakers_in(sample: Prompts, tokenizer, *, block_size: int, kv_tokens: int, count: int | None = None,
                encoder: TokenEncoder | None = None, cost_model=None, output_tokens: int = 8,
                min_gain: float = 0.01, cached: Sequence[int] | None = None) -> Breakers:
    """The breakers found in the first `count` requests of `sample` (default: all), their fixes replayed at
    `block_size` with `kv_tokens` of KV capacity and ranked (lab.audit.breakers.measure.find_breakers).
    `cached`: each request's cached tokens as the log was replayed (the first requests' are the same however
    many follow them), to save replaying them again."""
    count = len(sample.texts) if count is None else min(count, len(sample.texts))
    renderer = Renderer(tokenizer, encoder or TokenEncoder(tokenizer))
    return find_breakers(requests_of(sample, count), sample.token_ids[:count], renderer, block_size=block_size,
                         kv_tokens=kv_tokens, salts=sample.salts[:count], lines=sample.lines[:count],
                         cost_model=cost_model, output_tokens=output_tokens, min_gain=min_gain,
                         cached=None if cached is None else list(cached[:count]))


__all__ = ["CATALOGUE", "Breaker", "Breakers", "Example", "NotWorth", "Recommendation", "Renderer", "Request",
           "breakers_in", "find_breakers", "requests_of"]
