"""Which block size to use, from a sweep of the real engine at the sizes the back-end accepts.

The sweep is a row per workload, block size and repeat (`mean_ttft_ms`: that repeat's mean TTFT). A sentence that
compares sizes is printed from its repeats' spread (lab.experiments.verdict), never typed ahead of the run:

    verdicts = ttft_verdicts(engine_sweep)   # per workload: the ranking, the hit-rate order, the size to use
    block_size_findings(engine_sweep)        # that size as a finding (holds: fastest alone; cannot tell: a tie-break)
    ttft_outliers(engine_sweep)              # the runs more than twice, or under half, their workload's median
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import pandas as pd

from lab.experiments.findings import CANNOT_TELL, HOLDS, Finding
from lab.experiments.verdict import Spread, outliers, rank, spreads


def ttft_spreads(engine_sweep: pd.DataFrame, workload: str) -> list[Spread]:
    """One Spread of mean TTFT (ms) per block size of `workload`, over its repeats, named by the size."""
    rows = engine_sweep[engine_sweep.workload == workload].sort_values("block_size")
    return spreads(rows.assign(size=rows.block_size.astype(str)), "size", "mean_ttft_ms")


def sizes_left(ttft: Sequence[Spread]) -> list[Spread]:
    """The sizes this run does not show slower: no other size's TTFT range lies wholly below theirs."""
    return [s for s in ttft if not any(other.high < s.low for other in ttft)]


def recommend_from_spread(ttft: Sequence[Spread]) -> tuple[int | None, str]:
    """The block size to use as far as this run can tell, and why. A size is out when another size's TTFT range lies
    wholly below its own (the run shows it slower); of the sizes left, the fastest if it alone is left, else the
    largest (fewer blocks to track at a TTFT this run cannot tell apart: a tie-break, not a measured win). None with
    one run of any size: no spread, no verdict."""
    if min(len(s.values) for s in ttft) < 2:
        return None, "one run of some sizes, so no spread: this run cannot tell which size is fastest"
    fastest = min(ttft, key=lambda s: s.median)
    left = sizes_left(ttft)
    slower = "; ".join(f"{s.name} shown slower than {', '.join(o.name for o in ttft if o.high < s.low)}"
                       for s in ttft if s not in left)
    if left == [fastest]:
        return int(fastest.name), f"{fastest.name}: its TTFT range lies below every other size's"
    chosen = max(left, key=lambda s: int(s.name))
    return int(chosen.name), (f"this run cannot tell {', '.join(s.name for s in left)} apart by TTFT (lowest median: "
                              f"{fastest.name}); of those, {chosen.name}, the largest, tracks the fewest blocks"
                              + (f"; {slower}" if slower else ""))


def follows_hit_rate(ttft: Sequence[Spread], hit_rate: Mapping[int, float]) -> str:
    """Whether the TTFT order follows the hit-rate order: over each pair of sizes this run tells apart (two or more
    repeats each, ranges apart), does the faster size have more hits?"""
    pairs = list(combinations(ttft, 2))
    told = [sorted(pair, key=lambda s: s.median) for pair in pairs
            if min(len(s.values) for s in pair) >= 2 and not pair[0].overlaps(pair[1])]
    if not told:
        return "this run tells no two sizes apart by TTFT, so it cannot tell whether TTFT follows the hit rate"
    rate = {s.name: hit_rate[int(s.name)] for s in ttft}
    against = [f"{fast.name} is faster than {slow.name} at hit rate {rate[fast.name]:.3f} against {rate[slow.name]:.3f}"
               for fast, slow in told if rate[fast.name] <= rate[slow.name]]
    counted = f"{len(told)} pairs of sizes this run tells apart (of {len(pairs)})"
    if not against:
        return f"TTFT follows the hit rate: in each of the {counted}, the faster size has the higher hit rate"
    return (f"TTFT does not follow the hit rate alone: of the {counted}, in {len(against)} the faster size has no "
            "more hits: " + "; ".join(against))


def ttft_verdicts(engine_sweep: pd.DataFrame) -> pd.DataFrame:
    """Per workload, what this run's repeats support: the block sizes ranked by mean TTFT, whether that order
    follows vLLM's hit rate (`vllm_hit_rate`, the same in every repeat), and the size to use (None: cannot tell)."""
    rows = []
    for workload in engine_sweep.workload.unique():
        ttft = ttft_spreads(engine_sweep, workload)
        rate = engine_sweep[engine_sweep.workload == workload].groupby("block_size").vllm_hit_rate.first()
        size, why = recommend_from_spread(ttft)
        rows.append({"workload": workload, "ranking": str(rank(ttft, quantity=f"{workload}, mean TTFT by block size",
                                                                unit="ms", digits=2)),
                     "hit_rate_order": follows_hit_rate(ttft, rate.to_dict()), "recommended": size, "why": why})
    return pd.DataFrame(rows).astype({"recommended": "Int64"}).set_index("workload")


def recommend_block_size(engine_sweep: pd.DataFrame) -> pd.Series:
    """Per workload, the block size to use as far as the sweep's repeats tell (`recommend_from_spread`; <NA>: it
    cannot tell): lesson 04's answer, which it saves as findings (`block_size_findings`) for other pages."""
    return ttft_verdicts(engine_sweep).recommended.rename("block size to use")


def block_size_findings(engine_sweep: pd.DataFrame) -> list[Finding]:
    """Per workload, the block size to use as a finding (id `block_size.<workload>`, value the size): it holds
    where one size's TTFT range lies below every other's; where the repeats leave two or more sizes it cannot tell
    apart, or no spread, it cannot tell which is fastest (the value is then the tie-break's size, or None)."""
    found = []
    for workload, verdict in ttft_verdicts(engine_sweep).iterrows():
        size = None if pd.isna(verdict.recommended) else int(verdict.recommended)
        alone = size is not None and len(sizes_left(ttft_spreads(engine_sweep, str(workload)))) == 1
        found.append(Finding(f"block_size.{workload}", f"Which block size is fastest for {workload} on this back-end?",
                             HOLDS if alone else CANNOT_TELL,
                             f"{workload}: {verdict.why}" if size is None else
                             f"{workload}: use block size {size}. Why: {verdict.why}",
                             f"{verdict.ranking}; hit rate: {verdict.hit_rate_order}", size))
    return found


def ttft_outliers(engine_sweep: pd.DataFrame, factor: float = 2.0) -> pd.DataFrame:
    """The runs whose mean TTFT is more than `factor` times their workload's median over every size and repeat, or
    under that median over `factor` (lab.experiments.verdict.outliers), with that median beside them."""
    flagged = []
    for workload, rows in engine_sweep.groupby("workload", sort=False):
        found = outliers(Spread(str(workload), tuple(rows.mean_ttft_ms)), factor)
        if found:
            flagged.append(rows[rows.mean_ttft_ms.isin(found)].assign(workload_median_ms=rows.mean_ttft_ms.median()))
    empty = engine_sweep.iloc[:0].assign(workload_median_ms=pd.Series(dtype=float))
    return pd.concat(flagged, ignore_index=True) if flagged else empty
