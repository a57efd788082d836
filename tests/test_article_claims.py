"""The claims ledger (data/reference/article_claims.csv): every claim has a verdict, a basis and a reason; every pointer
to its evidence resolves to a notebook section, a committed results file, a test, a file of this repository or a
definition in the installed vLLM; no verdict claims more than its evidence can carry; a figure the verdict rests on
is the lab's number within the tolerance the row states; and every cited PR, issue, CVE or paper is a link."""

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from whole_tree import failures

from lab import PROJECT_ROOT
from lab.experiments import article
from lab.experiments.results import CANONICAL_DIR

pytestmark = pytest.mark.repo  # the repository's content, not behaviour: make check-repo

CLAIMS = article.claims()
RUN_POINTER = re.compile(r"^(notebooks/|results:|tests/)")
CITATION = re.compile(r"\b(19|20)\d\d\b|#\d+")  # a year or a PR / issue number
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<url>https?://[^)\s]+)\)")  # [text](https://...)
CITED = re.compile(r"#\d{3,}|\barXiv:\d|\bCVE-\d{4}|\bet al\.")  # a PR / issue, an arXiv paper, a CVE, a paper
NUMBER_DECIDES = ("reproduced", "calibrated")  # verdicts that a figure, when the article gives one, must agree with
# A lesson cited by number (what a renumbering stales): "07 sends", "(08 reads", "16's curves", "(17 and ...)"; not
# "block 16", "16 bits", "0.46", "2,048" or "12.5 req/s".
_NN = r"(?<![\w.,:/#-])(?<!size )(?<!block )(?:0\d|1\d|20)"
BARE_LESSON = re.compile(rf"{_NN}(?='s\b|[),:;]|,? (?:and|or)\b)|(?<=\()(?:0\d|1\d|20)(?= )|{_NN}(?<=0\d)(?![\w.,%-])"
                         r"|^(?:0\d|1\d|20)\b")


def notebook_headings(path) -> set[str]:
    cells = json.loads(path.read_text())["cells"]
    return {line.lstrip("#").strip() for c in cells if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines() if line.startswith("#")}


def defines(path: Path, name: str) -> bool:
    """`name` is a class, function or annotated attribute in the Python file."""
    return path.is_file() and re.search(rf"^\s*(class {re.escape(name)}\b|def {re.escape(name)}\(|{re.escape(name)}:)",
                                        path.read_text(), re.M) is not None


def resolves(pointer: str) -> bool:
    if pointer.startswith("results:"):
        return any(CANONICAL_DIR.glob(f"{pointer.removeprefix('results:')}-*.csv"))
    if pointer.startswith("vllm:"):
        import vllm

        file, _, name = pointer.removeprefix("vllm:").partition("::")
        return bool(name) and defines(Path(vllm.__file__).parent / file, name)
    if "::" in pointer:
        file, test = pointer.split("::")
        return defines(PROJECT_ROOT / file, test) and test.startswith("test_")
    file, _, heading = pointer.partition("#")
    path = PROJECT_ROOT / file
    if not heading:
        return path.is_file()
    return path.suffix == ".ipynb" and path.is_file() and heading in notebook_headings(path)


def test_every_claim_has_a_verdict_a_basis_and_a_reason():
    assert set(CLAIMS.verdict) <= set(article.VERDICTS), set(CLAIMS.verdict) - set(article.VERDICTS)
    assert set(CLAIMS.basis) <= set(article.BASES), set(CLAIMS.basis) - set(article.BASES)
    assert CLAIMS.index.is_unique and len(CLAIMS) >= 70
    no_reason = CLAIMS.index[CLAIMS.reason.str.strip().str.len() < 20].tolist()
    assert not no_reason, f"{no_reason}: say in a line why the verdict is what it is"
    assert not CLAIMS.reason.str.contains("\n").any(), "one line each"


def test_a_reason_cites_a_lesson_by_its_topic_not_its_number():
    """The CSV names a lesson `lesson:topic`; claims() writes its current NN_topic name, so a renumbering of the
    course cannot leave a reason pointing at the wrong lesson, and a topic no notebook has fails loudly."""
    raw = pd.read_csv(article.CLAIMS_CSV, dtype=str, keep_default_na=False).set_index("claim")
    numbered = {name: BARE_LESSON.findall(reason) for name, reason in raw.reason.items() if BARE_LESSON.search(reason)}
    assert not numbered, f"{numbered}: cite a lesson as lesson:topic, not by its number"
    topics = {found["topic"] for reason in raw.reason for found in article.LESSON.finditer(reason)}
    assert topics and topics <= set(article.lesson_names()), topics - set(article.lesson_names())
    assert not CLAIMS.reason.str.contains("lesson:").any(), "claims() shows each lesson under its current name"


