"""lab.tools.course_map: the map's tracks are the lessons' own titles, questions and needs; a lesson needs only
earlier lessons, and every earlier lesson it cites before "What it shows" is among what it needs."""

import json
import re

import pytest

from lab.tools import course_map
from lab.tools.runner import all_notebooks

pytestmark = pytest.mark.repo  # the repository's content: make check-repo


def cited_before_what_it_shows(path) -> set[str]:
    """The earlier lessons a lesson's prose cites (`notebook 05`, `[05](...)`, `05_cache_on_vs_off`, `(05)`)."""
    cited = set()
    for cell in json.loads(path.read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith(("## What it shows", "## Exercises", "**Exercise")):
            break
        if cell["cell_type"] == "markdown":
            text = text.split("*Needs first:*")[-1].split("\n", 1)[-1] if "*Needs first:*" in text else text
            cited |= {n for groups in re.findall(r"(?:notebooks?|lessons?|\[)\s*(\d\d)\b|\((\d\d)[),]|\b(\d\d)_[a-z]",
                                                 text) for n in groups if n}
    return {n for n in cited if n < path.name[:2]}


def test_the_map_is_what_the_lessons_render():
    assert course_map.write(check=True), "docs/COURSE_MAP.md: run python -m lab.tools.course_map"


def test_every_lesson_is_on_one_track_and_needs_only_earlier_tracks():
    by_number = course_map.lessons()
    placed = [n for _, _, numbers in course_map.TRACKS for n in numbers]
    assert sorted(placed) == sorted(by_number), "each lesson on exactly one track"
    for number, lesson in by_number.items():
        assert all(need < number for need in lesson.needs), f"{number} needs a later lesson: {lesson.needs}"
        assert all(placed.index(need) < placed.index(number) for need in lesson.needs), f"{number}: track order"


def test_a_lesson_needs_every_earlier_lesson_it_cites():
    by_number = course_map.lessons()
    missing = {p.stem: sorted(cited_before_what_it_shows(p) - course_map.closure(p.name[:2], by_number))
               for p in all_notebooks()}
    assert {k: v for k, v in missing.items() if v} == {}


def test_a_lesson_without_its_needs_line_is_named(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · A lesson\n\n**The question.** Why?")])
    nbformat.write(nb, tmp_path / "99_a_lesson.ipynb")
    with pytest.raises(ValueError, match=r"99_a_lesson.ipynb: .*'\*Needs first:\*' line"):
        course_map.read_lesson(tmp_path / "99_a_lesson.ipynb")
