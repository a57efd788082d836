"""The claims ledger (data/reference/article_claims.csv): every claim of the article has a verdict, and every
pointer to its evidence resolves to a notebook section, a committed results file or a test."""

import json
import re

import pytest

from lab import PROJECT_ROOT
from lab.experiments import article
from lab.experiments.results import CANONICAL_DIR

CLAIMS = article.claims()


def notebook_headings(path) -> set[str]:
    cells = json.loads(path.read_text())["cells"]
    return {line.lstrip("#").strip() for c in cells if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines() if line.startswith("#")}


def resolves(pointer: str) -> bool:
    if pointer.startswith("results:"):
        return any(CANONICAL_DIR.glob(f"{pointer.removeprefix('results:')}-*.csv"))
    if "::" in pointer:
        file, test = pointer.split("::")
        path = PROJECT_ROOT / file
        return path.is_file() and re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.M) is not None
    file, _, heading = pointer.partition("#")
    path = PROJECT_ROOT / file
    return path.suffix == ".ipynb" and path.is_file() and heading in notebook_headings(path)


def test_every_claim_has_a_verdict():
    assert set(CLAIMS.verdict) <= set(article.VERDICTS), set(CLAIMS.verdict) - set(article.VERDICTS)
    assert CLAIMS.index.is_unique and len(CLAIMS) >= 40


@pytest.mark.parametrize("name", CLAIMS.index)
def test_each_pointer_resolves(name):
    pointers = article.evidence(name)
    if CLAIMS.loc[name, "verdict"] in ("reproduced", "corrected"):
        assert pointers, f"{name} is {CLAIMS.loc[name, 'verdict']}: say where the evidence is"
    unresolved = [p for p in pointers if not resolves(p)]
    assert not unresolved, f"{name}: {unresolved} do not resolve"


def test_a_broken_pointer_is_caught():
    assert not resolves("notebooks/00_quickstart.ipynb#No such section")
    assert not resolves("results:no_such_results")
    assert not resolves("tests/test_engine.py::test_that_does_not_exist")
    assert resolves("notebooks/00_quickstart.ipynb#Send A, then B")
