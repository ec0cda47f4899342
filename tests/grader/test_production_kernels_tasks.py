"""Assignment 14 (kernels in production): the instructor's kernels pass on every case, agree
with plain JAX, lower for TPU, and plausible wrong answers fail with a message that says what
is wrong.

The kernels come from the notebook source itself; planted mistakes are made by editing that
source, so what is tested is what learners get.
"""

from __future__ import annotations

import functools

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelsim
from grader import tasks
from grader.learner import course

pytestmark = pytest.mark.interpret

ASSIGNMENT = "14_production_kernels"
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


@pytest.fixture(scope="module")
def notebook() -> dict:
    return gradertools.run(ASSIGNMENT)


def _planted(notebook: dict, cell: str, *edits: tuple[str, str]):
    return gradertools.planted(ASSIGNMENT, notebook, cell, *edits)


_fails = gradertools.fails


def _inputs(task_id: str, case_name: str) -> tuple[list, dict]:
    task = tasks.get(task_id)
    case = next(c for c in task.cases if c.name == case_name)
    return [jnp.asarray(v) for v in task.inputs(case).values()], case.params


def test_every_task_has_a_solution_and_tests():
    cells = gradertools.cells(ASSIGNMENT)
    assert TASKS == ["int8_matmul_per_channel", "kv_cache_append"]
    for task in TASKS:
        assert {f"{task}_solution", f"{task}_visible", f"{task}_hidden"} <= set(cells), task


@pytest.mark.parametrize("task", TASKS)
def test_the_reference_solution_passes(task, notebook):
    course.check(task, notebook[task], quiet=True)
    course.check(task, notebook[task], hidden=True, quiet=True)


def test_the_kernels_match_plain_jax(notebook):
    """Directly against plain JAX, outside the grader."""
    (x, wq, scale), params = _inputs("int8_matmul_per_channel", "h0")
    np.testing.assert_allclose(
        notebook["int8_matmul_per_channel"](x, wq, scale, **params),
        jnp.dot(x, wq.astype(jnp.float32) * scale, precision="highest"), rtol=1e-4, atol=1e-4)
    (cache, new_rows, table, positions), _ = _inputs("kv_cache_append", "v0")
    out = np.asarray(notebook["kv_cache_append"](cache, new_rows, table, positions))
    expected = np.array(cache)
    for s, pos in enumerate(np.asarray(positions)):
        expected[int(table[s, pos // 16]), pos % 16] = new_rows[s, 0]
    np.testing.assert_array_equal(out, expected)


def test_every_solution_case_lowers_for_tpu():
    compiled = gradertools.run(ASSIGNMENT, TPU_INTERPRET=False)
    for task_id in TASKS:
        task = tasks.get(task_id)
        for case in task.cases:
            arrays = [jax.ShapeDtypeStruct(v.shape, v.dtype)
                      for v in task.inputs(case).values()]
            fn = compiled[task_id]
            error = kernelsim.tpu_lowering_error(functools.partial(fn, **case.params), *arrays)
            assert error is None, (task_id, case.name, error)


def test_weights_dequantized_outside_the_kernel_fail(notebook):
    def outside(x, wq, scale, bm, bn, bk):
        w = wq.astype(jnp.float32) * scale  # outside any kernel: float32 weights
        return notebook["int8_matmul_per_channel"](x, w, jnp.ones_like(scale), bm, bn, bk)

    _fails("int8_matmul_per_channel", outside, "wq (int8, once per row block")


def test_a_fresh_output_instead_of_the_cache_fails(notebook):
    """Without the alias the pages no step writes are uninitialised (NaN in interpret mode)."""
    fresh = _planted(notebook, "kv_cache_append_solution",
                     ("        input_output_aliases={2: 0},\n", ""))
    _fails("kv_cache_append", fresh, "kv_cache_append")


def test_writing_the_new_row_into_the_first_row_fails(notebook):
    first_row = _planted(notebook, "kv_cache_append_solution",
                         ("row = pos_ref[pl.program_id(0)] % page_size", "row = 0"))
    _fails("kv_cache_append", first_row, "kv_cache_append")


@pytest.mark.parametrize("task", ["int8_matmul_per_channel", "kv_cache_append"])
def test_kernelsim_copies_equal_tpu_interpret_mode(task):
    """The solutions' DMAs as kernelsim models them equal those TPU interpret mode performs."""
    from kernelsim.verify import verify

    interpreted = gradertools.run(ASSIGNMENT, TPU_INTERPRET=True)
    arrays, params = _inputs(task, "v0")
    checked = verify(functools.partial(interpreted[task], **params), *arrays)
    assert checked.ok, checked.report()
