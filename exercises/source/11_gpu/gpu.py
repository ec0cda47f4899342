# %% [markdown]
# # Assignment 11 — Pallas on GPU
#
# Lesson 11 showed why a kernel that revisits an output block across grid steps is right on a
# TPU and a race on a GPU, where the programs of a grid run at the same time. Here you write
# two reductions the GPU-safe way, one program per output block and the reduction as a loop
# inside it, and predict what kernelsim's GPU model counts for one of them.
#
# Both kernels must also pass JAX's GPU lowering of `pallas_call` (Triton, in the pinned
# release). The check asks it on this machine, no GPU needed: it calls your function once with
# `interpret=False` under `kernelsim.gpu_lowering_error`. So keep each function's
# `interpret=` parameter and pass it on to `pl.pallas_call(..., interpret=interpret)`. You can
# ask the same question yourself:
#
# ```python
# kernelsim.gpu_lowering_error(functools.partial(gpu_row_sums, bm=16, bk=128,
#                                                interpret=False), x)   # None: it lowers
# ```
#
# **GPU-only**: the kernels compile on a GPU and run in interpret mode anywhere else (`INTERPRET`
# below), a TPU included: Mosaic asks of a slice of a block an alignment that a GPU's blocks
# need not meet.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check gpu.ipynb`.

# %% nbgrader={"grade_id": "setup", "locked": true}
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from grader.learner import course
from kernelsim.backend import choose

# Compiled on a GPU, interpreted elsewhere: these kernels are written for a GPU's blocks (a TPU
# would ask Mosaic's alignment of them, which a 64-column slice of K does not meet).
INTERPRET = choose(tpu_ok=False).interpret

# %% [markdown]
# ## Task 1 — `gpu_row_sums(x, bm, bk, interpret=INTERPRET)` (3 points)
#
# `x` has shape `(M, K)`; return its row sums, shape `(M, 1)`, in the dtype of `x` (add in
# float32).
#
# Write it GPU-safe:
#
# * grid `(cdiv(M, bm),)`: one program per block of `bm` rows, and **no grid axis over K**;
# * the output block `(bm, 1)`, written once, by the one program that owns it;
# * inside the program, a `jax.lax.fori_loop` over the `K // bk` column chunks of the row
#   band, carrying the running float32 sum.
#
# Triton's rule: every array a kernel loads or stores has a power-of-two size. `bm` and `bk`
# are powers of two; `K` need not be (the visible case has `K = 384`), so load the band one
# `(bm, bk)` chunk at a time. Graded on the values and on the rules above, read from kernelsim's
# trace and your kernel's jaxpr, and on the Triton lowering accepting your kernel.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Let `x`'s BlockSpec cover a whole row band, `(bm, K)`: on a GPU a block is only a window of
# addresses, nothing is copied until the kernel reads it. The body then reads one chunk of
# `bk` columns per loop iteration, reduces it along the columns with `keepdims=True` and adds
# it to the carried `(bm, 1)` float32 value; after the loop, one cast and one store.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The loop is `jax.lax.fori_loop` over the `k // bk` chunks, carrying the running `(bm, 1)` float32
# total from a start of zeros. Iteration `c` reads all rows of the band and `bk` columns from column
# `c * bk`: a `pl.ds` slice on the second axis of `x_ref`.
#
# </details>

# %% nbgrader={"grade_id": "gpu_row_sums_solution", "solution": true}
def gpu_row_sums(x, bm, bk, interpret=INTERPRET):
    ### BEGIN SOLUTION
    m, k = x.shape

    def kernel(x_ref, o_ref):
        def add_chunk(c, total):
            chunk = x_ref[:, pl.ds(c * bk, bk)].astype(jnp.float32)
            return total + jnp.sum(chunk, axis=1, keepdims=True)

        total = jax.lax.fori_loop(0, k // bk, add_chunk, jnp.zeros((bm, 1), jnp.float32))
        o_ref[...] = total.astype(o_ref.dtype)

    # one program per row band: it reads its band once and writes its output block once
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm),),
        in_specs=[pl.BlockSpec((bm, k), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), x.dtype),
        interpret=interpret,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "gpu_row_sums_visible", "grade": true, "points": 1}
