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


def _row_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (cdiv(m, bm),)))
    rules.append(block_is(call, "input", 0, (bm, n), "x"))


register_task(
    id="tiled_add", assignment=A2, title="Tiled add for any block size",
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
    id="row_softmax", assignment=A2, title="Row softmax",
    kernel_ops=(("exp",),),
    reference=lambda x, bm: jax.nn.softmax(as_f32(x), axis=-1).astype(x.dtype),
    tolerance="reduction",
    cases=(
        make_case("v0", 5, "float32", {"x": (16, 128)}, bm=8),
        # large logits, visible: exp overflows to inf (and the softmax to NaN) unless the row
        # maximum is subtracted first, as the task says
        make_case("v1", 6, "float32", {"x": (16, 256)}, values="large", bm=8),
        make_case("h0", 151, "float32", {"x": (37, 100)}, True, bm=16),
        make_case("h1", 152, "bfloat16", {"x": (32, 256)}, True, bm=8),
        make_case("h2", 153, "float32", {"x": (64, 128)}, True, bm=32),
        make_case("h3", 154, "float32", {"x": (16, 256)}, True, values="large", bm=8),
    ),
    structure=single_call(_row_rules),
)
