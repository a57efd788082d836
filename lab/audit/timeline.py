"""The replay over time: for each window of arrival time (of requests, when the log gives no times),
the token hit rate of one cache and of the fleet, and the working set (the distinct blocks the
window's requests touch) against one replica's KV capacity. A hit rate that falls while the working
set rises past the capacity is eviction at work."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.core.block_hash import REPLAY_HASH, chain_hashes, full_blocks


@dataclass
class Windows:
    """Each request's window (0 .. windows - 1), the windows' start points, and their unit."""

    window: np.ndarray
    starts: np.ndarray
    unit: str  # "seconds" of arrival time, or "requests"


@dataclass
class Timeline:
    """The replay window by window (see `timeline`), and the windows' unit ("seconds" or
    "requests")."""

    table: (
        pd.DataFrame
    )  # per window: start, requests, hit_rate, fleet_hit_rate, working_set_tokens, kv_tokens
    unit: str


def window_of(arrivals: Sequence[float | None], windows: int) -> Windows:
    """Equal spans of arrival time in seconds from the first request when every request has a time,
    else equal numbers of requests."""
    n = len(arrivals)
    windows = max(1, min(windows, n))
    if n and all(a is not None for a in arrivals):
        times = np.asarray(arrivals, dtype=float) - float(min(arrivals))
        span = float(times.max())
        if span > 0:
            edges = np.linspace(0.0, span, windows + 1)
            return Windows(
                np.minimum((times / span * windows).astype(int), windows - 1), edges[:-1], "seconds"
            )
    index = np.arange(n)
    return Windows(index * windows // max(n, 1), np.arange(windows) * n / windows, "requests")


def distinct_block_tokens(
    token_ids: Sequence[Sequence[int]], block_size: int
) -> Callable[[np.ndarray], dict[int, int]]:
    """For prompts held as token ids: window -> the tokens of the distinct full blocks the window's
    requests hold."""

    def count(window: np.ndarray) -> dict[int, int]:
        touched: dict[int, set[bytes]] = {}
        for w, ids in zip(window.tolist(), token_ids):
            touched.setdefault(w, set()).update(
                chain_hashes(full_blocks(ids, block_size), REPLAY_HASH)
            )
        return {w: len(s) * block_size for w, s in touched.items()}

    return count


def timeline(
    arrivals: Sequence[float | None],
    one_cache: pd.DataFrame,
    fleet: pd.DataFrame | None,
    tokens_touched: Callable[[np.ndarray], dict[int, int]],
    *,
    kv_tokens: int,
    windows: int = 40,
) -> Timeline:
    """Per window: requests, the token hit rate of one cache (`one_cache`: a row per request with
    prompt_tokens and cached_tokens), the fleet's (`fleet`: the same for the replicas, for the first
    len(fleet) requests: the windows after those have none), and the working set
    (`tokens_touched(window)`: the tokens of the distinct blocks per window, as
    `distinct_block_tokens` or `Trace.block_hash_sets` count them) beside `kv_tokens`."""
    windowed = window_of(list(arrivals), windows)
    window, starts = windowed.window, windowed.starts
    frame = pd.DataFrame(
        {
            "window": window,
            "prompt_tokens": one_cache.prompt_tokens.to_numpy(),
            "cached_tokens": one_cache.cached_tokens.to_numpy(),
        }
    )
    if fleet is not None:
        routed = np.full(len(frame), np.nan)
        routed[: len(fleet)] = fleet.cached_tokens.to_numpy()
        frame["fleet_cached_tokens"] = routed
        frame["fleet_prompt_tokens"] = np.where(np.isnan(routed), np.nan, frame.prompt_tokens)
    sums = frame.groupby("window").sum(min_count=1)
    table = pd.DataFrame(
        {
            "start": starts[sums.index],
            "requests": frame.groupby("window").size(),
            "hit_rate": sums.cached_tokens / sums.prompt_tokens,
        }
    )
    table["fleet_hit_rate"] = (
        sums.fleet_cached_tokens / sums.fleet_prompt_tokens if fleet is not None else np.nan
    )
    touched = tokens_touched(window)
    table["working_set_tokens"] = [touched[w] for w in table.index]
    table["kv_tokens"] = kv_tokens
    return Timeline(table.reset_index(), windowed.unit)
