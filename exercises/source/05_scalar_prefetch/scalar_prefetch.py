# %% [markdown]
# # Assignment 5 — scalar prefetch
#
# `pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=k, ...)` puts the first `k` operands in SMEM
# before the grid starts; index maps then receive them after the grid indices
# (`lambda i, ids_ref: (ids_ref[i], 0)`) and so can choose blocks from data.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check scalar_prefetch.ipynb`.

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
# ## Task 1 — `embedding_bag(table, ids, bag)` (3 points)
#
# `ids` holds `B · bag` row numbers of `table` (`V × D`), `bag` at a time: bag `b` is
# `ids[b·bag : (b+1)·bag]`. Return the `(B, D)` float32 sums `out[b] = Σⱼ table[ids[b·bag + j]]`,
# what a recommender's embedding bag computes from a user's items. Lesson 6's gather copied
# one row per step into its own output row; here `bag` rows add up into one output row, so a
# second grid axis walks the bag while the output block stays where it is.
#
# Grid `(B, bag)`; step `(b, j)` fetches only row `ids[b·bag + j]`, as a `(None, 1, D)` block
# of the table viewed as `(V, 1, D)` (the TPU's (8, 128) rule, as in lesson 6's gather). The
# table is read one row per id, and each bag's sum leaves the chip once. Sum in float32 for
# every table dtype.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# `ids` is the one scalar-prefetch operand, so both index maps receive the two grid indices
# and then its SMEM ref. The output's index map ignores `j`: the block of bag `b` stays in
# VMEM while `j` runs, and is written back once when `b` changes (lesson 4's accumulator).
# The kernel sets that block to zero at `j == 0` (`pl.when`) and adds its row, as float32,
# at every step. Reshape the table to `(V, 1, D)` before the call and the `(B, 1, D)` result
# to `(B, D)` after it.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The table's index map returns the row to fetch as its first block index: the entry of the
# prefetched ref at the position of step `(b, j)` in the flat `ids`, which `b`, `j` and the
# Python int `bag` give you. The other two block indices are 0.
#
# </details>

# %% nbgrader={"grade_id": "embedding_bag_solution", "solution": true}
def embedding_bag(table, ids, bag):
    ### BEGIN SOLUTION
    vocab, dim = table.shape
    bags = ids.shape[0] // bag

    def kernel(ids_ref, row_ref, o_ref):
        del ids_ref  # read by the index map only

        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += row_ref[...].astype(jnp.float32)

    row = (None, 1, dim)  # one table row; the squeezed V dimension keeps (1, D) whole
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(bags, bag),
        # a row repeated in a row repeats the block index: the pipeline skips the copy
        in_specs=[pl.BlockSpec(row, lambda b, j, ids_ref: (ids_ref[b * bag + j], 0, 0))],
        out_specs=pl.BlockSpec(row, lambda b, j, ids_ref: (b, 0, 0)),
    )
    out = pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((bags, 1, dim), jnp.float32),
        interpret=TPU_INTERPRET,
    )(jnp.asarray(ids, jnp.int32), table.reshape(vocab, 1, dim))
    return out.reshape(bags, dim)
    ### END SOLUTION


# %% nbgrader={"grade_id": "embedding_bag_visible", "grade": true, "points": 1}
course.check("embedding_bag", embedding_bag)

