"""The glossary points at the lessons as they ran, and each term's lesson uses the term."""

import re

import nbformat
import pytest

from lab import PROJECT_ROOT
from lab.tools.runner import NOTEBOOKS_DIR

GLOSSARY = PROJECT_ROOT / "docs" / "GLOSSARY.md"
ENTRY = re.compile(r"^- \*\*(.+?)\*\*(.*?)(?=^- \*\*|^#|\Z)", flags=re.MULTILINE | re.DOTALL)
LESSON_LINK = re.compile(r"\]\(([^)]*?)(\d\d_\w+)\.ipynb\)")


def entries() -> list[tuple[str, str]]:
    return ENTRY.findall(GLOSSARY.read_text())


def names(term: str) -> list[str]:
    """The names a term goes by: `A / B`, `A, B`, `A (B)` and `A and B` are each two; quotes and a leading article
    dropped. `KV events` -> ['kv events']."""
    spelled = re.sub(r"\s*\((.*?)\)", r", \1", term)
    parts = re.split(r" / |, and |, | and ", spelled)
    return [re.sub(r"^(the|a) ", "", part.strip().strip("`"), flags=re.IGNORECASE).strip("`").lower()
            for part in parts if part.strip()]


def uses(lesson_text: str, term: str) -> bool:
    """The lesson says one of the term's names, or a word starting as the first word of one does (`chunked prefill`:
    a lesson about chunks)."""
    return any(name in lesson_text or re.search(rf"\b{re.escape(name.split()[0][:5])}", lesson_text)
               for name in names(term))


def test_a_terms_names_are_read_from_how_it_is_written():
    assert names("K/V (keys and values)") == ["k/v", "keys", "values"]
    assert names("`num_cached_tokens` / `cached_tokens`") == ["num_cached_tokens", "cached_tokens"]
    assert uses("a long prompt runs in several chunks", "Chunked prefill")
    assert not uses("nothing about it here", "Radix tree cache")


@pytest.mark.repo
def test_every_term_links_the_executed_copy_of_a_lesson_that_uses_it():
    texts = {path.stem: " ".join(c.source for c in nbformat.read(path, as_version=4).cells).lower()
             for path in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")}
    wrong, unused = [], []
    for term, body in entries():
        for folder, lesson in LESSON_LINK.findall(body):
            if folder != "lessons/" or not (PROJECT_ROOT / "docs" / "lessons" / f"{lesson}.ipynb").is_file():
                wrong.append(f"{term}: ({folder}{lesson}.ipynb)")
            elif not uses(texts[lesson], term):
                unused.append(f"{term}: {lesson}")
    assert len(entries()) > 50
    assert wrong == [], "a term's link should open the executed copy: (lessons/NN_name.ipynb)"
    assert unused == [], "these lessons never use the term they are cited for"
