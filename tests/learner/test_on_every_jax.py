"""The learner side on every JAX and Python a student copy installs on: `make test`'s compat run
(Python 3.11 with jax 0.10.2, .venv-compat: Debian 12's python3, a Colab or Kaggle TPU runtime)
runs this file beside kernelsim's suite, and the main run on the course's pinned JAX. It needs
only what a learner's check needs: nbclient, ipykernel and absl-py (.ci/jax_env.py)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["grader.learner.course", "grader.learner.selfcheck",
                                    "grader.learner.check", "grader.tasks", "kernelsim"])
def test_the_learner_side_imports(module):
    assert importlib.import_module(module).__file__.startswith(str(REPO))


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
