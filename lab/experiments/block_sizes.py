"""Which block size to use, from a sweep of the real engine at the sizes the back-end accepts."""

from __future__ import annotations

import pandas as pd


def recommend_block_size(engine_sweep: pd.DataFrame, tolerance: float = 0.05) -> pd.Series:
    """Per workload: the block size with the lowest mean TTFT in the real engine. Sizes within `tolerance` of
    the lowest count as ties, and the largest of them wins (fewer blocks to track for the same latency)."""
    def fastest(rows: pd.DataFrame) -> int:
        return int(rows[rows.mean_ttft_ms <= (1 + tolerance) * rows.mean_ttft_ms.min()].block_size.max())

    return engine_sweep.groupby("workload").apply(fastest, include_groups=False).rename("recommended block size")
