"""What the site is made from: the lessons (``lessons/NN-slug.py``), the assignments (under
``exercises/source/``, their statements without solutions) and the glossary's terms. Read by
``site/hooks.py`` (the nav, the generated pages) and ``site/pages.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import syllabus

SITE = Path(__file__).resolve().parent
REPO = SITE.parent
LESSONS_DIR = REPO / "lessons"
EXERCISES_DIR = REPO / "exercises"
LESSON_GLOB = "[0-9][0-9]-*.py"


@dataclass
class Lesson:
    path: Path
    number: int
    title: str          # the H1 without "Lesson N —"
    markdown: str       # all markdown cells, for the course map and the glossary index

    stem = property(lambda self: self.path.stem)
    src_uri = property(lambda self: f"lessons/{self.path.name}")
    nav_title = property(lambda self: f"{self.number}. {self.title}")


def _percent_markdown(text: str) -> str:
    """The markdown cells of a jupytext percent file, comment marks removed."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("# %%"):
            inside = "[markdown]" in line
            continue
        if inside:
            out.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return "\n".join(out)


def lessons() -> list[Lesson]:
    found = []
    for path in sorted(LESSONS_DIR.glob(LESSON_GLOB)):
        text = path.read_text(encoding="utf-8")
        markdown = _percent_markdown(text)
        h1 = re.search(r"^# (.+)$", markdown, re.MULTILINE)
        title = h1.group(1).strip() if h1 else path.stem
        title = re.sub(r"^Lesson\s+\d+\s*[—–:-]\s*", "", title)
        found.append(Lesson(path, int(path.name[:2]), title, markdown))
    return found


@dataclass
class Assignment:
    name: str                        # folder under exercises/source
    notebook: str                    # notebook file name, e.g. first_kernel.ipynb
    title: str
    statement: list[str]             # markdown cells a learner sees
    release: Path | None             # the student notebook, when it has been released
    lessons: tuple[Lesson, ...] = ()  # those it practises, its own first (grader/syllabus.py)
    # its tasks that wait for a later lesson, in words: "tasks 4 and 5 after lessons 10 and 12"
    later_tasks: str | None = None

    src_uri = property(lambda self: f"exercises/{self.name}.md")
    download_uri = property(lambda self: f"exercises/{self.name}/{self.notebook}")


def _statement_cells(nb: Any, from_source: bool) -> list[str]:
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") or meta.get("grade"):
            continue  # a written answer is a solution in the instructor's copy
        source = cell.source
        if from_source and ("BEGIN SOLUTION" in source or "BEGIN HIDDEN TESTS" in source):
            continue
        cells.append(source)
    return cells


def assignments(ls: list[Lesson] = ()) -> list[Assignment]:
    """Assignments with a notebook under exercises/source/, in folder order, each with the
    lessons of ``ls`` it practises (``grader.syllabus.lessons_of``)."""
    import jupytext  # seconds to import: only reading a notebook needs them
    import nbformat

    found = []
    source_root = EXERCISES_DIR / "source"
    if not source_root.is_dir():
        return found
    for folder in sorted(p for p in source_root.iterdir() if p.is_dir()):
        notebooks = sorted(folder.glob("*.ipynb")) or sorted(folder.glob("*.py"))
        if not notebooks:
            continue
        stem = notebooks[0].stem
        release = EXERCISES_DIR / "release" / folder.name / f"{stem}.ipynb"
        if release.is_file():
            nb, from_source = nbformat.read(release, as_version=4), False
        else:
            release = None
            nb, from_source = jupytext.read(notebooks[0]), True
        cells = _statement_cells(nb, from_source)
        h1 = next((m.group(1).strip() for c in cells
                   if (m := re.search(r"^# (.+)$", c, re.MULTILINE))), folder.name)
        practised = syllabus.lessons_of(folder.name) if folder.name in syllabus.PRACTISES else ()
        found.append(Assignment(folder.name, f"{stem}.ipynb", h1, cells, release,
                                tuple(le for n in practised for le in ls if le.number == n),
                                syllabus.later_tasks(folder.name)))
    return found


@dataclass
class Term:
    name: str
    anchor: str
    pattern: re.Pattern


def glossary_terms() -> list[Term]:
    """The ``## Term {#anchor}`` headings of site/docs/glossary.md."""
    text = (SITE / "docs" / "glossary.md").read_text(encoding="utf-8")
    terms = []
    for m in re.finditer(r"^## (.+?) \{#([\w-]+)\}\s*$", text, re.MULTILINE):
        name = m.group(1).strip()
        words = r"\s+".join(re.escape(w) for w in name.split())
        flags = 0 if any(c.isupper() for c in name[1:]) else re.IGNORECASE
        terms.append(Term(name, m.group(2), re.compile(rf"\b{words}\w*", flags)))
    return terms
