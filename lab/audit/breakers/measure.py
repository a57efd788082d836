"""Each prefix-breaker found in a log, its fix applied, and the rewritten log replayed through the
same template and the same pool (lab.core.prefix_cache at the audit's block size and KV capacity,
the requests' own salts): the fixes that gain a point or more, ranked by measured gain, each on top
of the ones above it (a field in front hides what reordering the passages behind it would gain until
it has moved)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab.audit.breakers.anywhere import Anywhere, estimate
from lab.audit.breakers.catalogue import CATALOGUE, Breaker
from lab.audit.breakers.example import Example, example
from lab.audit.breakers.requests import Detection, Renderer, Request, changed, requests_of
from lab.audit.projection import Projection, project
from lab.audit.prompts import Prompts
from lab.audit.settings import AuditSettings
from lab.core.block_hash import REPLAY_HASH, kv_blocks, token_hit_rate
from lab.core.prefix_cache import PrefixCache


@dataclass
class Recommendation:
    """A fix worth making: what was found, the requests it rewrites (of `prompts` replayed), the hit
    rate before and after by replay (before: with the fixes ranked above it), the cost model's
    projection for both (None without a cost model), one pair of prompts where they diverge before
    and after, and what the model sees."""

    rank: int
    breaker: str
    advice: str
    found: str
    requests: int
    prompts: int
    hit_rate_before: float
    hit_rate_after: float
    gain_points: float
    projected_before: Projection | None
    projected_after: Projection | None
    example: Example | None
    changes_what_the_model_sees: bool
    caveat: str


@dataclass
class NotWorth:
    """A breaker found whose fix, replayed, gains less than the threshold (or could not be applied),
    and why."""

    breaker: str
    found: str
    requests: int
    gain_points: float
    reason: str


@dataclass
class Breakers:
    """The prefix-breakers section: the fixes ranked by measured gain, the ones found but not worth
    making, every breaker checked, and what was replayed (the first `prompts` requests, at
    `block_size`, `kv_tokens`)."""

    recommendations: list[Recommendation]
    not_worth: list[NotWorth]
    checked: list[str]
    prompts: int
    block_size: int
    kv_tokens: int
    hit_rate: float  # the replayed requests' hit rate as the log sent them
    min_gain_points: float = 1.0
    anywhere: Anywhere | None = (
        None  # position-independent reuse beside the fixes' (None: the log has no passages)
    )


@dataclass(frozen=True)
class FixReplay:
    """How each fix is replayed and judged: the pool (`block_size`, `kv_tokens` of KV capacity), the
    cost model that projects both sides (None: hit rates only), the answer length it assumes, and
    the least gain worth advising (a share of the prompt tokens: 0.01 is one point of hit rate)."""

    block_size: int
    kv_tokens: int
    cost_model: object | None = None
    output_tokens: int = 8
    min_gain: float = 0.01

    @classmethod
    def of(cls, settings: AuditSettings, block_size: int, cost_model=None) -> FixReplay:
        """The audit's own: its capacity and answer length, at the block size its hit rates chose."""
        return cls(block_size, settings.kv_tokens, cost_model, settings.output_tokens)


@dataclass
class _State:
    requests: list[Request]
    ids: list[list[int]]
    cached: list[int]

    @property
    def hit_rate(self) -> float:
        return token_hit_rate(self.cached, [len(ids) for ids in self.ids]) if self.ids else 0.0


class _Replay:
    """Rewrites and replays, with the audit's block size, capacity, salts, template and cost model."""

    def __init__(self, renderer: Renderer, judged: FixReplay, salts):
        self.renderer, self.block_size, self.kv_tokens = (
            renderer,
            judged.block_size,
            judged.kv_tokens,
        )
        self.salts = salts if salts and any(s is not None for s in salts) else None
        self.cost_model, self.output_tokens = judged.cost_model, judged.output_tokens
        self.context = getattr(renderer.tokenizer, "model_max_length", None) or 10**9

    def cached(self, ids: Sequence[Sequence[int]]) -> list[int]:
        pool = PrefixCache(
            num_blocks=kv_blocks(self.kv_tokens, self.block_size),
            block_size=self.block_size,
            hash_algo=REPLAY_HASH,
        )
        return pool.replay(ids, self.salts)

    def apply(
        self, state: _State, breaker: Breaker, detection: Detection
    ) -> tuple[_State, int] | str:
        """The state with the fix applied and replayed, and the requests whose tokens it changed; or
        why not."""
        fixed = breaker.fix(state.requests, detection)
        touched = changed(state.requests, fixed)
        if not touched:
            return "the fix changes no request"
        fixed = self.renderer.rendered(fixed)
        ids = list(state.ids)
        for i, new in zip(touched, self.renderer.ids([fixed[i] for i in touched])):
            ids[i] = new
        moved = sum(1 for i in touched if ids[i] != state.ids[i])
        if not moved:
            return "the chat template renders none of the change"
        longest = max(len(ids[i]) for i in touched)
        if longest > self.context or longest + self.block_size > self.kv_tokens:
            return (
                f"rewritten prompts grow to {longest:,} tokens, past the model's context ({self.context:,}) or "
                f"the KV capacity ({self.kv_tokens:,})"
            )
        return _State(fixed, ids, self.cached(ids)), moved

    def projection(self, state: _State) -> Projection | None:
        if self.cost_model is None:
            return None
        return project(self.cost_model, list(map(len, state.ids)), state.cached, self.output_tokens)


