"""Assignment 10 (transformations): the reference solutions pass every case, planted wrong
answers fail with the rule that catches them, judged in one process (``course.check``).

The reference solutions are the instructor notebook's solution cells, executed as written.
"""

from __future__ import annotations

import functools

import gradertools
import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader.learner import course

ASSIGNMENT = "10_transformations"
NOTEBOOK = gradertools.notebook(ASSIGNMENT)
EPS = 1e-6


@pytest.fixture(scope="module")
def solutions() -> dict:
    """The setup and solution cells of the instructor notebook, run in one namespace."""
    return gradertools.run(ASSIGNMENT)


@pytest.mark.parametrize("task", ["batched_bias_tanh", "rms_norm", "add_patch_in_place"])
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_reference_solution_passes(solutions, task, hidden):
    course.check(task, solutions[task], hidden=hidden, quiet=True)


def _fails(task: str, fn, *expected: str) -> str:
    with pytest.raises(course.CheckFailed) as err:
        course.check(task, fn, quiet=True)
    message = str(err.value)
    for text in expected:
        assert text in message, message
    return message


# ----------------------------------------------------------------------------- helpers
TPU_INTERPRET = pltpu.InterpretParams()


def _rows(bm, n):
    return pl.BlockSpec((bm, n), lambda i: (i, 0))


def _weight(n):
    return pl.BlockSpec((1, n), lambda i: (0, 0))


def _inv_rms(v):
    return jax.lax.rsqrt(jnp.mean(v * v, axis=1, keepdims=True) + EPS)


def _forward(x, w, bm):
    """The task's forward kernel, right: y = x * r * w."""
    m, n = x.shape

    def kernel(x_ref, w_ref, y_ref):
        v = x_ref[...].astype(jnp.float32)
        y_ref[...] = (v * _inv_rms(v) * w_ref[...].astype(jnp.float32)).astype(y_ref.dtype)

    return pl.pallas_call(kernel, grid=(pl.cdiv(m, bm),), in_specs=[_rows(bm, n), _weight(n)],
                          out_specs=_rows(bm, n),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=TPU_INTERPRET)(x, w)


def _backward(x, w, g, bm, *, r=None, mask_rows=True, projection=True, across_steps=True):
    """The task's backward kernel -> (dx, dw), right by default; each switch plants one
    mistake: rows past M summed into dw, dx without its projection term, dw from the last
    block's rows only. ``r``: the row statistic saved by a forward kernel, read instead of
    recomputed."""
    m, n = x.shape
    steps = pl.cdiv(m, bm)

    def kernel(*refs):
        if r is None:
            (x_ref, w_ref, g_ref, dx_ref, dw_ref, dw_sum), r_ref = refs, None
        else:
            x_ref, r_ref, w_ref, g_ref, dx_ref, dw_ref, dw_sum = refs
        step = pl.program_id(0)
        v, g = x_ref[...].astype(jnp.float32), g_ref[...].astype(jnp.float32)
        rv = _inv_rms(v) if r_ref is None else r_ref[...]
        xh = v * rv
        h = g * w_ref[...].astype(jnp.float32)
        dx = rv * (h - xh * jnp.mean(h * xh, axis=1, keepdims=True)) if projection else rv * h
        dx_ref[...] = dx.astype(dx_ref.dtype)
        row = step * bm + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)
        part = g * xh
        share = jnp.sum(jnp.where(row < m, part, 0.0) if mask_rows else part, axis=0,
                        keepdims=True)

        @pl.when(jnp.logical_or(step == 0, not across_steps))
        def _():
            dw_sum[...] = jnp.zeros_like(dw_sum)

        dw_sum[...] += share

        @pl.when(step == steps - 1)
        def _():
            dw_ref[...] = dw_sum[...].astype(dw_ref.dtype)

    statistic = [] if r is None else [pl.BlockSpec((bm, 1), lambda i: (i, 0))]
    return pl.pallas_call(
        kernel, grid=(steps,), in_specs=[_rows(bm, n), *statistic, _weight(n), _rows(bm, n)],
        out_specs=[_rows(bm, n), _weight(n)],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype)],
        scratch_shapes=[pltpu.VMEM((1, n), jnp.float32)], interpret=TPU_INTERPRET,
    )(x, *([] if r is None else [r]), w, g)


