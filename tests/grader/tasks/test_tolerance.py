"""Tests that see numerical mistakes (issue 14, class 4): adversarial inputs, one tolerance table.

A kernel that is right on N(0, 1) inputs but skips the softmax's max subtraction, or that
accumulates a long matmul in bfloat16, fails the visible case added for it (issue 25: the
learner sees why) and a hidden one; the same kernel done right passes every case. Visible
cases are large enough for their traffic budgets to fail.
"""

from __future__ import annotations

import gradertools
import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader import tasks
from grader.learner import course
from grader.verdict import refs


def _column_softmax(subtract_max: bool):
    def column_softmax(x, bn):
        def kernel(x_ref, o_ref):
            v = x_ref[...].astype(jnp.float32)
            e = jnp.exp(v - jnp.max(v, axis=0, keepdims=True) if subtract_max else v)
            o_ref[...] = (e / jnp.sum(e, axis=0, keepdims=True)).astype(o_ref.dtype)

        spec = pl.BlockSpec((x.shape[0], bn), lambda j: (0, j))
        return pl.pallas_call(kernel, grid=(pl.cdiv(x.shape[1], bn),), in_specs=[spec],
                              out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x)
    return column_softmax


def _matmul(accumulate_in_input_dtype: bool, mask_a: bool = True, mask_b: bool = True):
    """Assignment 4's matmul for any K; each switch plants one mistake: a bfloat16 accumulator,
    or the K overhang of A's or B's last block left unmasked."""
    def matmul(a, b, bm, bk, bn):
        (m, k), n = a.shape, b.shape[1]
        acc_dtype = a.dtype if accumulate_in_input_dtype else jnp.float32

        def kernel(a_ref, b_ref, o_ref, acc_ref):
            kk = pl.program_id(2)

            @pl.when(kk == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            a_in = kk * bk + jax.lax.broadcasted_iota(jnp.int32, (bm, bk), 1) < k
            b_in = kk * bk + jax.lax.broadcasted_iota(jnp.int32, (bk, bn), 0) < k
            x = jnp.where(a_in, a_ref[...], 0) if mask_a else a_ref[...]
            y = jnp.where(b_in, b_ref[...], 0) if mask_b else b_ref[...]
            acc_ref[...] += jnp.dot(x, y, precision=gradertools.precision_for(x.dtype),
                                    preferred_element_type=jnp.float32).astype(acc_dtype)

            @pl.when(kk == pl.num_programs(2) - 1)
            def _():
                o_ref[...] = acc_ref[...].astype(o_ref.dtype)

        return pl.pallas_call(
            kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)], interpret=pltpu.InterpretParams(),
        )(a, b)
    return matmul


def test_softmax_without_the_max_fails_the_large_logits():
    with pytest.raises(course.CheckFailed, match=r"wrong values for case v1 .*large"):
        course.check("column_softmax", _column_softmax(subtract_max=False))
    with pytest.raises(course.CheckFailed, match=r"wrong values for case h3 .*large"):
        course.check("column_softmax", _column_softmax(subtract_max=False), hidden=True)
    course.check("column_softmax", _column_softmax(subtract_max=True), hidden=True, quiet=True)


def test_bfloat16_accumulation_fails_the_long_positive_matmul():
    with pytest.raises(course.CheckFailed, match=r"wrong values for case v1 \(bfloat16"):
        course.check("matmul", _matmul(accumulate_in_input_dtype=True))
    with pytest.raises(course.CheckFailed, match=r"wrong values for case h\d \(bfloat16"):
        course.check("matmul", _matmul(accumulate_in_input_dtype=True), hidden=True)
    course.check("matmul", _matmul(accumulate_in_input_dtype=False), hidden=True, quiet=True)


@pytest.mark.parametrize("unmasked", ["mask_a", "mask_b"])
def test_a_k_overhang_left_in_either_block_fails_the_ragged_k_case(unmasked):
    """Assignment 4's matmul for any K: what lies past K in the last K step's blocks is NaN in
    interpret mode, and NaN times a masked zero is NaN, so masking one block is not enough;
    the visible case v2 (K = 200 in blocks of 128) shows it."""
    with pytest.raises(course.CheckFailed, match=r"wrong values for case v2 "):
        course.check("matmul", _matmul(accumulate_in_input_dtype=False, **{unmasked: False}))


def test_one_tolerance_table_in_the_manifest():
    manifest = refs.load_manifest(refs.REPO / "exercises" / "refs")
    for entry in manifest["cases"].values():
        task = tasks.get(entry["task"])
        assert (entry["rtol"], entry["atol"]) == \
            tasks.TOLERANCES[task.tolerance][entry["dtype"]], entry
        # a ring's bfloat16 sum rounds at each of its N - 1 hops (core.TOLERANCES["ring"])
        widest = 2**-6 if task.tolerance == "ring" else 2**-7
        assert entry["rtol"] <= widest and entry["atol"] <= 2**-5, "no loose bf16 tolerance"
    assert manifest["tolerances"]["reduction"]["bfloat16"] == {"rtol": 2**-7, "atol": 1e-3}


def test_visible_cases_let_the_traffic_budgets_fail():
    gmm = next(c for c in tasks.get("grouped_matmul").cases if not c.hidden)
    groups, blocks = gmm.arrays["w"][0], gmm.arrays["x"][0] // gmm.params["bm"]
    assert groups > blocks, "reading every group's weights once must exceed the budget"
    flash = next(c for c in tasks.get("flash_attention").cases if not c.hidden)
    assert flash.arrays["k"][0] != flash.arrays["q"][1], "Lk == d hides a transposed k"
