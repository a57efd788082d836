"""Verdicts computed from a run's own numbers, never typed ahead of it.

A timing measured on a shared machine moves from run to run. So a sentence that compares timings
(faster, wins, above a bound) is printed by `rank`, `against_bound` or `within_tolerance` from this
run's repeats: it states an order only where the repeats' ranges do not overlap, and otherwise says
that this run cannot tell.

    >>> print(rank([Spread("A", (1.0, 1.2)), Spread("B", (2.0, 2.4))], quantity="p50 TTFT", unit="ms"))
    p50 TTFT: A (1.0-1.2 ms) is lower than B (2.0-2.4 ms): their ranges over 2 repeats do not overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from lab.checks import number_in


@dataclass(frozen=True)
class Spread:
    """One quantity's values over a run's repeats: its range is the spread the verdicts judge by.
    `each` names what one value is, in the verdicts' words ("repeat", "pair", "conversation",
    "prompt")."""

    name: str
    values: tuple[float, ...]
    each: str = "repeat"

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.values if v is not None and np.isfinite(v))
        if not values:
            raise ValueError(f"{self.name}: no finite value to judge (got {self.values!r})")
        object.__setattr__(self, "values", values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    def overlaps(self, other: Spread) -> bool:
        return self.low <= other.high and other.low <= self.high

    def describe(self, unit: str = "", digits: int = 1) -> str:
        unit = f" {unit}" if unit else ""
        if len(self.values) == 1:
            return f"{self.low:,.{digits}f}{unit}, one run"
        return f"{self.low:,.{digits}f}-{self.high:,.{digits}f}{unit}"


def spreads(table, by: str, value: str, each: str = "repeat") -> list[Spread]:
    """One Spread per group of `by` in a long table (a row per `each`), in the table's order of
    first appearance."""
    return [
        Spread(str(name), tuple(group[value]), each)
        for name, group in table.groupby(by, sort=False)
    ]


@dataclass(frozen=True)
class Verdict:
    """What a run shows: `order` lists names from best to worst where the run can tell, else None."""

    text: str
    order: tuple[str, ...] | None

    @property
    def can_tell(self) -> bool:
        return self.order is not None

    def __str__(self) -> str:
        return self.text


def _repeats(items: Sequence[Spread]) -> str:
    counts = sorted({len(s.values) for s in items})
    shown = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{shown} {items[0].each}s"


def rank(
    items: Sequence[Spread],
    *,
    quantity: str,
    unit: str = "",
    lower_is_better: bool = True,
    digits: int = 1,
) -> Verdict:
    """Order `items` by their medians and say which neighbours this run can tell apart: two are told
    apart only when their ranges do not overlap, and a single run of either can tell nothing."""
    if len(items) < 2:
        raise ValueError(f"rank needs two or more spreads to compare, got {len(items)}")
    ordered = sorted(items, key=lambda s: s.median, reverse=not lower_is_better)
    better = "lower" if lower_is_better else "higher"
    shown = [f"{s.name} ({s.describe(unit, digits)})" for s in ordered]
    if min(len(s.values) for s in items) < 2:
        return Verdict(
            f"{quantity}: "
            + ", ".join(shown)
            + ": one run of some, so no spread: this run cannot tell "
            "them apart.",
            None,
        )
    apart = [not a.overlaps(b) for a, b in zip(ordered, ordered[1:])]
    if all(apart):
        joined = f" is {better} than ".join(shown)
        return Verdict(
            f"{quantity}: {joined}: their ranges over {_repeats(items)} do not overlap.",
            tuple(s.name for s in ordered),
        )
    tied = [f"{a.name} from {b.name}" for a, b, ok in zip(ordered, ordered[1:], apart) if not ok]
    return Verdict(
        f"{quantity}: "
        + ", ".join(shown)
        + f" over {_repeats(items)}: the ranges overlap, so this run "
        f"cannot tell {', nor '.join(tied)}.",
        None,
    )


def against_bound(
    item: Spread,
    bound: float | tuple[float, float],
    *,
    quantity: str,
    bound_name: str,
    unit: str = "",
    digits: int = 2,
) -> Verdict:
    """Whether every value of `item` (every repeat, say) lies below `bound`, above it, or they
    straddle it. A bound known only to lie in a range (low, high): below only if below low, above
    only if above high."""
    low, high = bound if isinstance(bound, tuple) else (bound, bound)
    if low > high:
        raise ValueError(f"bound={bound!r}: give a range as (low, high), low first")

    def number(value: float) -> str:
        return f"{value:,.{digits}f}{' ' + unit if unit else ''}"

    ranged = low != high
    shown = f"{quantity} {item.describe(unit, digits)} against {bound_name} " + (
        f"{low:,.{digits}f}-{number(high)}" if ranged else number(low)
    )
    if len(item.values) < 2:
        return Verdict(f"{shown}: no spread from one run, so this run cannot tell.", None)
    if item.high < low:
        return Verdict(
            f"{shown}: below {'its lowest, ' + number(low) + ',' if ranged else 'it'} in every "
            f"{item.each}.",
            ("below",),
        )
    if item.low > high:
        return Verdict(
            f"{shown}: above {'its highest, ' + number(high) + ',' if ranged else 'it'} in every "
            f"{item.each}.",
            ("above",),
        )
    if ranged:
        return Verdict(
            f"{shown}: not below {number(low)} in every {item.each} nor above {number(high)} in every "
            f"{item.each}, so this run cannot tell.",
            None,
        )
    return Verdict(
        f"{shown}: the {item.each}s lie on both sides of it, so this run cannot tell whether it is above "
        "or below.",
        None,
    )


def within_tolerance(
    item: Spread,
    reference: float,
    tolerance: float,
    *,
    quantity: str,
    reference_name: str,
    digits: int = 1,
) -> Verdict:
    """Whether `item`'s repeats lie within `tolerance` (a fraction) of `reference`: all of them,
    none of them, or some, in which case this run cannot tell. A spread wider than the tolerance
    band itself can never tell."""
    if not tolerance > 0:
        raise ValueError(f"tolerance={tolerance!r} must be a positive fraction, e.g. 0.15 for 15%")
    low, high = reference * (1 - tolerance), reference * (1 + tolerance)
    shown = (
        f"{quantity} {item.describe(digits=digits)} against {reference_name} {reference:,.{digits}f} "
        f"(within {tolerance:.0%}: {low:,.{digits}f}-{high:,.{digits}f})"
    )
    if len(item.values) < 2:
        return Verdict(
            f"{shown}: no spread from one run, so this run cannot tell whether {reference_name} is "
            f"within {tolerance:.0%}.",
            None,
        )
    if low <= item.low and item.high <= high:
        return Verdict(f"{shown}: every {item.each} is within it.", ("within",))
    if item.high < low or item.low > high:
        return Verdict(f"{shown}: no {item.each} is within it.", ("outside",))
    return Verdict(
        f"{shown}: some {item.each}s are and some are not, so this run cannot tell whether "
        f"{reference_name} is within {tolerance:.0%}.",
        None,
    )


def all_of(
    verdicts: Sequence[Verdict], claim: str, *, none: str = "nothing could be judged"
) -> Verdict:
    """One verdict for several: `claim` where every one shows it, another order where one shows
    that, else this run cannot tell; with no verdict at all it cannot tell either, and says `none`.
    """
    orders = [v.order for v in verdicts]
    other = [o for o in orders if o is not None and o[0] != claim]
    order = (
        (claim,) if verdicts and all(o == (claim,) for o in orders) else other[0] if other else None
    )
    return Verdict("; ".join(v.text for v in verdicts) or none, order)


def outliers(item: Spread, factor: float = 2.0) -> list[float]:
    """The values more than `factor` times their spread's median, or less than its median over
    `factor`."""
    middle = item.median
    return [v for v in item.values if v > middle * factor or v < middle / factor]


# how often one timing test may fail on a correct lab: 0.05% (15's sixteen take half), so that a
# make run's 45 (29 x 0.05% + 16 x 0.025%) together fail at random 1.85% of the time at most (their
# list: docs/TESTING.md)
FALSE_ALARM_RATE = 0.0005
CLAIMS = {"at_most": "at most", "at_least": "at least"}


@dataclass(frozen=True)
class TTest:
    """What a timing check's t-test is held to: `noise`, groups of ratios of further pairs of the
    run whose logs scatter as the checked ones do (the other points of a sweep, say), pooled into
    the spread; and the false-alarm rate it allows (two one-sided checks of one band take half
    each)."""

    noise: Sequence[Sequence[float]] = ()
    false_alarm_rate: float = FALSE_ALARM_RATE

    def __post_init__(self) -> None:
        number_in(
            "false_alarm_rate", self.false_alarm_rate, 0, 0.5, "a fraction in (0, 0.5)", ends="(]"
        )


@dataclass(frozen=True)
class TimingCheck:
    """A check on timings, decided by a one-sided t-test: `alarm` is True only where the run's
    paired repeats lie beyond the claimed bound by more than their noise allows at
    `false_alarm_rate`."""

    text: str
    alarm: bool
    false_alarm_rate: float
    # no alarm, yet the ratios' geometric mean lies on the wrong side of the bound: not shown
    beyond: bool = False

    def __str__(self) -> str:
        return self.text


def _logs(name: str, ratios: Sequence[float]) -> np.ndarray:
    values = np.asarray(Spread(name, tuple(ratios)).values)
    if (values <= 0).any():
        raise ValueError(
            f"{name}: a timing check judges ratios of two timings, all positive; got {values.tolist()}"
        )
    return np.log(values)


def _pooled_sd(samples: Sequence[np.ndarray]) -> tuple[float, int]:
    """The standard deviation pooled over samples, each about its own mean, and its degrees of
    freedom."""
    squares = sum(float(((s - s.mean()) ** 2).sum()) for s in samples if len(s) > 1)
    freedom = sum(len(s) - 1 for s in samples if len(s) > 1)
    if freedom < 1:
        raise ValueError(
            f"a timing check needs two or more paired repeats, or a `noise` group of two or more: got "
            f"{len(samples[0])} and groups of {[len(s) for s in samples[1:]]} (run more repeats, e.g. 3)"
        )
    return (squares / freedom) ** 0.5, freedom


def timing_check(
    ratios: Sequence[float],
    claim: str,
    bound: float,
    *,
    quantity: str,
    bound_name: str,
    test: TTest = TTest(),
) -> TimingCheck:
    """Check that the true ratio is `claim` ("at_most" or "at_least") `bound`, from paired,
    interleaved repeats.

    Each repeat gives one ratio of two runs made side by side (on / off, say). On their logs, a
    one-sided t-test raises the alarm when the mean lies on the wrong side of log(bound) by more
    than t(1 - rate, df) standard errors: on a correct lab (true ratio on the claimed side or on the
    bound itself) that happens at most `test.false_alarm_rate` of the time, the noise being normal
    and independent between pairs. The spread of `test.noise`, each group about its own mean, is
    pooled in: a margin from this machine's noise, with more degrees of freedom."""
    from scipy.stats import t as student_t

    if claim not in CLAIMS:
        raise ValueError(f"claim={claim!r} must be one of {sorted(CLAIMS)}")
    false_alarm_rate = test.false_alarm_rate
    logs = _logs(quantity, ratios)
    groups = [_logs("noise", group) for group in test.noise]
    sd, freedom = _pooled_sd([logs, *groups])
    margin = float(student_t.ppf(1 - false_alarm_rate, freedom)) * sd / len(logs) ** 0.5
    mean = float(np.exp(logs.mean()))
    edge = bound * np.exp(margin) if claim == "at_most" else bound * np.exp(-margin)
    alarm = mean > edge if claim == "at_most" else mean < edge
    beyond = not alarm and (mean > bound if claim == "at_most" else mean < bound)
    side = "above" if claim == "at_most" else "below"
    sources = f"{len(logs)} pairs" + (
        f" and {sum(map(len, groups))} more for the noise" if groups else ""
    )
    outcome = (
        "ALARM"
        if alarm
        else f"no alarm, though the mean itself lies {side} {bound:.4g}, so {CLAIMS[claim]} it is not shown"
        if beyond
        else "passes"
    )
    text = (
        f"{quantity}: geometric mean {mean:.4g} over {sources}; claimed {CLAIMS[claim]} {bound:.4g} "
        f"({bound_name}), with the noise (log sd {sd:.3f}, df {freedom}) an alarm only {side} {edge:.4g}: "
        f"{outcome} (one-sided t-test, false-alarm rate {false_alarm_rate * 100:g}%)"
    )
    return TimingCheck(text, bool(alarm), false_alarm_rate, bool(beyond))


def timing_band(
    ratios: Sequence[float],
    low: float,
    high: float,
    *,
    quantity: str,
    bound_name: str,
    test: TTest = TTest(),
) -> tuple[TimingCheck, TimingCheck]:
    """Check that the true ratio lies within [low, high] (low == high: on which side of one value),
    as two one-sided timing checks, "at least low" and "at most high", each at half of `test`'s
    false-alarm rate: an alarm on the first shows the ratio below `low`, on the second above `high`,
    and neither alarm leaves it inside (or untold)."""
    if low > high:
        raise ValueError(f"low={low!r} > high={high!r}: give the band's ends in order")
    half = replace(test, false_alarm_rate=test.false_alarm_rate / 2)
    return (
        timing_check(ratios, "at_least", low, quantity=quantity, bound_name=bound_name, test=half),
        timing_check(ratios, "at_most", high, quantity=quantity, bound_name=bound_name, test=half),
    )
