"""Assignments 01-04: block shapes the TPU accepts, and adversarial cases that bite (issues 14, 16).

Every case of every task in 01-04 uses blocks the TPU lowering accepts: the instructor's
solution, set to compile instead of interpret, goes through JAX's Mosaic lowering
(``kernelsim.tpu_lowering_error``, no TPU needed).

Assignment 04's adversarial hidden cases each fail a plausible wrong answer (issue 14).

Each planted answer below fails the hidden case added for it while the honest kernel passes
that case; the rounding mistakes and the prediction formulas also pass the visible case, so
only the hidden cases can catch them. Cases run one at a time, as the grader runs them
(``grader.facts.work.run_case``), judged with the task's tolerance.

``affine_row_blocks`` (lesson 5's "place an operand in SMEM"): a table left in VMEM gets every
value right and fails on its memory space; a scale and shift read swapped fail the values.
"""

from __future__ import annotations

import gradertools
import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader import tasks
from grader.facts import work
from grader.learner import course
from grader.verdict import refs, verdict

TPU_INTERPRET = pltpu.InterpretParams()


def wrong_values(task_id: str, case: str, fn) -> str | None:
    """None when ``fn`` gets case ``case`` of ``task_id`` right, else what is wrong."""
    refdir = refs.REPO / "exercises" / "refs"
    entry = refs.load_manifest(refdir)["cases"][f"{task_id}/{case}"]
    inputs, expected, params = refs.load_case(refdir, entry)
    run = work.run_case(tasks.get(task_id), fn, [jnp.asarray(v) for v in inputs.values()],
                        params)
    if run.error is not None:
        return run.error
    return verdict.compare(run.output, expected, entry["rtol"], entry["atol"])


# ----------------------------------------------------------------------- TPU-accepted blocks
MINE = ("01_first_kernel", "02_tiling", "03_index_maps", "04_memory_spaces")


def _compiled_solutions(assignment: str) -> dict[str, object]:
    """task id -> the instructor's function, with INTERPRET and TPU_INTERPRET set to compile."""
    return gradertools.solutions(assignment, **gradertools.COMPILED)


@pytest.mark.parametrize("assignment", MINE)
def test_every_case_has_blocks_the_tpu_lowering_accepts(assignment):
    solutions = _compiled_solutions(assignment)
    refused = []
    for task in (t for t in tasks.TASKS if t.assignment == assignment):
        if task.id.startswith("predict_"):
            continue  # returns a number; the grader's one-step kernel writes it
        for case in task.cases:
            arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
            error = kernelsim.tpu_lowering_error(
                lambda *a, t=task, c=case: t.call(solutions[t.id], list(a), c.params), *arrays)
            if error is not None:
                refused.append(f"{task.id} case {case.name}: {error.splitlines()[0]}")
    assert not refused, "\n".join(refused)


# ------------------------------------------------------------------------------------ sum_all
def _sum_all(running_sum_in_input_dtype: bool):
    def sum_all(x, block):
        (bm, bn), (m, n) = block, x.shape
        acc_dtype = x.dtype if running_sum_in_input_dtype else jnp.float32

        def kernel(x_ref, o_ref, acc_ref):
            i, j = pl.program_id(0), pl.program_id(1)

            @pl.when((i == 0) & (j == 0))
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            rows = i * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 0)
            cols = j * bn + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 1)
            v = jnp.where((rows < m) & (cols < n), x_ref[...].astype(jnp.float32), 0.0)
            acc_ref[...] += jnp.sum(v).reshape(1, 1).astype(acc_dtype)
            o_ref[...] = acc_ref[...].astype(jnp.float32)

        return pl.pallas_call(
            kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
            in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((1, 1), lambda i, j: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32),
            scratch_shapes=[pltpu.VMEM((1, 1), acc_dtype)], interpret=TPU_INTERPRET,
        )(x)
    return sum_all


