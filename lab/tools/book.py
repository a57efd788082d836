"""`make book`: the reader's edition as a static site, built offline from the executed lessons (no
re-execution).

    python -m lab.tools.book [--out site]

Stages the sources under book/ (ignored by git): the course map as the home page, the glossary, the
results page, and every executed lesson in docs/lessons/ (the canonical run's, each with its
banner). Links between them are rewritten to the site's pages, then MkDocs (Material theme,
mkdocs-jupyter for the notebooks, built-in search) builds the site into `--out`. MkDocs runs from
its own environment (`.venv-book`, requirements-lock-book.txt): the book's tools never touch the lab's
locked packages.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

from lab import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
STAGE = PROJECT_ROOT / "book"
MKDOCS = PROJECT_ROOT / ".venv-book" / "bin" / "mkdocs"
PAGES = {"index.md": "COURSE_MAP.md", "glossary.md": "GLOSSARY.md", "results.md": "RESULTS.md"}
LESSON_LINK = re.compile(r"\((?:\.\./)?(?:notebooks|docs/lessons|lessons)/(\d\d_\w+)\.ipynb\)")


def site_links(markdown: str) -> str:
    """A doc's links as the site has them: a lesson (notebooks/ or docs/lessons/) to its page, a doc
    to its page."""
    markdown = LESSON_LINK.sub(r"(lessons/\1.ipynb)", markdown)
    for page, doc in PAGES.items():
        markdown = markdown.replace(f"]({doc})", f"]({page})")
    return markdown.replace("](../figures/", "](figures/").replace("](lessons/)", "](index.md)")


def lesson_title(path: Path) -> str:
    import nbformat

    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown" and cell.source.startswith("# "):
            return cell.source.splitlines()[0][2:].strip()
    return path.stem


def config(lessons: list[Path]) -> str:
    nav = "\n".join(
        f"      - '{lesson_title(p).replace(chr(39), chr(39) * 2)}': lessons/{p.name}"
        for p in lessons
    )
    return f"""site_name: Prefix Cache Lab
site_description: vLLM's prefix caching and what it does to time to first token, measured on the real engine
docs_dir: src
theme:
  name: material
  font: false  # the system's fonts: the site loads nothing from elsewhere
  features: [navigation.sections, navigation.top, search.highlight]
plugins:
  - search
  - mkdocs-jupyter:
      execute: false
      include_source: false
      ignore_h1_titles: true
nav:
  - 'The course': index.md
  - 'Lessons':
{nav}
  - 'Glossary': glossary.md
  - 'Results': results.md
"""


def stage() -> Path:
    """The site's sources under book/src: the docs with site links, the executed lessons, the
    figures they show."""
    src = STAGE / "src"
    shutil.rmtree(STAGE, ignore_errors=True)
    (src / "lessons").mkdir(parents=True)
    lessons = sorted((DOCS / "lessons").glob("[0-9][0-9]_*.ipynb"))
    if not lessons:
        raise SystemExit(
            "no executed lessons in docs/lessons/: `make run` (or make promote after a full run) first"
        )
    for page, doc in PAGES.items():
        (src / page).write_text(
            site_links((DOCS / doc).read_text(encoding="utf-8")), encoding="utf-8"
        )
    for lesson in lessons:
        shutil.copy(lesson, src / "lessons" / lesson.name)
    shutil.copytree(
        PROJECT_ROOT / "figures", src / "figures", ignore=shutil.ignore_patterns("*.html")
    )
    (STAGE / "mkdocs.yml").write_text(config(lessons), encoding="utf-8")
    return STAGE / "mkdocs.yml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.tools.book", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=PROJECT_ROOT / "site", help="the site's folder (default: site/)"
    )
    args = parser.parse_args(argv)
    if not MKDOCS.is_file():
        raise SystemExit(
            f"{MKDOCS} is missing: `make book` installs it (requirements-lock-book.txt into .venv-book)"
        )
    mkdocs_yml = stage()
    subprocess.run(
        [
            str(MKDOCS),
            "build",
            "--quiet",
            "--strict",
            "-f",
            str(mkdocs_yml),
            "-d",
            str(args.out.resolve()),
        ],
        check=True,
    )
    print(f"the book: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
