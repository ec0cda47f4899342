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

import kernelsim
from grader import course

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
def _rows(bm, n):
    return pl.BlockSpec((bm, n), lambda i: (i, 0))


def _row_call(kernel, n_inputs, like, bm, out_shape=None):
    m, n = like.shape
    return pl.pallas_call(kernel, grid=(pl.cdiv(m, bm),), in_specs=[_rows(bm, n)] * n_inputs,
                          out_specs=_rows(bm, n),
                          out_shape=out_shape or jax.ShapeDtypeStruct(like.shape, like.dtype),
                          interpret=True)


def _inv_rms(v):
    return jax.lax.rsqrt(jnp.mean(v * v, axis=1, keepdims=True) + EPS)


def _forward_kernel(x_ref, y_ref):
    v = x_ref[...].astype(jnp.float32)
    y_ref[...] = (v * _inv_rms(v)).astype(y_ref.dtype)


def _with_vjp(forward, backward_from_x):
    """A custom_vjp function from a forward and a backward(x, g) -> dx; residual x."""
    f = jax.custom_vjp(forward)
    f.defvjp(lambda x: (f(x), x), lambda x, g: (backward_from_x(x, g),))
    return f


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
def test_backward_in_plain_jax_fails():
    def rms_norm(x, bm):
        def backward(x, g):  # right values, but not a kernel
            v, gf = x.astype(jnp.float32), g.astype(jnp.float32)
            r = _inv_rms(v)
            return (r * (gf - v * r * jnp.mean(gf * v * r, axis=1, keepdims=True))).astype(x.dtype)

        return _with_vjp(lambda x: _row_call(_forward_kernel, 1, x, bm)(x), backward)(x)

    _fails("rms_norm", rms_norm, "structural check failed", "[FAIL] pallas_call reached")


def test_wrong_gradient_fails():
    def rms_norm(x, bm):
        def backward_kernel(x_ref, g_ref, dx_ref):  # forgets the projection term
            v = x_ref[...].astype(jnp.float32)
            dx_ref[...] = (_inv_rms(v) * g_ref[...].astype(jnp.float32)).astype(dx_ref.dtype)

        return _with_vjp(lambda x: _row_call(_forward_kernel, 1, x, bm)(x),
                         lambda x, g: _row_call(backward_kernel, 2, x, bm)(x, g))(x)

    _fails("rms_norm", rms_norm, "wrong values", "first at [1, ")


def test_wrong_forward_fails():
    def rms_norm(x, bm):  # the forward kernel forgets eps^-1/2 normalisation: y = x
        def copy_kernel(x_ref, y_ref):
            y_ref[...] = x_ref[...]

        def backward(x, g):
            return _row_call(copy_kernel, 1, g, bm)(g)

        return _with_vjp(lambda x: _row_call(copy_kernel, 1, x, bm)(x), backward)(x)

    _fails("rms_norm", rms_norm, "wrong values", "first at [0, ")


def test_without_custom_vjp_grad_is_refused():
    def rms_norm(x, bm):  # a plain pallas_call: reverse mode cannot linearize it
        return _row_call(_forward_kernel, 1, x, bm)(x)

    _fails("rms_norm", rms_norm, "your function raised", "Linearization failed")


def test_residual_written_by_the_forward_kernel_is_correct():
    def rms_norm(x, bm):
        m, n = x.shape

        def forward_kernel(x_ref, y_ref, r_ref):  # also saves r for the backward pass
            v = x_ref[...].astype(jnp.float32)
            r = _inv_rms(v)
            y_ref[...] = (v * r).astype(y_ref.dtype)
            r_ref[...] = r

        def forward_call(x):
            return pl.pallas_call(
                forward_kernel, grid=(pl.cdiv(m, bm),), in_specs=[_rows(bm, n)],
                out_specs=[_rows(bm, n), pl.BlockSpec((bm, 1), lambda i: (i, 0))],
                out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                           jax.ShapeDtypeStruct((m, 1), jnp.float32)],
                interpret=True)(x)

        def backward_kernel(x_ref, r_ref, g_ref, dx_ref):
            v, r, g = x_ref[...].astype(jnp.float32), r_ref[...], g_ref[...].astype(jnp.float32)
            xh = v * r
            dx_ref[...] = (r * (g - xh * jnp.mean(g * xh, axis=1, keepdims=True))
                           ).astype(dx_ref.dtype)

        def backward(res, g):
            x, r = res
            return (pl.pallas_call(
                backward_kernel, grid=(pl.cdiv(m, bm),),
                in_specs=[_rows(bm, n), pl.BlockSpec((bm, 1), lambda i: (i, 0)), _rows(bm, n)],
                out_specs=_rows(bm, n), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                interpret=True)(x, r, g),)

        @jax.custom_vjp
        def norm(x):
            return forward_call(x)[0]

        def fwd(x):
            y, r = forward_call(x)
            return y, (x, r)

        norm.defvjp(fwd, backward)
        return norm(x)

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
    (the (8, 128) block rule) and the Triton GPU lowering (power-of-two block sizes)."""
    from grader import tasks

    monkeypatch.setitem(solutions, "INTERPRET", False)
    task = tasks.get(task_id)
    for case in task.cases:
        arrays = [jnp.asarray(v) for v in task.inputs(case).values()]

        def fn(*args, case=case):
            return task.call(solutions[task_id], list(args), case.params)

        assert kernelsim.tpu_lowering_error(fn, *arrays) is None, case.name
        assert kernelsim.gpu_lowering_error(fn, *arrays) is None, case.name
