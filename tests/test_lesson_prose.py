"""No number typed by hand in a lesson's prose: a result stands in a cell's output, printed from the run, or in its
check cell, asserted. So a digit in a lesson's markdown (before its exercises, whose problem statements give their
own numbers) must be one of these, and the scan below fails on any other:

- a literal written as code: `32`, `shared_system_tokens`, `1 / (1 - h)` (a parameter, a constant, a formula);
- part of a name, a size or an ordinal: p99, float32, SmolLM2-135M, vLLM V1, 7B, 80GB, Apache-2.0, 1st (a factor
  such as 3.7x or x4.48 is a result, and is not allowed);
- a version, a year, a citation (#2762, CVE-2025-46570, a link), a notebook (05, 11_routing), a section or a list
  number;
- the source article's own figure, as the ledger (data/reference/article_claims.csv) records it, in a paragraph
  that names the article;
- a heading.
"""

import csv
import json
import re

import pytest
from whole_tree import failures

from lab import PROJECT_ROOT
from lab.tools.runner import all_notebooks

pytestmark = pytest.mark.repo  # the repository's content, not behaviour: make check-repo

ALLOWED = [
    r"`[^`]*`",                                   # code: literals, parameters, formulas
    r"\[[^\]]*\]\([^)]*\)", r"https?://\S+",      # links
    r"(?:#|CVE-|GHSA-|arXiv:|vllm==|v)\d[\w.\-]*", r"\b\d+\.\d+\.\d+\b", r"\b(?:19|20)\d\d\b",  # citations, versions
    r"\b\d\d_\w+", r"\b(?:" + "|".join(p.name[:2] for p in all_notebooks()) + r")\b(?=[',’ );:]|\.(?!\d)|$)",  # notebooks
    r"\b(?!x\d)[A-Za-z]+[-.]?\d[\w.\-]*",  # names: p99, float32, SmolLM2-135M, V1 (not a factor: x4.48)
    r"\b\d+(?:\.\d+)?(?:B|M|K|GB|GiB|MB|TB|D|st|nd|rd|th)\b",  # sizes and ordinals: 7B, 80GB, 2D, 1st
    r"1\s*/\s*\(1\s*[−-]\s*[^)]*\)", r"\(1\s*[−-]\s*\*?h\*?\)",  # the bound, in prose
    r"^\s*\d+\.\s", r"\b\dxx\b", r"\b(?:sections?|parts?|steps?) \d+(?:(?:, | and | to )\d+)*",
]


