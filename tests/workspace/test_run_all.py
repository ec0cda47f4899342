"""A learner's Restart-and-Run-All checks every task: a failing check shows its message as the
cell's error output without stopping the run, and the notebook's last cell sums up what passed
and failed. (The grader's run is unchanged: there ``course.check`` does nothing,
tests/grader.)"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jupytext
import nbclient
import nbformat
import pytest

from grader.learner import course
from grader.logistics.hidden_tests import HIDDEN_RE

REPO = Path(__file__).resolve().parents[2]

WRONG_ADD = '''def add(x, y):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] - y_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET
    )(x, y)
'''


def test_run_all_checks_every_task_and_sums_up(full_course, tmp_path):
    folder = tmp_path / "01_first_kernel"
    shutil.copytree(full_course / "release" / "01_first_kernel", folder)
    # the learner's notebook: tasks 2 and 3 solved (the instructor's solutions), task 1 wrong
    nb = jupytext.read(full_course / "source" / "01_first_kernel" / "first_kernel.py")
    for cell in nb.cells:
        cell.source = HIDDEN_RE.sub("", cell.source)
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "add_solution":
            cell.source = WRONG_ADD
    # as JupyterLab's Run All: stop at the first cell whose execution fails
    client = nbclient.NotebookClient(nb, timeout=300, allow_errors=False,
                                     kernel_name="python3",
                                     resources={"metadata": {"path": str(folder)}})
    client.execute()  # raises CellExecutionError if a check stopped the run

    def outputs(grade_id):
        return next(c.outputs for c in nb.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)

    errors = [o for o in outputs("add_visible") if o.output_type == "error"]
    assert errors and errors[0].ename == "CheckFailed", outputs("add_visible")
    assert "add: wrong values" in errors[0].evalue
    for task in ("elementwise", "leaky_relu"):
        text = "".join(o.get("text", "") for o in outputs(f"{task}_visible"))
        assert re.search(rf"{task}: \d+ visible case\(s\) passed", text), text
    summary = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "2 of 3 task(s) passed" in summary, summary
    assert "FAIL         add: wrong values" in summary, summary
    assert "pass         elementwise" in summary and "pass         leaky_relu" in summary
    nbformat.validate(nb)


def test_outside_a_kernel_a_failed_check_raises():
    """Scripts and tests see the failure as an exception, as before."""
    import jax
    from jax.experimental import pallas as pl

    def add(x, y):
        return pl.pallas_call(lambda x_ref, y_ref, o_ref: None,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x, y)

    with pytest.raises(course.CheckFailed, match="add: wrong values"):
        course.check("add", add)


# the assignments whose notebooks show kernelsim's view of a task's kernel after its checks
VIEWS = {"12_kernel_api": ["softmax_in_parts", "matmul_bias_relu_cores"],
         "13_across_chips": ["ring_reduce_scatter", "bidirectional_reduce_scatter",
                             "two_slot_reduce_scatter", "ring_all_reduce"],
         "14_production_kernels": ["int8_matmul_per_channel", "w8a8_matmul", "kv_cache_append"]}


@pytest.mark.parametrize("assignment", sorted(VIEWS))
def test_a_blank_notebook_runs_to_its_summary(full_course, tmp_path, assignment):
    """A released notebook with no task written: Run All reaches the summary, which names the
    tasks still to write (a "what kernelsim sees" cell of a stub stopped the run, issue 50), and
    `pallas-course check` names them too, with no error before the checks."""
    from grader.learner import check

    folder = tmp_path / assignment
    shutil.copytree(full_course / "release" / assignment, folder)
    path = next(folder.glob("*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, allow_errors=False,
                                     kernel_name="python3",
                                     resources={"metadata": {"path": str(folder)}})
    client.execute()  # raises CellExecutionError if a cell stopped the run
    summary = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert f"still to write: {', '.join(VIEWS[assignment])}" in summary, summary
    for task in VIEWS[assignment]:
        assert f"to write     {task}:" in summary, summary
    lines: list[str] = []
    assert check.check_notebook(path, log=lines.append) == 1
    out = "\n".join(lines)
    assert "ERROR in cell" not in out and "not run" not in out, out
    assert lines[-1].endswith(f"still to write: {', '.join(VIEWS[assignment])}"), out


def test_the_ring_views_label_each_copy_with_the_ring_step_that_starts_it(tmp_path):
    """Assignment 13's views of the instructor's rings: every copy labelled with its step of
    the ring (they all said "step 0", the kernel's one grid step, issue 50). Its cells but the
    checks run as a script with four CPU devices (JAX counts them once, at its start)."""
    import os
    import subprocess
    import sys

    from grader.devices import cpu_devices_env

    nb = jupytext.read(REPO / "exercises" / "source" / "13_across_chips" / "across_chips.py")
    script = "\n\n".join(HIDDEN_RE.sub("", c.source) for c in nb.cells if c.cell_type == "code"
                         and "course.check(" not in c.source and "course.summary(" not in c.source)
    (tmp_path / "views.py").write_text(script)
    out = subprocess.run([sys.executable, "views.py"], cwd=tmp_path, capture_output=True,
                         text=True, env=cpu_devices_env(os.environ, 4), check=True).stdout
    ring, both = out.splitlines()[0], out.splitlines()[4]
    assert ring == ("device 0: step 0: 8,192 B to device 1; step 1: 8,192 B to device 1; "
                    "step 2: 8,192 B to device 1"), out
    assert both.startswith("device 0: step 0: 4,096 B to device 1; step 0: 4,096 B to device 3; "
                           "step 1: 4,096 B to device 1;"), out