def test_long_bfloat16_sum_catches_a_bfloat16_running_sum():
    wrong = _sum_all(running_sum_in_input_dtype=True)
    assert wrong_values("sum_all", "v0", wrong) is None  # the float32 visible case passes
    assert "1 of 1 elements differ" in wrong_values("sum_all", "v1", wrong)  # visible, long
    assert wrong_values("sum_all", "h1", wrong) is None  # so does the short bfloat16 case
    assert "1 of 1 elements differ" in wrong_values("sum_all", "h3", wrong)
    assert wrong_values("sum_all", "h3", _sum_all(running_sum_in_input_dtype=False)) is None


# --------------------------------------------------------------------------- matmul_bias_relu
def _matmul_bias_relu(acc_dtype=jnp.float32, epilogue_in_output_dtype=False,
                      bias_first_relu_every_step=False):
    """A fused matmul + bias + ReLU, right by default; each switch plants one mistake."""
    def matmul_bias_relu(a, b, bias, bm, bk, bn):
        (m, k), n = a.shape, b.shape[1]
        acc_t = a.dtype if acc_dtype is None else acc_dtype

        def kernel(a_ref, b_ref, bias_ref, o_ref, acc_ref):
            first, last = pl.program_id(2) == 0, pl.program_id(2) == pl.num_programs(2) - 1
            bias_v = bias_ref[...].astype(jnp.float32)

            @pl.when(first)
            def _():
                start = jnp.broadcast_to(bias_v, acc_ref.shape) if bias_first_relu_every_step \
                    else jnp.zeros(acc_ref.shape, jnp.float32)
                acc_ref[...] = start.astype(acc_t)

            acc = acc_ref[...].astype(jnp.float32) + jnp.dot(
                a_ref[...], b_ref[...], precision=gradertools.precision_for(a_ref.dtype),
                preferred_element_type=jnp.float32)
            if bias_first_relu_every_step:
                acc = jnp.maximum(acc, 0.0)
            acc_ref[...] = acc.astype(acc_t)

            @pl.when(last)
            def _():
                if bias_first_relu_every_step:
                    o_ref[...] = acc_ref[...].astype(o_ref.dtype)
                elif epilogue_in_output_dtype:
                    out = acc_ref[...].astype(o_ref.dtype) + bias_ref[...]
                    o_ref[...] = jnp.maximum(out, 0).astype(o_ref.dtype)
                else:
                    o_ref[...] = jnp.maximum(acc_ref[...].astype(jnp.float32) + bias_v,
                                             0.0).astype(o_ref.dtype)

        return pl.pallas_call(
            kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                      pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), acc_t)], interpret=TPU_INTERPRET,
        )(a, b, bias)
    return matmul_bias_relu


WRONG_BIAS_RELU = {
    "bfloat16 accumulator": dict(acc_dtype=None),
    "bias and ReLU after rounding to bfloat16": dict(epilogue_in_output_dtype=True),
    "bias as the start, ReLU every K step": dict(bias_first_relu_every_step=True),
}


def test_honest_bias_relu_passes_the_centred_case():
    assert wrong_values("matmul_bias_relu", "h3", _matmul_bias_relu()) is None


@pytest.mark.parametrize("mistake", sorted(WRONG_BIAS_RELU))
def test_centred_long_k_case_catches(mistake):
    wrong = _matmul_bias_relu(**WRONG_BIAS_RELU[mistake])
    found = wrong_values("matmul_bias_relu", "h3", wrong)
    assert found is not None and "elements differ" in found, (mistake, found)


def test_rounding_mistakes_pass_the_visible_case():
    """The two rounding mistakes are invisible in float32: only the hidden case shows them
    (the ReLU-every-step one fails the visible case too, which is fine)."""
    for mistake in ("bfloat16 accumulator", "bias and ReLU after rounding to bfloat16"):
        course.check("matmul_bias_relu", _matmul_bias_relu(**WRONG_BIAS_RELU[mistake]),
                     quiet=True)


