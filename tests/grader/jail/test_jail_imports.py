"""The grader's own modules are not importable in the grader's run of a notebook (issue 25).

Threat model (exercises/README.md): learner code runs with every power Python gives inside the
notebook's process. Had that process the tasks (references, the tuning task's block search,
the byte counts a prediction is judged against) or the verdict, a cell could compute an answer
with them. Its ``grader/`` is a view (``trusted.notebook_view``) holding the harness and what
it imports; every other module is a file that raises ``ImportError`` saying why. Tested here:
what the harness loads, what the view holds, what a cell in the real jail gets, and whole
submissions through the real grading path (assignments 01, 04 and 06): the instructor's
notebooks keep full marks, answers computed with the grader's code lose their task's points,
and each outcome has a status and a reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from coursetools import JAIL_ATTACKS as ATTACKS
from test_replay import _fresh, _verdict

from grader import rooms
from grader.jail import sandbox, trusted
from grader.verdict import refs

REPO = refs.REPO
# modules a cell could answer with, or that decide: never in the notebook's process
GRADERS_OWN = ("tasks", "verdict.verdict", "facts.work", "facts.gpu_facts",
               "facts.fingerprint", "logistics.batch", "jail.checker", "learner.selfcheck",
               "jail.trusted", "verdict.messages", "jail.sandbox")
REFUSED = "is the grader's own code"


def test_the_harness_loads_no_grader_module_outside_the_view():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, grader.jail.replay\n"
         "print(' '.join(sorted(m for m in sys.modules if m.startswith('grader'))))"],
        cwd=REPO, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert loaded <= {"grader", *(f"grader.{m}" for m in trusted.NOTEBOOK_MODULES)}, loaded
    assert not set(GRADERS_OWN) & set(trusted.NOTEBOOK_MODULES), trusted.NOTEBOOK_MODULES
    assert {"learner.course", "calling", "jail.replay"} <= set(trusted.NOTEBOOK_MODULES)


def test_the_view_holds_the_harness_and_refusals(tmp_path):
    view = trusted.notebook_view(tmp_path / "grader")
    for name in trusted.NOTEBOOK_MODULES:
        rel = name.replace(".", "/") + ("/__init__.py" if name in rooms.ROOMS else ".py")
        assert (view / rel).read_bytes() == (REPO / "grader" / rel).read_bytes()
    # no package but the rooms: tasks/ is one refusal
    assert not [p for p in view.iterdir() if p.is_dir() and p.name not in rooms.ROOMS]
    for name in GRADERS_OWN:
        path = name.replace(".", "/")
        with pytest.raises(ImportError, match=f"grader.{name} {REFUSED}"):
            exec(compile((view / f"{path}.py").read_text(), name, "exec"), {})  # noqa: S102


def test_preflight_names_a_view_the_harness_cannot_start_in(monkeypatch):
    if sandbox.isolation() != "jail":
        pytest.skip("the view needs the jail")
    monkeypatch.setattr(trusted, "NOTEBOOK_MODULES",
                        tuple(m for m in trusted.NOTEBOOK_MODULES if m != "jail.wire"))
    why = trusted.preflight(trusted.TrustedExecute().limits())
    assert "cannot import the course" in why and f"grader.jail.wire {REFUSED}" in why, why


# what a cell tries in the jail: each import, the source files, and what is loaded already
PROBE = ("import importlib, os, sys\nfor _m in ('grader.tasks', 'grader.tasks.a06_performance',"
         " 'grader.tasks.a04_memory_spaces', 'grader.verdict.verdict', 'grader.facts.work',"
         " 'grader.logistics.batch', 'grader.jail.checker', 'grader.learner.selfcheck',"
         " 'kernelsim', 'grader.calling'):\n"
         "    try:\n        importlib.import_module(_m)\n        print('IMPORTED', _m)\n"
         "    except ImportError as e:\n        print('REFUSED', _m, e)\n"
         "print('FILE', os.path.exists(os.path.join(os.path.dirname(importlib.import_module("
         "'grader.learner.course').__file__), '..', 'tasks', 'a06_performance.py')))\n"
         "print('LOADED', sorted(m for m in sys.modules if m.startswith('grader.t')))\n")


def test_a_cell_in_the_jail_gets_import_error_and_the_honest_add_still_passes(slot):
    got, loaded = _fresh(slot, PROBE)
    text = "".join(str(p.get("text", "")) for pieces in got.outputs.values() for p in pieces)
    for name in ("grader.tasks", "grader.verdict.verdict", "grader.facts.work",
                 "grader.logistics.batch", "grader.jail.checker", "grader.learner.selfcheck"):
        assert f"REFUSED {name} {name} {REFUSED}" in text, text
    for name in ("grader.tasks.a06_performance", "grader.tasks.a04_memory_spaces"):
        assert f"REFUSED {name} grader.tasks {REFUSED}" in text, text
    assert "IMPORTED kernelsim" in text and "IMPORTED grader.calling" in text, text
    assert "FILE False" in text and "LOADED []" in text, text
    assert (got.tampered, got.died) == ([], None)
    assert _verdict(got, loaded).passed


# ----------------------------------------------------------------------------- graded whole
# ATTACKS (coursetools.JAIL_ATTACKS), student: (assignment, the task it attacks, what is added
# to that task's solution cell): the grader's block search, its byte count, a task's reference
ASSIGNMENTS = ("01_first_kernel", "04_memory_spaces", "06_performance")


def _notebook(root: Path, assignment: str):
    (path,) = (root / "source" / assignment).glob("*.ipynb")
    return path, nbformat.read(path, as_version=4)


def _points(nb, task: str | None = None) -> float:
    graded = [c.metadata["nbgrader"] for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade")]
    return sum(g["points"] for g in graded
               if task is None or g["grade_id"] in (f"{task}_visible", f"{task}_hidden"))


@pytest.fixture(scope="module")
def graded(course):
    """The session's graded course (tests/grader/conftest.py): the instructor's notebooks of
    every assignment and the ATTACKS were graded in its one batch, as a class's would be."""
    return course["root"], course["results"]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_instructor_notebook_keeps_full_marks(graded, assignment):
    root, results = graded
    r = results[("inst", assignment)]
    full = _points(_notebook(root, assignment)[1])
    assert (r["status"], r["score"], r["max_score"]) == ("graded", full, full), r


@pytest.mark.parametrize("student", sorted(ATTACKS))
def test_an_answer_from_the_grader_s_code_loses_its_task(graded, student):
    root, results = graded
    assignment, task, _ = ATTACKS[student]
    r = results[(student, assignment)]
    nb = _notebook(root, assignment)[1]
    assert (r["status"], r["score"]) == ("graded", _points(nb) - _points(nb, task)), r
    # the reason, in the graded notebook the feedback is made from: the check's error
    (path,) = (root / "autograded" / student / assignment).glob("*.ipynb")
    assert f"ImportError: grader.tasks {REFUSED}" in path.read_text()
