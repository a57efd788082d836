"""The source article's figures, read from data/reference/article_claims.csv in one place.

    claim("mean_ttft_no_cache")        # 2350.0 (ms, A100, Llama-2-7b-chat)
    change_percent("requests_per_s")   # +82.4: the article's own off -> on change, from its two values
"""

from __future__ import annotations

from functools import cache

import pandas as pd

from lab import PROJECT_ROOT

CLAIMS_CSV = PROJECT_ROOT / "data" / "reference" / "article_claims.csv"
SETTING = "A100 80GB, Llama-2-7b-chat, 1000 prompts"  # the article's test environment (section 4.1)

# The lab's metric name -> the article's (caching off, caching on) claims for it.
PAIRS = {
    "mean_ttft_ms": ("mean_ttft_no_cache", "mean_ttft_prefix_cache"),
    "requests_per_s": ("throughput_no_cache", "throughput_prefix_cache"),
    "gpu_memory_gb": ("gpu_memory_no_cache", "gpu_memory_prefix_cache"),
    "e2e_ttft_s": ("e2e_ttft_before", "e2e_ttft_after"),
}


# What the lab concluded about a claim, and what that conclusion rests on (the ledger's `verdict` and `basis`).
VERDICTS = {
    "reproduced": "a run here shows it",
    "calibrated": "matched only by a workload built toward the article's number: consistent, not independent",
    "corrected": "wrong or incomplete as stated; the evidence shows what is true instead",
    "supported": "agrees with a source the lab reads or cites but does not run (vLLM's code, literature)",
    "unverifiable": "needs the article's hardware, data or method, which it does not give",
    "not applicable": "the article's setting, not a claim",
}
BASES = {
    "run": "a notebook section, results file or test of this lab",
    "vllm source": "vLLM's code as installed, read (`vllm:path::name` pointers), not run on the hardware it is for",
    "citation": "a published source named in the reason",
    "arithmetic": "computed in a notebook from published figures",
    "none": "nothing to check against",
}
# Evidence from workloads built toward the article's own figures: it can calibrate a claim, never reproduce it.
CALIBRATED_EVIDENCE = {
    "results:07_warmup_and_eviction-stages": "the customer_service generator was shaped toward the article's stage hit rates",
}


@cache
def claims() -> pd.DataFrame:
    """The claims ledger, indexed by claim name: section, value (as written), unit, context (what the article
    says), the lab's verdict (VERDICTS), its basis (BASES), a one-line reason, and the evidence
    (`notebooks/NN_x.ipynb#Heading`, `results:NAME`, `tests/file.py::test`, `vllm:path.py::name` or a file of this
    repository, several joined by " ; ")."""
    return pd.read_csv(CLAIMS_CSV, dtype={"value": str}, keep_default_na=False).set_index("claim")


def evidence(name: str) -> list[str]:
    """The pointers to a claim's evidence."""
    return [e.strip() for e in claims().loc[name, "evidence"].split(";") if e.strip()]


def claim(name: str) -> float:
    """A numeric figure of the article, in the unit the CSV gives."""
    if name not in claims().index:
        raise KeyError(f"the article has no figure named {name!r}; see {CLAIMS_CSV.name} for the names")
    return float(claims().loc[name, "value"])


def pair(metric: str) -> tuple[float, float]:
    """The article's (caching off, caching on) values for one of the lab's metrics (see PAIRS)."""
    if metric not in PAIRS:
        raise KeyError(f"the article reports no off/on pair for {metric!r}; it does for {sorted(PAIRS)}")
    off, on = PAIRS[metric]
    return claim(off), claim(on)


def change_percent(metric: str) -> float:
    """The article's change from caching off to on, in %, computed from its two values."""
    off, on = pair(metric)
    return (on / off - 1) * 100
