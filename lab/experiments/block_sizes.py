"""Which block size to use, from a sweep of the real engine at the sizes the back-end accepts.

The sweep is a row per workload, block size and repeat (`mean_ttft_ms`: that repeat's mean TTFT). A
sentence that compares sizes is printed from its repeats' spread (lab.experiments.verdict), never
typed ahead of the run:

    verdicts = ttft_verdicts(engine_sweep)   # per workload: the ranking, the hit-rate order, the size to use
    block_size_findings(engine_sweep)        # one size per workload: the fastest, a TTFT tie settled by hit rate
    ttft_outliers(engine_sweep)              # the runs more than twice, or under half, their workload's median
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import pandas as pd

from lab.experiments.findings import CANNOT_TELL, HOLDS, Finding
from lab.experiments.verdict import Spread, outliers, rank, spreads


def ttft_spreads(engine_sweep: pd.DataFrame, workload: str) -> list[Spread]:
    """One Spread of mean TTFT (ms) per block size of `workload`, over its repeats, named by the
    size."""
    rows = engine_sweep[engine_sweep.workload == workload].sort_values("block_size")
    return spreads(rows.assign(size=rows.block_size.astype(str)), "size", "mean_ttft_ms")


def sizes_left(ttft: Sequence[Spread]) -> list[Spread]:
    """The sizes this run does not show slower: no other size's TTFT range lies wholly below theirs."""
    return [s for s in ttft if not any(other.high < s.low for other in ttft)]


def recommend_from_spread(ttft: Sequence[Spread]) -> tuple[str | None, str]:
    """The block size to use as far as this run can tell, and why. A size is out when another size's
    TTFT range lies wholly below its own (the run shows it slower). One size left: that size ("64").
    Several: all of them, as the run cannot tell them apart ("32 or 64"). None with one run of any
    size: no spread, no verdict."""
    if min(len(s.values) for s in ttft) < 2:
        return (
            None,
            "one run of some sizes, so no spread: this run cannot tell which size is fastest",
        )
    fastest = min(ttft, key=lambda s: s.median)
    left = sizes_left(ttft)
    slower = "; ".join(
        f"{s.name} shown slower than {', '.join(o.name for o in ttft if o.high < s.low)}"
        for s in ttft
        if s not in left
    )
    if left == [fastest]:
        edge = (
            " (the smallest size swept: a smaller one was not tried)"
            if fastest is min(ttft, key=lambda s: int(s.name))
            else ""
        )
        return fastest.name, f"{fastest.name}{edge}: its TTFT range lies below every other size's"
    tied = " or ".join(sorted((s.name for s in left), key=int))
    return tied, (
        f"this run cannot tell {tied} apart by TTFT (lowest median: {fastest.name})"
        + (f"; {slower}" if slower else "")
    )


def follows_hit_rate(ttft: Sequence[Spread], hit_rate: Mapping[int, float]) -> str:
    """Whether the TTFT order follows the hit-rate order: over each pair of sizes this run tells
    apart (two or more repeats each, ranges apart), does the faster size have more hits?"""
    pairs = list(combinations(ttft, 2))
    told = [
        sorted(pair, key=lambda s: s.median)
        for pair in pairs
        if min(len(s.values) for s in pair) >= 2 and not pair[0].overlaps(pair[1])
    ]
    if not told:
        return "this run tells no two sizes apart by TTFT, so it cannot tell whether TTFT follows the hit rate"
    rate = {s.name: hit_rate[int(s.name)] for s in ttft}
    against = [
        f"{fast.name} is faster than {slow.name} at hit rate {rate[fast.name]:.3f} against {rate[slow.name]:.3f}"
        for fast, slow in told
        if rate[fast.name] <= rate[slow.name]
    ]
    counted = f"{len(told)} pairs of sizes this run tells apart (of {len(pairs)})"
    if not against:
        return (
            f"in each of the {counted}, the faster size is also the one with the higher hit rate (the hit rate "
            "falls as blocks grow, so this does not tell the hit rate from anything else that changes with the size)"
        )
    return (
        f"TTFT does not follow the hit rate alone: of the {counted}, in {len(against)} the faster size has no "
        "more hits: " + "; ".join(against)
    )