def _rms_norm(forward=_forward, backward=_backward, **mistakes):
    """A learner's rms_norm(x, w, bm) from a forward(x, w, bm) and a backward(x, w, g, bm)
    -> (dx, dw) behind jax.custom_vjp, residuals x and w."""
    def rms_norm(x, w, bm):
        @jax.custom_vjp
        def norm(x, w):
            return forward(x, w, bm)

        norm.defvjp(lambda x, w: (norm(x, w), (x, w)),
                    lambda res, g: tuple(backward(*res, g, bm, **mistakes)))
        return norm(x, w)
    return rms_norm


# ----------------------------------------------------------------------------- task 1
def test_batch_loop_is_not_one_call(solutions):
    def per_example(x, bias, scale, bm):  # one pallas_call per example instead of vmap's axis
        one = solutions["batched_bias_tanh"]
        return jnp.concatenate([one(x[b:b + 1], bias[b:b + 1], scale, bm)
                                for b in range(x.shape[0])])

    _fails("batched_bias_tanh", per_example, "pallas_call reached", "exactly 1")


def test_batched_scale_is_fetched_per_example(solutions):
    def batched_scale(x, bias, scale, bm):  # scale broadcast to the batch: fetched B times
        s = jnp.broadcast_to(scale[None], (x.shape[0], *scale.shape))
        return jax.vmap(lambda x2, b2, s2: solutions["batched_bias_tanh"](
            x2[None], b2[None], s2, bm)[0])(x, bias, s)

    _fails("batched_bias_tanh", batched_scale, "scale (shared: no batch dimension) block shape",
           "[FAIL] scale (fetched once for the whole batch) HBM reads")


def test_bias_shared_by_the_batch_is_wrong(solutions):
    def first_bias(x, bias, scale, bm):  # every example gets example 0's bias
        return solutions["batched_bias_tanh"](x, jnp.broadcast_to(bias[:1], bias.shape), scale, bm)

    _fails("batched_bias_tanh", first_bias, "wrong values")


def test_whole_bias_as_one_block_fails_the_block_rule():
    def whole_bias(x, bias, scale, bm):  # every step sees all B bias rows and picks its own
        b, m, n = x.shape

        def kernel(x_ref, bias_ref, s_ref, o_ref):
            row = bias_ref[pl.program_id(0)].astype(jnp.float32)
            v = x_ref[...].astype(jnp.float32) * s_ref[...].astype(jnp.float32) + row
            o_ref[...] = jnp.tanh(v).astype(o_ref.dtype)

        rows = pl.BlockSpec((None, bm, n), lambda e, i: (e, i, 0))
        return pl.pallas_call(
            kernel, grid=(b, pl.cdiv(m, bm)),
            in_specs=[rows, pl.BlockSpec((b, 1, n), lambda e, i: (0, 0, 0)),
                      pl.BlockSpec((1, n), lambda e, i: (0, 0))],
            out_specs=rows, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            interpret=True)(x, bias, scale)

    _fails("batched_bias_tanh", whole_bias, "[FAIL] bias (one per example: batched) block shape")


def test_wrong_values_of_a_vmapped_kernel_are_reported(solutions):
    def doubled(x, bias, scale, bm):
        return solutions["batched_bias_tanh"](x, bias, scale, bm) * 2

    _fails("batched_bias_tanh", doubled, "wrong values")


# ----------------------------------------------------------------------------- task 2
def test_the_planted_helpers_are_right():
    course.check("rms_norm", _rms_norm(), hidden=True, quiet=True)


