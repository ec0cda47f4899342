"""End to end with real nbgrader: release, collect, autograde (2 workers), feedback, export.

One session-scoped course copy is released and graded once (``course``, tests/grader/conftest.py:
coursetools.graded_course says who submitted what); the tests read its results.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from coursetools import FIRST_TASK

from grader import cli
from grader.logistics import batch as grading
from grader.logistics import build, hidden_tests

REPO = Path(__file__).resolve().parents[3]


def points(root: Path, assignment: str) -> tuple[float, float]:
    """(the assignment's points, its first task's points), from the release notebook's
    nbgrader metadata."""
    (nb_path,) = (root / "release" / assignment).glob("*.ipynb")
    graded = [c.metadata["nbgrader"] for c in nbformat.read(nb_path, as_version=4).cells
              if c.metadata.get("nbgrader", {}).get("grade")]
    first = FIRST_TASK[assignment]
    return (sum(g["points"] for g in graded),
            sum(g["points"] for g in graded
                if g["grade_id"] in (f"{first}_visible", f"{first}_hidden")))


def test_release_has_no_solutions_or_hidden_refs(course):
    rel = course["root"] / "release"
    assert sorted(p.name for p in rel.iterdir()) == sorted(FIRST_TASK)
    assert not list(rel.rglob("*.py"))
    assert not [p for p in rel.rglob("*.npz") if "/hidden/" in str(p)]
    for nb in rel.glob("*/*.ipynb"):
        text = nb.read_text()
        assert "BEGIN SOLUTION" not in text and "hidden=True" not in text


def test_collect_reports_skips(course):
    skipped = dict(course["collected"]["skipped"])
    assert "README.txt" in skipped


def test_instructor_full_marks_blank_zero(course):
    res = course["results"]
    for a in FIRST_TASK:
        assert res[("inst", a)]["status"] == "graded"
        total, _ = points(course["root"], a)
        assert res[("inst", a)]["score"] == res[("inst", a)]["max_score"] == total, a
        assert res[("blank", a)]["status"] == "graded"
        assert res[("blank", a)]["score"] == 0, a


def test_wrong_first_task_loses_its_points(course):
    for a in FIRST_TASK:
        total, first = points(course["root"], a)
        assert first > 0, a
        assert course["results"][("wrong", a)]["score"] == total - first, a


def test_checks_asked_again_get_the_checkers_kept_answer(course):
    """The wrong notebooks are graded after the instructor's (students in order): each check
    whose programs are the instructor's is answered from the checker's kept answer, and the
    first task's, whose programs changed, is run again (it fails: the test above)."""
    for a in FIRST_TASK:
        assert course["results"][("wrong", a)]["checks_from_cache"] > 0, a
    assert course["results"][("blank", "01_first_kernel")]["checks_from_cache"] == 0


def test_numpy_answer_fails_structural_check(course):
    r = course["results"][("numpy", "01_first_kernel")]
    assert r["score"] == 6
    nb = (course["root"] / "autograded" / "numpy" / "01_first_kernel" /
          "first_kernel.ipynb").read_text()
    assert "traced once per case, as jax.jit traces it" in nb  # NumPy cannot trace


def test_malformed_is_reported(course):
    assert course["results"][("junk", "01_first_kernel")]["status"] == "malformed"


def test_feedback_and_export(course, tmp_path):
    root = course["root"]
    files = grading.feedback(root, "01_first_kernel", log=lambda *a: None)
    assert files
    for f in files:  # as a browser reads it (the highlighter splits the tokens into spans)
        assert not hidden_tests.in_page(f.read_text())
    out = grading.export(root, tmp_path / "grades.csv", log=lambda *a: None)
    rows = list(csv.DictReader(out.open()))
    cols = set(rows[0])
    assert {"assignment", "student_id", "score", "max_score", "status"} <= cols
    st = {(r["student_id"], r["assignment"]): r["status"] for r in rows}
    assert st[("junk", "01_first_kernel")] == "malformed"
    assert st[("inst", "01_first_kernel")] == "graded"
    assert st[("numpy", "02_tiling")] == "missing"
    reason = {(r["student_id"], r["assignment"]): r["reason"] for r in rows}
    assert "add_solution" in reason[("loop", "01_first_kernel")]
    assert st[("loop", "01_first_kernel")] == "timeout"
    assert "run of your notebook died" in reason[("dies", "01_first_kernel")]
    assert st[("dies", "01_first_kernel")] == "crashed"
    assert "not a valid notebook" in reason[("junk", "01_first_kernel")]


def test_timeout_and_crash_do_not_stop_the_batch(course):
    res = course["results"]
    loop = res[("loop", "01_first_kernel")]
    assert loop["status"] == "timeout"
    assert "first_kernel.ipynb:add_solution" in loop["detail"]
    # the per-cell timeout fired, not the 900 s one of the whole submission
    assert loop["seconds"] < 120
    dies = res[("dies", "01_first_kernel")]
    assert dies["status"] == "crashed"
    assert dies["detail"].startswith("the grader's run of your notebook died while running "
                                     "add_solution"), dies
    inst = res[("inst", "01_first_kernel")]
    assert inst["status"] == "graded" and inst["score"] == inst["max_score"] == 9