def _trials(
    replay: _Replay, state: _State, breakers: dict[str, Breaker], first: dict[str, Detection] | None
):
    """Each breaker still found in `state`, its fix applied and replayed (or why it could not be)."""
    out = {}
    for name, breaker in breakers.items():
        detection = first[name] if first else breaker.detect(state.requests, replay.renderer)
        if detection is not None:
            out[name] = (detection, replay.apply(state, breaker, detection))
    return out


def _recommendation(
    rank: int,
    breaker: Breaker,
    detection: Detection,
    before: _State,
    after: _State,
    moved: int,
    replay: _Replay,
    lines: Sequence[int],
) -> Recommendation:
    return Recommendation(
        rank,
        breaker.name,
        breaker.advice.format(what=detection.what),
        detection.found,
        moved,
        len(before.ids),
        before.hit_rate,
        after.hit_rate,
        100 * (after.hit_rate - before.hit_rate),
        replay.projection(before),
        replay.projection(after),
        example(
            before.ids,
            after.ids,
            [i for i, (a, b) in enumerate(zip(before.ids, after.ids)) if a != b],
            replay.renderer.tokenizer.decode,
            lines,
        ),
        breaker.changes_what_the_model_sees,
        breaker.caveat,
    )


def find_breakers(
    sample: Prompts,
    renderer: Renderer,
    judged: FixReplay,
    *,
    count: int | None = None,
    catalogue: Sequence[Breaker] = CATALOGUE,
    cached: Sequence[int] | None = None,
) -> Breakers:
    """Every breaker of `catalogue` looked for in the first `count` requests of `sample` (default:
    all; their token ids as the audit read them); each one found fixed and replayed as `judged`
    says; the best fix kept if it gains `judged.min_gain` or more, the rest tried again on top of
    it, until none gains enough. A fix that gains less is never recommended. `cached`: the requests'
    cached tokens as sent, where already replayed (the first requests' are the same however many
    follow them)."""
    count = len(sample.texts) if count is None else min(count, len(sample.texts))
    min_gain, lines = judged.min_gain, sample.lines[:count]
    replay = _Replay(renderer, judged, sample.salts[:count])
    ids = [list(i) for i in sample.token_ids[:count]]
    cached = [int(c) for c in cached[:count]] if cached is not None else replay.cached(ids)
    state = _State(requests_of(sample, count), ids, cached)
    start = state.hit_rate
    remaining = {b.name: b for b in catalogue}
    first = {name: b.detect(state.requests, renderer) for name, b in remaining.items()}
    remaining = {name: b for name, b in remaining.items() if first[name] is not None}
    ranked, trials = [], _trials(replay, state, remaining, first)
    while trials:
        worked = {n: t for n, t in trials.items() if not isinstance(t[1], str)}
        best = max(worked, key=lambda n: worked[n][1][0].hit_rate, default=None)
        if best is None or worked[best][1][0].hit_rate - state.hit_rate < min_gain:
            break
        detection, (after, moved) = worked[best]
        ranked.append(
            _recommendation(
                len(ranked) + 1, remaining.pop(best), detection, state, after, moved, replay, lines
            )
        )
        state = after
        trials = _trials(replay, state, remaining, None)
    not_worth = [
        _not_worth(name, detection, result, state, min_gain, bool(ranked))
        for name, (detection, result) in trials.items()
    ]
    return Breakers(
        ranked,
        not_worth,
        [b.name for b in catalogue],
        len(ids),
        judged.block_size,
        judged.kv_tokens,
        start,
        100 * min_gain,
        estimate(state.requests, renderer.tokenizer, state.hit_rate),
    )


def _not_worth(
    name: str, detection: Detection, result, state: _State, min_gain: float, on_top: bool
) -> NotWorth:
    if isinstance(result, str):
        return NotWorth(name, detection.found, 0, 0.0, result)
    after, moved = result
    gain = 100 * (after.hit_rate - state.hit_rate)
    return NotWorth(
        name,
        detection.found,
        moved,
        gain,
        f"replayed, it gains {gain:+.1f} points (under "
        f"{100 * min_gain:.0f})" + (" on top of the fixes above" if on_top else ""),
    )
