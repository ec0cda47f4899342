"""Every lesson executes top to bottom on the CPU, and every lesson has the parts a reader needs.

Execution: the site build's own path (``grader.website.site.prerender_lessons``: mkdocs-jupyter runs
each lesson with the ``python3`` kernel in ``lessons/``, so ``import _course`` works, and keeps
it in its cache, where the site tests' build finds it). Every lesson executes here, even when
the cache or the shipped pages (site/executed/) hold it. A failing cell fails the lesson's test
with the cell's source and traceback.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import jupytext
import pytest

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]-*.py"))
IDS = [p.stem for p in LESSONS]


def test_lessons_are_numbered_without_gaps():
    assert len(LESSONS) >= 8, IDS
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, len(LESSONS) + 1)], IDS


def _markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


@pytest.mark.parametrize("path", LESSONS, ids=IDS)
def test_lesson_structure(path: Path):
    nb = jupytext.read(path)
    text = _markdown(nb)
    assert path.read_text().startswith("# ---\n# jupyter:"), f"{path.name}: no jupytext header"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", path.name
    title = next((line for line in text.splitlines() if line.startswith("# ")), "")
    assert title and "`" not in title, \
        f"{path.name}: the H1 {title!r} holds code; the site's page title drops code spans"
    assert "**Learning objectives.**" in text, f"{path.name}: no learning objectives"
    assert text.find("**Learning objectives.**") < text.find("##"), \
        f"{path.name}: learning objectives must come first"
    assert "## Check yourself" in text, f"{path.name}: no 'Check yourself' section"
    tail = text[text.find("## Check yourself"):]
    assert "<details><summary>Answer</summary>" in tail and "</details>" in tail, \
        f"{path.name}: 'Check yourself' needs a collapsible answer block"
    assert re.search(r"https://docs\.jax\.dev/en/latest/pallas/", text), \
        f"{path.name}: no link to the JAX Pallas docs"
    assert "../exercises/" in text, f"{path.name}: no link to the exercises"
    assert any(c.cell_type == "code" for c in nb.cells), path.name


@pytest.fixture(scope="session")
def lesson_runs():
    """Every lesson executed once, as the site build executes it (into mkdocs-jupyter's cache,
    one process per CPU): the site tests' build then finds them there."""
    from grader.website import site

    return site.prerender_lessons(fresh=True)


@pytest.mark.parametrize("path", LESSONS, ids=IDS)
def test_lesson_executes(path: Path, lesson_runs, record_property):
    run = lesson_runs[path.name]
    record_property("seconds", run.seconds)
    print(f"{path.name}: executed in {run.seconds:.1f} s", file=sys.stderr)
    if run.error:
        pytest.fail(f"{path.name} failed:\n{run.error}", pytrace=False)
    assert run.source == "executed", f"{path.name} was not executed but taken from {run.source}"


@pytest.fixture(scope="session")
def lesson_pages():
    """mkdocs-jupyter as the site build has it: where each executed lesson's page is."""
    from grader.website import site

    return site.lesson_pages_config()[1]


@pytest.mark.parametrize("path", LESSONS, ids=IDS)
def test_lesson_figures_are_readable(path: Path, lesson_runs, lesson_pages, course):
    """No figure a lesson shows has overlapping, clipped or faint text: executed, a lesson
    prints ``_course.UNREADABLE_MARK`` and what to change under each figure that has
    (``kernelsim.views.readability.unreadable_text``)."""
    from grader.website import site

    if lesson_runs[path.name].error:
        pytest.skip("the lesson failed: test_lesson_executes says where")
    page = json.loads(site.lesson_cache_file(lesson_pages, path.name).read_text())["content"]
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    marks = [line.strip() for line in text.splitlines() if course.UNREADABLE_MARK in line]
    assert not marks, f"{path.name}:\n" + "\n".join(marks)


FIGSIZE = re.compile(r"figsize=\((?P<width>[0-9.]+)")
FONTSIZE = re.compile(r"fontsize=(?P<size>[0-9.]+)")


@pytest.mark.parametrize("path", LESSONS, ids=IDS)
def test_lesson_figures_follow_the_figure_rules(path: Path):
    """A lesson's own figures are no wider than kernelsim's (the site shows them unscaled) and
    have no text below kernelsim's smallest size; ``_course`` sets both as the defaults, so a
    lesson only breaks them by naming a number."""
    from kernelsim.views.figure import FONT, WIDTH

    source = path.read_text()
    wide = [m.group(0) for m in FIGSIZE.finditer(source) if float(m.group("width")) > WIDTH]
    small = [m.group(0) for m in FONTSIZE.finditer(source) if float(m.group("size")) < FONT]
    assert not wide, f"{path.name}: figures wider than {WIDTH} in: {wide} (use " \
        "_course.FIGURE_WIDTH)"
    assert not small, f"{path.name}: text below {FONT} pt: {small} (leave the size to _course)"
