"""Assignment 10, transformations: a vmapped kernel, a forward and backward kernel pair behind
``jax.custom_vjp`` graded through ``jax.vjp``, and an in-place update with
``input_output_aliases`` that touches a patch of rows and columns.

How the backward task is graded, and why not with ``jax.grad`` directly:
``calling.vjp_rows_stacked`` calls ``jax.vjp(fn, x)`` and applies the pullback to the case's
cotangent ``g``, an input of the traced program. That is the pullback ``jax.grad`` of
``sum(fn(x, w) * g)`` runs, but under ``jax.grad`` the cotangent reaching the backward kernel
is ``g`` times the loss's seed, a ``mul`` computed outside any kernel, and the shared work
rules (``core.work_rules``: "kernel inputs are your function's inputs", "compute outside
kernels") would fail every correct solution. The output judged is the rows of ``y``, ``dx``
and ``dw`` stacked, so the forward kernel's values count too.

The shared rule "kernel inputs are your function's inputs" also rejects a backward kernel that
reads a residual the forward *kernel* wrote (``pallas_call #0`` feeding ``pallas_call #1``),
although that is a correct design. The task therefore asks for the inputs ``x`` and ``w`` as
the only residuals, with the backward kernel recomputing the row statistic (which also moves
fewer bytes), and for ``dw``'s sum over rows inside that kernel, across its grid steps; see
tests/grader/tasks/test_transformations_tasks.py for the rejected alternative.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grader import calling
from grader.tasks.core import (
    Rule,
    as_f32,
    block_is,
    calls_at_least,
    cdiv,
    grid_is,
    make_case,
    nbytes_of,
    read_budget,
    register_task,
    role_count,
    single_call,
    total_budget,
    with_zero_row,
)

A10 = "10_transformations"
RMS_EPS = 1e-6  # added to the mean square before the reciprocal square root


# ----------------------------------------------------------------------------- task 1: vmap
def _batched_rules(call, case, rules, inputs):
    (b, m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (b, cdiv(m, bm))))
    rules.append(block_is(call, "input", 0, (None, bm, n), "x (batch dimension squeezed)"))
    rules.append(block_is(call, "input", 1, (None, 1, n), "bias (one per example: batched)"))
    rules.append(read_budget(call, "input", 1, nbytes_of((b, 1, n), case.dtype),
                             "bias (each example's row fetched once)"))
    rules.append(block_is(call, "input", 2, (1, n), "scale (shared: no batch dimension)"))
    rules.append(read_budget(call, "input", 2, nbytes_of((1, n), case.dtype),
                             "scale (fetched once for the whole batch)"))


def _batched_ref(x, bias, scale, bm):
    """``tanh(x[b] * scale + bias[b])`` for every example ``b``, in float32, rounded once."""
    return jnp.tanh(as_f32(x) * as_f32(scale) + as_f32(bias)).astype(x.dtype)


register_task(
    id="batched_bias_tanh", assignment=A10,
    title="A kernel for one matrix, vmapped over a batch with one operand shared",
    kernel_ops=(("tanh",),),
    reference=_batched_ref,
    tolerance="reduction",
    cases=(
        make_case("v0", 10, "float32", {"x": (3, 16, 128), "bias": (3, 1, 128),
                                        "scale": (1, 128)}, bm=8),
        make_case("h0", 1001, "float32", {"x": (2, 37, 256), "bias": (2, 1, 256),
                                          "scale": (1, 256)}, True, bm=16),
        make_case("h1", 1002, "bfloat16", {"x": (4, 32, 128), "bias": (4, 1, 128),
                                           "scale": (1, 128)}, True, bm=8),
        make_case("h2", 1003, "float32", {"x": (5, 8, 512), "bias": (5, 1, 512),
                                          "scale": (1, 512)}, True, bm=8),
    ),
    structure=single_call(_batched_rules),
)


# ----------------------------------------------------------------------------- task 2: custom_vjp
def _rms_norm_f32(x, w):
    x = as_f32(x)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * as_f32(w)


def _rms_norm_ref(x, w, g, bm):
    """The rows of ``y``, ``dx`` and ``dw`` stacked, (2M + 1, N): the scaled RMS norm and plain
    JAX's gradients for the cotangent ``g``, computed in float32 and rounded once to the
    input's dtype."""
    y, pullback = jax.vjp(_rms_norm_f32, as_f32(x), as_f32(w))
    dx, dw = pullback(as_f32(g))
    return jnp.concatenate([y, dx, dw]).astype(x.dtype)


