"""Assignment 06, performance: its tasks, cases and structural rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grader.tasks.core import (
    Rule,
    _c,
    _f32,
    _matmul_ref,
    _nbytes,
    _normal,
    _struct,
    _task,
    calls_exactly,
    cdiv,
    grid_is,
    read_budget,
    total_budget,
)

A6 = "06_performance"


def _fused_rules_all(t, case, inputs) -> list[Rule]:
    rules = [calls_exactly(t, 1)]
    if t.calls:
        shape = case.arrays["x"]
        b = _nbytes(shape, case.dtype)
        rules.extend(total_budget(t.calls[0], 3 * b, b))
    return rules


def _tuned_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    ideal = _nbytes((m, k), case.dtype) + _nbytes((k, n), case.dtype)
    rules.extend(total_budget(call, 4 * ideal, _nbytes((m, n), case.dtype)))
    limit = 16 * 2**20
    rules.append(Rule("on-chip peak", f"<= {limit:,} B (v5e scoped VMEM)",
                      f"{call.onchip_peak_bytes:,} B", call.onchip_peak_bytes <= limit))


def _ln_ref(x, gamma, beta, bm):
    xf = _f32(x)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    return ((xf - mu) * jax.lax.rsqrt(var + 1e-5) * _f32(gamma) + _f32(beta)).astype(x.dtype)


def _make_ln(rng, case):
    m, n = case.arrays["x"]
    return {"x": _normal(rng, (m, n), case.dtype), "gamma": _normal(rng, (1, n), case.dtype),
            "beta": _normal(rng, (1, n), case.dtype)}


def _ln_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (cdiv(m, bm),)))
    b = _nbytes((m, n), case.dtype)
    rules.append(read_budget(call, "input", 0, b, "x (one pass)"))
    rules.append(read_budget(call, "input", 1, _nbytes((1, n), case.dtype), "gamma (once)"))
    rules.append(read_budget(call, "input", 2, _nbytes((1, n), case.dtype), "beta (once)"))
    rules.extend(total_budget(call, None, b))


_task(
    id="fused_add_relu_mul", assignment=A6, title="relu(x + y) * z in one pass over HBM",
    kernel_ops=(("add",), ("max",), ("mul",)),
    reference=lambda x, y, z: (jnp.maximum(x + y, 0) * z).astype(x.dtype),
    tolerance="exact",
    cases=(
        _c("v0", 15, "float32", {"x": (64, 256), "y": (64, 256), "z": (64, 256)}),
        _c("h0", 251, "float32", {"x": (100, 200), "y": (100, 200), "z": (100, 200)}, True),
        _c("h1", 252, "bfloat16", {"x": (64, 256), "y": (64, 256), "z": (64, 256)}, True),
        _c("h2", 253, "float32", {"x": (8, 128), "y": (8, 128), "z": (8, 128)}, True),
    ),
    structure=_fused_rules_all,
)
_task(
    id="matmul_tuned", assignment=A6, title="Choose matmul blocks within a traffic budget",
    kernel_ops=(("dot_general",),),
    reference=_matmul_ref, tolerance="reduction",
    cases=(
        _c("v0", 16, "float32", {"a": (256, 128), "b": (128, 256)}),
        _c("h0", 261, "float32", {"a": (384, 128), "b": (128, 256)}, True),
        _c("h1", 262, "bfloat16", {"a": (256, 256), "b": (256, 256)}, True),
        _c("h2", 263, "float32", {"a": (128, 128), "b": (128, 384)}, True),
    ),
    structure=_struct(_tuned_rules),
)
_task(
    id="layernorm", assignment=A6, title="LayerNorm in one pass",
    kernel_ops=(("reduce_sum",), ("rsqrt", "sqrt")),
    reference=_ln_ref, tolerance="reduction", make=_make_ln,
    cases=(
        _c("v0", 17, "float32", {"x": (32, 256)}, bm=8),
        _c("h0", 271, "float32", {"x": (37, 384)}, True, bm=16),
        _c("h1", 272, "bfloat16", {"x": (64, 256)}, True, bm=32),
        _c("h2", 273, "float32", {"x": (16, 128)}, True, bm=16),
    ),
    structure=_struct(_ln_rules),
)
