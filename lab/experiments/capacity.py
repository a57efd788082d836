"""Capacity at a TTFT target: the highest offered rate whose p99 TTFT stays under it, from a sweep
or a bisection, and the capacity table notebook 17 builds (off against on, the bound beside it, the
cost model's projection).

    capacity(sweep, target_ms=500)                          # highest swept rate with p99 TTFT <= 500 ms
    highest_rate_meeting(meets, low=4, high=8, tolerance=0.1, floor=0.5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from lab.experiments.gains import amdahl_bound

# a benchmark run at a low rate still sends this many prompts (sweeps, searches, the cost model)
MIN_PROMPTS = 8


class CapacityColumns:
    """The columns of the capacity table (`17_capacity-capacity`, a row per dataset). Notebook 17
    builds it with `capacity_frame`, `add_searched` and `add_cost_model`; the report and the tests
    read it by these names, so a column is renamed here and nowhere else."""

    DATASET = "dataset"
    UNLOADED_OFF = "unloaded p99 TTFT off (ms)"
    UNLOADED_ON = "unloaded p99 TTFT on (ms)"
    TARGET = "target p99 TTFT (ms)"
    OFF = "capacity off (req/s)"
    ON = "capacity on (req/s)"
    RATIO = "capacity ratio"
    HIT_RATE = "hit rate (on, highest rate)"
    BOUND = "bound 1/(1-h)"
    # with capacity_repeats: found by bisection, the mean over the repeats
    SEARCHED_OFF = "searched off (req/s)"
    SEARCHED_ON = "searched on (req/s)"
    SEARCHED_RATIO = "searched ratio"
    RATIO_LOW = "ratio low"
    RATIO_HIGH = "ratio high"
    MODEL_OFF = "cost model off (req/s)"  # the cost model's projected capacity
    MODEL_ON = "cost model on (req/s)"
    MODEL_RATIO = "cost model ratio"


def capacity_row(
    dataset: str,
    capacities: Mapping[str, float],
    unloaded_ms: Mapping[str, float],
    *,
    target_ms: float,
    hit_rate: float,
) -> dict:
    """One dataset's row of the capacity table: the unloaded p99 TTFT and the capacity at the
    target, each with caching "off" and "on", the capacities' ratio (infinite when caching off met
    no swept rate), the hit rate and its bound."""
    c = CapacityColumns
    off, on = capacities["off"], capacities["on"]
    return {
        c.DATASET: dataset,
        c.UNLOADED_OFF: unloaded_ms["off"],
        c.UNLOADED_ON: unloaded_ms["on"],
        c.TARGET: target_ms,
        c.OFF: off,
        c.ON: on,
        c.RATIO: on / off if off else math.inf,
        c.HIT_RATE: hit_rate,
        c.BOUND: amdahl_bound(hit_rate),
    }


def capacity_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """The capacity table from `capacity_row`s, indexed by dataset."""
    ones = {"off": 1, "on": 1}
    columns = list(capacity_row("", ones, ones, target_ms=0, hit_rate=0))
    return pd.DataFrame(rows, columns=columns).set_index(CapacityColumns.DATASET)


def add_searched(table: pd.DataFrame, searched: pd.DataFrame) -> pd.DataFrame:
    """The capacities found by bisection (`searched`: dataset, caching, repeat, capacity): the mean
    of each setting and the ratio's range over the repeats."""
    c = CapacityColumns
    found = searched.pivot_table(
        index="dataset", columns="caching", values="capacity", aggfunc=["mean", "min", "max"]
    )
    return table.assign(
        **{
            c.SEARCHED_OFF: found["mean", "off"],
            c.SEARCHED_ON: found["mean", "on"],
            c.SEARCHED_RATIO: found["mean", "on"] / found["mean", "off"],
            c.RATIO_LOW: found["min", "on"] / found["max", "off"],
            c.RATIO_HIGH: found["max", "on"] / found["min", "off"],
        }
    )


def add_cost_model(table: pd.DataFrame, dataset: str, off: float, on: float) -> pd.DataFrame:
    """The cost model's projected capacities for one dataset, beside the measured ones."""
    c = CapacityColumns
    table = table.copy()
    table.loc[dataset, [c.MODEL_OFF, c.MODEL_ON, c.MODEL_RATIO]] = [
        off,
        on,
        on / off if off else math.inf,
    ]
    return table


def highest_rate_meeting(
    meets: Callable[[float], bool], *, low: float, high: float, tolerance: float, floor: float
) -> float:
    """The highest rate for which `meets(rate)` holds, to within `tolerance`: the bracket [`low`,
    `high`] is halved or doubled until `low` meets and `high` misses, then split at its geometric
    middle until high / low <= 1 + tolerance. 0.0 when even a rate below `floor` misses. Used for
    the engine's measured capacity (`serving_bench.find_capacity`) and the cost model's projected
    one (`CostModel.capacity`)."""
    while not meets(low):
        high, low = low, low / 2
        if low < floor:
            return 0.0
    while meets(high):
        low, high = high, high * 2
    while high / low > 1 + tolerance:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def capacity(sweep: pd.DataFrame, target_ms: float, column: str = "p99_ttft_ms") -> float:
    """The highest offered rate whose `column` stays at or under `target_ms`, among the rates of one
    sweep (0.0 when even the lowest rate misses the target). Rates above the first miss do not
    count."""
    if not target_ms > 0:
        raise ValueError(f"target_ms={target_ms!r} must be a positive number of milliseconds")
    best = 0.0
    for _, row in sweep.sort_values("request_rate").iterrows():
        if row[column] > target_ms:
            break
        best = float(row["request_rate"])
    return best


MIN_BOOTSTRAP = (
    10  # fewer ratios than this: a bootstrap interval is only their range, so report the range
)


def ratio_interval(
    ratios: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of paired ratios and its bootstrap (percentile) confidence interval; with fewer than
    MIN_BOOTSTRAP ratios, the lowest and the highest (`spread_name` says which it was)."""
    values = np.asarray(ratios, float)
    if len(values) < 2:
        raise ValueError(f"{len(values)} ratio(s): an interval needs at least two repeats")
    if len(values) < MIN_BOOTSTRAP:
        return float(values.mean()), float(values.min()), float(values.max())
    means = np.random.default_rng(seed).choice(values, (resamples, len(values))).mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(values.mean()), float(low), float(high)


def spread_name(count: int, confidence: float = 0.95) -> str:
    """What ratio_interval's low and high are for `count` ratios."""
    return (
        f"{confidence:.0%} bootstrap interval of {count}"
        if count >= MIN_BOOTSTRAP
        else f"range of {count}"
    )
