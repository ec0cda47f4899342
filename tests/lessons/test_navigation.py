"""Each lesson ends by naming its assignments, as ``grader.syllabus`` has them.

The closing cell of ``lessons/NN-*.py`` links every assignment that practises the lesson, by
its title (the H1 of its notebook) and its notebook in the workspace
(``../exercises/<assignment>/<notebook>.ipynb``, which the site points at the assignment's
page); a lesson no assignment practises says so and links the next assignment. The syllabus
itself must name every assignment there is, each with a lesson that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

from grader import syllabus

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted((REPO / "lessons").glob("[0-9][0-9]-*.py"))
SOURCE = REPO / "exercises" / "source"
LINK = re.compile(r"\[([^\]]+)\]\((\.\./exercises/[^)]+)\)")
NO_ASSIGNMENT = "This lesson has no graded assignment yet."


def _title_and_link(assignment: str) -> tuple[str, str]:
    """The assignment's title (its notebook's H1) and the link a lesson gives it."""
    notebook = next((SOURCE / assignment).glob("*.py"))
    title = re.search(r"^# # (.+)$", notebook.read_text(), re.MULTILINE).group(1).strip()
    return title, f"../exercises/{assignment}/{notebook.stem}.ipynb"


def _closing_links(path: Path) -> tuple[str, dict[str, str]]:
    """The lesson's last cell as one line of text, and its exercise links: href -> text."""
    last = jupytext.read(path).cells[-1]
    assert last.cell_type == "markdown", f"{path.name} ends with a {last.cell_type} cell"
    text = " ".join(last.source.split())
    return text, {href: label for label, href in LINK.findall(text)}


def test_the_syllabus_names_every_assignment_with_a_lesson():
    from grader import tasks  # imports every task module: JAX

    folders = {p.name for p in SOURCE.iterdir() if p.is_dir()}
    assert set(syllabus.PRACTISES) == folders == set(tasks.ASSIGNMENTS)
    numbers = {int(p.name[:2]) for p in LESSONS}
    assert set(syllabus.PRACTISES.values()) <= numbers


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_each_lesson_ends_with_a_link_to_its_assignment(path: Path):
    number = int(path.name[:2])
    text, links = _closing_links(path)
    own = syllabus.assignments_of(number)
    wanted = own or [syllabus.next_assignment(number)]
    expected = dict(_title_and_link(a)[::-1] for a in wanted if a)
    assert links == expected, (f"{path.name}'s last cell links {links}; grader/syllabus.py "
                               f"gives it {expected}")
    assert (NO_ASSIGNMENT in text) == (not own), (
        f"{path.name}: a lesson without an assignment of its own says {NO_ASSIGNMENT!r}, "
        "and only such a lesson")


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_assignment_a_lesson_names_exists(path: Path):
    numbers = {int(a[:2]) for a in syllabus.PRACTISES}
    named = {int(n) for n in re.findall(r"\b[Aa]ssignments? (\d+)\b", path.read_text())}
    assert named <= numbers, f"{path.name} names assignments {sorted(named - numbers)}"


@pytest.mark.parametrize("assignment", sorted(syllabus.LATER_TASKS))
def test_tasks_that_wait_for_a_later_lesson_say_so_where_the_learner_is_sent(assignment: str):
    """Assignment 7's backward tasks need lessons 10 and 12, but lesson 8 sends learners to
    the assignment first: its text and every lesson that links it name those tasks."""
    words = syllabus.later_tasks(assignment)
    notebook = next((SOURCE / assignment).glob("*.py"))
    assert words in " ".join(notebook.read_text().replace("#", " ").split()).lower(), (
        f"{notebook.relative_to(REPO)} must say {words!r} (grader/syllabus.py LATER_TASKS)")
    href = _title_and_link(assignment)[1]
    for path in LESSONS:
        text, links = _closing_links(path)
        if href in links:
            assert words in text.lower(), (
                f"{path.name}'s last cell links {assignment} without saying {words!r}")
