# %% [markdown]
# # Assignment 9 — find the bug
#
# Each task hands you a kernel that is wrong, in a locked cell named `<task>_buggy`, with the
# symptom it shows. Run it, find the bug with the tools of lesson 9 (`pl.debug_print`, TPU
# interpret mode's NaN fill and race detector, kernelsim's step table and heatmap,
# `kernelsim.tpu_lowering_error`) and write the fixed kernel in the task's solution cell, under
# the task's own name. Copy the buggy code and change what is wrong; keep its grid and blocks
# unless the task says otherwise.
# `course.check("<task>", <task>_buggy)` shows what the grader says about the buggy version.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check debugging.ipynb`.

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
# TPU-only features (here: an output block revisited across grid steps).
INTERPRET = choose().interpret
TPU_INTERPRET = choose(tpu_features=True).interpret


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

# %% [markdown]
# ## Task 1 — `roll_rows(x, bm, shift)` (3 points)
#
# `jnp.roll(x, shift * bm, axis=0)`: the row blocks of height `bm` move down by `shift` blocks,
# the last ones wrapping round to the top. The kernel only copies; the index maps do the
# moving. `M` is a multiple of `bm`.
#
# The kernel is given, `copy_kernel` above, whose body `o_ref[...] = x_ref[...]` lesson 2
# ships too: it is the one shipped body "kernels are your own" accepts in this task.
#
# Symptom: wrong values, though every block of `x` appears in the output exactly once. Print
# the step table (`kernelsim.trace(...).steps()`) and compare the block each step reads with
# the block `jnp.roll` puts at that step's output position.

# %% nbgrader={"grade_id": "roll_rows_buggy", "locked": true}
def roll_rows_buggy(x, bm, shift):
    m, n = x.shape
    n_blocks = m // bm
    # Each x block is read once and lands in one output block; nothing is reused.
    return pl.pallas_call(
        copy_kernel,
        grid=(n_blocks,),
        in_specs=[pl.BlockSpec((bm, n), lambda i: ((i + shift) % n_blocks, 0))],
        out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Grid step `i` writes output block `i`. After a roll by `shift` blocks, output block `i`
# holds the input block that sat `shift` blocks *above* it, wrapping round. The buggy map
# reads the block `shift` below. With 4 blocks and `shift = 2` the two are the same block,
# which is why some cases cannot tell them apart.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The input's index map, `lambda i: ((i + shift) % n_blocks, 0)`, reads the block `shift` below.
# With 4 blocks and a shift of 1, output block 0 must hold input block 3 and output block 1 input
# block 0: work out which expression of `i`, `shift` and `n_blocks` gives that, wrapping round.
#
# </details>

# %% nbgrader={"grade_id": "roll_rows_solution", "solution": true}
def roll_rows(x, bm, shift):
    ### BEGIN SOLUTION
    m, n = x.shape
    n_blocks = m // bm
    # Each x block is read once and lands in one output block; nothing is reused.
    return pl.pallas_call(
        copy_kernel,
        grid=(n_blocks,),
        in_specs=[pl.BlockSpec((bm, n), lambda i: ((i + n_blocks - shift) % n_blocks, 0))],
        out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "roll_rows_visible", "grade": true, "points": 1}
course.check("roll_rows", roll_rows)

# %% nbgrader={"grade_id": "roll_rows_hidden", "grade": true, "points": 2}
# Hidden tests: other block counts and shifts, bfloat16.
### BEGIN HIDDEN TESTS
course.check("roll_rows", roll_rows, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `row_sums(x, bm, bn)` (2 points)
#
# The float32 sums of each row of `x`, shape `(M, 1)`. Grid `(M // bm, N // bn)` over blocks
# `(bm, bn)`; the output block `(bm, 1)` of row block `i` stays on chip while `j` sweeps the
# columns, and each step adds its block's partial sums into it. TPU-only: an output block is
# revisited across grid steps, which a GPU's parallel programs cannot do.
#
# Symptom: every sum is NaN. In TPU interpret mode an output buffer starts as NaN.

# %% nbgrader={"grade_id": "row_sums_buggy", "locked": true}
def row_sums_kernel_buggy(x_ref, o_ref):
    o_ref[...] += jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True)


def row_sums_buggy(x, bm, bn):
    m, n = x.shape
    # j innermost: output block (i, 0) stays on chip while j sweeps row block i's columns.
    return pl.pallas_call(
        row_sums_kernel_buggy,
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=TPU_INTERPRET,
    )(x)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# `+=` reads the output block before adding to it. Nothing ever wrote it before the first
# column step of each row block, so the first read returns whatever the memory held: NaN
# here, anything on a chip. Give the block a value at the first step along `j`, and only
# there: zeroing it at every step keeps just the last block's sums.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The line to change is the kernel's `o_ref[...] +=`: at the first column step of each row block it
# reads an output block nothing has written. Ahead of it the kernel needs a store of zeros into
# `o_ref`, under a `pl.when` whose condition holds only where the program id along grid axis 1
# (`pl.program_id`) is 0.
#
# </details>

# %% nbgrader={"grade_id": "row_sums_solution", "solution": true}
def row_sums(x, bm, bn):
    ### BEGIN SOLUTION
    def kernel(x_ref, o_ref):
        j = pl.program_id(1)

        @pl.when(j == 0)  # the first column block of each row block
        def _init():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True)

    m, n = x.shape
    # j innermost: output block (i, 0) stays on chip while j sweeps row block i's columns.
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=TPU_INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "row_sums_visible", "grade": true, "points": 1}
course.check("row_sums", row_sums)