def _rms_norm_rules(t, case, inputs) -> list[Rule]:
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules = [calls_at_least(t, 2)]
    if len(t.calls) < 2:
        rules.append(Rule("backward pass", "a pallas_call of its own (jax.custom_vjp's bwd)",
                          "no second pallas_call", False))
        return rules
    forward, backward = t.calls[0], t.calls[-1]
    for label, call in (("forward", forward), ("backward", backward)):
        rules.append(Rule(f"{label} grid", str((cdiv(m, bm),)), str(tuple(call.grid)),
                          tuple(call.grid) == (cdiv(m, bm),)))
        rules.append(block_is(call, "output", 0, (bm, n), f"{label} output"))
    rules.append(role_count(backward, "input", 3, "backward kernel inputs (x, w and the "
                            "cotangent)"))
    rules.append(block_is(backward, "input", 0, (bm, n), "backward input 0 (x)"))
    rules.append(role_count(backward, "output", 2, "backward kernel outputs (dx and dw)"))
    rules.append(block_is(backward, "output", 1, (1, n),
                          "backward output 1 (dw: one row, summed across the grid steps)"))
    return rules


register_task(
    id="rms_norm", assignment=A10,
    title="Scaled RMS norm: forward and backward kernels via custom_vjp, dw summed across steps",
    kernel_ops=(("rsqrt", "sqrt"),),
    reference=_rms_norm_ref, invoke=calling.vjp_rows_stacked, make=with_zero_row("x"),
    tolerance="reduction",
    cases=(
        make_case("v0", 20, "float32", {"x": (16, 128), "w": (1, 128), "g": (16, 128)}, bm=8),
        # visible: an all-zero row of x, whose mean square is 0: without RMS_EPS its
        # reciprocal square root is inf and the row NaN
        make_case("v1", 21, "float32", {"x": (16, 128), "w": (1, 128), "g": (16, 128)},
                  values="zero_row", bm=8),
        # visible: 20 rows in blocks of 8, so the last block's 4 rows past M must stay out of dw
        make_case("v2", 22, "float32", {"x": (20, 128), "w": (1, 128), "g": (20, 128)}, bm=8),
        make_case("h0", 2001, "float32", {"x": (37, 256), "w": (1, 256), "g": (37, 256)}, True,
                  bm=16),
        make_case("h1", 2002, "bfloat16", {"x": (32, 512), "w": (1, 512), "g": (32, 512)}, True,
                  bm=8),
        make_case("h2", 2003, "float32", {"x": (64, 128), "w": (1, 128), "g": (64, 128)}, True,
                  values="large", bm=32),
        make_case("h3", 2004, "float32", {"x": (8, 1024), "w": (1, 1024), "g": (8, 1024)}, True,
                  bm=8),
        # hidden too: an all-zero row, so a norm without RMS_EPS loses the hidden points
        make_case("h4", 2005, "bfloat16", {"x": (24, 256), "w": (1, 256), "g": (24, 256)}, True,
                  values="zero_row", bm=8),
    ),
    structure=_rms_norm_rules,
)


# ----------------------------------------------------------------------------- task 3: aliasing
def _add_patch_ref(acc, delta, row0, col0, bm, bn):
    """``acc`` with ``delta`` added into the patch at ``[row0:, col0:]``, the sum rounded once
    to ``acc``'s dtype."""
    r, c = delta.shape
    patch = acc[row0:row0 + r, col0:col0 + c]
    return acc.at[row0:row0 + r, col0:col0 + c].set(
        (as_f32(patch) + as_f32(delta)).astype(acc.dtype))


def _add_patch_rules(call, case, rules, inputs):
    r, c = case.arrays["delta"]
    bm, bn = case.params["bm"], case.params["bn"]
    rules.append(grid_is(call, (r // bm, c // bn)))
    rules.append(block_is(call, "input", 0, (bm, bn), "acc"))
    updated = nbytes_of((r, c), case.dtype)
    rules.extend(total_budget(call, read=2 * updated, write=updated))


register_task(
    id="add_patch_in_place", assignment=A10,
    given_body=("total = acc_ref[...].astype(jnp.float32) + delta_ref[...].astype(jnp.float32)\n"
                "out_ref[...] = total.astype(out_ref.dtype)"),
    title="Add a patch of rows and columns into a buffer in place",
    kernel_ops=(("add",),),
    reference=_add_patch_ref,
    cases=(
        make_case("v0", 30, "float32", {"acc": (64, 384), "delta": (16, 128)}, row0=24,
                  col0=128, bm=8, bn=128),
        # the full width, two column blocks
        make_case("h0", 3001, "float32", {"acc": (128, 256), "delta": (32, 256)}, True, row0=0,
                  col0=0, bm=16, bn=128),
        # the bottom-right corner
        make_case("h1", 3002, "bfloat16", {"acc": (64, 512), "delta": (16, 128)}, True, row0=48,
                  col0=384, bm=16, bn=128),
        make_case("h2", 3003, "float32", {"acc": (256, 512), "delta": (64, 256)}, True, row0=128,
                  col0=256, bm=32, bn=128),
    ),
    structure=single_call(_add_patch_rules),
)
