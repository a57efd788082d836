"""When is reading a cached block back faster than computing it again? Measured on the mini-engine,
and the formula.

Recomputing a hit of p tokens costs about p x f / G (f: the model's FLOPs per token, G: the FLOP/s
this machine reaches in prefill). Loading it from a tier costs about L + p x b / B (b: K/V bytes per
token, B: the tier's read bandwidth, L: a read's fixed cost). So loading wins for every hit when B
clears the break-even bandwidth G x b / f and L is small, for hits longer than L / (f / G - b / B)
when L is not, and never when B < G x b / f.

A measurement serves one prompt of p + 1 tokens cold (nothing cached: the p tokens recomputed), then
from each tier in turn (the p tokens loaded back into the pool), then from the pool (a local hit,
nothing moved), one right after another in each repeat. The local hit's TTFT is what all share, so
recompute = cold - local; a load is timed directly (the read and the copy into the pool).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from lab.checks import positive_int
from lab.core.kv_tier import KVTier
from lab.core.mini_engine import MiniEngine


def kv_bytes_per_token(config: dict, bytes_per_value: int = 4) -> int:
    """Bytes of K and V one token holds across all layers (fp32: 4 bytes a value)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return (
        2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * bytes_per_value
    )


def linear_flops_per_token(config: dict) -> int:
    """FLOPs of one token through every layer's projections (2 a weight); attention's own share
    grows with the context and is left out, so a G measured with this counts linear FLOPs per
    second."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_and_o = 2 * hidden * config["num_attention_heads"] * head_dim
    k_and_v = 2 * hidden * config["num_key_value_heads"] * head_dim
    mlp = 3 * hidden * config["intermediate_size"]
    return 2 * layers * (q_and_o + k_and_v + mlp)


def break_even_bandwidth(flops_per_s: float, kv_bytes: float, flops_per_token: float) -> float:
    """The read bandwidth (bytes/s) above which loading a token's K/V beats recomputing it: G x b /
    f."""
    return flops_per_s * kv_bytes / flops_per_token


def crossover_tokens(
    latency_s: float, bandwidth: float, flops_per_s: float, kv_bytes: float, flops_per_token: float
) -> float:
    """The hit length (tokens) above which loading beats recomputing: L / (f / G - b / B); inf when
    the tier's bandwidth is below break-even (recompute always wins), 0 when a read has no fixed
    cost."""
    per_token_gain = flops_per_token / flops_per_s - kv_bytes / bandwidth
    if per_token_gain <= 0:
        return float("inf")
    return latency_s / per_token_gain


def measure(
    engine: MiniEngine,
    tiers: dict[str, KVTier],
    lengths: Sequence[int],
    repeats: int,
    seed: int = 0,
    progress=None,
) -> pd.DataFrame:
    """A row per (hit length, repeat, tier): TTFT cold, from the tier and from the pool, the load's
    time, the time to store the blocks in the tier, and the recompute's. The lengths are in tokens,
    multiples of the engine's block size; the lengths and the tiers are shuffled in every repeat."""
    if not tiers:
        raise ValueError("tiers is empty: give at least one, e.g. {'memory': MemoryTier(512)}")
    positive_int("repeats", repeats)
    for length in lengths:
        if (
            positive_int("lengths", length, "positive multiples of the block size")
            % engine.block_size
        ):
            raise ValueError(
                f"lengths: {length} is not a multiple of block_size={engine.block_size}"
            )
    generator = torch.Generator().manual_seed(seed)
    prompts = {
        p: torch.randint(3, engine.config["vocab_size"], (p + 1,), generator=generator).tolist()
        for p in lengths
    }
    order = random.Random(seed)
    rows = []
    for repeat in range(repeats):
        for length in order.sample(list(lengths), len(lengths)):
            rows += [
                {"hit_tokens": length, "repeat": repeat, **row}
                for row in _every_way(engine, tiers, prompts[length], order)
            ]
            if progress is not None:
                progress.update(1)
    table = pd.DataFrame(rows)
    table["recompute_s"] = table["ttft_cold_s"] - table["ttft_local_s"]
    table["load_over_recompute"] = table["load_s"] / table["recompute_s"]
    return table


def _every_way(
    engine: MiniEngine, tiers: dict[str, KVTier], prompt: list[int], order: random.Random
) -> list[dict]:
    hit = len(prompt) - 1
    engine.use_tier(None)
    engine.cache.reset()
    cold = engine.generate(prompt)
    loads = []
    for name in order.sample(list(tiers), len(tiers)):
        tier = tiers[name]
        engine.use_tier(tier)
        tier.clear()
        start = time.perf_counter()
        engine.cache.evict_free_blocks()  # every block of the prompt now lives in this tier only
        store_s = time.perf_counter() - start
        loaded = engine.generate(prompt)
        if loaded.num_tier_tokens != hit or loaded.output_token_ids != cold.output_token_ids:
            raise RuntimeError(
                f"tier {name}: loaded {loaded.num_tier_tokens} of {hit} tokens, first token "
                f"{loaded.output_token_ids} against {cold.output_token_ids} cold: is it smaller than the prompt?"
            )
        loads.append((name, loaded, store_s))
        tier.clear()
    engine.use_tier(None)
    local = engine.generate(prompt)
    if (
        cold.num_cached_tokens
        or local.num_cached_tokens != hit
        or local.output_token_ids != cold.output_token_ids
    ):
        raise RuntimeError(
            f"expected a cold run and a {hit}-token pool hit with one first token; got "
            f"{cold.num_cached_tokens} and {local.num_cached_tokens} cached: is the pool too small?"
        )
    return [
        {
            "tier": name,
            "ttft_cold_s": cold.ttft_s,
            "ttft_tier_s": loaded.ttft_s,
            "ttft_local_s": local.ttft_s,
            "load_s": loaded.load_s,
            "store_s": store_s,
        }
        for name, loaded, store_s in loads
    ]


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b), the fixed cost and the cost per unit."""
    slope, intercept = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(intercept), float(slope)


def rates(table: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Per row: G (linear FLOP/s of the recompute) and B (bytes/s of the load), from the measured
    times."""
    out = table.copy()
    out["flops_per_s"] = out["hit_tokens"] * linear_flops_per_token(config) / out["recompute_s"]
    out["load_bytes_per_s"] = out["hit_tokens"] * kv_bytes_per_token(config) / out["load_s"]
    return out