# %% nbgrader={"grade_id": "row_sums_hidden", "grade": true, "points": 1}
# Hidden tests: a single column block, bfloat16, long all-positive rows.
### BEGIN HIDDEN TESTS
course.check("row_sums", row_sums, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `column_max(x, bm)` (2 points)
#
# The maximum of each column, shape `(1, N)`, dtype of `x`. Grid `cdiv(M, bm)` over row blocks
# `(bm, N)`; `M` need not be a multiple of `bm`, so the last block hangs over the edge and its
# extra rows must not count. The `(1, N)` output block stays on chip for the whole grid.
# TPU-only, as in task 2.
#
# Symptom: NaN in the visible case, right values when `bm` divides `M`. `pl.debug_print`
# the number of rows the mask keeps at each step, and compare it with the rows the block
# really has.

# %% nbgrader={"grade_id": "column_max_buggy", "locked": true}
def column_max_buggy(x, bm):
    m, n = x.shape

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _init():
            o_ref[...] = jnp.full_like(o_ref, -jnp.inf)

        rows = i * bm + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 0)
        block = jnp.where(rows <= m, x_ref[...], -jnp.inf)
        o_ref[...] = jnp.maximum(o_ref[...], jnp.max(block, axis=0, keepdims=True))

    # The (1, N) output block stays on chip for the whole grid; each x block is read once.
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm),),
        in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, n), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((1, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=TPU_INTERPRET,
    )(x)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Rows are numbered from 0, so an array of `M` rows has rows `0 … M-1`. The mask keeps one
# row too many: in the last block, the first row past the edge, which holds padding (NaN in
# interpret mode, anything on a chip). Masked rows must lose every comparison, so `-inf` is
# the right fill; 0 would win in a column of negative numbers.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The mask, `block = jnp.where(rows <= m, x_ref[...], -jnp.inf)`: its comparison keeps row `m`, one
# past the array's last row. With 10 rows and blocks of 4, the last block holds rows 8 to 11: which
# of them are in the array, and which comparison with `m` keeps exactly those?
#
# </details>

# %% nbgrader={"grade_id": "column_max_solution", "solution": true}
def column_max(x, bm):
    ### BEGIN SOLUTION
    m, n = x.shape

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _init():
            o_ref[...] = jnp.full_like(o_ref, -jnp.inf)

        rows = i * bm + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 0)
        in_array = rows < m  # rows 0 .. m-1; the overhang of the last block is padding
        block = jnp.where(in_array, x_ref[...], -jnp.inf)
        o_ref[...] = jnp.maximum(o_ref[...], jnp.max(block, axis=0, keepdims=True))

    # The (1, N) output block stays on chip for the whole grid; each x block is read once.
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, bm),),
        in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, n), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((1, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=TPU_INTERPRET,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "column_max_visible", "grade": true, "points": 1}
course.check("column_max", column_max)

# %% nbgrader={"grade_id": "column_max_hidden", "grade": true, "points": 1}
# Hidden tests: an edge one row past a block, bfloat16, all-negative columns.
### BEGIN HIDDEN TESTS
course.check("column_max", column_max, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 4 — `pool_rows(x)` (2 points)
#
# The mean of each group of 4 consecutive rows, shape `(M // 4, N)`, dtype of `x` (computed in
# float32). `M` is a multiple of 4. Choose the blocks yourself: each block of `x` is read once
# and every block shape must be one the TPU lowering accepts.
#
# Symptom: right values in interpret mode, yet on a TPU the kernel never compiles. Ask the TPU
# lowering on this machine: `kernelsim.tpu_lowering_error(functools.partial(pool_rows_buggy,
# interpret=False), x)`, or read the warnings of `kernelsim.trace(pool_rows_buggy, x)`.

# %% nbgrader={"grade_id": "pool_rows_buggy", "locked": true}
def pool_rows_buggy(x, interpret=INTERPRET):
    m, n = x.shape

    def kernel(x_ref, o_ref):
        group = x_ref[...].astype(jnp.float32)
        o_ref[...] = jnp.mean(group, axis=0, keepdims=True).astype(o_ref.dtype)

    # One group of 4 rows per step; each x block is read once.
    return pl.pallas_call(
        kernel,
        grid=(m // 4,),
        in_specs=[pl.BlockSpec((4, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m // 4, n), x.dtype),
        interpret=interpret,
    )(x)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# The lowering wants the second-to-last block dimension to be a multiple of 8 (or the whole
# array's). So let each step produce 8 output rows from 32 input rows, with a `cdiv` grid for
# the last, partial block. Inside, read the whole block once, convert it to float32, and sum
# each group of 4 rows with a mask: output row `j` is the column sum of the rows `4j … 4j+3`.
#
# A strided read, `x_ref[pl.ds(r, 8, stride=4), :]`, looks like the natural way to pick every
# 4th row, and interpret mode runs it, but Mosaic lowers a strided load only of 32-bit data
# from a ref exactly 128 lanes wide: a bfloat16 block fails "Strided load with non 32-bit
# data", a float32 block of 256 columns "The last dim size is not 128" (both on a TPU v5e).
# The grader refuses such a read (rule strided_load).
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The two BlockSpecs: blocks `(4, n)` in and `(1, n)` out break the TPU's rule on the second-to-last
# dimension. Keep the kernel's idea, each output row the mean of 4 input rows, but give each step 8
# output rows from 32 input rows. Inside, number the block's rows with a broadcasted iota: output
# row j is the column sum of the block with every row outside rows 4j to 4j+3 masked to zero, and a
# second mask on the output's own row numbers puts it in place.
#
# </details>

# %% nbgrader={"grade_id": "pool_rows_solution", "solution": true}
def pool_rows(x, interpret=INTERPRET):
    ### BEGIN SOLUTION
    m, n = x.shape
    out_rows = 8  # a multiple of 8 output rows per step, from 4 times as many input rows

    def kernel(x_ref, o_ref):
        # The whole block, in 32-bit: Mosaic lowers a strided read (pl.ds(r, 8, stride=4))
        # only of 32-bit data from a ref exactly 128 lanes wide, so each group of 4 rows is
        # summed under a mask instead. Rows past the array's edge are never selected.
        x = x_ref[...].astype(jnp.float32)
        rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
        out_row = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        pooled = jnp.zeros(o_ref.shape, jnp.float32)
        for j in range(out_rows):
            group = (rows >= 4 * j) & (rows < 4 * j + 4)
            total = jnp.sum(jnp.where(group, x, 0.0), axis=0, keepdims=True)
            pooled = jnp.where(out_row == j, total, pooled)
        o_ref[...] = (pooled / 4).astype(o_ref.dtype)

    # Each x block is read once; the last block may hang over the edge (its rows are dropped).
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m // 4, out_rows),),
        in_specs=[pl.BlockSpec((4 * out_rows, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((out_rows, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m // 4, n), x.dtype),
        interpret=interpret,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "pool_rows_visible", "grade": true, "points": 1}
course.check("pool_rows", pool_rows)

# %% nbgrader={"grade_id": "pool_rows_hidden", "grade": true, "points": 1}
# Hidden tests: a partial last block, bfloat16, rows narrower than 128.
### BEGIN HIDDEN TESTS
course.check("pool_rows", pool_rows, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 5 — `chunk_sum(x, chunk, interpret=TPU_INTERPRET)` (2 points)
#
# The float32 sum of the `chunk`-row slices of `x`, shape `(chunk, N)`, with `x` left in HBM
# (`pl.ANY`) and streamed by hand. Lesson 5 kept one copy in flight behind the add, in two
# VMEM buffers; this kernel keeps **two** in flight, in a ring of **three** buffers, for
# copies slower than an add. TPU-only: manual DMAs and semaphores. `M` is a multiple of
# `chunk`. The grader calls your function with
# `interpret=pltpu.InterpretParams(detect_races=True)`, so a fix that still races fails; and
# it follows your copies in order, so a fix that shrinks the ring (two buffers, one, or each
# copy waited as soon as it starts) fails too, as does one that starts a copy into a buffer
# while a copy out of it is still in flight.
#
# Symptom: NaN with TPU interpret mode's defaults; the right values with
# `interpret=pltpu.InterpretParams(dma_execution_mode="eager")`. Run it with
# `interpret=pltpu.InterpretParams(detect_races=True)` and read the two lines the report names
# (call `pltpu.reset_tpu_interpret_mode_state()` after the error).

# %% nbgrader={"grade_id": "chunk_sum_buggy", "locked": true}
def chunk_sum_buggy(x, chunk, interpret=TPU_INTERPRET):
    n_chunks = x.shape[0] // chunk

    def kernel(x_hbm, o_ref, ring, sems):
        def fetch(c):  # chunk c travels into ring slot c % 3
            return pltpu.make_async_copy(x_hbm.at[pl.ds(c * chunk, chunk)], ring.at[c % 3],
                                         sems.at[c % 3])

        for c in range(min(2, n_chunks)):  # two chunks in flight before the first add
            fetch(c).start()
        o_ref[...] = jnp.zeros_like(o_ref)

        def body(c, carry):
            @pl.when(c + 2 < n_chunks)
            def _prefetch():
                fetch(c + 2).start()  # into the slot chunk c - 1 was added from

            o_ref[...] += ring[c % 3].astype(jnp.float32)
            fetch(c).wait()
            return carry

        jax.lax.fori_loop(0, n_chunks, body, 0)

    # No grid: one step streams x from HBM through a ring of three VMEM buffers by hand.
    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((3, chunk, x.shape[1]), x.dtype),
                        pltpu.SemaphoreType.DMA((3,))],
        out_shape=jax.ShapeDtypeStruct((chunk, x.shape[1]), jnp.float32),
        interpret=interpret,
    )(x)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# A DMA's data may land any time between `.start()` and the end of its `.wait()`. The race
# report names a write by a DMA and a read by the core of the same buffer with nothing
# ordering them: the kernel reads chunk `c`'s slot of the ring before it has waited for chunk
# `c`'s copy. The prefetch of chunk `c + 2` is fine where it is: its slot was last read by the
# add of chunk `c - 1`, which the core has finished.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The loop body's line that adds `ring[c % 3]` into `o_ref` reads chunk `c`'s slot. Of the
# statements in `body`, only the `.wait()` on chunk `c`'s copy says that chunk has landed:
# check which of the two runs first.
#
# </details>

# %% nbgrader={"grade_id": "chunk_sum_solution", "solution": true}
def chunk_sum(x, chunk, interpret=TPU_INTERPRET):
    ### BEGIN SOLUTION
    n_chunks = x.shape[0] // chunk

    def kernel(x_hbm, o_ref, ring, sems):
        def fetch(c):  # chunk c travels into ring slot c % 3
            return pltpu.make_async_copy(x_hbm.at[pl.ds(c * chunk, chunk)], ring.at[c % 3],
                                         sems.at[c % 3])

        for c in range(min(2, n_chunks)):  # two chunks in flight before the first add
            fetch(c).start()
        o_ref[...] = jnp.zeros_like(o_ref)

        def body(c, carry):
            @pl.when(c + 2 < n_chunks)
            def _prefetch():
                fetch(c + 2).start()  # into the slot chunk c - 1 was added from

            fetch(c).wait()  # chunk c has landed in its slot only after this
            o_ref[...] += ring[c % 3].astype(jnp.float32)
            return carry

        jax.lax.fori_loop(0, n_chunks, body, 0)

    # No grid: one step streams x from HBM through a ring of three VMEM buffers by hand.
    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((3, chunk, x.shape[1]), x.dtype),
                        pltpu.SemaphoreType.DMA((3,))],
        out_shape=jax.ShapeDtypeStruct((chunk, x.shape[1]), jnp.float32),
        interpret=interpret,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "chunk_sum_visible", "grade": true, "points": 1}
course.check("chunk_sum", chunk_sum)

# %% nbgrader={"grade_id": "chunk_sum_hidden", "grade": true, "points": 1}
# Hidden tests: more and longer chunks, bfloat16, one chunk, two chunks; all with the race
# detector.
### BEGIN HIDDEN TESTS
course.check("chunk_sum", chunk_sum, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
