"""Every lesson objective is practised by at least one graded task.

``lessons/README.md`` holds the table (lesson, objective, graded tasks); this test reads each
lesson's numbered objectives and checks that the table has a row for each, that the row quotes
the objective as the lesson words it (its start: a row may shorten it), and that every task it
names exists in ``grader.tasks``. Backticked words inside a row's parenthesised notes are code,
not task ids.
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

from grader import tasks

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]-*.py"))
ROW = re.compile(r"^\| (\d\d) \| (\d+)\. (.+?) \| (.+?) \|$")
# Objectives no graded task can check yet, each with the reason and its issue. Their rows
# name no task; the test fails once one does (then drop the entry).
UNGRADED = {
    ("14", 4): "issue 37: no task writes a collective matmul (assignment 13's reduce-scatters "
               "overlap two copies, no compute)",
    ("09", 6): "issue 22: pl.debug_check fires only in a compiled TPU kernel (interpret modes "
               "skip it) and a checkify error is not an output the grader compares",
    ("09", 7): "issue 22: profiling needs a TPU or GPU; the graded run is CPU-only",
    # issue 37: these rows credited tasks that practise a neighbouring skill on the course's
    # own kernels, not the objective (reading a production kernel, choosing a tolerance,
    # writing a paged attention); each row's note names those tasks
    **{("12", k): "issue 37: no task reads, runs or measures a kernel bundled with JAX"
       for k in (1, 2, 3, 4, 5)},
    ("15", 2): "issue 37: no task has the learner predict a quantization error or choose a "
               "tolerance",
    ("15", 4): "issue 37: no task reads JAX's ragged paged attention",
    ("15", 5): "issue 37: no task writes a paged attention",
}


def objectives(path: Path) -> list[str]:
    """The lesson's numbered objectives, in order, as one line each."""
    text = "\n".join(c.source for c in jupytext.read(path).cells if c.cell_type == "markdown")
    block = text[text.index("**Learning objectives.**"):]
    items: list[str] = []
    for line in block.splitlines()[1:]:
        m = re.match(r"(\d+)\. (.*)", line.strip())
        if m:
            items.append(m.group(2))
        elif items and line.strip() and not line.startswith(" "):
            break  # the paragraph after the list
        elif items and line.startswith(" "):
            items[-1] += " " + line.strip()
    return items


def table() -> dict[tuple[str, int], tuple[str, list[str]]]:
    rows = {}
    for line in (LESSONS_DIR / "README.md").read_text().splitlines():
        m = ROW.match(line.strip())
        if m:
            tasks_only = re.sub(r"\([^)]*\)", "", m.group(4))  # notes in parentheses
            rows[(m.group(1), int(m.group(2)))] = (m.group(3),
                                                   re.findall(r"`([^`]+)`", tasks_only))
    return rows


def _words(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_objective_maps_to_a_graded_task(path: Path):
    rows = table()
    found = objectives(path)
    assert found, f"{path.name}: no numbered learning objectives"
    for k, objective in enumerate(found, 1):
        key = (path.name[:2], k)
        assert key in rows, (f"lessons/README.md: no row for lesson {key[0]} objective {k} "
                             f"({objective!r}); add '| {key[0]} | {k}. ... | `task_id` |'")
        quoted, task_ids = rows[key]
        assert _words(objective).startswith(_words(quoted).removesuffix(" ")[:40]), (
            f"lessons/README.md: lesson {key[0]} objective {k} reads {objective!r} in the "
            f"lesson but {quoted!r} in the table")
        if key in UNGRADED:
            assert not task_ids, (f"lesson {key[0]} objective {k} names {task_ids}: drop it "
                                  f"from UNGRADED ({UNGRADED[key]})")
            continue
        assert task_ids, f"lessons/README.md: lesson {key[0]} objective {k} names no task"
        unknown = [t for t in task_ids if t not in tasks.BY_ID]
        assert not unknown, (f"lessons/README.md: lesson {key[0]} objective {k} names "
                             f"{unknown}, not tasks in grader.tasks")
    extra = [k for k in rows if k[0] == path.name[:2] and k[1] > len(found)]
    assert not extra, f"lessons/README.md: rows for objectives {path.name} does not have: {extra}"


def test_the_course_has_its_lessons_and_assignments():
    assert len(LESSONS) >= 12, [p.name for p in LESSONS]
    assert len(tasks.ASSIGNMENTS) >= 9, tasks.ASSIGNMENTS
