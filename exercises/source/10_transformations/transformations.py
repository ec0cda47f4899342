# %% [markdown]
# # Assignment 10 — transformations
#
# Lesson 10 showed three things JAX transformations do with a kernel: `jax.vmap` turns a
# kernel for one matrix into a kernel for a batch by adding a grid axis; `jax.grad` cannot see
# through a `pallas_call`, so a backward kernel is attached with `jax.custom_vjp`; and
# `input_output_aliases` lets a kernel update a buffer in place. One task each; task 2 is the
# centrepiece.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check transformations.ipynb`.

# %% nbgrader={"grade_id": "setup", "locked": true}
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from grader import course
from kernelsim.backend import choose

# Compiled on a GPU or TPU, interpreted on a CPU.
INTERPRET = choose().interpret

# %% [markdown]
# ## Task 1 — `batched_bias_tanh(x, bias, scale, bm)` (3 points)
#
# `x` has shape `(B, M, N)`, `bias` shape `(B, 1, N)` (one row per example) and `scale` shape
# `(1, N)` (one row for the whole batch); return `tanh(x[b] * scale + bias[b])` for every
# `b`, in the dtype of `x` (compute in float32).
#
# Write the kernel for **one** `(M, N)` matrix (blocks of `bm` full rows, grid
# `(cdiv(M, bm),)`) and let `jax.vmap` batch it. Graded on the call it produces: one
# `pallas_call` with grid `(B, cdiv(M, bm))` and an `x` block `(None, bm, N)`; `bias` batched,
# block `(None, 1, N)`, each example's row read from HBM once (`B · N` elements in all); and
# `scale` kept unbatched, block `(1, N)`, read once for the whole batch.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Write `one(x2d, bias_row, scale)` as an ordinary row-block kernel for one example, in which
# both `(1, N)` rows have a block whose index never changes. Then decide, operand by operand,
# which ones carry the batch: a shared operand passed with a batch axis would be fetched once
# per example, and a per-example one passed without it would not be per example at all.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# `jax.vmap`'s `in_axes` has one entry per argument of `one`: the axis along which that
# argument's examples lie, or `None` for an argument every example shares. Here two arguments
# carry the batch on their first axis and one is shared. Lesson 10's first two check-yourself
# questions and their answers say what each choice does to the operand's block and its fetches.
#
# </details>

# %% nbgrader={"grade_id": "batched_bias_tanh_solution", "solution": true}
def batched_bias_tanh(x, bias, scale, bm):
    ### BEGIN SOLUTION
    def kernel(x_ref, b_ref, s_ref, o_ref):
        v = x_ref[...].astype(jnp.float32) * s_ref[...].astype(jnp.float32)
        o_ref[...] = jnp.tanh(v + b_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

    def one(x2d, bias_row, scale):
        m, n = x2d.shape
        # Both (1, n) rows keep block (0, 0): within one example each is fetched once.
        row = pl.BlockSpec((1, n), lambda i: (0, 0))
        return pl.pallas_call(
            kernel,
            grid=(pl.cdiv(m, bm),),
            in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0)), row, row],
            out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x2d.shape, x2d.dtype),
            interpret=INTERPRET,
        )(x2d, bias_row, scale)

    # bias carries the batch on axis 0 (vmap squeezes it: block (None, 1, n), index (b, 0, 0),
    # refetched only when b changes); scale is shared, so its block never changes at all.
    return jax.vmap(one, in_axes=(0, 0, None))(x, bias, scale)
    ### END SOLUTION


# %% nbgrader={"grade_id": "batched_bias_tanh_visible", "grade": true, "points": 1}
course.check("batched_bias_tanh", batched_bias_tanh)

