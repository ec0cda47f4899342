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
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader.learner import course
from kernelsim.backend import choose

# Compiled on a GPU or TPU, interpreted on a CPU. TPU_INTERPRET is for kernels that use
# TPU-only features (VMEM scratch) or revisit an output block across grid steps.
INTERPRET = choose().interpret
TPU_INTERPRET = choose(tpu_features=True).interpret

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
# ## Task 2 — `rms_norm(x, w, bm)` with its own backward kernel (3 points)
#
# The RMS norm of each row of `x` (shape `(M, N)`), scaled by a learned weight `w` of shape
# `(1, N)`, as transformer layers use it:
#
# $$y = x \cdot r \cdot w, \qquad r = \frac{1}{\sqrt{\tfrac1N \sum_j x_j^2 + \varepsilon}},
# \quad \varepsilon = 10^{-6}.$$
#
# For a cotangent `g` (the gradient of some loss with respect to `y`), with $\hat x = x \cdot
# r$ and $h = g \cdot w$, the gradients are, row by row for `x` and summed over **all** rows
# for `w`:
#
# $$dx = r \cdot \Big(h - \hat x \cdot \tfrac1N \sum_j h_j \hat x_j\Big), \qquad
# dw = \sum_{\text{rows}} g \cdot \hat x.$$
#
# `jax.grad` cannot differentiate a `pallas_call` (lesson 10), so make `rms_norm`
# differentiable in both `x` and `w` with `jax.custom_vjp`:
#
# * the **forward kernel** computes `y`, one block of `bm` full rows per step;
# * the **residuals are the inputs `x` and `w`**; one **backward kernel** (blocks of `bm`
#   rows, grid `(cdiv(M, bm),)`) reads `x`, `w` and `g`, recomputes `r`, and writes both
#   `dx` and `dw`. `dw` is one `(1, N)` row that every grid step adds to: the sum runs across
#   grid steps, as the accumulators of lessons 4 and 5 do, so run this kernel (and, to keep
#   one setting, the forward one) with `TPU_INTERPRET`. `M` need not be a multiple of `bm`:
#   rows past `M` in the last block are unspecified (NaN in interpret mode) and must not
#   reach `dw`.
#
# Compute in float32 inside both kernels; return the dtypes of `x` and `w`. The check calls
# `y, pullback = jax.vjp(lambda x, w: rms_norm(x, w, bm), x, w)` and `pullback(g)` — what
# `jax.grad` does for the loss `sum(rms_norm(x, w) * g)` — and compares the rows of `y`, then
# `dx`, then the one row of `dw`, stacked, with plain JAX's (a wrong element at `[r, …]` is in
# `y` for `r < M`, in `dx` for `M <= r < 2M`, and in `dw` at `r = 2M`). Structure: at least
# two `pallas_call`s, forward and backward, each with grid `(cdiv(M, bm),)`; the backward one
# has outputs `dx` (blocks `(bm, N)`) and `dw` (one `(1, N)` block).
#
# A skeleton for the wiring (the kernels are yours):
#
# ```python
# @jax.custom_vjp
# def f(x, w): ...            # forward pallas_call
# def fwd(x, w): ...          # returns (f(x, w), residuals)
# def bwd(residuals, g): ...  # returns a tuple: one cotangent per input of f
# f.defvjp(fwd, bwd)
# ```
#
# Check it yourself with `jax.grad` on a small input before running the test cell.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Build the `custom_vjp` function inside `rms_norm`, where `bm` is a plain Python int the
# kernels close over. `w` gets a `(1, N)` block that is the same at every step. Both kernels
# start the same way: load the rows in float32 and compute `r` per row with `keepdims=True`.
# In the backward kernel `dx` is a row-by-row formula, written block by block; `dw` is a
# reduction over the grid: keep a float32 `(1, N)` running sum in VMEM scratch, zero it at the
# first step, add this block's column sums of `g` times the normalised rows, and write it,
# cast, at the last step. Rows past `M` are masked first, as lesson 3 masked the overhang.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The mask: the global row index of each element of the block is the step times `bm` plus
# `jax.lax.broadcasted_iota` along axis 0 of the block's shape; `jnp.where` keeps `g` times
# the normalised rows where that index is below `M` and puts 0 elsewhere, and `jnp.sum`
# along axis 0 with `keepdims=True` of that is this step's `(1, N)` share of `dw`. The
# backward `pallas_call` has two `out_specs` and two `out_shape`s, and `bwd` returns both
# outputs as a tuple.
#
# </details>

# %% nbgrader={"grade_id": "rms_norm_solution", "solution": true}
def rms_norm(x, w, bm):
    ### BEGIN SOLUTION
    eps = 1e-6
    m, n = x.shape
    steps = pl.cdiv(m, bm)
    rows = pl.BlockSpec((bm, n), lambda i: (i, 0))
    weight = pl.BlockSpec((1, n), lambda i: (0, 0))  # the same block at every step

    def inv_rms(v):
        return jax.lax.rsqrt(jnp.mean(v * v, axis=1, keepdims=True) + eps)

    def forward_kernel(x_ref, w_ref, y_ref):
        v = x_ref[...].astype(jnp.float32)
        y_ref[...] = (v * inv_rms(v) * w_ref[...].astype(jnp.float32)).astype(y_ref.dtype)

    def backward_kernel(x_ref, w_ref, g_ref, dx_ref, dw_ref, dw_sum):
        step = pl.program_id(0)
        v, g = x_ref[...].astype(jnp.float32), g_ref[...].astype(jnp.float32)
        r = inv_rms(v)
        xh = v * r
        h = g * w_ref[...].astype(jnp.float32)
        dx_ref[...] = (r * (h - xh * jnp.mean(h * xh, axis=1, keepdims=True))
                       ).astype(dx_ref.dtype)
        # rows past m in the last block hold garbage: keep them out of the sum over rows
        row = step * bm + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)
        share = jnp.sum(jnp.where(row < m, g * xh, 0.0), axis=0, keepdims=True)

        @pl.when(step == 0)
        def _():
            dw_sum[...] = jnp.zeros_like(dw_sum)

        dw_sum[...] += share

        @pl.when(step == steps - 1)
        def _():
            dw_ref[...] = dw_sum[...].astype(dw_ref.dtype)

    def forward(x, w):
        return pl.pallas_call(
            forward_kernel, grid=(steps,), in_specs=[rows, weight], out_specs=rows,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=TPU_INTERPRET,
        )(x, w)

    def backward(x, w, g):
        return pl.pallas_call(
            backward_kernel,
            grid=(steps,),  # dw's block is revisited by every step: the axis is a reduction
            in_specs=[rows, weight, rows],
            out_specs=[rows, weight],
            out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                       jax.ShapeDtypeStruct(w.shape, w.dtype)],
            scratch_shapes=[pltpu.VMEM((1, n), jnp.float32)],
            interpret=TPU_INTERPRET,
        )(x, w, g)

    @jax.custom_vjp
    def norm(x, w):
        return forward(x, w)

    def fwd(x, w):
        return norm(x, w), (x, w)

    def bwd(residuals, g):
        return tuple(backward(*residuals, g))

    norm.defvjp(fwd, bwd)
    return norm(x, w)
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
#
# The kernel body is given, an add in float32 as the course's examples write one; it is the
# one shipped body "kernels are your own" accepts in this task:
#
# ```python
# total = acc_ref[...].astype(jnp.float32) + delta_ref[...].astype(jnp.float32)
# out_ref[...] = total.astype(out_ref.dtype)
# ```
#
# The grid, the index maps and the aliasing are your work.

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
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
