"""The source article's figures, read from data/reference/article_claims.csv in one place.

claim("mean_ttft_no_cache")        # 2350.0 (ms, A100, Llama-2-7b-chat)
change_percent("requests_per_s")   # +82.4: the article's own off -> on change, from its two values
measured("prompt_share_of_ttft")   # the lab's number for that figure, from the canonical results
holds("prompt_share_of_ttft")      # True: the lab's number meets the figure within the row's
tolerance
"""

from __future__ import annotations

import re
from functools import cache

import pandas as pd

from lab import PROJECT_ROOT
from lab.experiments.results import load_latest_full_or_canonical

CLAIMS_CSV = PROJECT_ROOT / "data" / "reference" / "article_claims.csv"
NOTEBOOKS_DIR = PROJECT_ROOT / "notebooks"
# A reason cites a lesson by its topic, `lesson:gain_vs_hit_rate`, never by its number: claims()
# writes the lesson's current name (16_gain_vs_hit_rate) in its place, so a renumbering of the
# course cannot leave a reason pointing at the wrong lesson.
LESSON = re.compile(r"\blesson:(?P<topic>[a-z0-9_]+)")
SETTING = "A100 80GB, Llama-2-7b-chat, 1000 prompts"  # the article's test environment (section 4.1)

# The lab's metric name -> the article's (caching off, caching on) claims for it.
PAIRS = {
    "mean_ttft_ms": ("mean_ttft_no_cache", "mean_ttft_prefix_cache"),
    "requests_per_s": ("throughput_no_cache", "throughput_prefix_cache"),
    "gpu_memory_gb": ("gpu_memory_no_cache", "gpu_memory_prefix_cache"),
    "e2e_ttft_s": ("e2e_ttft_before", "e2e_ttft_after"),
}


# What the lab concluded about a claim, and what that conclusion rests on (the ledger's `verdict`
# and `basis`).
VERDICTS = {
    "reproduced": "a run here shows it",
    "calibrated": "matched only by a workload built toward the article's number: consistent, not independent",
    "corrected": "wrong or incomplete as stated; the evidence shows what is true instead",
    "supported": "agrees with a source the lab reads or cites but does not run (vLLM's code, literature)",
    "unverifiable": "cannot be settled here: it needs the article's hardware, data or method, which it does not give, "
    "or a setting this back-end does not run (block sizes under 32)",
    "not applicable": "the article's setting, not a claim",
}
BASES = {
    "run": "a notebook section, results file or test of this lab",
    "vllm source": "vLLM's code as installed, read (`vllm:path::name` pointers), not run on the hardware it is for",
    "citation": "a published source named in the reason",
    "arithmetic": "computed in a notebook from published figures",
    "none": "nothing to check against",
}
# Evidence from workloads built toward the article's own figures: it can calibrate a claim, never
# reproduce it.
CALIBRATED_EVIDENCE = {
    "results:07_cache_warmup-stages": "the customer_service generator was shaped toward the article's stage hit rates",
}


# How a row's `tolerance` compares the lab's measured number m with the article's figure (a value v,
# or a range lo-hi): ">=" m >= lo (the article says "over"), "<=" m <= hi, "±X" lo - X <= m <= hi +
# X (in the row's unit).
TOLERANCE = re.compile(r"^(>=|<=|±(?P<plus>\d+(\.\d+)?))$")
# A row's `measured`: one cell of a canonical results table,
# `results:NAME[column=value&...]/column`, times an optional factor into the row's unit (`*100`: a
# fraction in %; `*0.001`: ms in s).
MEASURED = re.compile(
    r"^results:(?P<name>[\w.-]+)\[(?P<where>[^\]]+)\]/(?P<column>[^*]+?)(\*(?P<factor>[\d.]+))?$"
)
FIGURE = re.compile(r"^(?P<low>-?\d+(\.\d+)?)(-(?P<high>\d+(\.\d+)?))?$")


@cache
def claims() -> pd.DataFrame:
    """The claims ledger, indexed by claim name: section, value (as written), unit, context (what
    the article says), the lab's verdict (VERDICTS), its basis (BASES), a one-line reason (lessons
    cited by topic, LESSON, written here under their current names), the evidence
    (`notebooks/NN_x.ipynb#Heading`, `results:NAME`, `tests/file.py::test`, `vllm:path.py::name` or
    a file of this repository, several joined by " ; "), and where a lab number stands beside the
    figure: `measured` (MEASURED) and the `tolerance` within which it agrees with the figure
    (TOLERANCE). Claims about vLLM's behaviour are judged against the vLLM the lab runs (the version
    every results file records); a reason says where the article's own release behaved otherwise."""
    ledger = pd.read_csv(CLAIMS_CSV, dtype=str, keep_default_na=False).set_index("claim")
    ledger["reason"] = ledger.reason.map(cite_lessons)
    return ledger


