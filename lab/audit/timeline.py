"""The replay over time: for each window of arrival time (of requests, when the log gives no times), the token hit
rate of one cache and of the fleet, and the working set (the distinct blocks the window's requests touch) against one
replica's KV capacity. A hit rate that falls while the working set rises past the capacity is eviction at work."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from lab.core.block_hash import REPLAY_HASH, chain_hashes, full_blocks


def window_of(arrivals: Sequence[float | None], windows: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Each request's window (0 .. windows - 1), the windows' start points, and their unit: equal spans of arrival
    time in seconds from the first request when every request has a time, else equal numbers of requests."""
    n = len(arrivals)
    windows = max(1, min(windows, n))
    if n and all(a is not None for a in arrivals):
        times = np.asarray(arrivals, dtype=float) - float(min(arrivals))
        span = float(times.max())
        if span > 0:
            edges = np.linspace(0.0, span, windows + 1)
            return np.minimum((times / span * windows).astype(int), windows - 1), edges[:-1], "seconds"
    index = np.arange(n)
    return index * windows // max(n, 1), np.arange(windows) * n / windows, "requests"


def timeline(token_ids: Sequence[Sequence[int]], arrivals: Sequence[float | None], one_cache: pd.DataFrame,
             fleet: pd.DataFrame | None, *, block_size: int, kv_tokens: int, windows: int = 40) -> tuple[pd.DataFrame, str]:
    """Per window: requests, the token hit rate of one cache (`one_cache`: a row per request with prompt_tokens and
    cached_tokens, as `lab.audit.misses.attribute(...).requests` gives), the fleet's (`fleet`, the same for the
    replicas), and the working set in tokens beside `kv_tokens`. Reads the first len(fleet) requests when a fleet
    is given. Returns the table and the windows' unit ("seconds" or "requests")."""
    n = len(fleet) if fleet is not None else len(token_ids)
    window, starts, unit = window_of(list(arrivals[:n]), windows)
    frame = pd.DataFrame({"window": window, "prompt_tokens": one_cache.prompt_tokens.to_numpy()[:n],
                          "cached_tokens": one_cache.cached_tokens.to_numpy()[:n]})
    if fleet is not None:
        frame["fleet_cached_tokens"] = fleet.cached_tokens.to_numpy()
    touched: dict[int, set[bytes]] = {}
    for w, ids in zip(window, token_ids[:n]):
        touched.setdefault(int(w), set()).update(chain_hashes(full_blocks(ids, block_size), REPLAY_HASH))
    sums = frame.groupby("window").sum()
    table = pd.DataFrame({"start": starts[sums.index], "requests": frame.groupby("window").size(),
                          "hit_rate": sums.cached_tokens / sums.prompt_tokens})
    table["fleet_hit_rate"] = sums.fleet_cached_tokens / sums.prompt_tokens if fleet is not None else np.nan
    table["working_set_tokens"] = [len(touched[w]) * block_size for w in table.index]
    table["kv_tokens"] = kv_tokens
    return table.reset_index(), unit
