# %% [markdown]
# # Assignment 4 — memory spaces
#
# Blocks live in VMEM; a `scratch_shapes=[pltpu.VMEM(shape, dtype)]` buffer stays on chip across
# grid steps. Use `pl.when(pl.program_id(axis) == 0)` to initialise it and
# `pl.num_programs(axis) - 1` to find the last step. Kernels with scratch use `TPU_INTERPRET`.

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


def _matmul_call(a, b, bm, bk, bn, epilogue, extra=(), extra_specs=()):
    m, k = a.shape
    n = b.shape[1]

    def kernel(a_ref, b_ref, *rest):
        *extra_refs, o_ref, acc_ref = rest

        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = epilogue(acc_ref[...], *[r[...] for r in extra_refs]).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)), *extra_specs],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        interpret=TPU_INTERPRET,
    )(a, b, *extra)

# %% [markdown]
# ## Task 1 — `matmul(a, b, bm, bk, bn)` (3 points)
#
# `a @ b` (output dtype of `a`) with grid `(cdiv(M, bm), cdiv(N, bn), K // bk)`, the K axis last,
# and a float32 VMEM accumulator of shape `(bm, bn)`. `K` is a multiple of `bk`. Budget: `A` is
# read at most `N / bn` times, `B` at most `M / bm` times, the output written once. The helper
# above is yours to use or ignore.

# %% nbgrader={"grade_id": "matmul_solution", "solution": true}
def matmul(a, b, bm, bk, bn):
    ### BEGIN SOLUTION
    return _matmul_call(a, b, bm, bk, bn, lambda acc: acc)
    ### END SOLUTION


# %% nbgrader={"grade_id": "matmul_visible", "grade": true, "points": 1}
course.check("matmul", matmul)

# %% nbgrader={"grade_id": "matmul_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: non-divisible M and N, bfloat16, other blocks.
### BEGIN HIDDEN TESTS
course.check("matmul", matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `matmul_bias_relu(a, b, bias, bm, bk, bn)` (3 points)
#
# `relu(a @ b + bias)` with `bias` of shape `(1, N)`, in **one** `pallas_call`: add the bias and
# apply the ReLU to the accumulator at the last K step (a fused epilogue), never writing `a @ b`
# to HBM.

# %% nbgrader={"grade_id": "matmul_bias_relu_solution", "solution": true}
def matmul_bias_relu(a, b, bias, bm, bk, bn):
    ### BEGIN SOLUTION
    return _matmul_call(
        a, b, bm, bk, bn,
        lambda acc, bb: jnp.maximum(acc + bb.astype(jnp.float32), 0.0),
        extra=(bias,), extra_specs=(pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),),
    )
    ### END SOLUTION


# %% nbgrader={"grade_id": "matmul_bias_relu_visible", "grade": true, "points": 1}
course.check("matmul_bias_relu", matmul_bias_relu)

# %% nbgrader={"grade_id": "matmul_bias_relu_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: non-divisible M and N, bfloat16.
### BEGIN HIDDEN TESTS
course.check("matmul_bias_relu", matmul_bias_relu, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `sum_all(x, block)` (3 points)
#
# The sum of all elements as a float32 array of shape `(1, 1)`. Grid `(cdiv(M, bm), cdiv(N, bn))`
# over blocks `block = (bm, bn)`; the output block's index map is constant, so it stays on chip
# and is written back once. Edge blocks hold padding: mask it out (`jax.lax.broadcasted_iota`).

# %% nbgrader={"grade_id": "sum_all_solution", "solution": true}
def sum_all(x, block):
    ### BEGIN SOLUTION
    bm, bn = block
    m, n = x.shape

    def kernel(x_ref, o_ref):
        i, j = pl.program_id(0), pl.program_id(1)

        @pl.when((i == 0) & (j == 0))
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        rows = i * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 0)
        cols = j * bn + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 1)
        v = jnp.where((rows < m) & (cols < n), x_ref[...].astype(jnp.float32), 0.0)
        o_ref[...] += jnp.sum(v).reshape(1, 1)

    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((1, 1), lambda i, j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32),
        interpret=INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "sum_all_visible", "grade": true, "points": 1}
course.check("sum_all", sum_all)

# %% nbgrader={"grade_id": "sum_all_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible shapes (padding must not be summed), bfloat16.
### BEGIN HIDDEN TESTS
course.check("sum_all", sum_all, hidden=True)
### END HIDDEN TESTS
