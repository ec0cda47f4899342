# %% [markdown]
# # Assignment 3 — index maps
#
# An index map turns a grid point into a block index. It decides *which* block a step sees, and
# so it can transpose, reuse or broadcast blocks without moving data in the kernel. When two
# consecutive steps ask for the same block of an input, the pipeline skips the copy.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check index_maps.ipynb`.

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
# ## Task 1 — `transpose(x, block)` (3 points)
#
# Return `x.T`. Read `x` in blocks `(bm, bn) = block`, write output blocks `(bn, bm)`; the
# output's index map sends grid point `(i, j)` to block `(j, i)`. Each input block is read once.
#
# The kernel body is given: `o_ref[...] = x_ref[...].T`, as `kernelsim/examples.py` writes
# it, and the one shipped body "kernels are your own" accepts in this task. The grid and the
# index maps are your work.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# The grid walks the input's blocks `(i, j)`. The kernel transposes the `(bm, bn)` block it
# was given; the *output's* index map decides where that `(bn, bm)` result lands: in block
# row `j`, block column `i`. No element offsets anywhere: index maps return block indices.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Only the output's spec differs from the input's: its block shape is `(bn, bm)`, and its index map
# sends grid step `(i, j)` to block row `j`, block column `i`. The kernel stores the `.T` of its
# input block.
#
# </details>

# %% nbgrader={"grade_id": "transpose_solution", "solution": true}
def transpose(x, block):
    ### BEGIN SOLUTION
    bm, bn = block
    m, n = x.shape

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].T

    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        interpret=INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "transpose_visible", "grade": true, "points": 1}
course.check("transpose", transpose)

# %% nbgrader={"grade_id": "transpose_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible shapes, other blocks, bfloat16.
### BEGIN HIDDEN TESTS
course.check("transpose", transpose, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `add_bias(x, bias, block)` (3 points)
#
# `x + bias` with `x` of shape `(M, N)` and `bias` of shape `(1, N)`, blocks `block = (bm, bn)`
# of `x` and `(1, bn)` of `bias`. Budget: each bias block may be fetched from HBM **once** in
# total, so order the grid so that consecutive steps use the same bias block.
#
# The kernel body is given: `o_ref[...] = x_ref[...] + b_ref[...]`, an add as the course's
# examples write it, and the one shipped body "kernels are your own" accepts in this task.
# The grid's order and the index maps are your work.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# The bias block `(1, bn)` depends only on the column block. The pipeline skips a copy
# when consecutive steps ask for the same block, so make the column-block axis the *outer*
# grid axis and the row-block axis the inner one: the bias block then stays for a whole
# column. Both index maps take the grid indices in that new order.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The grid lists the column blocks first, `pl.cdiv(n, bn)` of them, then the `pl.cdiv(m, bm)` row
# blocks, so every index map now receives `j` before `i`. The bias's map returns block row 0 and
# column block `j`; `x`'s and the output's still return row block `i`, column block `j`.
#
# </details>

# %% nbgrader={"grade_id": "add_bias_solution", "solution": true}
def add_bias(x, bias, block):
    ### BEGIN SOLUTION
    bm, bn = block
    m, n = x.shape

    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = x_ref[...] + b_ref[...]

    xspec = pl.BlockSpec((bm, bn), lambda j, i: (i, j))
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(n, bn), pl.cdiv(m, bm)),  # column blocks outer: the bias block stays
        in_specs=[xspec, pl.BlockSpec((1, bn), lambda j, i: (0, j))],
        out_specs=xspec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x, bias)
    ### END SOLUTION


# %% nbgrader={"grade_id": "add_bias_visible", "grade": true, "points": 1}
course.check("add_bias", add_bias)

# %% nbgrader={"grade_id": "add_bias_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible shapes, bfloat16.
### BEGIN HIDDEN TESTS
course.check("add_bias", add_bias, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `symmetrize(x, b)` (3 points)
#
# `x + x.T` for a square `x`, with square blocks `(b, b)` and grid `(cdiv(n, b), cdiv(n, b))`.
# Pass `x` to the `pallas_call` twice, with two different index maps.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Pass `x` to the call twice. The first operand's index map gives step `(i, j)` block `(i, j)`;
# the second's gives it block `(j, i)`, whose transpose is exactly the `(i, j)` block of
# `x.T`. The kernel adds the first block to the transpose of the second.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# All three specs have blocks `(b, b)` over a square grid of `pl.cdiv(n, b)` blocks each way. The
# first input's and the output's index maps return the grid indices as they come; the second input's
# returns the same two in the opposite order, and the kernel adds the `.T` of that block.
#
# </details>

# %% nbgrader={"grade_id": "symmetrize_solution", "solution": true}
def symmetrize(x, b):
    ### BEGIN SOLUTION
    n = x.shape[0]

    def kernel(a_ref, t_ref, o_ref):
        o_ref[...] = a_ref[...] + t_ref[...].T

    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(n, b), pl.cdiv(n, b)),
        in_specs=[pl.BlockSpec((b, b), lambda i, j: (i, j)),
                  pl.BlockSpec((b, b), lambda i, j: (j, i))],
        out_specs=pl.BlockSpec((b, b), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x, x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "symmetrize_visible", "grade": true, "points": 1}
course.check("symmetrize", symmetrize)

# %% nbgrader={"grade_id": "symmetrize_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible sizes, bfloat16.
### BEGIN HIDDEN TESTS
course.check("symmetrize", symmetrize, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
