# %% [markdown]
# # Assignment 2 — tiling
#
# A grid runs the kernel once per grid point; a `BlockSpec(block_shape, index_map)` gives each
# step one block of an operand. With `grid = (pl.cdiv(M, bm), pl.cdiv(N, bn))` the last blocks
# may stick out of the array: reads there return unspecified values (NaN in interpret mode),
# writes there are dropped. Hidden tests use shapes that are not multiples of the block.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check tiling.ipynb`.

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

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# One `BlockSpec((bm, bn), ...)` serves both inputs and the output; its index map returns the
# *block* index, which for a 2-D grid `(i, j)` is simply `(i, j)`. The grid uses `pl.cdiv` so
# it covers the edges: the out-of-range part of an edge block reads unspecified values and its
# writes are dropped, which is harmless for an elementwise add.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The grid counts blocks with `pl.cdiv` in both dimensions. One `pl.BlockSpec((bm, bn), ...)` serves
# both inputs and the output: its index map takes the two grid indices and gives them back,
# unchanged, as the block index.
#
# </details>

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

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Each step gets `bm` whole rows (block `(bm, N)`, index map `(i, 0)`) and writes a `(bm, 1)`
# block of the output. Sum along axis 1 in float32 with `keepdims=True` so the shape matches
# the output block, then cast. Rows past the array's end in the last block hold unspecified
# values; their sums are dropped on the write.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Cast the loaded block to `jnp.float32` first, then `jnp.sum` along axis 1 with `keepdims=True`: a
# `(bm, N)` block gives `(bm, 1)`, the output block's shape. The store casts back with
# `.astype(o_ref.dtype)`.
#
# </details>

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

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Same grid and blocks as `row_sum`, with the output block equal to the input block. Every
# row is whole inside its block, so the softmax needs no communication between steps:
# subtract the row maximum, exponentiate, divide by the row sum, all in float32, then cast.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# With `v` the float32 block, take every row statistic along axis 1 with `keepdims=True`, so its
# `(bm, 1)` result broadcasts against `v`: subtract the row max from `v`, apply `jnp.exp`, divide by
# the row sums of that, then cast to `o_ref.dtype`.
#
# </details>

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

# %% [markdown]
# ## What passed
#
# The cell below lists every task of this notebook as passed, failed (with the first line of
# its message) or not checked in this kernel; run all cells above first.

# %%
course.summary()
