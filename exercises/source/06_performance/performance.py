# %% [markdown]
# # Assignment 6 — performance
#
# On a memory-bound kernel the time is the HBM traffic. kernelsim counts it per operand; these
# tasks are graded on values **and** on staying within a traffic budget.

# %% nbgrader={"grade_id": "setup", "locked": true}
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader import course
from kernelsim.backend import choose

# Compiled on a GPU or TPU, interpreted on a CPU. TPU_INTERPRET is for kernels that use
# TPU-only features (VMEM/SMEM scratch, scalar prefetch).
INTERPRET = choose().interpret
TPU_INTERPRET = choose(tpu_features=True).interpret

# %% [markdown]
# ## Task 1 — `fused_add_relu_mul(x, y, z)` (3 points)
#
# `relu(x + y) * z` in a single `pallas_call` that reads each input once and writes the output
# once (three separate kernels would move twice as many bytes). Choose the blocks yourself.

# %% nbgrader={"grade_id": "fused_add_relu_mul_solution", "solution": true}
def fused_add_relu_mul(x, y, z):
    ### BEGIN SOLUTION
    m, n = x.shape
    bm = min(m, 64)

    def kernel(x_ref, y_ref, z_ref, o_ref):
        o_ref[...] = (jnp.maximum(x_ref[...] + y_ref[...], 0) * z_ref[...]).astype(o_ref.dtype)

    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return pl.pallas_call(
        kernel, grid=(pl.cdiv(m, bm),), in_specs=[spec] * 3, out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET,
    )(x, y, z)
    ### END SOLUTION


# %% nbgrader={"grade_id": "fused_add_relu_mul_visible", "grade": true, "points": 1}
course.check("fused_add_relu_mul", fused_add_relu_mul)

# %% nbgrader={"grade_id": "fused_add_relu_mul_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible shapes, bfloat16.
### BEGIN HIDDEN TESTS
course.check("fused_add_relu_mul", fused_add_relu_mul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `matmul_tuned(a, b)` (3 points)
#
# `a @ b` with block sizes of your choice. Budget: HBM reads at most 4 x (bytes of `a` + bytes of
# `b`), one write of the output, on-chip peak at most 16 MiB. Shapes are multiples of 128.

# %% nbgrader={"grade_id": "matmul_tuned_solution", "solution": true}
def matmul_tuned(a, b):
    ### BEGIN SOLUTION
    m, k = a.shape
    n = b.shape[1]
    bm, bn = min(m, 256), min(n, 256)

    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...],
                             preferred_element_type=jnp.float32).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype), interpret=INTERPRET,
    )(a, b)
    ### END SOLUTION


# %% nbgrader={"grade_id": "matmul_tuned_visible", "grade": true, "points": 1}
course.check("matmul_tuned", matmul_tuned)

# %% nbgrader={"grade_id": "matmul_tuned_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: other shapes, bfloat16.
### BEGIN HIDDEN TESTS
course.check("matmul_tuned", matmul_tuned, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `layernorm(x, gamma, beta, bm)` (3 points)
#
# `(x - mean) / sqrt(var + 1e-5) * gamma + beta` over the last axis (`gamma`, `beta` of shape
# `(1, N)`), in float32, returned in the dtype of `x`. One pass: grid `(cdiv(M, bm),)`, `x`
# read once, `gamma` and `beta` fetched once each (a constant index map), output written once.

# %% nbgrader={"grade_id": "layernorm_solution", "solution": true}
def layernorm(x, gamma, beta, bm):
    ### BEGIN SOLUTION
    m, n = x.shape

    def kernel(x_ref, g_ref, b_ref, o_ref):
        v = x_ref[...].astype(jnp.float32)
        mu = jnp.mean(v, axis=1, keepdims=True)
        var = jnp.mean((v - mu) ** 2, axis=1, keepdims=True)
        y = (v - mu) * jax.lax.rsqrt(var + 1e-5)
        o_ref[...] = (y * g_ref[...].astype(jnp.float32)
                      + b_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

    row = pl.BlockSpec((bm, n), lambda i: (i, 0))
    par = pl.BlockSpec((1, n), lambda i: (0, 0))
    return pl.pallas_call(
        kernel, grid=(pl.cdiv(m, bm),), in_specs=[row, par, par], out_specs=row,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET,
    )(x, gamma, beta)
    ### END SOLUTION


# %% nbgrader={"grade_id": "layernorm_visible", "grade": true, "points": 1}
course.check("layernorm", layernorm)

# %% nbgrader={"grade_id": "layernorm_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible row counts, bfloat16.
### BEGIN HIDDEN TESTS
course.check("layernorm", layernorm, hidden=True)
### END HIDDEN TESTS
