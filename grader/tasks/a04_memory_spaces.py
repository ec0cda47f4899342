"""Assignment 04, memory spaces: its tasks, cases and structural rules."""

from __future__ import annotations

import jax.numpy as jnp

from grader.tasks.core import (
    Rule,
    _c,
    _f32,
    _matmul_ref,
    _nbytes,
    _normal,
    _ops,
    _struct,
    _task,
    _values,
    block_is,
    cdiv,
    grid_is,
    read_budget,
    role_count,
    total_budget,
)

A4 = "04_memory_spaces"


def _mm_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk, bn = case.params["bm"], case.params["bk"], case.params["bn"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn), k // bk)))
    rules.append(role_count(call, "scratch", 1, "VMEM accumulator"))
    rules.append(read_budget(call, "input", 0, cdiv(n, bn) * _nbytes((m, k), case.dtype),
                             f"A (at most N/bn = {cdiv(n, bn)} times)"))
    rules.append(read_budget(call, "input", 1, cdiv(m, bm) * _nbytes((k, n), case.dtype),
                             f"B (at most M/bm = {cdiv(m, bm)} times)"))
    rules.extend(total_budget(call, None, _nbytes((m, n), case.dtype)))


def _mm_bias_rules(call, case, rules, inputs):
    _mm_rules(call, case, rules, inputs)
    rules.append(role_count(call, "input", 3, "bias as a kernel input (fused epilogue)"))


def _make_mm(rng, case, bias=False):
    out = {k: _values(rng, s, case) for k, s in case.arrays.items()}
    if bias:
        out["bias"] = _normal(rng, (1, case.arrays["b"][1]), case.dtype)
    return out


def _sum_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn))))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(read_budget(call, "input", 0, _nbytes((m, n), case.dtype), "x (read once)"))
    outs = _ops(call, "output")
    wb = outs[0].writebacks if outs else -1
    rules.append(Rule("output writebacks", "1 (the (1, 1) result stays on chip)", str(wb),
                      wb == 1))


_mm = dict(bm=16, bk=32, bn=64)
_task(
    id="matmul", assignment=A4, title="Matmul with a VMEM accumulator",
    kernel_ops=(("dot_general",),),
    reference=_matmul_ref, tolerance="reduction",
    cases=(
        _c("v0", 9, "float32", {"a": (32, 64), "b": (64, 128)}, **_mm),
        _c("h0", 191, "float32", {"a": (40, 96), "b": (96, 200)}, True, **_mm),
        _c("h1", 192, "bfloat16", {"a": (64, 128), "b": (128, 256)}, True,
           bm=32, bk=64, bn=128),
        _c("h2", 193, "float32", {"a": (16, 32), "b": (32, 64)}, True, bm=16, bk=16, bn=32),
        _c("h3", 194, "bfloat16", {"a": (64, 1024), "b": (1024, 128)}, True, values="positive",
           bm=32, bk=64, bn=128),
    ),
    structure=_struct(_mm_rules),
)
_task(
    id="matmul_bias_relu", assignment=A4, title="Fused bias + ReLU epilogue",
    kernel_ops=(("dot_general",), ("max",)),
    reference=lambda a, b, bias, **_: jnp.maximum(
        jnp.dot(a, b, preferred_element_type=jnp.float32) + _f32(bias), 0).astype(a.dtype),
    tolerance="reduction",
    make=lambda rng, case: _make_mm(rng, case, bias=True),
    cases=(
        _c("v0", 10, "float32", {"a": (32, 64), "b": (64, 128)}, **_mm),
        _c("h0", 201, "float32", {"a": (40, 96), "b": (96, 200)}, True, **_mm),
        _c("h1", 202, "bfloat16", {"a": (64, 128), "b": (128, 256)}, True,
           bm=32, bk=64, bn=128),
        _c("h2", 203, "float32", {"a": (48, 64), "b": (64, 64)}, True, bm=16, bk=64, bn=32),
    ),
    structure=_struct(_mm_bias_rules),
)
_task(
    id="sum_all", assignment=A4, title="Sum of all elements into one resident output block",
    kernel_ops=(("reduce_sum",),),
    reference=lambda x, block: jnp.sum(_f32(x)).reshape(1, 1),
    tolerance="reduction",
    cases=(
        _c("v0", 11, "float32", {"x": (32, 256)}, block=(8, 128)),
        _c("h0", 211, "float32", {"x": (37, 300)}, True, block=(16, 128)),
        _c("h1", 212, "bfloat16", {"x": (64, 256)}, True, block=(32, 128)),
        _c("h2", 213, "float32", {"x": (20, 130)}, True, block=(8, 128)),
    ),
    structure=_struct(_sum_rules),
)
