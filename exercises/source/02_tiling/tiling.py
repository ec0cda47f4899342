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
from grader.learner import course
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
#
# The kernel body is given: `o_ref[...] = x_ref[...] + y_ref[...]`, the body of lesson 3's
# `tiled_add` and the one shipped body "kernels are your own" accepts in this task. The grid
# and the `BlockSpec`s are your work.

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
# ## Task 3 — `column_softmax(x, bn)` (3 points)
#
# Softmax down each **column** of `x` (shape `(M, N)`): every column of the result sums to 1.
# Give each grid step a block of `bn` whole columns and all `M` rows, so that a column never
# spans two steps; the grid has `cdiv(N, bn)` steps. `bn` is a multiple of 128, and `N` need
# not be a multiple of `bn`. Subtract each column's maximum before `exp`; compute in float32,
# return the dtype of `x`.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# This is `row_sum`'s layout turned on its side: the block holds every row and a band of
# columns, and the grid walks along the columns, so the index map puts the grid index in the
# column position and keeps the row block at 0. Every statistic of the softmax is now taken
# down a column, along the block's first axis. Columns past the end of `x` in the last block
# hold unspecified values, but each column is computed on its own and their writes are
# dropped.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# With `v` the float32 block, take the column maximum and the column sum along axis 0 with
# `keepdims=True`: each gives a `(1, bn)` row that broadcasts against the `(M, bn)` block.
# The block shape is all of `M` by `bn`; the index map takes the grid index `j` and returns a
# block position whose row part is the first block and whose column part is `j`.
#
# </details>

# %% nbgrader={"grade_id": "column_softmax_solution", "solution": true}
def column_softmax(x, bn):
    ### BEGIN SOLUTION
    m, n = x.shape

    def kernel(x_ref, o_ref):
        cols = x_ref[...].astype(jnp.float32)
        shifted = jnp.exp(cols - cols.max(axis=0, keepdims=True))
        o_ref[...] = (shifted / shifted.sum(axis=0, keepdims=True)).astype(o_ref.dtype)

    band = pl.BlockSpec((m, bn), lambda j: (0, j))  # whole columns: no column spans two steps
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(n, bn),),
        in_specs=[band],
        out_specs=band,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "column_softmax_visible", "grade": true, "points": 1}
course.check("column_softmax", column_softmax)

# %% nbgrader={"grade_id": "column_softmax_hidden", "grade": true, "points": 2}
# Hidden tests: column counts that are not a multiple of bn, bfloat16, large values.
### BEGIN HIDDEN TESTS
course.check("column_softmax", column_softmax, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
