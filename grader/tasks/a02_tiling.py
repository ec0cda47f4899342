"""Assignment 02, tiling: its tasks, cases and structural rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grader.tasks.core import as_f32, block_is, cdiv, grid_is, make_case, register_task, single_call

A2 = "02_tiling"


def _tiled_add_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn))))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(block_is(call, "output", 0, (bm, bn), "output"))


def _column_rules(call, case, rules, inputs):
    (m, n), bn = case.arrays["x"], case.params["bn"]
    rules.append(grid_is(call, (cdiv(n, bn),)))
    rules.append(block_is(call, "input", 0, (m, bn), "x"))
    rules.append(block_is(call, "output", 0, (m, bn), "output"))


def _row_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (cdiv(m, bm),)))
    rules.append(block_is(call, "input", 0, (bm, n), "x"))


register_task(
    id="tiled_add", assignment=A2, title="Tiled add for any block size",
    given_body="o_ref[...] = x_ref[...] + y_ref[...]",
    kernel_ops=(("add",),),
    reference=lambda x, y, block: x + y,
    cases=(
        make_case("v0", 3, "float32", {"x": (32, 256), "y": (32, 256)}, block=(8, 128)),
        make_case("h0", 131, "float32", {"x": (37, 300), "y": (37, 300)}, True, block=(8, 128)),
        make_case("h1", 132, "bfloat16", {"x": (64, 512), "y": (64, 512)}, True, block=(16, 256)),
        make_case("h2", 133, "float32", {"x": (20, 130), "y": (20, 130)}, True, block=(16, 128)),
    ),
    structure=single_call(_tiled_add_rules),
)
register_task(
    id="row_sum", assignment=A2, title="Row sums, one block of rows per step",
    kernel_ops=(("reduce_sum",),),
    reference=lambda x, bm: jnp.sum(as_f32(x), axis=1, keepdims=True).astype(x.dtype),
    tolerance="reduction",
    cases=(
        make_case("v0", 4, "float32", {"x": (32, 128)}, bm=8),
        make_case("h0", 141, "float32", {"x": (37, 200)}, True, bm=16),
        make_case("h1", 142, "bfloat16", {"x": (64, 256)}, True, bm=32),
        make_case("h2", 143, "float32", {"x": (8, 64)}, True, bm=8),
    ),
    structure=single_call(_row_rules),
)
register_task(
    id="column_softmax", assignment=A2, title="Column softmax, one band of whole columns per step",
    kernel_ops=(("exp",),),
    reference=lambda x, bn: jax.nn.softmax(as_f32(x), axis=0).astype(x.dtype),
    tolerance="reduction",
    cases=(
        make_case("v0", 5, "float32", {"x": (16, 256)}, bn=128),
        # large values, visible: exp overflows to inf (and the softmax to NaN) unless the
        # column maximum is subtracted first, as the task says
        make_case("v1", 6, "float32", {"x": (32, 256)}, values="large", bn=128),
        # 300 columns in bands of 128: the last band sticks out by 84 columns
        make_case("h0", 151, "float32", {"x": (37, 300)}, True, bn=128),
        make_case("h1", 152, "bfloat16", {"x": (32, 256)}, True, bn=128),
        # one band wider than the array's 200 columns, an odd row count
        make_case("h2", 153, "float32", {"x": (9, 200)}, True, bn=256),
        make_case("h3", 154, "float32", {"x": (16, 384)}, True, values="large", bn=128),
    ),
    structure=single_call(_column_rules),
)