def test_a_lesson_topic_becomes_its_current_name_and_a_number_is_caught():
    current = article.lesson_names()["gain_vs_hit_rate"]
    assert article.cite_lessons("on lesson:gain_vs_hit_rate's curves") == f"on {current}'s curves"
    with pytest.raises(KeyError, match="no_such_topic"):
        article.cite_lessons("see lesson:no_such_topic")
    for numbered in ("(08 reads them from the live server)", "07 sends a hot prefix", "on 16's curves",
                     "(15 runs two model sizes)", "(17 and python -m lab.audit)", "(07: half the bytes"):
        assert BARE_LESSON.search(numbered), numbered
    assert not BARE_LESSON.search("at block 16 to 256, at size 16 and 32, in 16 bits, 0.46-0.57, 2,048 tokens, 12.5 req/s")


def pointers_resolve(name) -> None:
    unresolved = [p for p in article.evidence(name) if not resolves(p)]
    assert not unresolved, f"{name}: {unresolved} do not resolve"


def test_each_pointer_resolves():
    assert failures(pointers_resolve, CLAIMS.index) == {}


def verdict_no_stronger_than_basis(name) -> None:
    row, pointers = CLAIMS.loc[name], article.evidence(name)
    runs = [p for p in pointers if RUN_POINTER.match(p)]
    if row.verdict in ("reproduced", "calibrated"):
        assert row.basis == "run" and runs, f"{name} is {row.verdict}: point at the run that shows it"
    if row.verdict == "reproduced":
        independent = [p for p in runs if p not in article.CALIBRATED_EVIDENCE]
        assert independent, f"{name}: its only evidence was built toward the article's number; the verdict is calibrated"
    if row.verdict == "not applicable":
        assert row.basis == "none", f"{name}: a setting rests on nothing"
    if row.verdict in ("corrected", "supported"):
        assert row.basis != "none", f"{name} is {row.verdict}: on what?"
    if row.verdict == "supported":
        assert row.basis != "run", f"{name}: a run here makes it reproduced, not supported"
    if row.basis in ("run", "arithmetic"):
        assert runs, f"{name}: basis {row.basis}, but nothing of this lab's runs is pointed at"
    if row.basis == "vllm source":
        assert any(p.startswith("vllm:") for p in pointers), f"{name}: point at the vLLM definition read"
    if row.basis == "citation":
        assert CITATION.search(row.reason), f"{name}: name the cited source (a year or a PR / issue number)"


def test_the_verdict_is_no_stronger_than_its_basis():
    assert failures(verdict_no_stronger_than_basis, CLAIMS.index) == {}


def test_a_broken_pointer_is_caught():
    assert not resolves("notebooks/00_quickstart.ipynb#No such section")
    assert not resolves("results:no_such_results")
    assert not resolves("tests/test_engine.py::test_that_does_not_exist")
    assert not resolves("vllm:v1/core/kv_cache_utils.py::NoSuchBlock")
    assert not resolves("vllm:v1/core/no_such_file.py::KVCacheBlock")
    assert not resolves("lab/no_such_module.py")
    assert resolves("notebooks/00_quickstart.ipynb#vLLM's own API: one engine, two timed requests")
    assert resolves("vllm:v1/core/kv_cache_utils.py::KVCacheBlock")
    assert resolves("lab/experiments/article.py")


def test_calibrated_evidence_is_what_the_generator_says_it_is():
    from lab.experiments.generators import customer_service

    assert "article" in customer_service.__doc__, "the generator says what it was built toward"
    assert all(CLAIMS.loc[n, "verdict"] != "reproduced" for n in CLAIMS.index
               if set(article.evidence(n)) and set(article.evidence(n)) <= set(article.CALIBRATED_EVIDENCE))


def unlinked_citations(text: str) -> list[str]:
    """The citations in `text` outside a markdown link, and the links whose PR / issue number or arXiv id is not
    the one their address names."""
    wrong = []
    for link in LINK.finditer(text):
        number, paper = re.search(r"#(\d+)", link["text"]), re.search(r"arXiv:(\d{4}\.\d{4,5})", link["text"])
        url = link["url"].rstrip("/")
        if (number and not url.endswith("/" + number[1])) or (paper and not url.endswith("/" + paper[1])):
            wrong.append(link["text"])
    return wrong + CITED.findall(LINK.sub("", text))


