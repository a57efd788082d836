"""What each cause of misses costs: the trace replayed again with that cause taken away, and where
prompts stopped sharing, shown as a short excerpt with its position.

    table = what_ifs(token_ids, misses, salts=tenants, block_sizes=(32, 64, 128))
    points = divergence_points(token_ids, misses, tokenizer.decode)
    why = why_it_missed(trace, settings, tokenizer, block_size)   # the audit's stage: all three
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
from tqdm.auto import tqdm

from lab.audit.fields import line_label as label
from lab.audit.misses import Misses, Routes, attribute
from lab.audit.settings import AuditSettings
from lab.audit.trace import Trace
from lab.core.block_hash import REPLAY_HASH


def _hit_rate(token_ids, misses: Misses, **changes) -> float:
    settings = (
        dict(
            block_size=misses.block_size,
            kv_tokens=misses.kv_tokens,
            salts=None,
            routes=None,
            hash_algo=REPLAY_HASH,
        )
        | changes
    )
    return attribute(token_ids, **settings).hit_rate


def working_set_tokens(misses: Misses) -> int:
    """A KV capacity per replica that never evicts on this trace: every block the replay stored, on
    the replica that stored most."""
    return int(misses.requests.groupby("replica").blocks_stored.sum().max() + 1) * misses.block_size


def what_ifs(
    token_ids: Sequence[Sequence[int]],
    misses: Misses,
    *,
    salts: Sequence[str | None] | None = None,
    routes: Routes | None = None,
    block_sizes: Sequence[int] = (),
) -> pd.DataFrame:
    """One row per change that removes a cause present in `misses`: the change, the cause, the hit
    rate after it (replayed, not estimated) and the gain in points. `block_sizes`: the sizes the
    back-end accepts (the smallest is tried against partial blocks). Other prefixes get the bound a
    position-independent cache would reach (every such token a hit), labelled as a bound."""
    totals, base = misses.totals, misses.hit_rate
    same = dict(salts=salts, routes=routes)
    rows = []
    if totals.evicted:
        capacity = working_set_tokens(misses)
        rows.append(
            (
                "evicted",
                f"a KV cache of {capacity:,} tokens per replica (nothing evicted)",
                _hit_rate(token_ids, misses, kv_tokens=capacity, **same),
            )
        )
    if totals.other_replica:
        rows.append(
            (
                "other_replica",
                "requests that share a prefix routed to the same replica (one cache of "
                f"{misses.kv_tokens * misses.replicas:,} tokens: the best any routing does)",
                _hit_rate(
                    token_ids, misses, kv_tokens=misses.kv_tokens * misses.replicas, salts=salts
                ),
            )
        )
    if totals.salt:
        rows.append(
            (
                "salt",
                "no cache_salt (tenants share; the timing side channel opens, notebook 10)",
                _hit_rate(token_ids, misses, routes=routes),
            )
        )
    smaller = min((s for s in block_sizes if s < misses.block_size), default=None)
    if totals.partial_block and smaller:
        rows.append(
            (
                "partial_block",
                f"block size {smaller}",
                _hit_rate(token_ids, misses, block_size=smaller, **same),
            )
        )
    if totals.other_prefix:
        total = misses.requests.prompt_tokens.sum()
        rows.append(
            (
                "other_prefix",
                "a position-independent cache reusing all of it (a bound: vLLM has none)",
                base + totals.other_prefix / total,
            )
        )
    table = pd.DataFrame(rows, columns=["cause", "change", "hit_rate"])
    return table.assign(gain_points=100 * (table.hit_rate - base)).sort_values(
        "gain_points", ascending=False, kind="stable", ignore_index=True
    )


def excerpt(text: str, position: int, width: int = 40) -> str:
    """`width` characters either side of `position`, on one line, the point marked with `⟦`."""
    before, after = text[max(0, position - width) : position], text[position : position + width]
    flat = (before + "⟦" + after).replace("\n", "⏎")
    return ("…" if position > width else "") + flat + ("…" if position + width < len(text) else "")


def divergence_points(
    token_ids: Sequence[Sequence[int]],
    misses: Misses,
    decode: Callable[[list[int]], str],
    top: int = 3,
    sample: int = 2000,
) -> pd.DataFrame:
    """Where prompts whose text came back behind another prefix stopped sharing, grouped by the
    label of the line they stopped in (lab.audit.fields), the most costly first: the requests, the
    tokens lost to `other_prefix`, the median position (in tokens) and an excerpt around the point
    of the first such request. Read from the first `sample` such requests."""
    rows = misses.requests[misses.requests.other_prefix > 0].head(sample)
    if rows.empty:
        return pd.DataFrame(columns=["requests", "other_prefix_tokens", "position", "excerpt"])
    heads = [decode(list(token_ids[r][:p])) for r, p in zip(rows.request, rows.shared_prefix)]
    labels = [label(head[head.rfind("\n") + 1 :]) for head in heads]
    groups = (
        rows.assign(label=labels, head=heads)
        .groupby("label", sort=False)
        .agg(
            requests=("request", "size"),
            other_prefix_tokens=("other_prefix", "sum"),
            position=("shared_prefix", "median"),
            first=("request", "first"),
            point=("shared_prefix", "first"),
            head=("head", "first"),
        )
    )
    groups = groups.sort_values("other_prefix_tokens", ascending=False).head(top)
    after = [decode(list(token_ids[r][p : p + 40])) for r, p in zip(groups["first"], groups.point)]
    return pd.DataFrame(
        {
            "requests": groups.requests,
            "other_prefix_tokens": groups.other_prefix_tokens,
            "position": groups.position.astype(int),
            "excerpt": [excerpt(h + a, len(h)) for h, a in zip(groups["head"], after)],
        }
    ).reset_index(drop=True)


@dataclass
class WhyItMissed:
    """The explained requests' uncached tokens, one cause each; each cause taken away and replayed;
    where prompts stopped sharing text seen again later."""

    misses: Misses
    what_ifs: pd.DataFrame
    divergence_points: pd.DataFrame


def why_it_missed(trace: Trace, settings: AuditSettings, tokenizer, block_size: int) -> WhyItMissed:
    """The first `settings.explained` requests' misses, each with its cause, at `block_size`."""
    explained = trace.sample.head(settings.explained)
    salts = explained.salts if any(explained.salts) else None
    ids = tqdm(
        explained.token_ids, desc="attributing misses", disable=not settings.progress, leave=False
    )
    misses = attribute(
        ids, block_size=block_size, kv_tokens=settings.kv_tokens, salts=salts, hash_algo=REPLAY_HASH
    )
    changes = what_ifs(explained.token_ids, misses, salts=salts, block_sizes=list(trace.blocks))
    return WhyItMissed(
        misses, changes, divergence_points(explained.token_ids, misses, tokenizer.decode)
    )
