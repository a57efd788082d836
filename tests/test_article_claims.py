"""The claims ledger (data/reference/article_claims.csv): every claim has a verdict, a basis and a reason; every pointer
to its evidence resolves to a notebook section, a committed results file, a test, a file of this repository or a
definition in the installed vLLM; and no verdict claims more than its evidence can carry."""

import json
import re
from pathlib import Path

import pytest

from lab import PROJECT_ROOT
from lab.experiments import article
from lab.experiments.results import CANONICAL_DIR

CLAIMS = article.claims()
RUN_POINTER = re.compile(r"^(notebooks/|results:|tests/)")
CITATION = re.compile(r"\b(19|20)\d\d\b|#\d+")  # a year or a PR / issue number


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
    assert CLAIMS.index.is_unique and len(CLAIMS) >= 55
    no_reason = CLAIMS.index[CLAIMS.reason.str.strip().str.len() < 20].tolist()
    assert not no_reason, f"{no_reason}: say in a line why the verdict is what it is"
    assert not CLAIMS.reason.str.contains("\n").any(), "one line each"


@pytest.mark.parametrize("name", CLAIMS.index)
def test_each_pointer_resolves(name):
    unresolved = [p for p in article.evidence(name) if not resolves(p)]
    assert not unresolved, f"{name}: {unresolved} do not resolve"


@pytest.mark.parametrize("name", CLAIMS.index)
def test_the_verdict_is_no_stronger_than_its_basis(name):
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


def test_a_broken_pointer_is_caught():
    assert not resolves("notebooks/00_quickstart.ipynb#No such section")
    assert not resolves("results:no_such_results")
    assert not resolves("tests/test_engine.py::test_that_does_not_exist")
    assert not resolves("vllm:v1/core/kv_cache_utils.py::NoSuchBlock")
    assert not resolves("vllm:v1/core/no_such_file.py::KVCacheBlock")
    assert not resolves("lab/no_such_module.py")
    assert resolves("notebooks/00_quickstart.ipynb#Send A, then B")
    assert resolves("vllm:v1/core/kv_cache_utils.py::KVCacheBlock")
    assert resolves("lab/experiments/article.py")


def test_calibrated_evidence_is_what_the_generator_says_it_is():
    from lab.experiments.generators import customer_service

    assert "article" in customer_service.__doc__, "the generator says what it was built toward"
    assert all(CLAIMS.loc[n, "verdict"] != "reproduced" for n in CLAIMS.index
               if set(article.evidence(n)) and set(article.evidence(n)) <= set(article.CALIBRATED_EVIDENCE))