# %% nbgrader={"grade_id": "batched_bias_tanh_hidden", "grade": true, "points": 2}
# Hidden tests: rows not a multiple of bm, bfloat16, other batch sizes.
### BEGIN HIDDEN TESTS
course.check("batched_bias_tanh", batched_bias_tanh, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `rms_norm(x, bm)` with its own backward kernel (3 points)
#
# The RMS norm of each row of `x` (shape `(M, N)`):
#
# $$y = x \cdot r, \qquad r = \frac{1}{\sqrt{\tfrac1N \sum_j x_j^2 + \varepsilon}},
# \quad \varepsilon = 10^{-6}.$$
#
# For a cotangent `g` (the gradient of some loss with respect to `y`), the gradient with
# respect to `x` is, row by row, with $\hat x = x \cdot r$:
#
# $$dx = r \cdot \Big(g - \hat x \cdot \tfrac1N \sum_j g_j \hat x_j\Big).$$
#
# `jax.grad` cannot differentiate a `pallas_call` (lesson 10), so make `rms_norm`
# differentiable with `jax.custom_vjp`:
#
# * the **forward kernel** computes `y`, one block of `bm` full rows per step;
# * the **only residual is `x`** itself; the **backward kernel** reads `x` and `g` (blocks of
#   `bm` rows), recomputes `r` and writes `dx`. Recomputing costs one reduction per row and no
#   HBM bytes: the backward kernel loads `x` anyway, whereas saving `r` would add a forward
#   output, its write and its read.
#
# Compute in float32 inside both kernels; return the dtype of `x`. The check calls
# `y, pullback = jax.vjp(lambda x: rms_norm(x, bm), x)` and `pullback(g)` — what `jax.grad`
# does for the loss `sum(rms_norm(x) * g)` — and compares `stack([y, dx])` with plain JAX's
# values and gradient (a wrong element at `[0, …]` is in `y`, at `[1, …]` in `dx`). Structure:
# at least two `pallas_call`s, forward and backward, each with grid `(cdiv(M, bm),)`.
#
# A skeleton for the wiring (the kernels are yours):
#
# ```python
# @jax.custom_vjp
# def f(x): ...            # forward pallas_call
# def fwd(x): ...          # returns (f(x), residuals)
# def bwd(residuals, g): ...  # returns a tuple: one cotangent per input of f
# f.defvjp(fwd, bwd)
# ```
#
# Check it yourself with `jax.grad` on a small input before running the test cell.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Build the `custom_vjp` function inside `rms_norm`, where `bm` is a plain Python int the
# kernels close over. Both kernels start the same way: load the rows in float32 and compute
# `r` per row with `keepdims=True`, so it broadcasts against the `(bm, N)` block. `fwd` saves
# `x`; `bwd` passes `x` and `g` to the second `pallas_call` and returns its output in a
# one-element tuple.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# In the backward kernel the task's sum over `j`, divided by `N`, is a row mean: `jnp.mean` along
# axis 1 with `keepdims=True` of `g` times `xh` (`xh` being the float32 rows times `r`), so the
# result is `(bm, 1)` and broadcasts against the block in the task's formula for `dx`.
#
# </details>

# %% nbgrader={"grade_id": "rms_norm_solution", "solution": true}
def rms_norm(x, bm):
    ### BEGIN SOLUTION
    eps = 1e-6

    def inv_rms(x):
        return jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps)

    def forward_kernel(x_ref, y_ref):
        v = x_ref[...].astype(jnp.float32)
        y_ref[...] = (v * inv_rms(v)).astype(y_ref.dtype)

    def backward_kernel(x_ref, g_ref, dx_ref):
        v, g = x_ref[...].astype(jnp.float32), g_ref[...].astype(jnp.float32)
        r = inv_rms(v)
        xh = v * r
        dx_ref[...] = (r * (g - xh * jnp.mean(g * xh, axis=1, keepdims=True))
                       ).astype(dx_ref.dtype)

    def row_call(kernel, n_inputs, like):
        m, n = like.shape
        rows = pl.BlockSpec((bm, n), lambda i: (i, 0))
        # Each block of rows is used by one step: nothing is reused.
        return pl.pallas_call(
            kernel,
            grid=(pl.cdiv(m, bm),),
            in_specs=[rows] * n_inputs,
            out_specs=rows,
            out_shape=jax.ShapeDtypeStruct(like.shape, like.dtype),
            interpret=INTERPRET,
        )

    @jax.custom_vjp
    def norm(x):
        return row_call(forward_kernel, 1, x)(x)

    def fwd(x):
        return norm(x), x

    def bwd(x, g):
        return (row_call(backward_kernel, 2, x)(x, g),)

    norm.defvjp(fwd, bwd)
    return norm(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "rms_norm_visible", "grade": true, "points": 1}
