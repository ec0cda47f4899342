# %% [markdown]
# # Assignment 2 — tiling
#
# A grid runs the kernel once per grid point; a `BlockSpec(block_shape, index_map)` gives each
# step one block of an operand. With `grid = (pl.cdiv(M, bm), pl.cdiv(N, bn))` the last blocks
# may stick out of the array: reads there return padding, writes there are dropped. Hidden tests
# use shapes that are not multiples of the block.

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
# ## Task 1 — `tiled_add(x, y, block)` (3 points)
#
# `x + y` with blocks of shape `block = (bm, bn)` and a 2-D grid that covers the whole array,
# for any `bm, bn` (the shape need not be a multiple of the block).

# %% nbgrader={"grade_id": "tiled_add_solution", "solution": true}
def tiled_add(x, y, block):
    ### BEGIN SOLUTION
    bm, bn = block
    m, n = x.shape

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x, y)
    ### END SOLUTION


# %% nbgrader={"grade_id": "tiled_add_visible", "grade": true, "points": 1}
course.check("tiled_add", tiled_add)

# %% nbgrader={"grade_id": "tiled_add_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible shapes, other blocks, bfloat16.
### BEGIN HIDDEN TESTS
course.check("tiled_add", tiled_add, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `row_sum(x, bm)` (3 points)
#
# The sum of each row, shape `(M, 1)`, dtype of `x` (accumulate in float32). Each grid step takes
# `bm` full rows: block `(bm, N)`, grid `(cdiv(M, bm),)`.

# %% nbgrader={"grade_id": "row_sum_solution", "solution": true}
def row_sum(x, bm):
    ### BEGIN SOLUTION
    m, n = x.shape

    def kernel(x_ref, o_ref):
        s = jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True)
        o_ref[...] = s.astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm),),
        in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), x.dtype),
        interpret=INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "row_sum_visible", "grade": true, "points": 1}
course.check("row_sum", row_sum)

# %% nbgrader={"grade_id": "row_sum_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible row counts, bfloat16.
### BEGIN HIDDEN TESTS
course.check("row_sum", row_sum, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `row_softmax(x, bm)` (3 points)
#
# Softmax along the last axis, same blocks and grid as `row_sum`. Subtract the row maximum
# before `exp`; compute in float32, return the dtype of `x`.

# %% nbgrader={"grade_id": "row_softmax_solution", "solution": true}
def row_softmax(x, bm):
    ### BEGIN SOLUTION
    m, n = x.shape

    def kernel(x_ref, o_ref):
        v = x_ref[...].astype(jnp.float32)
        e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
        o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)

    spec = pl.BlockSpec((bm, n), lambda i: (i, 0))
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm),),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "row_softmax_visible", "grade": true, "points": 1}
course.check("row_softmax", row_softmax)

# %% nbgrader={"grade_id": "row_softmax_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible row counts, bfloat16.
### BEGIN HIDDEN TESTS
course.check("row_softmax", row_softmax, hidden=True)
### END HIDDEN TESTS