def test_learner_cell_timeout_can_only_be_lowered(tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    def learner_timeout(value):
        os.environ["PALLAS_COURSE_CELL_TIMEOUT"] = value
        try:
            cfg = PyFileConfigLoader("nbgrader_config.py",
                                     path=str(REPO / "exercises")).load_config()
        finally:
            os.environ.pop("PALLAS_COURSE_CELL_TIMEOUT")
        learner = {"metadata": {"timeout": 999, "nbgrader": {"solution": True}}}
        test = {"metadata": {"timeout": 120, "nbgrader": {"grade": True, "locked": True}}}
        return cfg.Execute.timeout_func(learner), cfg.Execute.timeout_func(test)

    assert learner_timeout("5") == (5, 120)
    assert learner_timeout("100000") == (60, 120)
    assert learner_timeout("junk") == (60, 120)


def test_build_rejects_bad_metadata(tmp_path):
    p = tmp_path / "nb.py"
    p.write_text('# %% nbgrader={"grade_id": "x", "grade": true}\n1\n')
    with pytest.raises(build.BuildError, match=re.escape(str(p)) + ".*needs points"):
        build.build_notebook(p)


def test_status_files_are_json(course):
    for p in (course["root"] / "status").rglob("*.json"):
        json.loads(p.read_text())


def _filled_release(course, dest: Path, code_for: dict[str, str] | None = None) -> Path:
    """The released 01_first_kernel folder, solution cells taken from the instructor source."""
    shutil.copytree(course["root"] / "release" / "01_first_kernel", dest)
    src = nbformat.read(course["root"] / "source" / "01_first_kernel" / "first_kernel.ipynb",
                        as_version=4)
    sol = {c.metadata["nbgrader"]["grade_id"]: c.source for c in src.cells
           if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.read(dest / "first_kernel.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if code_for is not None and gid in code_for:
            cell.source = sol[gid] + "\n" + code_for[gid]
        elif gid in sol:
            cell.source = sol[gid]
    nbformat.write(nb, dest / "first_kernel.ipynb")
    return dest / "first_kernel.ipynb"


@pytest.fixture
def learner_env(monkeypatch, tmp_path):
    # a learner's machine: no course root, only the refs/ folder shipped with the assignment
    monkeypatch.setenv("PALLAS_COURSE_ROOT", str(tmp_path / "no-course-here"))
    monkeypatch.delenv("PALLAS_COURSE_REFS", raising=False)


def test_check_instructor_solution_passes(course, tmp_path, capsys, learner_env):
    nb = _filled_release(course, tmp_path / "a1")
    assert cli.main(["check", str(nb)]) == 0
    out = capsys.readouterr().out
    for task in ("add", "elementwise", "leaky_relu"):
        assert f"pass  {task}_visible" in out
    assert "3 passed, 0 failed" in out
    assert "[ok" not in out and "HBM traffic" not in out, out  # a pass is one line
    assert cli.main(["check", "--verbose", str(nb)]) == 0
    out = capsys.readouterr().out
    for task in ("add", "elementwise", "leaky_relu"):
        assert f"{task}: structural check" in out
        assert f"{task}: kernelsim" in out
    assert "[ok  ] pallas_call reached" in out
    assert "HBM traffic" in out


def test_check_blank_fails_and_names_the_task(course, tmp_path, capsys, learner_env):
    shutil.copytree(course["root"] / "release" / "01_first_kernel", tmp_path / "a1")
    assert cli.main(["check", str(tmp_path / "a1" / "first_kernel.ipynb")]) == 1
    out = capsys.readouterr().out
    assert "FAIL  add_visible: CheckFailed: add: not implemented yet" in out
    assert "0 passed, 3 failed" in out
    assert "BEGIN HIDDEN" not in out


def test_check_dead_kernel_fails_the_rest(course, tmp_path, capsys, learner_env):
    nb = _filled_release(course, tmp_path / "a1",
                         {"elementwise_solution": "import os\nos._exit(1)"})
    assert cli.main(["check", str(nb)]) == 1
    out = capsys.readouterr().out
    assert "pass  add_visible" in out
    assert "FAIL  elementwise_visible: not run" in out
    assert "kernel died" in out
    assert "1 passed, 2 failed" in out


def test_the_grading_worker_finds_a_submissions_files_in_time_linear_in_their_count(
        tmp_path, monkeypatch):
    """Issue 52: grading a submission of 2,000 extra files took 27 s, of 6,000 221 s. nbgrader's
    search for a submission's other files (``find_all_files``, in autograde and feedback) listed
    the whole folder once per file and ignore pattern; the grading worker decides by the name.
    Counted in folder listings, not timed: one per folder, whatever the number of files, and
    the same files found as nbgrader's own rule finds."""
    import glob

    import nbgrader.utils as utils

    from grader.logistics import worker

    folder = tmp_path / "submission"
    (folder / "__pycache__").mkdir(parents=True)
    (folder / "__pycache__" / "m.pyc").write_text("")
    for name in [*(f"{i}.txt" for i in range(500)), "a.pyc", ".hidden.ipynb", "nb.ipynb",
                 ".ipynb_checkpoints"]:
        (folder / name).write_text("")
    ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.ipynb"]
    nbgraders = sorted(utils.find_all_files(str(folder), ignore))
    monkeypatch.setattr(utils, "is_ignored", utils.is_ignored)  # undone after the test
    worker.install_linear_ignore()
    listings = []
    real_glob = glob.glob
    monkeypatch.setattr(glob, "glob", lambda *a, **kw: listings.append(a) or real_glob(*a, **kw))
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir",
                        lambda *a: listings.append(a) or real_scandir(*a))
    assert sorted(utils.find_all_files(str(folder), ignore)) == nbgraders
    assert len(listings) <= 2, len(listings)  # the submission and its __pycache__
