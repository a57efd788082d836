"""A rough model of Llama-2-7b-chat in bf16 on one A100 80GB, for the order of magnitude on the
article's hardware: prefill costed by its arithmetic at half of the A100's peak, decode by reading
the weights once per step.

    a100_projection(prompt_tokens, cached_tokens, output_tokens)    # seconds of prefill and decode, requests/s
    a100_curve(prompt_tokens, output_tokens, [0.0, 0.5, 0.9])      # the projected gain at each hit rate
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

# The A100 projection of notebook 05: Llama-2-7b-chat in bf16 on one A100 80GB.
A100_PEAK_FLOPS = 312e12  # dense bf16
A100_ACHIEVED = 0.5  # fraction of peak a prefill reaches
A100_HBM_BYTES_PER_S = 2.0e12
LLAMA_7B = {"params": 6.74e9, "layers": 32, "hidden": 4096, "weight_bytes": 13.5e9}
MAX_NUM_SEQS = 256  # vLLM's default batch limit: requests decoded together


def a100_projection(
    prompt_tokens: Sequence[int], cached_tokens: Sequence[int], output_tokens: Sequence[int]
) -> dict:
    """Seconds an A100 would spend on these requests submitted together: prefill by FLOPs (weights
    plus attention over cached and new keys) at half of peak, decode by reading the weights once per
    step with up to MAX_NUM_SEQS requests per step. A rough model, for the order of magnitude."""
    uncached = np.asarray(prompt_tokens, float) - np.asarray(cached_tokens, float)
    cached = np.asarray(cached_tokens, float)
    m = LLAMA_7B
    flops = (
        2 * m["params"] * uncached
        + 4 * m["layers"] * m["hidden"] * (uncached**2 / 2 + uncached * cached)
    ).sum()
    prefill_s = flops / (A100_PEAK_FLOPS * A100_ACHIEVED)
    decode_steps = math.ceil(len(uncached) / MAX_NUM_SEQS) * max(output_tokens)
    decode_s = decode_steps * m["weight_bytes"] / A100_HBM_BYTES_PER_S
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "requests_per_s": len(uncached) / (prefill_s + decode_s),
    }


def a100_curve(
    prompt_tokens: Sequence[int], output_tokens: Sequence[int], hit_rates: Sequence[float]
) -> pd.DataFrame:
    """The projected throughput gain at each token hit rate for these prompt lengths. In a batch
    submitted at once, mean TTFT scales with the time to work through it, so its change is about 1 /
    gain - 1."""
    prompt = np.asarray(prompt_tokens)
    off = a100_projection(prompt, np.zeros_like(prompt), output_tokens)["requests_per_s"]
    rows = []
    for h in hit_rates:
        on = a100_projection(prompt, np.floor(h * prompt), output_tokens)["requests_per_s"]
        rows.append({"hit_rate": h, "throughput_gain": on / off, "ttft_change": off / on - 1})
    return pd.DataFrame(rows)
