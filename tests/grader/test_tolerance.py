"""Tests that see numerical mistakes (issue 14, class 4): adversarial inputs, one tolerance table.

A kernel that is right on N(0, 1) inputs but skips the softmax's max subtraction, or that
accumulates a long matmul in bfloat16, fails the visible case added for it (issue 25: the
learner sees why) and a hidden one; the same kernel done right passes every case. Visible
cases are large enough for their traffic budgets to fail.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader import course, refs, tasks


def _row_softmax(subtract_max: bool):
    def row_softmax(x, bm):
        def kernel(x_ref, o_ref):
            v = x_ref[...].astype(jnp.float32)
            e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True) if subtract_max else v)
            o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)

        spec = pl.BlockSpec((bm, x.shape[1]), lambda i: (i, 0))
        return pl.pallas_call(kernel, grid=(pl.cdiv(x.shape[0], bm),), in_specs=[spec],
                              out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x)
    return row_softmax


def _matmul(accumulate_in_input_dtype: bool):
    def matmul(a, b, bm, bk, bn):
        (m, k), n = a.shape, b.shape[1]
        acc_dtype = a.dtype if accumulate_in_input_dtype else jnp.float32

        def kernel(a_ref, b_ref, o_ref, acc_ref):
            @pl.when(pl.program_id(2) == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            acc_ref[...] += jnp.dot(a_ref[...], b_ref[...],
                                    preferred_element_type=jnp.float32).astype(acc_dtype)

            @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
            def _():
                o_ref[...] = acc_ref[...].astype(o_ref.dtype)

        return pl.pallas_call(
            kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)], interpret=pltpu.InterpretParams(),
        )(a, b)
    return matmul


def test_softmax_without_the_max_fails_the_large_logits():
    with pytest.raises(course.CheckFailed, match=r"wrong values for case v1 .*large"):
        course.check("row_softmax", _row_softmax(subtract_max=False))
    with pytest.raises(course.CheckFailed, match=r"wrong values for case h3 .*large"):
        course.check("row_softmax", _row_softmax(subtract_max=False), hidden=True)
    course.check("row_softmax", _row_softmax(subtract_max=True), hidden=True, quiet=True)


def test_bfloat16_accumulation_fails_the_long_positive_matmul():
    with pytest.raises(course.CheckFailed, match=r"wrong values for case v1 \(bfloat16"):
        course.check("matmul", _matmul(accumulate_in_input_dtype=True))
    with pytest.raises(course.CheckFailed, match=r"wrong values for case h\d \(bfloat16"):
        course.check("matmul", _matmul(accumulate_in_input_dtype=True), hidden=True)
    course.check("matmul", _matmul(accumulate_in_input_dtype=False), hidden=True, quiet=True)


def test_one_tolerance_table_in_the_manifest():
    manifest = refs.load_manifest(refs.REPO / "exercises" / "refs")
    for entry in manifest["cases"].values():
        task = tasks.get(entry["task"])
        assert (entry["rtol"], entry["atol"]) == \
            tasks.TOLERANCES[task.tolerance][entry["dtype"]], entry
        assert entry["rtol"] <= 2**-7 and entry["atol"] <= 2**-5, "no loose bf16 tolerance"
    assert manifest["tolerances"]["reduction"]["bfloat16"] == {"rtol": 2**-7, "atol": 1e-3}


def test_visible_cases_let_the_traffic_budgets_fail():
    gmm = next(c for c in tasks.get("grouped_matmul").cases if not c.hidden)
    groups, blocks = gmm.arrays["w"][0], gmm.arrays["x"][0] // gmm.params["bm"]
    assert groups > blocks, "reading every group's weights once must exceed the budget"
    flash = next(c for c in tasks.get("flash_attention").cases if not c.hidden)
    assert flash.arrays["k"][0] != flash.arrays["q"][1], "Lk == d hides a transposed k"
