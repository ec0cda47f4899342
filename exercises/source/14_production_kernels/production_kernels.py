# %% [markdown]
# # Assignment 14 — kernels in production
#
# Lesson 15 dequantized int8 and fp8 weights block by block inside a matmul, multiplied int8
# by int8 on the MXU's int8 path, read JAX's ragged paged attention, and wrote whole pages of a
# paged KV cache in place. Each task here changes one thing the lesson fixed: where a
# quantization scale can be applied, which operands are int8, and how much of a page a decode
# step writes.
#
# **TPU-only** features (VMEM scratch, scalar prefetch): on this machine the kernels run in
# TPU interpret mode (`TPU_INTERPRET`).
#
# Rules: [scalar prefetch](https://docs.jax.dev/en/latest/pallas/tpu/sparse.html),
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html).
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check production_kernels.ipynb`.

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

# Compiled on a TPU; TPU interpret mode anywhere else (scratch and scalar prefetch).
TPU_INTERPRET = choose(tpu_features=True).interpret

# %% [markdown]
# ## Task 1 — `int8_matmul_per_channel(x, wq, scale, bm, bn, bk)` (3 points)
#
# `x` is float32 `(M, K)`, `wq` int8 `(K, N)` and `scale` float32 `(1, N)`: one scale per
# output column, so the weights are `wq * scale`. Return `x @ (wq * scale)` in float32.
#
# Lesson 15 had one scale per block of rows and had to dequantize each block before its dot.
# Here a column's scale is the same for every row of `wq`: take it out of the sum. Multiply
# `x` by the int8 weights converted to float32, accumulate over `k` in float32 scratch, and
# apply `scale` once per output block, at its last `k` step.
#
# Grid `(M // bm, N // bn, K // bk)` with `k` innermost; `wq` is read as int8, at most once
# per row block of `x` (`(M / bm) · K · N` bytes). Weights dequantized outside the kernel
# would be float32, four times the bytes, and computed outside any kernel: both fail.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Start from lesson 4's accumulating matmul with a float32 scratch accumulator. Two changes:
# the weight block is converted to float32 before the dot (a cast, not a multiplication),
# and the branch for the last `k` step multiplies the accumulator by this column block's
# scales before writing it. The scales' BlockSpec is `(1, bn)` and follows the column index;
# its row dimension is the array's own size, 1, so the (8, 128) rule accepts it.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The output line in the last-step branch: the accumulator times the scale block, which
# broadcasts along the rows because it has one row, written to the output ref. Nowhere else in
# the kernel is the scale used.
#
# </details>

# %% nbgrader={"grade_id": "int8_matmul_per_channel_solution", "solution": true}
def int8_matmul_per_channel(x, wq, scale, bm, bn, bk):
    ### BEGIN SOLUTION
    (m, k), n = x.shape, wq.shape[1]

    def kernel(x_ref, wq_ref, scale_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...].astype(jnp.float32),
                                wq_ref[...].astype(jnp.float32),
                                precision=jax.lax.Precision.HIGHEST,
                                preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...] * scale_ref[...]  # one scale per column, once

    # k innermost: the output block and the accumulator stay on chip for all k.
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=TPU_INTERPRET,
    )(x, wq, scale)
    ### END SOLUTION


# %% nbgrader={"grade_id": "int8_matmul_per_channel_visible", "grade": true, "points": 1}
course.check("int8_matmul_per_channel", int8_matmul_per_channel)