def test_backward_in_plain_jax_fails():
    def plain(x, w, g, bm):  # right values, but not a kernel
        xf, wf, gf = (a.astype(jnp.float32) for a in (x, w, g))
        r = _inv_rms(xf)
        xh, h = xf * r, gf * wf
        dx = r * (h - xh * jnp.mean(h * xh, axis=1, keepdims=True))
        return dx.astype(x.dtype), jnp.sum(gf * xh, axis=0, keepdims=True).astype(w.dtype)

    _fails("rms_norm", _rms_norm(backward=plain), "structural check failed",
           "[FAIL] pallas_call reached")


def test_wrong_gradient_fails():
    # dx's rows come after y's 16: the first wrong element is in dx
    _fails("rms_norm", _rms_norm(projection=False), "wrong values", "first at [16, ")


def test_wrong_forward_fails():
    def unscaled(x, w, bm):  # forgets the weight: y = x * r
        return _forward(x, jnp.ones_like(w), bm)

    _fails("rms_norm", _rms_norm(forward=unscaled), "wrong values", "first at [0, ")


def test_rows_past_m_in_dw_fail_the_ragged_case():
    """Rows past M in the last block are NaN in interpret mode: summed into dw, they make it
    NaN; v0 and v1 (M a multiple of bm) pass, v2 (20 rows in blocks of 8) fails in dw's row,
    the last one (2M = 40)."""
    _fails("rms_norm", _rms_norm(mask_rows=False), "wrong values for case v2",
           "first at [40, ")


def test_dw_from_one_block_fails():
    _fails("rms_norm", _rms_norm(across_steps=False), "wrong values for case v0",
           "first at [32, ")


def test_without_custom_vjp_grad_is_refused():
    def rms_norm(x, w, bm):  # a plain pallas_call: reverse mode cannot linearize it
        return _forward(x, w, bm)

    _fails("rms_norm", rms_norm, "your function raised", "Linearization failed")


def test_residual_written_by_the_forward_kernel_is_correct():
    """Saving r from a forward kernel for the backward one is a correct design the grader
    accepts (the task asks for x and w as residuals only because that moves fewer bytes)."""
    def forward_saving_r(x, w, bm):
        m, n = x.shape

        def kernel(x_ref, w_ref, y_ref, r_ref):
            v = x_ref[...].astype(jnp.float32)
            r = _inv_rms(v)
            y_ref[...] = (v * r * w_ref[...].astype(jnp.float32)).astype(y_ref.dtype)
            r_ref[...] = r

        return pl.pallas_call(
            kernel, grid=(pl.cdiv(m, bm),), in_specs=[_rows(bm, n), _weight(n)],
            out_specs=[_rows(bm, n), pl.BlockSpec((bm, 1), lambda i: (i, 0))],
            out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                       jax.ShapeDtypeStruct((m, 1), jnp.float32)],
            interpret=TPU_INTERPRET)(x, w)

    def rms_norm(x, w, bm):
        @jax.custom_vjp
        def norm(x, w):
            return forward_saving_r(x, w, bm)[0]

        def fwd(x, w):
            y, r = forward_saving_r(x, w, bm)
            return y, (x, w, r)

        def bwd(res, g):
            x, w, r = res
            return tuple(_backward(x, w, g, bm, r=r))

        norm.defvjp(fwd, bwd)
        return norm(x, w)

    course.check("rms_norm", rms_norm, quiet=True)


# ----------------------------------------------------------------------------- task 3
def _add_kernel(acc_ref, delta_ref, out_ref):
    out_ref[...] = acc_ref[...] + delta_ref[...]