course.check("gpu_row_sums", gpu_row_sums)

# %% nbgrader={"grade_id": "gpu_row_sums_hidden", "grade": true, "points": 2}
# Hidden tests: rows not a multiple of bm, bfloat16, long all-positive rows (float32 and
# bfloat16), one chunk.
### BEGIN HIDDEN TESTS
course.check("gpu_row_sums", gpu_row_sums, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `gpu_matmul(a, b, bm, bn, bk, interpret=INTERPRET)` (3 points)
#
# `a @ b` for `a` of shape `(M, K)` and `b` of shape `(K, N)`, in the dtype of `a`,
# accumulated in float32. The TPU kernel of lessons 4 and 7 has grid `(i, j, k)` and adds
# into output block `(i, j)` at every `k` step: on a GPU those `K / bk` programs would race.
# Write the GPU shape instead:
#
# * grid `(cdiv(M, bm), cdiv(N, bn))`: one program per `(bm, bn)` output block, written once;
# * program `(i, j)` sees row band `i` of `a`, `(bm, K)`, and column band `j` of `b`,
#   `(K, bn)`, and loops over `K` in chunks of `bk` with `jax.lax.fori_loop`, the float32
#   accumulator as the loop's carried value.
#
# As in task 1, `K` need not be a power of two but `bm`, `bn` and `bk` are, and every array
# the kernel loads must have a power-of-two size. One more GPU fact: at the default precision
# the Triton lowering multiplies float32 in TF32 (10 mantissa bits), so a GPU would miss the
# tolerance. Pass `precision=jax.lax.Precision.HIGHEST` to `jnp.dot`; the check refuses a
# float32 product without it. Graded as task 1.
#
# The kernel body is given: it is lesson 11's `matmul_gpu_safe_kernel`, the one shipped body
# "kernels are your own" accepts in this task. The grid, the bands' `BlockSpec`s and the
# precision are your work:
#
# ```python
# def add_chunk(c, acc):
#     ks = pl.ds(c * bk, bk)  # chunk c of K: columns of a's band, rows of b's
#     product = jnp.dot(a_ref[:, ks], b_ref[ks, :], precision=precision,
#                       preferred_element_type=jnp.float32)
#     return acc + product
#
# acc = jax.lax.fori_loop(0, k // bk, add_chunk, jnp.zeros((bm, bn), jnp.float32))
# o_ref[...] = acc.astype(o_ref.dtype)
# ```

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Task 1 with a second operand: both bands are blocks whose index maps follow `i` and `j`
# respectively, and the loop body multiplies the `(bm, bk)` chunk of `a`'s band by the
# `(bk, bn)` chunk of `b`'s band, adding the product to the accumulator. The same `pl.ds`
# slice selects the columns of one and the rows of the other.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Chunk `c` of K is one `pl.ds` slice, `bk` long from `c * bk`: it picks the columns of `a`'s band
# and the rows of `b`'s band. The `jnp.dot` of the two chunks, with a float32 result, is added to
# the `(bm, bn)` carry of the `fori_loop`.
#
# </details>

# %% nbgrader={"grade_id": "gpu_matmul_solution", "solution": true}
def gpu_matmul(a, b, bm, bn, bk, interpret=INTERPRET):
    ### BEGIN SOLUTION
    (m, k), n = a.shape, b.shape[1]
    # float32: IEEE float32 products (TF32 at the default); bfloat16: the default (a TPU
    # refuses a bfloat16 dot at "highest")
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None

    def kernel(a_ref, b_ref, o_ref):
        def add_chunk(c, acc):
            ks = pl.ds(c * bk, bk)  # chunk c of K: columns of a's band, rows of b's
            product = jnp.dot(a_ref[:, ks], b_ref[ks, :], precision=precision,
                              preferred_element_type=jnp.float32)
            return acc + product

        acc = jax.lax.fori_loop(0, k // bk, add_chunk, jnp.zeros((bm, bn), jnp.float32))
        o_ref[...] = acc.astype(o_ref.dtype)

    # one program per output block, written once; a's row band and b's column band are
    # loaded again by every program that needs them (no pipeline between programs)
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        interpret=interpret,
    )(a, b)
    ### END SOLUTION


# %% nbgrader={"grade_id": "gpu_matmul_visible", "grade": true, "points": 1}
course.check("gpu_matmul", gpu_matmul)

# %% nbgrader={"grade_id": "gpu_matmul_hidden", "grade": true, "points": 2}
# Hidden tests: bfloat16, edge blocks in M, several column blocks, a long all-positive K.
### BEGIN HIDDEN TESTS
course.check("gpu_matmul", gpu_matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — predict, then run: `predict_gpu_reads(m, k, n, bm, bn, itemsize)` (3 points)
#
# Before running anything: how many bytes of `a` and `b` together does kernelsim's **GPU
# model** (`kernelsim.trace(..., model="gpu")`) have the programs of your task 2 kernel load
# from global memory, for `a` of shape `(m, k)`, `b` of shape `(k, n)`, blocks `bm` and `bn`,
# and `itemsize` bytes per element? Return a Python `int`, computed from the sizes alone by
# your own code (a prediction that calls kernelsim or the grader's code fails); the grade
# compares it with kernelsim's count. The GPU model runs one program per grid point, and
# every program loads its own blocks (no pipeline skips one); an edge block moves only its
# in-bounds part. Of those loads, kernelsim counts a re-read by a program running alongside
# as served by L2 (`cost.l2_hit_bytes`) and the rest as HBM reads (`hbm_read_bytes`): the
# two together are the loads you predict.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Count per operand. Every program reads its whole `a` band and its whole `b` band, and no
# program can skip a band the previous one read. Group the programs: all programs in one
# row of the grid read the same `a` band, all programs in one column the same `b` band. The
# edge bands are smaller, so a full pass over an operand costs exactly its size.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Every band of `a` is read by the same number of programs, so `a` costs that many passes of its
# size; likewise `b`. Count them on a small grid first: with `m` twice `bm` and `n` three times
# `bn`, the grid is 2 rows by 3 columns of programs; how many read `a`'s first row band, and how
# many `b`'s first column band? Then say how each count follows from the sizes, edge blocks
# included.
#
# </details>

# %% nbgrader={"grade_id": "predict_gpu_reads_solution", "solution": true}
def predict_gpu_reads(m, k, n, bm, bn, itemsize):
    ### BEGIN SOLUTION
    column_blocks, row_blocks = -(-n // bn), -(-m // bm)
    return itemsize * (column_blocks * m * k + row_blocks * k * n)
    ### END SOLUTION


# %% nbgrader={"grade_id": "predict_gpu_reads_visible", "grade": true, "points": 1}
course.check("predict_gpu_reads", predict_gpu_reads)

# %% nbgrader={"grade_id": "predict_gpu_reads_hidden", "grade": true, "points": 2}
# Hidden tests: several column blocks, edge blocks, bfloat16, a single program.
### BEGIN HIDDEN TESTS
course.check("predict_gpu_reads", predict_gpu_reads, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Now run it: kernelsim traces your `gpu_matmul` on these sizes under both models. The GPU
# model's `fetches` column shows every program reading its bands, most of them from L2 on
# this small grid; the TPU model, which runs the grid in order, skips `a`'s band while `j`
# moves along a row of the grid.

# %%
sizes = dict(m=128, k=512, n=512, bm=64, bn=128)
a = jnp.ones((sizes["m"], sizes["k"]), jnp.float32)
b = jnp.ones((sizes["k"], sizes["n"]), jnp.float32)
try:
    predicted = predict_gpu_reads(**sizes, itemsize=4)
    fn = functools.partial(gpu_matmul, bm=sizes["bm"], bn=sizes["bn"], bk=64)
    for model, chip in (("gpu", "h100"), ("tpu", "tpu-v5e")):
        traced = kernelsim.trace(fn, a, b, model=model, chip=chip)
        cost = traced.calls[0].cost
        print(f"{model} model: the programs load {cost.hbm_read_bytes + cost.l2_hit_bytes:,} B "
              f"({cost.hbm_read_bytes:,} B from HBM; you predicted {predicted:,} B for the "
              "GPU model)")
        print(traced)
except NotImplementedError:
    print("implement gpu_matmul and predict_gpu_reads first")

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