def article_figures() -> set[float]:
    """Each figure of the article as the ledger holds it, and in seconds where it is in milliseconds."""
    figures = set()
    with open(PROJECT_ROOT / "data" / "reference" / "article_claims.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for number in re.findall(r"\d+(?:\.\d+)?", row["value"] or ""):
                figures.add(float(number))
                if row["unit"] == "ms":
                    figures.add(float(number) / 1000)
    return figures


def typed_numbers(markdown: str, figures: set[float]) -> list[str]:
    """The digits of `markdown` that none of the allowed forms explains, each with its context."""
    found = []
    text = re.sub(ALLOWED[0], " ", markdown)  # code spans first: they may run over a line break
    for paragraph in re.split(r"\n\s*\n", text):
        quoting = "article" in paragraph.lower()  # the article's figures stand where the article is named
        for line in paragraph.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for pattern in ALLOWED[1:]:
                line = re.sub(pattern, " ", line)
            for number in re.finditer(r"\d+(?:[.,]\d+)*", line):
                if not (quoting and float(number.group().replace(",", "")) in figures):
                    found.append(line[max(0, number.start() - 40):number.end() + 20].strip())
    return found


def lesson_prose(path) -> str:
    cells = []
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and source.startswith(("## Exercises", "**Exercise")):
            break
        if cell["cell_type"] == "markdown":
            cells.append(source)
    return "\n".join(cells)


def no_typed_result(path) -> None:
    assert typed_numbers(lesson_prose(path), article_figures()) == []


def test_no_result_is_typed_by_hand_in_a_lessons_prose():
    assert failures(no_typed_result, all_notebooks(), lambda p: p.stem) == {}


def test_the_scan_finds_a_typed_result_and_lets_the_allowed_forms_pass():
    figures = {2350.0, 2.35}
    assert typed_numbers("The hit rate was 0.85 here.", figures) == ["The hit rate was 0.85 here."]
    assert typed_numbers("Caching saved 1,234 tokens.", figures) == ["Caching saved 1,234 tokens."]
    assert len(typed_numbers("B came 3.7x sooner, a gain of x4.48.", figures)) == 2, "a factor is a result"
    assert typed_numbers("We measured 2.35 s.", figures) == ["We measured 2.35 s."], "the article's figure, as ours"
    assert typed_numbers("It took 12.5 s, see notebook 13.", figures) == ["It took 12.5 s, see notebook  ."]
    allowed = ("## 3 · Capacity at 2 rates\n`block_size = 32`, p99 TTFT, float32, vLLM V1, a 7B model on 80GB, "
               "PR [#2762](https://github.com/vllm-project/vllm/pull/2762), CVE-2025-46570, vllm==0.3.0, "
               "notebook 05's curve and 11_routing, section 2, 1 / (1 - h).\nThe article's 2.35 s (2350 ms).\n"
               "1. a list item")
    assert typed_numbers(allowed, figures) == []


# A result in words: an order or a comparison ("faster", "loses", "more than"). A lesson's markdown may hold them
# only where they do not conclude: a question, a prediction, a conditional or a bound (a mechanism or a hypothesis),
# or one of the sentences below, each with its reason. Anything else states a result, which belongs in a printed
# line computed from the run (lab.experiments.findings, lab.experiments.verdict).
RESULT_WORDS = (r"\b(faster|slower|sooner|later than|beats?|wins?|loses?|lost|outperform\w*|more than|less than|"
                r"fewer than|higher than|lower than|better than|worse than|cheaper|twice as|half as|doubles?|halves|"
                r"reused (?:less|more)|keeps (?:more|less))\b")
NOT_CONCLUDING = r"\b(if|would|should|could|can|cannot|may|might|at most|at least|expect|predict\w*|whether|which|when)\b"
ALLOWED_COMPARISONS = {
    ("01", "one block fewer than the whole prompt"): "exact by vLLM's rule (the last token is always computed), "
                                                     "asserted in the lesson's check",
    ("08", "every hit loses its prefix's last blocks"): "a prediction's option",
    ("08", "finds the first blocks of each prefix and loses the rest"): "the LRU mechanism, exact by construction",
    ("11", "twice as many tenants as before"): "the workload's design",
    ("11", "evens the requests per replica and loses hits"): "the two pulls the run then weighs (its verdict)",
    ("12", "Twice as many tenants as replicas"): "the workload's design",
    ("12", "differ in more than the skew"): "a limit of the method, stated",
    ("14", "built to lose"): "the workload's design",
    ("17", "caps how much faster the server gets"): "the bound's arithmetic (Amdahl), not a result",
    ("17", "the wait grows faster than linearly"): "a queueing model, labelled as an assumption",
    ("18", "sooner);"): "a column's sign, defined",
    ("18", "shows more than the bound saved more than"): "what a result above the bound would mean, not a result",
    ("19", "need more than one number each"): "the section's plan",
    ("20", "One way to lose all of it"): "the mechanism, shown by the lesson's own file",
    ("23", "recomputing wins at every length"): "the cost model's consequence, derived, not measured",
    ("23", "below `1`, loading was faster"): "how to read the figure's axis",
    ("23", "under the recompute line, loading was faster"): "how to read the figure",
}


def comparisons(markdown: str) -> list[str]:
    """The sentences of `markdown` that state an order or a comparison as a fact (see RESULT_WORDS)."""
    text = "\n".join(line for line in markdown.splitlines() if not line.lstrip().startswith("#"))
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.lstrip().startswith(("**Predict", "**The question")):
            continue
        for sentence in re.split(r"(?<=[.!?:;])\s+", " ".join(paragraph.split())):
            if (re.search(RESULT_WORDS, sentence, re.I) and not sentence.endswith("?")
                    and not re.search(NOT_CONCLUDING, sentence, re.I)):
                found.append(sentence)
    return found


def no_result_in_words(path) -> None:
    lesson = path.name[:2]
    stated = [s for s in comparisons(lesson_prose(path))
              if not any(lesson == n and snippet in s for n, snippet in ALLOWED_COMPARISONS)]
    assert stated == [], "a result in the markdown: print it from the run, or give the allowlist its reason"


def test_no_lesson_states_a_result_in_its_markdown():
    assert failures(no_result_in_words, all_notebooks(), lambda p: p.stem) == {}


def test_the_comparison_scan_finds_a_stated_result_and_lets_questions_and_mechanisms_pass():
    assert comparisons("With the cache, B came back 3 times sooner. Kimi's hour reused less than ours.") == [
        "With the cache, B came back 3 times sooner.", "Kimi's hour reused less than ours."]
    assert comparisons("**Predict, then run.** B will be faster.\n\nWill B come sooner? If the pool is short, a hit "
                       "loses its last blocks. It is at most 1 / (1 - h) faster.\n## Faster than light") == []