def citations_are_links(name) -> None:
    unlinked = unlinked_citations(CLAIMS.loc[name, "context"] + " " + CLAIMS.loc[name, "reason"])
    assert not unlinked, f"{name}: {unlinked}: cite as [owner/repo#N](https://github.com/...) or [Author et al., year](url)"


def test_every_cited_pr_issue_cve_or_paper_is_a_link():
    assert failures(citations_are_links, CLAIMS.index) == {}


def test_an_unlinked_or_mislinked_citation_is_caught():
    assert unlinked_citations("added in PR #2762 (v0.4.0)") == ["#2762"]
    assert unlinked_citations("GPTQ (Frantar et al., 2023)") == ["et al."]
    assert unlinked_citations("see arXiv:2312.07104") == ["arXiv:2"]
    assert unlinked_citations("[vllm-project/vllm#2762](https://github.com/vllm-project/vllm/pull/2614)") == \
        ["vllm-project/vllm#2762"]
    assert unlinked_citations("[Zheng et al., arXiv:2312.07104](https://arxiv.org/abs/2309.06180)") != []
    assert not unlinked_citations("[vllm-project/vllm#2762](https://github.com/vllm-project/vllm/pull/2762) and "
                                  "[Zheng et al., arXiv:2312.07104, 2023](https://arxiv.org/abs/2312.07104)")


def measured_number_is_read_from_results(name) -> None:
    row, locator = CLAIMS.loc[name], article.MEASURED.match(CLAIMS.loc[name, "measured"])
    assert locator, f"{name}: `measured` is results:NAME[column=value&...]/column[*factor]"
    assert f"results:{locator['name']}" in article.evidence(name), f"{name}: point at the results the number is read from"
    assert article.figure_range(name) is not None and row.unit, f"{name}: a lab number stands beside a figure, in its unit"
    assert math.isfinite(article.measured(name))


def test_a_measured_number_is_read_from_a_results_file_the_row_points_to():
    assert failures(measured_number_is_read_from_results, CLAIMS.index[CLAIMS.measured != ""]) == {}


NUMERIC = [n for n in CLAIMS.index if article.figure_range(n) is not None
           and (CLAIMS.loc[n, "verdict"] in NUMBER_DECIDES or CLAIMS.loc[n, "tolerance"])]


def figure_within_tolerance(name) -> None:
    """A reproduced (or calibrated) claim that carries a number must meet it: the lab's measured number, read from
    the canonical results, within the tolerance the row states. A corrected one with a tolerance must miss it."""
    row = CLAIMS.loc[name]
    assert row.tolerance and row.measured, f"{name} is {row.verdict} with a figure: state `measured` and `tolerance`"
    number = article.measured(name)
    if row.verdict in NUMBER_DECIDES:
        assert article.holds(name), f"{name}: the lab measures {number:.4g} {row.unit}, not {row.value} {row.tolerance}"
    else:
        assert row.verdict == "corrected", f"{name}: a tolerance belongs to a verdict a number decides"
        assert not article.holds(name), f"{name} is corrected, yet the lab's {number:.4g} {row.unit} meets the figure"


def test_a_figure_the_verdict_rests_on_is_the_labs_number_within_its_tolerance():
    assert failures(figure_within_tolerance, NUMERIC) == {}


def test_the_tolerance_check_can_fail():
    assert article.within(">=", 94.6, (60, 60)) and not article.within(">=", 13.4, (60, 60))
    assert article.within("±5", 94.65, (98, 98)) and not article.within("±5", 92.9, (98, 98))
    assert article.within("<=", 2.5, (2, 3)) and not article.within("<=", 3.5, (2, 3))
    assert article.within("±0", 32, (16, 64)) and not article.within("±0", 128, (16, 64))
    with pytest.raises(ValueError):
        article.within("about", 1, (1, 1))


def test_a_reproduced_figure_the_lab_misses_is_caught(monkeypatch):
    """The same check on a ledger whose reproduced row asks more than the canonical run measured."""
    tampered = CLAIMS.copy()
    tampered.loc["prompt_share_of_ttft", "value"] = "99"
    monkeypatch.setattr(article, "claims", lambda: tampered)
    assert article.measured("prompt_share_of_ttft") < 99 and not article.holds("prompt_share_of_ttft")
    tampered.loc["prompt_share_of_ttft", "measured"] = "results:03_ttft_breakdown-load[run=nobody]/ttft_ms"
    with pytest.raises(LookupError):
        article.measured("prompt_share_of_ttft")