def _add_patch(acc, delta, row0, col0, bm, bn, aliases):
    r, c = delta.shape
    patch = pl.BlockSpec((bm, bn), lambda i, j: (row0 // bm + i, col0 // bn + j))
    return pl.pallas_call(_add_kernel, grid=(r // bm, c // bn),
                          in_specs=[patch, pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
                          out_specs=patch, out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
                          input_output_aliases=aliases, interpret=True)(acc, delta)


def test_without_alias_the_rest_is_wrong():
    _fails("add_patch_in_place", functools.partial(_add_patch, aliases={}), "wrong values")


def test_patch_at_the_wrong_column_fails():
    def whole_rows_start(acc, delta, row0, col0, bm, bn):  # ignores col0: lesson 10's rows
        return _add_patch(acc, delta, row0, 0, bm, bn, {0: 0})

    _fails("add_patch_in_place", whole_rows_start, "wrong values")


def test_whole_row_blocks_fail_the_traffic_budget():
    def add_whole_rows(acc, delta, row0, col0, bm, bn):  # aliased, but moves full rows
        r, c = delta.shape
        n = acc.shape[1]
        wide = jnp.zeros((r, n), acc.dtype).at[:, col0:col0 + c].set(delta)
        rows = pl.BlockSpec((bm, n), lambda i: (row0 // bm + i, 0))
        return pl.pallas_call(_add_kernel, grid=(r // bm,),
                              in_specs=[rows, pl.BlockSpec((bm, n), lambda i: (i, 0))],
                              out_specs=rows,
                              out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
                              input_output_aliases={0: 0}, interpret=True)(acc, wide)

    _fails("add_patch_in_place", add_whole_rows, "[FAIL] grid", "[FAIL] acc block shape",
           "[FAIL] HBM read traffic")


def test_update_outside_the_kernel_fails():
    def add_patch_outside(acc, delta, row0, col0, bm, bn):  # kernel adds, XLA writes it back
        r, c = delta.shape
        patch = _add_patch(acc[row0:row0 + r, col0:col0 + c], delta, 0, 0, bm, bn, {0: 0})
        return jax.lax.dynamic_update_slice(acc, patch, (row0, col0))

    _fails("add_patch_in_place", add_patch_outside, "[FAIL] result comes from the kernel")


# ----------------------------------------------------------------------------- compiled backends
@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("task_id", ["batched_bias_tanh", "rms_norm", "add_patch_in_place"])
def test_reference_solution_lowers_for_tpu_and_gpu(solutions, monkeypatch, task_id):
    """Every case's kernels, compiled rather than interpreted, pass the Mosaic TPU lowering
    (the (8, 128) block rule) and the Triton GPU lowering (power-of-two block sizes). On a GPU
    a solution whose kernels all run with ``TPU_INTERPRET`` (rms_norm's: the backward keeps
    VMEM scratch and a block every step revisits) stays interpreted, as
    ``kernelsim.backend.choose`` has it there, so only the TPU lowering applies."""
    from grader import tasks

    task = tasks.get(task_id)
    lowerings = [(gradertools.COMPILED, kernelsim.tpu_lowering_error)]
    if "interpret=INTERPRET" in gradertools.cells(ASSIGNMENT)[f"{task_id}_solution"]:
        lowerings.append(({"INTERPRET": False}, kernelsim.gpu_lowering_error))
    for compiled, lowering_error in lowerings:
        with monkeypatch.context() as patch:
            for name, value in compiled.items():
                patch.setitem(solutions, name, value)
            for case in task.cases:
                arrays = [jnp.asarray(v) for v in task.inputs(case).values()]

                def fn(*args, case=case):
                    return task.call(solutions[task_id], list(args), case.params)

                assert lowering_error(fn, *arrays) is None, (lowering_error.__name__, case.name)


def test_a_norm_without_epsilon_fails_a_hidden_case_too(monkeypatch):
    """Only the epsilon keeps an all-zero row finite; a hidden case has one as well as v1, so
    a norm without it loses the hidden points, not only the visible case (issue 36: it scored 8
    of 9)."""
    monkeypatch.setitem(globals(), "EPS", 0.0)  # _inv_rms of the planted kernels, forward and back
    with pytest.raises(course.CheckFailed, match="wrong values"):
        course.check("rms_norm", _rms_norm(), hidden=True, quiet=True)
