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
    assert TASKS == ["int8_matmul_per_channel", "w8a8_matmul", "kv_cache_append"]
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


def test_the_w8a8_kernel_matches_plain_jax_and_the_float_matmul(notebook):
    """Against plain JAX on the same int8 operands (exact integer sums), and against the float
    matmul the operands were quantized from, to within what the quantization moved."""
    task = tasks.get("w8a8_matmul")
    case = next(c for c in task.cases if c.name == "h0")
    xq, x_scale, wq, w_scale = (jnp.asarray(v) for v in task.inputs(case).values())
    out = notebook["w8a8_matmul"](xq, x_scale, wq, w_scale, **case.params)
    exact = jnp.dot(xq.astype(jnp.int32), wq.astype(jnp.int32))
    np.testing.assert_allclose(out, exact * x_scale * w_scale, rtol=1e-6, atol=1e-6)
    assert not np.asarray(out[1]).any()  # the row of zeros: scale 0, no 0/0
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal(xq.shape, dtype=np.float32)
    x[1] = 0
    w = rng.standard_normal(wq.shape, dtype=np.float32)
    error = np.abs(np.asarray(out) - x @ w).max() / np.abs(x @ w).max()
    assert 1e-4 < error < 2e-2, error  # quantization's error: far above float32's, below 2 %


def _w8a8(notebook, *edits):
    return _planted(notebook, "w8a8_matmul_solution", *edits)


_INT8_DOT = "jnp.dot(xq_ref[...], wq_ref[...], preferred_element_type=jnp.int32)"


def test_w8a8_dequantized_before_the_dot_fails_on_its_rule_alone(notebook):
    """Converted to float32 before the dot, the blocks take the float path: the sums are the
    same integers, so the values pass and only the dot rule fails."""
    float_dot = _w8a8(notebook, (_INT8_DOT, "jnp.dot(xq_ref[...].astype(jnp.float32), "
                                 "wq_ref[...].astype(jnp.float32), precision='highest', "
                                 "preferred_element_type=jnp.float32).astype(jnp.int32)"))
    message = _fails("w8a8_matmul", float_dot, "[FAIL] the dot takes the MXU's int8 path")
    assert "float32 x float32 -> float32" in message
    assert "wrong values" not in message and message.count("[FAIL]") == 1, message


def test_w8a8_float32_accumulator_fails_on_its_rule_alone(notebook):
    float_acc = _w8a8(notebook,
                      ("pltpu.VMEM((bm, bn), jnp.int32)", "pltpu.VMEM((bm, bn), jnp.float32)"),
                      (_INT8_DOT, f"{_INT8_DOT}.astype(jnp.float32)"))
    message = _fails("w8a8_matmul", float_acc, "[FAIL] int32 accumulator across the k steps")
    assert "float32 (128, 128) scratch" in message
    assert "wrong values" not in message and message.count("[FAIL]") == 1, message


def test_w8a8_output_block_as_the_accumulator_fails(notebook):
    """The output block summed into across k (a float), the int32 scratch kept but unused."""
    in_output = _w8a8(notebook, (
        "acc_ref[...] += " + _INT8_DOT,
        "@pl.when(pl.program_id(2) == 0)\n        def _():\n"
        "            o_ref[...] = jnp.zeros_like(o_ref)\n\n"
        "        o_ref[...] += (" + _INT8_DOT + ".astype(jnp.float32)\n"
        "                       * xs_ref[...] * ws_ref[...]).astype(o_ref.dtype)"),
        ("o_ref[...] = scaled.astype(o_ref.dtype)", "pass"))
    message = _fails("w8a8_matmul", in_output, "[FAIL] int32 accumulator across the k steps")
    assert "the output block read back" in message and "(never read)" in message, message


def test_w8a8_scales_applied_at_every_k_step_fail(notebook):
    """Each step's product scaled and summed in float32: both the accumulator and the scale
    rule fail, whatever the values do."""
    per_step = _w8a8(notebook,
                     ("pltpu.VMEM((bm, bn), jnp.int32)", "pltpu.VMEM((bm, bn), jnp.float32)"),
                     (_INT8_DOT, f"{_INT8_DOT}.astype(jnp.float32) * xs_ref[...] * ws_ref[...]"),
                     ("acc_ref[...].astype(jnp.float32) * xs_ref[...] * ws_ref[...]",
                      "acc_ref[...]"))
    message = _fails("w8a8_matmul", per_step, "[FAIL] scales applied once per output block")
    assert "x_scale read at every k step; w_scale read at every k step" in message
    assert "[FAIL] int32 accumulator across the k steps" in message


def test_w8a8_weight_scales_along_the_rows_fail(notebook):
    """One weight scale per row of the output block instead of per column: wrong values."""
    per_row = _w8a8(notebook, ("* ws_ref[...]", "* ws_ref[...].reshape(-1, 1)"))
    _fails("w8a8_matmul", per_row, "wrong values for case v0")


def test_w8a8_blank_is_not_implemented():
    def w8a8_matmul(xq, x_scale, wq, w_scale, bm, bn, bk, out_dtype):
        raise NotImplementedError

    assert _fails("w8a8_matmul", w8a8_matmul, "not implemented yet") == \
        "w8a8_matmul: not implemented yet"


@pytest.mark.parametrize("task", ["int8_matmul_per_channel", "w8a8_matmul", "kv_cache_append"])
def test_kernelsim_copies_equal_tpu_interpret_mode(task):
    """The solutions' DMAs as kernelsim models them equal those TPU interpret mode performs."""
    from kernelsim.verify import verify

    interpreted = gradertools.run(ASSIGNMENT, TPU_INTERPRET=True)
    arrays, params = _inputs(task, "v0")
    checked = verify(functools.partial(interpreted[task], **params), *arrays)
    assert checked.ok, checked.report()