def lesson_names() -> dict[str, str]:
    """Each lesson's topic -> its notebook's current name: `gain_vs_hit_rate` ->
    `16_gain_vs_hit_rate`."""
    return {path.stem[3:]: path.stem for path in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))}


def cite_lessons(text: str) -> str:
    """`text` with each `lesson:topic` replaced by that lesson's current name; KeyError for a topic
    no notebook has."""
    names = lesson_names()

    def name(found: re.Match) -> str:
        if found["topic"] not in names:
            raise KeyError(
                f"lesson:{found['topic']} names no notebook in {NOTEBOOKS_DIR}; the topics: {sorted(names)}"
            )
        return names[found["topic"]]

    return LESSON.sub(name, text)


def evidence(name: str) -> list[str]:
    """The pointers to a claim's evidence."""
    return [e.strip() for e in claims().loc[name, "evidence"].split(";") if e.strip()]


def claim(name: str) -> float:
    """A numeric figure of the article, in the unit the CSV gives."""
    if name not in claims().index:
        raise KeyError(
            f"the article has no figure named {name!r}; see {CLAIMS_CSV.name} for the names"
        )
    return float(claims().loc[name, "value"])


def pair(metric: str) -> tuple[float, float]:
    """The article's (caching off, caching on) values for one of the lab's metrics (see PAIRS)."""
    if metric not in PAIRS:
        raise KeyError(
            f"the article reports no off/on pair for {metric!r}; it does for {sorted(PAIRS)}"
        )
    off, on = PAIRS[metric]
    return claim(off), claim(on)


def change_percent(metric: str) -> float:
    """The article's change from caching off to on, in %, computed from its two values."""
    off, on = pair(metric)
    return (on / off - 1) * 100


def figure_range(name: str) -> tuple[float, float] | None:
    """The article's figure as a (low, high) range ("16-64" -> (16, 64), "60" -> (60, 60)); None if
    not a number."""
    found = FIGURE.match(claims().loc[name, "value"].strip())
    if not found:
        return None
    low = float(found["low"])
    return low, float(found["high"]) if found["high"] else low


def measured(name: str) -> float | None:
    """The lab's number beside the article's figure, in the row's unit, read from the results table
    the row's `measured` names: the newest full run's (during `make run`, this run's), else the
    canonical run's; None when the row names none."""
    locator = claims().loc[name, "measured"].strip()
    if not locator:
        return None
    found = MEASURED.match(locator)
    if not found:
        raise ValueError(
            f"{name}: `measured` is not results:NAME[column=value&...]/column[*factor]: {locator!r}"
        )
    table = load_latest_full_or_canonical(found["name"])[0]
    for condition in found["where"].split("&"):
        column, _, value = condition.partition("=")
        table = table[table[column.strip()].astype(str) == value.strip()]
    if len(table) != 1:
        raise LookupError(f"{name}: {locator!r} selects {len(table)} rows, not one")
    return float(table[found["column"].strip()].iloc[0]) * float(found["factor"] or 1)


def within(tolerance: str, number: float, figure: tuple[float, float]) -> bool:
    """Whether `number` agrees with the article's `figure` (low, high) within `tolerance`
    (TOLERANCE)."""
    found = TOLERANCE.match(tolerance.strip())
    if not found:
        raise ValueError(f"a tolerance is >=, <= or ±X, not {tolerance!r}")
    low, high = figure
    if found["plus"] is not None:
        return low - float(found["plus"]) <= number <= high + float(found["plus"])
    return number >= low if tolerance.strip() == ">=" else number <= high


def holds(name: str) -> bool:
    """Whether the lab's measured number agrees with the article's figure within the row's
    tolerance."""
    row = claims().loc[name]
    if not row.tolerance.strip() or figure_range(name) is None or measured(name) is None:
        raise ValueError(
            f"{name}: a tolerance check needs a numeric value, a `measured` and a `tolerance`"
        )
    return within(row.tolerance, measured(name), figure_range(name))


def lessons(name: str) -> list[str]:
    """The lesson notebooks a claim's evidence points to, in order (NN_topic stems, from notebook
    and results pointers)."""
    stems = [
        re.match(r"^(notebooks/|results:)(\d\d_[a-z0-9_]+?)(\.ipynb|-|$)", p)
        for p in evidence(name)
    ]
    return list(dict.fromkeys(m[2] for m in stems if m))