# %% nbgrader={"grade_id": "int8_matmul_per_channel_hidden", "grade": true, "points": 2}
# Hidden tests: other block sizes, a long K, a single row block.
### BEGIN HIDDEN TESTS
course.check("int8_matmul_per_channel", int8_matmul_per_channel, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `w8a8_matmul(xq, x_scale, wq, w_scale, bm, bn, bk, out_dtype)` (3 points)
#
# Task 1 still multiplied in float32: its int8 weights became floats before the dot. The int8
# rate of a v5e or v6e (twice bfloat16's) needs int8 on **both** sides of the dot (lesson 15's
# table), so the activations are quantized too: `xq` int8 `(M, K)` with one scale per row,
# `x_scale` float32 `(M, 1)`, and `wq` int8 `(K, N)` with one scale per output column,
# `w_scale` float32 `(1, N)`, both made by lesson 15's `quantize_int8` (a row of zeros gets
# scale 0 and stays zero). Return `(xq @ wq) * x_scale * w_scale` as `out_dtype`
# (`"float32"` or `"bfloat16"`).
#
# Multiply the int8 blocks as they are, asking the dot for int32; add each product to an
# int32 scratch over `k`; at the last `k` step convert the finished sum to float32, multiply
# it by its rows' and its columns' scales, and write it in the output's dtype. The int32 sum
# is exact, so your output must match the reference to within a few of float32's last bits.
#
# Grid `(M // bm, N // bn, K // bk)` with `k` innermost and `"arbitrary"`; each of `xq` and
# `wq` read once per block of the other. An int8 block's rows come in multiples of 32 (a TPU
# tiles int8 as `(32, 128)`; the check's block rule says so). Checked on your kernel's program,
# since the values cannot show it: every dot is `int8 x int8 -> int32` (blocks converted to a
# float before the dot fail, however right the values), the only state across `k` is the
# int32 scratch (a float32 one fails), and the scales are read only inside the last step's
# `pl.when`.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Start from Task 1's kernel, now with four inputs and no cast before the dot. The row
# scales' BlockSpec is `(bm, 1)` and follows the row block; the column scales' is `(1, bn)`
# and follows the column block: a dimension of 1 is the array's own size there, so the
# (8, 128) rule accepts both. The scratch holds `jnp.int32` and is zeroed at the first `k`
# step; the output's dtype comes from `jnp.dtype(out_dtype)`.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Two lines. The accumulating one adds to the int32 scratch the dot of the two int8 blocks,
# read from their refs unchanged, with int32 asked as the preferred element type. The
# epilogue's, in the last-step branch: the scratch converted to float32, times the row-scale
# block, times the column-scale block, cast to the output ref's dtype.
#
# </details>

# %% nbgrader={"grade_id": "w8a8_matmul_solution", "solution": true}
def w8a8_matmul(xq, x_scale, wq, w_scale, bm, bn, bk, out_dtype):
    ### BEGIN SOLUTION
    (m, k), n = xq.shape, wq.shape[1]

    def kernel(xq_ref, xs_ref, wq_ref, ws_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        # int8 x int8 on the MXU's int8 path, summed in int32: exact
        acc_ref[...] += jnp.dot(xq_ref[...], wq_ref[...], preferred_element_type=jnp.int32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():  # the scales once, on the finished sum
            scaled = acc_ref[...].astype(jnp.float32) * xs_ref[...] * ws_ref[...]
            o_ref[...] = scaled.astype(o_ref.dtype)

    # k innermost and "arbitrary": the int32 accumulator stays on chip for all k.
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.dtype(out_dtype)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=TPU_INTERPRET,
    )(xq, x_scale, wq, w_scale)
    ### END SOLUTION


# %% nbgrader={"grade_id": "w8a8_matmul_visible", "grade": true, "points": 1}
course.check("w8a8_matmul", w8a8_matmul)

# %% nbgrader={"grade_id": "w8a8_matmul_hidden", "grade": true, "points": 2}
# Hidden tests: bfloat16 output, a row of zeros (scale 0), a long K, a single k step, 32-row
# blocks.
### BEGIN HIDDEN TESTS
course.check("w8a8_matmul", w8a8_matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `kv_cache_append(cache, new_rows, page_indices, positions)` (4 points)
#
# A paged key cache `cache` of shape `(P, page_size, D)`; for each of `S` sequences a new
# key row `new_rows[s]` (shape `(S, 1, D)`), its page table row `page_indices[s]` (int32,
# shape `(S, slots)`) and the position `positions[s]` (int32) the new token takes in its
# sequence. Write row `positions[s] % page_size` of page
# `page_indices[s, positions[s] // page_size]` and return the whole cache, every other row of
# every page unchanged. No two sequences share a page.
#
# Lesson 15's `write_pages` replaced whole pages. A decode step writes **one row**: the
# kernel must bring in the page it writes, keep its other rows and change one. Grid `(S,)`,
# each sequence's page and the positions as scalar prefetch (in that order), the output
# aliased to the cache, and at most one page written per sequence.
#
# Look each sequence's page up **before the call**, in plain JAX
# (`page_indices[jnp.arange(S), positions // page_size]`: S integers), and let the index map
# read it at the step alone. An output's index map that reads a scalar-prefetch array at an
# index it read from scalar prefetch (`table[s * slots + positions[s] // page_size]`, the table
# 1-D or 2-D) halted a TPU v5e's core on this very task, though interpret mode ran it right
# (lesson 15 says more). The check refuses it (rule `dependent_prefetch_read`).

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# One grid step per sequence. The cache's input block and the output block are the same
# `(None, page_size, D)` block, chosen by an index map that reads the page you looked up for
# the sequence; the output is the cache's own buffer. In the body the row inside the page is a
# scalar from the positions; build a row mask with an iota along the page's rows and select
# the new row where the mask holds, the page's old row elsewhere.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The page's index map: the looked-up pages ref at the step, then 0 and 0.
# `input_output_aliases` maps the cache's operand number, counted after the two prefetched
# arrays, to output 0.
#
# </details>

# %% nbgrader={"grade_id": "kv_cache_append_solution", "solution": true}
def kv_cache_append(cache, new_rows, page_indices, positions):
    ### BEGIN SOLUTION
    _, page_size, d = cache.shape
    n = new_rows.shape[0]
    # each sequence's page, looked up here: an output index map that reads scalar prefetch at
    # an index read from scalar prefetch halted a TPU v5e core
    pages = page_indices[jnp.arange(n), positions // page_size]

    def kernel(pages_ref, pos_ref, page_ref, new_ref, out_ref):
        row = pos_ref[pl.program_id(0)] % page_size
        rows = jax.lax.broadcasted_iota(jnp.int32, page_ref.shape, 0)
        out_ref[...] = jnp.where(rows == row, new_ref[...], page_ref[...])

    page = pl.BlockSpec((None, page_size, d), lambda s, pages_ref, pos_ref: (pages_ref[s], 0, 0))
    # each step reads and writes back only the one page its sequence appends to
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(n,),
            in_specs=[page, pl.BlockSpec((None, 1, d), lambda s, *_: (s, 0, 0))],
            out_specs=page),
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={2: 0},
        interpret=TPU_INTERPRET,
    )(pages, positions, cache, new_rows)
    ### END SOLUTION


# %% nbgrader={"grade_id": "kv_cache_append_visible", "grade": true, "points": 1}
course.check("kv_cache_append", kv_cache_append)

# %% nbgrader={"grade_id": "kv_cache_append_hidden", "grade": true, "points": 3}
# Hidden tests: bfloat16, longer pages and wider rows, a single sequence, positions on the
# first and last row of a page.
### BEGIN HIDDEN TESTS
course.check("kv_cache_append", kv_cache_append, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# kernelsim's view of your append: one page read and one written per sequence, out of a
# cache of twelve.

# %%
cache = jax.random.normal(jax.random.key(14), (12, 16, 128), jnp.float32)
new_rows = jax.random.normal(jax.random.key(15), (3, 1, 128), jnp.float32)
table = jnp.array([[3, 7, 1, 0], [9, 2, 5, 6], [4, 8, 10, 11]], jnp.int32)
positions = jnp.array([20, 3, 63], jnp.int32)
course.view("kv_cache_append",
            lambda: print(kernelsim.trace(kv_cache_append, cache, new_rows, table, positions)))

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
