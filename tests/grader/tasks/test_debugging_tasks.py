"""Assignment 09 ("find the bug"): the buggy kernels the notebook ships fail grading, the
reference solutions and other right fixes pass, and each key hint points at the buggy line.

The kernels are taken from the notebook source itself (its setup, ``*_buggy`` and
``*_solution`` cells), so what is tested is what learners get.
"""

from __future__ import annotations

import functools
import re

import gradertools
import jax
import jax.numpy as jnp
import jupytext
import numpy as np
import pytest
from test_exercise_content import key_hints

import kernelsim
from grader import tasks
from grader.learner import course
from grader.verdict import verdict

ASSIGNMENT = "09_debugging"
NOTEBOOK = gradertools.notebook(ASSIGNMENT)
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


@pytest.fixture(scope="module")
def notebook() -> dict:
    """The notebook's setup, buggy and solution cells, executed into one namespace."""
    return gradertools.run(ASSIGNMENT, ("_buggy", "_solution"))


# What each key hint ("Hint 2: the key line") must point at, quoted from the buggy cell: the line
# to change, or the statements whose order is wrong. The hint names it and says what is wrong;
# that it never writes the fix is tests/grader/tasks/test_exercise_content.py's to check.
BUGGY_LINES = {
    "roll_rows": ("lambda i: ((i + shift) % n_blocks, 0)",),
    "row_sums": ("o_ref[...] +=",),
    "column_max": ("block = jnp.where(rows <= m, x_ref[...], -jnp.inf)",),
    "pool_rows": ("(4, n)", "(1, n)"),
    "chunk_sum": ("ring[c % 3]", ".wait()"),
}


def test_every_task_has_a_buggy_cell_a_solution_and_tests():
    """(The hint cells' form is tests/grader/tasks/test_exercise_content.py's to check.)"""
    cells = gradertools.cells(ASSIGNMENT)
    assert len(TASKS) == 5
    for task in TASKS:
        assert {f"{task}_buggy", f"{task}_solution", f"{task}_visible", f"{task}_hidden"} \
            <= set(cells), task


@pytest.mark.parametrize("task", TASKS)
def test_the_shipped_buggy_kernel_fails_visible_and_hidden(task, notebook):
    buggy = notebook[f"{task}_buggy"]
    for hidden in (False, True):
        with pytest.raises(course.CheckFailed) as failed:
            course.check(task, buggy, hidden=hidden, quiet=True)
        # the bug is found by values, except the block shape only the TPU lowering rejects
        # and the race, which the detector the grader turns on reports first
        expected = {"pool_rows": "structural check failed",
                    "chunk_sum": "RACE DETECTED"}.get(task, "wrong values")
        assert expected in str(failed.value), (task, hidden, str(failed.value))


@pytest.mark.parametrize("task", TASKS)
def test_the_reference_solution_passes(task, notebook):
    course.check(task, notebook[task], quiet=True)
    course.check(task, notebook[task], hidden=True, quiet=True)


def test_every_case_exposes_the_bug_in_values(notebook):
    """Each case on its own, visible or hidden, gives wrong values with the buggy kernel
    (``pool_rows`` aside: its bug is a block shape, right values and a failed structure)."""
    from grader.verdict import refs

    refdir = refs.course_root() / "refs"
    manifest = refs.load_manifest(refdir)
    for entry in manifest["cases"].values():
        if entry["task"] not in TASKS or entry["task"] == "pool_rows":
            continue
        inputs, expected, params = refs.load_case(refdir, entry)
        got = notebook[f"{entry['task']}_buggy"](*map(jnp.asarray, inputs.values()), **params)
        assert verdict.compare(got, expected, entry["rtol"], entry["atol"], None) is not None, \
            entry


def test_the_key_line_hints_point_at_the_buggy_line():
    keys = key_hints(jupytext.read(NOTEBOOK).cells)
    cells = gradertools.cells(ASSIGNMENT)
    assert set(BUGGY_LINES) == set(TASKS)
    for task, lines in BUGGY_LINES.items():
        key = re.sub(r"\s+", " ", keys[task][1])
        for line in lines:
            assert line in cells[f"{task}_buggy"], (task, line)
            assert f"`{line}`" in key, (task, line, key)


def test_other_right_fixes_pass(notebook):
    """Fixes other than the reference's pass every case: roll_rows with a negative modulus in
    the index map, which kernelsim and both interpreters must agree on, and column_max with the
    comparison changed in place."""
    roll_rows = _replace(notebook, "roll_rows",
                         "lambda i: ((i + shift) % n_blocks, 0)",
                         "lambda i: ((i - shift) % n_blocks, 0)")
    course.check("roll_rows", roll_rows, hidden=True, quiet=True)
    column_max = _replace(notebook, "column_max",
                          "block = jnp.where(rows <= m, x_ref[...], -jnp.inf)",
                          "block = jnp.where(rows < m, x_ref[...], -jnp.inf)")
    course.check("column_max", column_max, hidden=True, quiet=True)


