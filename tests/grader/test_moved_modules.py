"""Old names keep working (grader/__init__.py's MOVED and DEPRECATED). A notebook released
before grader/ had rooms (its locked set-up cell reads ``from grader import course`` and
``from grader.calling import ...``), or before grader/grading/ was split into rooms (``from
grader.grading.calling import ...``), still runs: a learner's copy is never rewritten, so the
old names must stay the modules the new names are, in the jail too. A class set up before the
split keeps its course's nbgrader_config.py (deploy/setup-class.sh never replaces it): its old
paths still load the grader's classes, with a warning that names the new ones, and grade."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from coursetools import NB, A, append_to_solution

import grader
from grader.logistics import batch, collect

REPO = Path(__file__).resolve().parents[2]

OLD_SETUP = ("from grader import course\n"
             "from grader.calling import softmax_rows, traced_as_tpu\n"
             "from grader.grading.calling import absmax_scale\n")


def test_a_notebook_released_before_the_rooms_imports_its_modules():
    check = ("import grader.calling as calling, grader.learner.course as new\n"
             "assert course is new and traced_as_tpu is calling.traced_as_tpu\n"
             "assert absmax_scale is calling.absmax_scale\n"
             "assert course.__name__ == 'grader.learner.course'\n"
             "assert course.__spec__.name == 'grader.learner.course'\n")
    out = subprocess.run([sys.executable, "-W", "error", "-c", OLD_SETUP + check],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # no warning: a learner cannot change that cell


def test_old_names_imported_in_the_jail_change_nothing_its_tamper_check_sees():
    """The notebook's process snapshots its modules before learner code runs; a released
    notebook's old names imported after that add modules of the course and replace nothing."""
    probe = ("import grader.calling, grader.learner.course\n"
             "from grader import integrity\n"
             "snapshot = integrity.Snapshot()\n" + OLD_SETUP +
             "print(snapshot.changes())\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def old_config(config: str) -> str:
    """``config`` (a course's nbgrader_config.py) as it read before grader/grading/ was split:
    every moved module by its old name."""
    new_to_old = {new: old for old, new in grader.DEPRECATED.items()}
    return re.sub(r"\bgrader\.\w+\.\w+|\bgrader\.integrity\b",
                  lambda m: new_to_old.get(m[0], m[0]), config)


def test_the_old_config_names_the_old_paths():
    old = old_config((REPO / "exercises" / "nbgrader_config.py").read_text())
    assert "grader.grading.trusted." in old and "from grader.grading.late import" in old
    assert not re.search(r"grader\.(logistics|jail|facts|verdict|gradebook)\b", old)


def test_an_old_course_config_loads_the_same_classes_with_a_warning():
    probe = ("import json, warnings\n"
             "from traitlets.config.loader import PyFileConfigLoader\n"
             "from traitlets.utils.importstring import import_item\n"
             "warnings.simplefilter('always')\n"
             "with warnings.catch_warnings(record=True) as seen:\n"
             "    c = PyFileConfigLoader('nbgrader_config.py', path='.').load_config()\n"
             "names = [n for key in ('sanitize_preprocessors', 'autograde_preprocessors') "
             "for n in c.Autograde[key] if isinstance(n, str)]\n"
             "same = all(import_item(n) is import_item(n.replace('grader.grading.', "
             "'grader.jail.')) for n in names if n.startswith('grader.grading.trusted.'))\n"
             "print(json.dumps({'same': same, 'n': len(names), "
             "'warned': [str(w.message) for w in seen if w.category is FutureWarning]}))\n")
    folder = REPO / "build" / "old-config-probe"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "nbgrader_config.py").write_text(
        old_config((REPO / "exercises" / "nbgrader_config.py").read_text()))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=folder)
    shutil.rmtree(folder, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["same"] and found["n"] >= 2
    assert any("grader.grading.late is grader.gradebook.late" in w and grader.DEPRECATED_UNTIL
               in w for w in found["warned"]), found["warned"]


def test_a_course_set_up_before_the_split_still_grades(released_01, tmp_path):
    """The course folder a class was set up with before the split, its nbgrader_config.py
    naming grader.grading's modules, grades the instructor's notebook, which imports a helper
    by its old name in the jail (as assignments 8 and 12 released before the split do), with
    full marks and nothing reported tampered."""
    root, subs = tmp_path / "course", tmp_path / "subs"
    shutil.copytree(released_01, root)
    config = root / "nbgrader_config.py"
    config.write_text(old_config(config.read_text()))
    assert "grader.grading.trusted." in config.read_text()
    (subs / "inst" / A).mkdir(parents=True)
    nb = append_to_solution(nbformat.read(root / "source" / A / NB, as_version=4),
                            "add_solution", "from grader.grading.calling import traced_as_tpu\n")
    nbformat.write(nb, subs / "inst" / A / NB)
    collect.collect(root, subs, log=lambda *a: None)
    (graded,) = batch.autograde(root, A, workers=1, progress=None, log=lambda *a: None)
    assert graded["status"] == "graded", graded
    assert graded["score"] == graded["max_score"] > 0, graded