course.check("rms_norm", rms_norm)

# %% nbgrader={"grade_id": "rms_norm_hidden", "grade": true, "points": 2}
# Hidden tests: rows not a multiple of bm, bfloat16, large values, one block of long rows.
### BEGIN HIDDEN TESTS
course.check("rms_norm", rms_norm, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `add_patch_in_place(acc, delta, row0, col0, bm, bn)` (3 points)
#
# `acc` has shape `(M, N)` and `delta` shape `(R, C)`; return `acc` with `delta` added into
# the patch of rows `row0` to `row0 + R` and columns `col0` to `col0 + C` (ends exclusive),
# every other element unchanged. `row0`, `R` and `M` are multiples of `bm`; `col0`, `C` and
# `N` are multiples of `bn`. Compute the sum in float32 and return the dtype of `acc`.
#
# Touch only the patch: blocks of `(bm, bn)`, grid `(R // bm, C // bn)`, at most `2 · R · C`
# elements read from HBM (the patch of `acc`, and `delta`) and `R · C` written. A kernel whose
# output is a fresh buffer would leave everything outside the patch uninitialised, so the
# output must be `acc`'s own buffer.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Lesson 10 updated whole rows. Here a grid step owns one `(bm, bn)` tile of the patch, so the
# grid has two axes and every index map two coordinates. `acc` and the output share one
# BlockSpec that places step `(i, j)` on the tile of `acc` the patch's tile `(i, j)` covers;
# `delta`'s places it on its own tile `(i, j)`. Then declare that the output *is* input 0.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# An index map returns block coordinates, not element offsets: the patch starts `row0 // bm`
# blocks down and `col0 // bn` blocks across (whole divisions, by the task's promise), and
# step `(i, j)` is `i` and `j` blocks further. `pallas_call`'s `input_output_aliases` maps an
# input's position to the position of the output that takes over its buffer.
#
# </details>

# %% nbgrader={"grade_id": "add_patch_in_place_solution", "solution": true}
def add_patch_in_place(acc, delta, row0, col0, bm, bn):
    ### BEGIN SOLUTION
    def kernel(acc_ref, delta_ref, out_ref):
        total = acc_ref[...].astype(jnp.float32) + delta_ref[...].astype(jnp.float32)
        out_ref[...] = total.astype(out_ref.dtype)

    r, c = delta.shape
    top, left = row0 // bm, col0 // bn  # the patch's first block, in block coordinates
    tile = (bm, bn)
    patch = pl.BlockSpec(tile, lambda i, j: (top + i, left + j))
    # Each tile of the patch is read and written by one step; the rest of acc never moves.
    return pl.pallas_call(
        kernel,
        grid=(r // bm, c // bn),
        in_specs=[patch, pl.BlockSpec(tile, lambda i, j: (i, j))],
        out_specs=patch,
        out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
        input_output_aliases={0: 0},
        interpret=INTERPRET,
    )(acc, delta)
    ### END SOLUTION


# %% nbgrader={"grade_id": "add_patch_in_place_visible", "grade": true, "points": 1}
course.check("add_patch_in_place", add_patch_in_place)

# %% nbgrader={"grade_id": "add_patch_in_place_hidden", "grade": true, "points": 2}
# Hidden tests: the full width from the first row, the bottom-right corner, bfloat16, larger
# blocks.
### BEGIN HIDDEN TESTS
course.check("add_patch_in_place", add_patch_in_place, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What passed
#
# The cell below lists every task of this notebook as passed, failed (with the first line of
# its message) or not checked in this kernel; run all cells above first.

# %%
course.summary()