def _replace(notebook: dict, task: str, old: str, new: str):
    source = gradertools.cells(ASSIGNMENT)[f"{task}_buggy"]
    assert old in source, (task, old)
    namespace = dict(notebook)
    exec(source.replace(old, new), namespace)
    return namespace[f"{task}_buggy"]


def test_plausible_wrong_fixes_fail(notebook):
    """Zeroing the accumulator at every step, or masking the edge with 0 instead of -inf,
    passes some cases and fails the hidden ones."""
    every_step = _replace(notebook, "row_sums", "o_ref[...] += ",
                          "o_ref[...] = jnp.zeros_like(o_ref)\n    o_ref[...] += ")
    with pytest.raises(course.CheckFailed, match="wrong values"):
        course.check("row_sums", every_step, quiet=True)
    zero_fill = _replace(notebook, "column_max",
                         "block = jnp.where(rows <= m, x_ref[...], -jnp.inf)",
                         "block = jnp.where(rows < m, x_ref[...], 0.0)")
    course.check("column_max", zero_fill, quiet=True)
    with pytest.raises(course.CheckFailed, match=r"wrong values for case h2"):
        course.check("column_max", zero_fill, hidden=True, quiet=True)


def test_the_tpu_lowering_rejects_only_the_buggy_blocks(notebook):
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    err = kernelsim.tpu_lowering_error(
        functools.partial(notebook["pool_rows_buggy"], interpret=False), x)
    assert err is not None and "divisible by 8 and 128" in err, err
    assert kernelsim.tpu_lowering_error(
        functools.partial(notebook["pool_rows"], interpret=False), x) is None


def test_every_solution_lowers_for_tpu():
    """JAX's TPU lowering accepts every solution (blocks, scratch, DMAs, revisited outputs):
    the notebook's cells run again with kernels set to compile."""
    cells = gradertools.cells(ASSIGNMENT)
    namespace: dict = {}
    exec(compile(cells["setup"], "setup", "exec"), namespace)
    namespace.update(INTERPRET=False, TPU_INTERPRET=False)
    for task in TASKS:
        exec(compile(cells[f"{task}_solution"], task, "exec"), namespace)
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    calls = {"roll_rows": dict(bm=16, shift=1), "row_sums": dict(bm=8, bn=128),
             "column_max": dict(bm=16), "pool_rows": {}, "chunk_sum": dict(chunk=8)}
    assert set(calls) == set(TASKS)
    for task, params in calls.items():
        error = kernelsim.tpu_lowering_error(functools.partial(namespace[task], **params), x)
        assert error is None, (task, error)


def test_lesson_5s_two_buffers_do_not_solve_chunk_sum():
    """The solution with lesson 5's ring (two buffers, one copy in flight) instead of three
    computes the right values, races nothing, and fails the buffer count the task asks for."""
    namespace = gradertools.run(ASSIGNMENT, ("_solution",))
    source = gradertools.cells(ASSIGNMENT)["chunk_sum_solution"]
    for old, new in (("% 3", "% 2"), ("c + 2", "c + 1"), ("min(2, n_chunks)", "min(1, n_chunks)"),
                     ("VMEM((3,", "VMEM((2,"), ("DMA((3,)", "DMA((2,)")):
        assert old in source, old
        source = source.replace(old, new)
    exec(compile(source, "planted chunk_sum", "exec"), namespace)  # noqa: S102
    with pytest.raises(course.CheckFailed) as failed:
        course.check("chunk_sum", namespace["chunk_sum"], quiet=True)
    message = str(failed.value)
    assert "[FAIL] copies into VMEM: buffers: required 3 VMEM buffers (triple buffering); " \
        "found 2" in message and "wrong values" not in message, message


def test_the_grader_runs_chunk_sum_with_the_race_detector(notebook):
    """The buggy kernel's race is reported even where its values are right: with eager DMAs
    its copies land before the early reads, and only the detector sees the missing order."""
    from jax.experimental.pallas import tpu as pltpu

    x = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
    eager = notebook["chunk_sum_buggy"](
        x, 8, interpret=pltpu.InterpretParams(dma_execution_mode="eager"))
    np.testing.assert_allclose(eager, x.reshape(-1, 8, 256).sum(0), rtol=1e-5, atol=1e-5)
    seen = {}

    def records_interpret(x, chunk, interpret=None):
        seen["interpret"] = interpret
        return notebook["chunk_sum"](x, chunk, interpret=interpret)

    course.check("chunk_sum", records_interpret, quiet=True)
    assert seen["interpret"].detect_races