# ----------------------------------------------------------------------- predict_matmul_reads
def _cdiv(a, b):
    return -(-a // b)


def every_step_fetches(m, k, n, bm, bk, bn, itemsize):  # forgets skipped copies
    return itemsize * (_cdiv(n, bn) * m * k + _cdiv(m, bm) * k * n)


def whole_edge_blocks(m, k, n, bm, bk, bn, itemsize):  # counts an edge block's padding
    a_rows, b_cols = _cdiv(m, bm) * bm, _cdiv(n, bn) * bn
    return itemsize * (_cdiv(n, bn) * a_rows * k + _cdiv(m, bm) * k * b_cols)


@pytest.mark.parametrize("prediction, caught_by", [
    (every_step_fetches, ("h0", "h1")), (whole_edge_blocks, ("h2",))])
def test_prediction_cases_catch_plausible_formulas(prediction, caught_by):
    course.check("predict_matmul_reads", prediction, quiet=True)  # right on the visible case
    for case in caught_by:
        assert "1 of 1 elements differ" in wrong_values("predict_matmul_reads", case,
                                                        prediction), case


def test_prediction_must_be_an_int():
    with pytest.raises(course.CheckFailed, match="return a Python int"):
        course.check("predict_matmul_reads", lambda **p: jnp.asarray(every_step_fetches(**p)))


def test_prediction_that_runs_a_kernel_fails():
    def runs_a_kernel(**sizes):
        def copy(x_ref, o_ref):
            o_ref[...] = x_ref[...]
        x = jnp.zeros((8, 128), jnp.float32)
        pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)
        return every_step_fetches(**sizes)
    with pytest.raises(course.CheckFailed, match=r"kernels run: required only the grader's"):
        course.check("predict_matmul_reads", runs_a_kernel)


# -------------------------------------------------------------------------- affine_row_blocks
def _affine_row_blocks(table_spec=None, swap_scale_and_shift=False):
    """A per-row-block scale and shift, right by default (the table whole in SMEM);
    ``table_spec`` replaces the table's BlockSpec, the switch reads its columns swapped."""
    scale_col, shift_col = (1, 0) if swap_scale_and_shift else (0, 1)

    def affine_row_blocks(x, table, bm):
        m, n = x.shape

        def kernel(table_ref, x_ref, o_ref):
            i = pl.program_id(0)
            o_ref[...] = (x_ref[...].astype(jnp.float32) * table_ref[i, scale_col]
                          + table_ref[i, shift_col]).astype(o_ref.dtype)

        spec = pl.BlockSpec(memory_space=pltpu.SMEM) if table_spec is None else table_spec(table)
        return pl.pallas_call(
            kernel, grid=(m // bm,),
            in_specs=[spec, pl.BlockSpec((bm, n), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=TPU_INTERPRET,
        )(table, x)
    return affine_row_blocks


def test_affine_row_blocks_needs_the_table_in_smem_and_its_columns_in_order():
    course.check("affine_row_blocks", _affine_row_blocks(), quiet=True)
    course.check("affine_row_blocks", _affine_row_blocks(), hidden=True, quiet=True)
    in_vmem = _affine_row_blocks(table_spec=lambda t: pl.BlockSpec(t.shape, lambda i: (0, 0)))
    assert wrong_values("affine_row_blocks", "v0", in_vmem) is None  # right values, wrong place
    with pytest.raises(course.CheckFailed, match=r"\[FAIL\] table memory space: required smem "
                       r"\(pl\.BlockSpec\(memory_space=pltpu\.SMEM\)\).*found vmem \(table_ref\)"):
        course.check("affine_row_blocks", in_vmem)
    swapped = _affine_row_blocks(swap_scale_and_shift=True)
    for case in ("v0", "h1"):
        found = wrong_values("affine_row_blocks", case, swapped)
        assert found is not None and "elements differ" in found, (case, found)
