"""Assignment 03, index maps: its tasks, cases and structural rules."""

from __future__ import annotations

from grader.tasks.core import (
    block_is,
    cdiv,
    grid_is,
    grid_rank,
    make_case,
    nbytes_of,
    normal_array,
    read_budget,
    register_task,
    role_count,
    single_call,
)

A3 = "03_index_maps"


def _transpose_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_rank(call, 2))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(block_is(call, "output", 0, (bn, bm), "output"))
    rules.append(read_budget(call, "input", 0, nbytes_of((m, n), case.dtype),
                             "x (each block once)"))


def _bias_rules(call, case, rules, inputs):
    (_, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_rank(call, 2))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(block_is(call, "input", 1, (1, bn), "bias"))
    rules.append(read_budget(call, "input", 1, nbytes_of((1, n), case.dtype),
                             "bias (each bias block fetched once: order the grid for it)"))


def _sym_rules(call, case, rules, inputs):
    (n, _), b = case.arrays["x"], case.params["b"]
    rules.append(grid_is(call, (cdiv(n, b), cdiv(n, b))))
    rules.append(role_count(call, "input", 2, "x passed twice (two index maps)"))
    rules.append(block_is(call, "input", 0, (b, b), "first x"))
    rules.append(block_is(call, "input", 1, (b, b), "second x"))


def _make_bias(rng, case):
    m, n = case.arrays["x"]
    return {"x": normal_array(rng, (m, n), case.dtype), "bias": normal_array(rng, (1, n),
                                                                             case.dtype)}


register_task(
    id="transpose", assignment=A3, title="Transpose through the index map",
    given_body="o_ref[...] = x_ref[...].T",
    kernel_ops=(("transpose",),),
    reference=lambda x, block: x.T,
    cases=(
        make_case("v0", 6, "float32", {"x": (256, 384)}, block=(128, 128)),
        make_case("h0", 161, "float32", {"x": (300, 200)}, True, block=(128, 128)),
        make_case("h1", 162, "bfloat16", {"x": (256, 512)}, True, block=(128, 256)),
        make_case("h2", 163, "float32", {"x": (384, 128)}, True, block=(256, 128)),
    ),
    structure=single_call(_transpose_rules),
)
register_task(
    id="add_bias", assignment=A3, title="Add a row bias, fetching each bias block once",
    given_body="o_ref[...] = x_ref[...] + b_ref[...]",
    kernel_ops=(("add",),),
    reference=lambda x, bias, block: x + bias,
    make=_make_bias,
    cases=(
        make_case("v0", 7, "float32", {"x": (32, 256)}, block=(8, 128)),
        make_case("h0", 171, "float32", {"x": (37, 300)}, True, block=(16, 128)),
        make_case("h1", 172, "bfloat16", {"x": (64, 512)}, True, block=(16, 128)),
        make_case("h2", 173, "float32", {"x": (16, 128)}, True, block=(8, 128)),
    ),
    structure=single_call(_bias_rules),
)
register_task(
    id="symmetrize", assignment=A3, title="x + x.T with two index maps on one array",
    kernel_ops=(("add",), ("transpose",)),
    reference=lambda x, b: x + x.T,
    cases=(
        make_case("v0", 8, "float32", {"x": (256, 256)}, b=128),
        make_case("h0", 181, "float32", {"x": (300, 300)}, True, b=128),
        make_case("h1", 182, "bfloat16", {"x": (256, 256)}, True, b=128),
        make_case("h2", 183, "float32", {"x": (384, 384)}, True, b=128),
    ),
    structure=single_call(_sym_rules),
)
