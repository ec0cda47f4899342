"""The learner side on every JAX and Python a student copy installs on: `make test`'s compat run
(Python 3.11 with jax 0.10.2, .venv-compat: Debian 12's python3, a Colab or Kaggle TPU runtime)
runs this file beside kernelsim's suite, and the main run on the course's pinned JAX. It needs
only what a learner's check needs: nbclient, ipykernel and absl-py (.ci/jax_env.py)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import nbformat
import pytest

from kernelsim.adapter import SUPPORTED_JAX

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["grader.learner.course", "grader.learner.selfcheck",
                                    "grader.learner.check", "grader.tasks", "kernelsim"])
def test_the_learner_side_imports(module):
    assert importlib.import_module(module).__file__.startswith(str(REPO))


def test_what_is_installed_beside_jax_is_what_the_course_names():
    """pyproject.toml's ``tool.pallas-course.jax-companions``, which a student copy and `make
    test-jax` install with an older JAX, hold where their markers say (on Python 3.11: an
    ml_dtypes that does not take half a second to start in every process that imports JAX)."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    companions = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pallas-course"][
        "jax-companions"]
    for requirement in map(Requirement, companions):
        if requirement.marker is None or requirement.marker.evaluate():
            assert version(requirement.name) in requirement.specifier, requirement


def test_pallas_course_check_passes_a_right_kernel(tmp_path, monkeypatch):
    """`pallas-course check` runs a notebook in a fresh kernel and reads its verdicts."""
    from grader.learner import check

    cells = [nbformat.v4.new_code_cell(source) for source in (
        "import jax\nfrom jax.experimental import pallas as pl\n"
        "from grader.learner import course",
        "def kernel(x_ref, y_ref, o_ref):\n    o_ref[...] = x_ref[...] + y_ref[...]\n"
        "def add(x, y):\n    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct("
        "x.shape, x.dtype), interpret=True)(x, y)",
        'course.check("add", add)')]
    cells[2].metadata["nbgrader"] = {"grade": True, "grade_id": "add_visible", "points": 1}
    notebook = tmp_path / "first_kernel.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), notebook)
    # the kernel imports this checkout's grader, as the copy's kernel imports the copy's
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    said: list[str] = []
    assert check.check_notebook(notebook, log=said.append) == 0, said
    assert "pass  add_visible" in said and said[-1].strip() == "1 passed, 0 failed", said


@pytest.mark.skipif(
    jax.__version__ == SUPPORTED_JAX[-1],
    reason="on the pinned JAX, tests/lessons and tests/grader execute these notebooks")
def test_every_lesson_and_instructor_notebook_runs_on_this_jax(tmp_path):
    """Every lesson and every assignment's instructor notebook (its solutions and visible checks,
    what a learner runs on this JAX) runs to its end here, as on a TPU runtime's:
    bench/on_device.py on the CPU, one process per notebook. A cell may only fail by saying
    which newer release it needs. The hidden checks are left out: they run where grading runs,
    on the course's pinned JAX (tests/grader), and took 60 % of the assignments' CPU time here."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "on_device.py"), "--jobs", "2",
                           "--visible-only", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=1500)
    record = json.loads((tmp_path / "on_device.json").read_text())
    failed = {n["notebook"]: n["error_cells"] or n.get("log_tail", "")[-800:]
              for n in record["notebooks"] if not n["passed"]}
    assert not failed and done.returncode == 0, (failed, done.stdout[-3000:])
    summary = record["summary"]
    assert summary["lessons"] == summary["lessons_passed"] >= 16
    checks = [c for n in record["notebooks"] for c in n["checks"]]
    assert record["hidden_checks"] is False and not [c for c in checks if c["hidden"]]
    assert {n["notebook"] for n in record["notebooks"] if n["checks"]} == {
        n["notebook"] for n in record["notebooks"] if n["kind"] == "exercise"}
    assert summary["checks"] == summary["checks_passed"] + summary["checks_needing_newer_jax"]