def ttft_verdicts(engine_sweep: pd.DataFrame) -> pd.DataFrame:
    """Per workload, what this run's repeats support: the block sizes ranked by mean TTFT, whether
    that order follows vLLM's hit rate (`vllm_hit_rate`, the same in every repeat), and the size to
    use ("64", "32 or 64" where the run cannot tell them apart, None where it has no spread)."""
    rows = []
    for workload in engine_sweep.workload.unique():
        ttft = ttft_spreads(engine_sweep, workload)
        rate = vllm_hit_rates(engine_sweep, workload)
        size, why = recommend_from_spread(ttft)
        rows.append(
            {
                "workload": workload,
                "ranking": str(
                    rank(ttft, quantity=f"{workload}, mean TTFT by block size", unit="ms", digits=2)
                ),
                "hit_rate_order": follows_hit_rate(ttft, rate),
                "recommended": size,
                "why": why,
            }
        )
    return pd.DataFrame(rows).set_index("workload")


def recommend_block_size(engine_sweep: pd.DataFrame) -> pd.Series:
    """Per workload, the block size to use as far as the sweep's repeats tell
    (`recommend_from_spread`: "64", or "32 or 64" where they cannot tell, None without a spread):
    lesson 04's answer, saved as its findings."""
    return ttft_verdicts(engine_sweep).recommended.rename("block size to use")


def vllm_hit_rates(engine_sweep: pd.DataFrame, workload: str) -> dict[int, float]:
    """vLLM's token hit rate of `workload` at each block size (the same in every repeat: exact)."""
    rows = engine_sweep[engine_sweep.workload == workload]
    return rows.groupby("block_size").vllm_hit_rate.first().to_dict()


def settle_tie(tied: str, hit_rate: Mapping[int, float]) -> int:
    """Among the block sizes TTFT cannot tell apart ("32 or 64"), the one that caches the most, the
    smallest at equal hit rates: the finest sharing, at no cost this run can show."""
    return max((int(size) for size in tied.split(" or ")), key=lambda size: (hit_rate[size], -size))


BLOCK_SIZE_QUESTION = (
    "Which block size should {workload} use on this back-end: the fastest by TTFT, or, among sizes "
    "this run cannot tell apart by TTFT, the one with the highest hit rate?"
)


def block_size_findings(engine_sweep: pd.DataFrame) -> list[Finding]:
    """Per workload, the block size to use as a finding (id `block_size.<workload>`, value the
    size). The fastest where one size's TTFT range lies below every other's; where the repeats leave
    sizes they cannot tell apart ("32 or 64"), the one of those with the highest hit rate, which is
    exact (`settle_tie`). With one run of some size there is no spread: it cannot tell."""
    found = []
    for workload, verdict in ttft_verdicts(engine_sweep).iterrows():
        question = BLOCK_SIZE_QUESTION.format(workload=workload)
        evidence = f"{verdict.ranking}; hit rate: {verdict.hit_rate_order}"
        if pd.isna(verdict.recommended):
            answer = f"{workload}: {verdict.why}"
            found.append(Finding(f"block_size.{workload}", question, CANNOT_TELL, answer, evidence))
            continue
        rates = vllm_hit_rates(engine_sweep, workload)
        size = settle_tie(str(verdict.recommended), rates)
        tied = str(verdict.recommended).split(" or ")
        settled = (
            ""
            if len(tied) == 1
            else f" TTFT cannot tell {verdict.recommended} apart; of those, {size} caches the most "
            f"(hit rate {', '.join(f'{s}: {rates[int(s)]:.3f}' for s in tied)})."
        )
        answer = f"{workload}: block size {size}.{settled} Why: {verdict.why}"
        found.append(
            Finding(f"block_size.{workload}", question, HOLDS, answer, evidence, str(size))
        )
    return found


def ttft_outliers(engine_sweep: pd.DataFrame, factor: float = 2.0) -> pd.DataFrame:
    """The runs whose mean TTFT is more than `factor` times their workload's median over every size
    and repeat, or under that median over `factor` (lab.experiments.verdict.outliers), with that
    median beside them."""
    flagged = []
    for workload, rows in engine_sweep.groupby("workload", sort=False):
        found = outliers(Spread(str(workload), tuple(rows.mean_ttft_ms)), factor)
        if found:
            flagged.append(
                rows[rows.mean_ttft_ms.isin(found)].assign(
                    workload_median_ms=rows.mean_ttft_ms.median()
                )
            )
    empty = engine_sweep.iloc[:0].assign(workload_median_ms=pd.Series(dtype=float))
    return pd.concat(flagged, ignore_index=True) if flagged else empty