# %% nbgrader={"grade_id": "embedding_bag_hidden", "grade": true, "points": 2}
# Hidden tests: other tables and bag sizes (one row, one bag of all), bfloat16 tables.
### BEGIN HIDDEN TESTS
course.check("embedding_bag", embedding_bag, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `block_sparse_matmul(a, b, block_mask, bm, bk, bn)` (3 points)
#
# `a @ b` where `a`'s `(bm, bk)` blocks are zero wherever the NumPy array
# `block_mask[M // bm, K // bk]` is 0. Visit only the non-zero blocks: build, on the host, the
# list of non-zero K-block indices of each row of blocks (pad short lists by repeating the last
# index, so the pipeline skips the copy) and their counts, and prefetch both. A row of blocks with
# no non-zero block gives zeros. Budget: `A` reads at most its non-zero blocks once per column
# block (one block for an empty row).

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Plan on the host with NumPy: for each row of blocks, the indices of its non-zero K blocks,
# padded to the longest row's length by repeating the last one, and the count of real entries.
# Flatten the padded table and prefetch it together with the counts. Grid `(row blocks, column
# blocks, longest list)`: at step `(i, j, s)` both index maps read entry `s` of row `i`'s list.
# The kernel zeroes a float32 VMEM accumulator at `s == 0`, adds the product of its two blocks
# only while `s` is below the row's count, and writes the output at the last `s`. An empty row
# still gets one step (the list is at least one long), so its output block is written: zeros.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The flat table holds the padded lists one after another, `width` entries each (`width` the padded
# length), so entry `s` of row block `i`'s list sits at one position you can compute from `i`,
# `width` and `s`. `a`'s block index is row block `i` and that entry; `b`'s is that entry and column
# block `j`. The product is added under a `pl.when` that compares `s` with row `i`'s count.
#
# </details>

# %% nbgrader={"grade_id": "block_sparse_matmul_solution", "solution": true}
def block_sparse_matmul(a, b, block_mask, bm, bk, bn):
    ### BEGIN SOLUTION
    mask = np.asarray(block_mask).astype(bool)
    gm, _ = mask.shape
    n = b.shape[1]
    counts = mask.sum(axis=1).astype(np.int32)
    width = max(int(counts.max()), 1)
    ids = np.zeros((gm, width), np.int32)
    for i in range(gm):
        nz = np.flatnonzero(mask[i])
        if len(nz):
            ids[i, : len(nz)] = nz
            ids[i, len(nz):] = nz[-1]
    ids = ids.reshape(-1)
    # float32: several MXU passes, exact; bfloat16: one pass (Mosaic refuses "highest" there)
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None

    def kernel(ids_ref, cnt_ref, a_ref, b_ref, o_ref, acc_ref):
        i, s = pl.program_id(0), pl.program_id(2)

        @pl.when(s == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        @pl.when(s < cnt_ref[i])
        def _():
            acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=precision,
                                    preferred_element_type=jnp.float32)

        @pl.when(s == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(gm, pl.cdiv(n, bn), width),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, s, ids, cnt: (i, ids[i * width + s])),
                  pl.BlockSpec((bk, bn), lambda i, j, s, ids, cnt: (ids[i * width + s], j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, s, ids, cnt: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    return pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((a.shape[0], n), a.dtype),
        interpret=TPU_INTERPRET,
    )(jnp.asarray(ids), jnp.asarray(counts), a, b)
    ### END SOLUTION


# %% nbgrader={"grade_id": "block_sparse_matmul_visible", "grade": true, "points": 1}
course.check("block_sparse_matmul", block_sparse_matmul)

# %% nbgrader={"grade_id": "block_sparse_matmul_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: other masks and shapes, non-divisible N, bfloat16 (one a long all-positive
# sum), a mask with no non-zero block.
### BEGIN HIDDEN TESTS
course.check("block_sparse_matmul", block_sparse_matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `grouped_matmul(x, w, group_sizes, bm, bn)` (3 points)
#
# Rows of `x` (shape `(M, K)`) come in consecutive groups of sizes `group_sizes` (NumPy, each a
# multiple of `bm`); group `g` is multiplied by `w[g]` (`w` has shape `(G, K, N)`). Grid
# `(M // bm, cdiv(N, bn))`; prefetch the group of each row block and let `w`'s index map pick
# `w[group]` — block `(pl.Squeezed(), K, bn)`.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# On the host, the group of every row block: group `g` covers `group_sizes[g] // bm`
# consecutive row blocks. Prefetch that array of group ids. `x`'s and the output's index maps do
# not need it; `w`'s uses it to pick the group's weights, with the group dimension squeezed out
# of the block. With the column axis innermost, `w`'s block changes at every step whenever
# `N > bn` (each step wants another column block), so the pipeline re-fetches it each step;
# only when one column block covers `N` do consecutive row blocks of one group reuse it. The
# read budget allows both. The kernel is one matmul with a float32 result, rounded to the
# output dtype.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The group ids come from `np.repeat`: each group number repeated as many times as its group has row
# blocks, so entry `i` is row block `i`'s group. `w`'s index map reads that entry of the prefetched
# ref for the squeezed group axis, then block 0 along K and column block `j`.
#
# </details>

# %% nbgrader={"grade_id": "grouped_matmul_solution", "solution": true}
def grouped_matmul(x, w, group_sizes, bm, bn):
    ### BEGIN SOLUTION
    m, k = x.shape
    g, _, n = w.shape
    gid = np.repeat(np.arange(g, dtype=np.int32), np.asarray(group_sizes) // bm)

    precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None  # as above

    def kernel(gid_ref, x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], precision=precision,
                             preferred_element_type=jnp.float32).astype(o_ref.dtype)

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(m // bm, pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j, gid: (i, 0)),
                  pl.BlockSpec((pl.Squeezed(), k, bn), lambda i, j, gid: (gid[i], 0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, gid: (i, j)),
    )
    return pl.pallas_call(
        kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        interpret=TPU_INTERPRET,
    )(jnp.asarray(gid), x, w)
    ### END SOLUTION


# %% nbgrader={"grade_id": "grouped_matmul_visible", "grade": true, "points": 1}
course.check("grouped_matmul", grouped_matmul)

# %% nbgrader={"grade_id": "grouped_matmul_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: other group sizes, non-divisible N, bfloat16.
### BEGIN HIDDEN TESTS
course.check("grouped_matmul", grouped_matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
