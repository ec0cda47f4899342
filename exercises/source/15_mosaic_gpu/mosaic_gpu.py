# %% [markdown]
# # Assignment 15 — Mosaic GPU
#
# Lesson 16 built Mosaic GPU kernels from three parts: a TMA copy into shared memory that
# completes on a barrier, `plgpu.emit_pipeline` keeping several copies in flight, and WGMMA
# adding into an accumulator held in registers. A Hopper kernel lives or dies by what those
# parts allocate and move: 227 KiB of shared memory per CTA, 255 registers per thread, and the
# bytes its copies pull from global memory. Predict each from the sizes alone, then let
# `kernelsim.gpu` (whose shared-memory count is the Mosaic GPU lowering's own) check you.
#
# Tasks 1 to 4 are predictions: Python `int`s, computed from the sizes alone by your own code
# (a prediction that calls kernelsim or the grader's code fails). Tasks 5 and 6 are kernels of
# your own, written with `plgpu.kernel`: they run in GPU interpret mode on a CPU (compiled on a
# GPU), and are graded on their values against plain JAX and on what they move and multiply,
# read by `kernelsim.gpu`. Lesson 16's staging kernel runs at the end of the notebook, so you can
# watch the numbers you predicted.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check mosaic_gpu.ipynb`.

# %% nbgrader={"grade_id": "setup", "locked": true}
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernelsim
from grader.learner import course
from kernelsim.backend import NeedsNewerJax, gpu_interpret

# %% [markdown]
# ## Task 1 — predict: `predict_staging_smem(rows, cols, itemsize)` (3 points)
#
# A kernel stages one `(rows, cols)` tile per CTA: `plgpu.copy_gmem_to_smem` into a
# `plgpu.SMEM((rows, cols), dtype)` scratch buffer, completing on one `plgpu.Barrier()`, then
# a wait, and the tile goes back by `plgpu.copy_smem_to_gmem`. `itemsize` is the bytes per
# element. How many bytes of shared memory does the Mosaic GPU lowering allocate per CTA?
#
# The lowering's rules (`_estimate_resources` in `jax/_src/pallas/mosaic_gpu/lowering.py`):
# every shared-memory allocation is rounded up to a multiple of 1024 bytes, and each barrier
# takes 8 bytes, after the buffers.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Two allocations: the tile and the barrier. Size the tile in bytes, round it up to the next
# multiple of 1024 (a size that already is one stays), then add what one barrier costs.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The return line rounds the tile's byte count up with a ceiling division by 1024, times 1024,
# and adds the barrier's 8 bytes. Try it on the visible case: a 32 KiB tile gives 32,776.
#
# </details>

# %% nbgrader={"grade_id": "predict_staging_smem_solution", "solution": true}
def predict_staging_smem(rows, cols, itemsize):
    ### BEGIN SOLUTION
    tile = rows * cols * itemsize
    return -(-tile // 1024) * 1024 + 8
    ### END SOLUTION


# %% nbgrader={"grade_id": "predict_staging_smem_visible", "grade": true, "points": 1}
course.check("predict_staging_smem", predict_staging_smem)

# %% nbgrader={"grade_id": "predict_staging_smem_hidden", "grade": true, "points": 2}
# Hidden tests: a tile that is not a whole number of KiB, bfloat16 tiles.
### BEGIN HIDDEN TESTS
course.check("predict_staging_smem", predict_staging_smem, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — predict: `predict_pipeline_smem(tm, tn, stages, itemsize)` (3 points)
#
# Lesson 16's `fold_tiles`: one `plgpu.emit_pipeline` over `(tm, tn)` input tiles with
# `max_concurrent_steps=stages` (the loop has more steps than that), the running total as its
# carry, and one `(tm, tn)` output tile in shared memory for the copy back. How many bytes of
# shared memory per CTA?
#
# What the pipeline allocates: for its input, **one** buffer of `stages` slots (shape
# `(stages, tm, tn)`), and one barrier per slot. Same rounding rules as task 1.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Three things to add: the pipeline's buffer, the output tile, the barriers. The buffer is one
# allocation holding every slot, so it is rounded up once, as a whole; the output tile is
# rounded up on its own.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# With a helper that rounds a byte count up to 1024, the return line adds the rounded size of
# the slots buffer (`stages` tiles), the rounded size of one output tile, and 8 bytes per
# stage. The visible case, three 32 KiB slots and a 32 KiB output tile, gives 131,096.
#
# </details>

# %% nbgrader={"grade_id": "predict_pipeline_smem_solution", "solution": true}
def predict_pipeline_smem(tm, tn, stages, itemsize):
    ### BEGIN SOLUTION
    def rounded(nbytes):
        return -(-nbytes // 1024) * 1024

    tile = tm * tn * itemsize
    return rounded(stages * tile) + rounded(tile) + 8 * stages
    ### END SOLUTION


# %% nbgrader={"grade_id": "predict_pipeline_smem_visible", "grade": true, "points": 1}
course.check("predict_pipeline_smem", predict_pipeline_smem)

# %% nbgrader={"grade_id": "predict_pipeline_smem_hidden", "grade": true, "points": 2}
# Hidden tests: one stage, bfloat16 tiles, tiles under a KiB.
### BEGIN HIDDEN TESTS
course.check("predict_pipeline_smem", predict_pipeline_smem, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — predict: `predict_accumulator_registers(tm, tn)` (3 points)
#
# `pl.run_scoped(body, plgpu.ACC((tm, tn), jnp.float32))` gives one warpgroup a WGMMA
# accumulator in registers. A warpgroup is 128 threads and a register holds 32 bits. How many
# registers does the accumulator take **per thread**? (A thread has at most 255; past that the
# compiler spills to local memory, or the tile is split over more warpgroups.)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# The accumulator's elements are spread evenly over the warpgroup's threads, one float32 per
# register.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The return line divides the accumulator's element count by the number of threads in a
# warpgroup. A `(128, 128)` tile gives 128.
#
# </details>

# %% nbgrader={"grade_id": "predict_accumulator_registers_solution", "solution": true}
def predict_accumulator_registers(tm, tn):
    ### BEGIN SOLUTION
    return tm * tn // 128
    ### END SOLUTION


# %% nbgrader={"grade_id": "predict_accumulator_registers_visible", "grade": true, "points": 1}
course.check("predict_accumulator_registers", predict_accumulator_registers)

# %% nbgrader={"grade_id": "predict_accumulator_registers_hidden", "grade": true, "points": 2}
# Hidden tests: smaller and wider tiles, one over the limit.
### BEGIN HIDDEN TESTS
course.check("predict_accumulator_registers", predict_accumulator_registers, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 4 — predict: `predict_matmul_tma_bytes(m, n, k, tm, tn, tk, itemsize)` (3 points)
#
# Lesson 16's WGMMA matmul for `(m, k) @ (k, n)`: one CTA per `(tm, tn)` output tile, and in
# each CTA an `emit_pipeline` over K that TMA-copies one `(tm, tk)` tile of A and one
# `(tk, tn)` tile of B per step. How many bytes do all the TMA copies of the launch read
# from global memory? (The sizes divide evenly. Every CTA makes its own copies, even of a
# tile another CTA copies too; count them all, whether L2 or HBM ends up serving them.)

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Count one CTA first: its number of steps, times the bytes of the two tiles it copies per
# step. Then multiply by the number of CTAs. Check yourself against the single-CTA case: A
# and B are each read exactly once.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The return line multiplies three counts: the CTAs (output tiles in M times output tiles in
# N), the pipeline steps per CTA (K over its tile), and the bytes of one A tile plus one B
# tile. The visible case gives 4,194,304.
#
# </details>

# %% nbgrader={"grade_id": "predict_matmul_tma_bytes_solution", "solution": true}
def predict_matmul_tma_bytes(m, n, k, tm, tn, tk, itemsize):
    ### BEGIN SOLUTION
    ctas = (m // tm) * (n // tn)
    per_step = (tm * tk + tk * tn) * itemsize
    return ctas * (k // tk) * per_step
    ### END SOLUTION


# %% nbgrader={"grade_id": "predict_matmul_tma_bytes_visible", "grade": true, "points": 1}
course.check("predict_matmul_tma_bytes", predict_matmul_tma_bytes)

# %% nbgrader={"grade_id": "predict_matmul_tma_bytes_hidden", "grade": true, "points": 2}
# Hidden tests: one CTA, a wide tile, float32 with a short tk.
### BEGIN HIDDEN TESTS
course.check("predict_matmul_tma_bytes", predict_matmul_tma_bytes, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 5 — write: `rms_norm_mgpu(x, w, interpret)` (6 points)
#
# RMS norm, the normalisation of most transformer layers: each row of `x`, shape `(m, n)`,
# divided by its root mean square, then multiplied by the weights `w`, shape `(n,)`:
#
# `out[i, j] = x[i, j] / sqrt(mean(x[i, :]²) + 1e-6) · w[j]`
#
# Compute in float32 and return `x`'s dtype. Write it as one Mosaic GPU kernel
# (`plgpu.kernel`) with one CTA per band of rows, and move the data the way lesson 16 does:
#
# * each CTA copies its band of `x`, and `w`, from global to shared memory by TMA
#   (`plgpu.copy_gmem_to_smem`), each copy completing on a barrier (`plgpu.Barrier()`);
# * it waits on those barriers (`plgpu.barrier_wait`) before it reads the tiles;
# * the result goes back through shared memory: store it there, `plgpu.commit_smem()`, TMA it
#   to the output (`plgpu.copy_smem_to_gmem`), and `plgpu.wait_smem_to_gmem(0)`.
#
# `m` is a multiple of 64 and `n` is 128 or 256 (a TMA copy moves at most 256 elements along
# each dimension). Pass `interpret` on to `plgpu.kernel(interpret=...)`: the grader gives
# GPU interpret mode on a CPU and `None` (compiled) on a GPU.
#
# The grader checks the values on every case, then reads your kernel with `kernelsim.gpu`
# (one CTA's TMA copies and barrier waits, as in lesson 16): both inputs staged by TMA,
# every copy waited on, the result sent back by TMA, and no plain load or store of a global
# ref (`x_gmem[...]`), which would bypass the copy engine. GPU interpret mode finishes a
# copy at once, so a read before the wait still gives the right values here, and a race on a
# GPU: the wait is checked by structure.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Start from lesson 16's `scale_rows`: a grid of `m // 64` CTAs, each with a `(64, n)` tile
# in `scratch_types`. Add a second shared-memory buffer for `w` and a barrier for each copy.
# In the kernel, read the band as float32, take the mean of its squares along the row, and
# scale.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# After both waits, read the band as float32. The key line computes one number per row: one
# over the square root (`jax.lax.rsqrt`) of the mean of the squared band along axis 1, plus
# 1e-6. The stored result is the band times that per-row scale (indexed `[:, None]`) times the
# weights (indexed `[None, :]`), cast back to the dtype. To compile on a GPU the lowering needs
# to know how registers hold these values: give the float32 band the layout
# `plgpu.Layout.WGMMA` and the float32 weights that layout reduced along axis 0, each with
# `plgpu.layout_cast` (interpret mode does without).
#
# </details>

# %% nbgrader={"grade_id": "rms_norm_mgpu_solution", "solution": true}
def rms_norm_mgpu(x, w, interpret=None):
    ### BEGIN SOLUTION
    band_rows = 64
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(m // band_rows,), grid_names=("band",),
        scratch_types=dict(x_smem=plgpu.SMEM((band_rows, n), x.dtype),
                           w_smem=plgpu.SMEM((n,), w.dtype),
                           x_landed=plgpu.Barrier(), w_landed=plgpu.Barrier()),
        interpret=interpret)
    def kernel(x_gmem, w_gmem, o_gmem, x_smem, w_smem, x_landed, w_landed):
        band = pl.ds(jax.lax.axis_index("band") * band_rows, band_rows)
        plgpu.copy_gmem_to_smem(x_gmem.at[band], x_smem, x_landed)
        plgpu.copy_gmem_to_smem(w_gmem, w_smem, w_landed)
        plgpu.barrier_wait(x_landed)
        plgpu.barrier_wait(w_landed)
        rows = plgpu.layout_cast(x_smem[...].astype(jnp.float32), plgpu.Layout.WGMMA)
        weights = plgpu.layout_cast(w_smem[...].astype(jnp.float32),
                                    plgpu.Layout.WGMMA.reduce(0))
        scale = jax.lax.rsqrt(jnp.mean(rows * rows, axis=1) + 1e-6)
        x_smem[...] = (rows * scale[:, None] * weights[None, :]).astype(x_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[band])
        plgpu.wait_smem_to_gmem(0)

    return kernel(x, w)
    ### END SOLUTION


# %% nbgrader={"grade_id": "rms_norm_mgpu_visible", "grade": true, "points": 2}
course.check("rms_norm_mgpu", rms_norm_mgpu)

# %% nbgrader={"grade_id": "rms_norm_mgpu_hidden", "grade": true, "points": 4}
# Hidden tests: one band, bfloat16, rows far from zero mean.
### BEGIN HIDDEN TESTS
course.check("rms_norm_mgpu", rms_norm_mgpu, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 6 — write: `wgmma_matmul(a, b, tm, tn, tk, interpret)` (6 points)
#
# `a @ b` for bfloat16 `a` of shape `(m, k)` and `b` of shape `(k, n)` (B stored as it is
# multiplied: K along its rows), on the tensor cores, accumulated in float32 and returned in
# bfloat16. One CTA per `(tm, tn)` output tile (grid `(m // tm, n // tn)`), and in each CTA a
# loop over K in steps of `tk`:
#
# * each step TMA-copies this CTA's `(tm, tk)` tile of A and `(tk, tn)` tile of B into shared
#   memory (`plgpu.copy_gmem_to_smem`), each copy completing on a barrier, and waits on it
#   (`plgpu.barrier_wait`) before it multiplies;
# * `plgpu.wgmma(acc, a_smem, b_smem)` adds the product of the two tiles into **one**
#   float32 accumulator, `pl.run_scoped(..., plgpu.ACC((tm, tn), jnp.float32))`, allocated
#   once around the whole loop; `plgpu.wgmma_wait(0)` before the next step's copies overwrite
#   the tiles it reads;
# * after the loop the accumulator (`acc[...]`, a value in registers in lesson 16's
#   `plgpu.Layout.WGMMA`) is cast to bfloat16, stored into a shared-memory tile and sent
#   back by TMA: `plgpu.commit_smem()`, `plgpu.copy_smem_to_gmem`,
#   `plgpu.wait_smem_to_gmem(0)`.
#
# WGMMA reads shared memory in the layouts lesson 16 describes. Give each tile
# `transforms=(plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))` in
# its `plgpu.SMEM`, with one swizzle for A's and B's tiles, the widest A's rows allow
# (`plgpu.find_swizzle(tk * 16)`: `tk` elements of 16 bits); or give a tile no transforms,
# and the lowering picks them. The sizes divide evenly, `tm` is 64 or 128, `tn` 64 or 128,
# `tk` 32 to 128. Pass `interpret` on to `plgpu.kernel`.
#
# The grader checks the values on every case, then reads your kernel with `kernelsim.gpu`:
# exactly one `plgpu.kernel` (no `pallas_call`) with one CTA per output tile; every input
# reaches shared memory by TMA copies, each waited on; the result leaves by TMA, after
# `commit_smem` and before `wait_smem_to_gmem`; no plain load or store of a global ref; one
# WGMMA per K step (`k // tk` per CTA), all added onto one accumulator; B read as it is
# stored; tiles in a layout the Mosaic GPU lowering accepts; at most 227 KiB of shared memory
# per CTA. GPU interpret mode runs a
# WGMMA at once and ignores swizzles, so a layout the lowering refuses still gives right values
# here (and no kernel at all on a GPU): it is checked by structure. A copy you never wait for
# stops GPU interpret mode when its barrier completes again ("Barrier completed phase 1, but
# no threads observed phase 0").

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Three tiles in `scratch_types` (A's, B's, the output's), a barrier per input copy, and a
# grid of `(m // tm, n // tn)` named axes. In the body, `jax.lax.axis_index` gives the CTA's
# row band and column band (`pl.ds(i * tm, tm)`, `pl.ds(j * tn, tn)`). Inside a function
# that receives the accumulator, loop over `k // tk` steps (`@pl.loop(0, k // tk)`); run that
# function with `pl.run_scoped(function, plgpu.ACC((tm, tn), jnp.float32))` and return
# `acc[...]` from it.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Step `s` copies the `s`-th K slice of this CTA's A band and of its B band (a `pl.ds`
# starting at `s` times `tk`, along K), waits on both barriers, adds the product of the tiles
# into the accumulator, and waits for that WGMMA before the loop goes on. Nothing else
# touches the accumulator inside the loop: allocating it or storing to it there starts the
# sum from zero again. The transforms: one swizzle from `plgpu.find_swizzle` of A's row in
# bits, the same tuple for A's and B's tiles; the output tile takes its own, from `tn`.
#
# </details>

# %% nbgrader={"grade_id": "wgmma_matmul_solution", "solution": true}
def wgmma_matmul(a, b, tm, tn, tk, interpret=None):
    ### BEGIN SOLUTION
    m, k = a.shape
    n = b.shape[1]

    def layout(row_elems):
        swizzle = plgpu.find_swizzle(row_elems * 16)  # a row of bfloat16, in bits
        return (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), a.dtype),
        grid=(m // tm, n // tn), grid_names=("m", "n"),
        scratch_types=dict(a_smem=plgpu.SMEM((tm, tk), a.dtype, transforms=layout(tk)),
                           b_smem=plgpu.SMEM((tk, tn), b.dtype, transforms=layout(tk)),
                           o_smem=plgpu.SMEM((tm, tn), a.dtype, transforms=layout(tn)),
                           a_landed=plgpu.Barrier(), b_landed=plgpu.Barrier()),
        interpret=interpret)
    def kernel(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, a_landed, b_landed):
        rows = pl.ds(jax.lax.axis_index("m") * tm, tm)
        cols = pl.ds(jax.lax.axis_index("n") * tn, tn)

        def accumulate(acc):
            @pl.loop(0, k // tk)
            def _(s):
                depth = pl.ds(s * tk, tk)
                plgpu.copy_gmem_to_smem(a_gmem.at[rows, depth], a_smem, a_landed)
                plgpu.copy_gmem_to_smem(b_gmem.at[depth, cols], b_smem, b_landed)
                plgpu.barrier_wait(a_landed)
                plgpu.barrier_wait(b_landed)
                plgpu.wgmma(acc, a_smem, b_smem)
                plgpu.wgmma_wait(0)  # done reading the tiles the next copies overwrite

            return acc[...]

        o_smem[...] = pl.run_scoped(accumulate, plgpu.ACC((tm, tn), jnp.float32)).astype(
            o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[rows, cols])
        plgpu.wait_smem_to_gmem(0)

    return kernel(a, b)
    ### END SOLUTION


# %% nbgrader={"grade_id": "wgmma_matmul_visible", "grade": true, "points": 2}
course.check("wgmma_matmul", wgmma_matmul)

# %% nbgrader={"grade_id": "wgmma_matmul_hidden", "grade": true, "points": 4}
# Hidden tests: one CTA with a long K loop, tk = 32, (128, 128) tiles.
### BEGIN HIDDEN TESTS
course.check("wgmma_matmul", wgmma_matmul, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Now run it
#
# Lesson 16's staging kernel, run in GPU interpret mode (compiled on a GPU) and checked
# against plain JAX; then kernelsim's count of its shared memory against your prediction.
# Change the sizes and run again.

# %%
ROWS = 64


def scale_rows(x, s, interpret=None):
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(m // ROWS,), grid_names=("rows",),
        scratch_types=dict(tile=plgpu.SMEM((ROWS, n), x.dtype), landed=plgpu.Barrier()),
        interpret=interpret)
    def kernel(x_gmem, o_gmem, tile, landed):
        rows = pl.ds(jax.lax.axis_index("rows") * ROWS, ROWS)
        plgpu.copy_gmem_to_smem(x_gmem.at[rows], tile, landed)
        plgpu.barrier_wait(landed)
        tile[...] = tile[...] * s
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(tile, o_gmem.at[rows])
        plgpu.wait_smem_to_gmem(0)

    return kernel(x)


x = jax.random.normal(jax.random.key(15), (256, 128), jnp.float32)
# compiled on a GPU, in GPU interpret mode elsewhere (which JAX 0.10.2 lacks: it says so)
np.testing.assert_allclose(scale_rows(x, 3.0, interpret=gpu_interpret()), 3.0 * x, rtol=1e-6)
(staged,) = kernelsim.gpu.analyse(functools.partial(scale_rows, s=3.0), x)
try:
    print(f"kernelsim: {staged.smem_bytes:,} B of shared memory per CTA; you predicted "
          f"{predict_staging_smem(ROWS, 128, 4):,} B")
    print(f"a (128, 256) float32 accumulator: you predicted "
          f"{predict_accumulator_registers(128, 256)} registers per thread (limit 255)")
except NotImplementedError:
    print("implement predict_staging_smem and predict_accumulator_registers first")

# %% [markdown]
# Your kernel of task 5 through the same model: one CTA's events in the order it issues them
# (the grader reads these), and its shared memory.

# %%
w = jax.random.normal(jax.random.key(16), (128,), jnp.float32)
try:
    (mine,) = kernelsim.gpu.analyse(functools.partial(rms_norm_mgpu, interpret=None), x, w)
    print(" -> ".join(e.kind for e in mine.events))
    print(f"{mine.smem_bytes:,} B of shared memory per CTA, grid {mine.grid}")
except NeedsNewerJax:  # kernelsim.gpu on an older JAX: not an unfinished task
    raise
except NotImplementedError:
    print("implement rms_norm_mgpu first")

# %% [markdown]
# Your matmul of task 6 the same way: CTA 0's events, its WGMMAs (one per K step) and its
# shared memory against the 227 KiB a CTA may use.

# %%
a = jax.random.normal(jax.random.key(17), (128, 256), jnp.bfloat16)
b = jax.random.normal(jax.random.key(18), (256, 128), jnp.bfloat16)
try:
    (matmul,) = kernelsim.gpu.analyse(
        functools.partial(wgmma_matmul, tm=64, tn=64, tk=64, interpret=None), a, b)
    print(" -> ".join(e.kind for e in matmul.events))
    print(f"{matmul.count('wgmma')} WGMMAs and {matmul.smem_bytes:,} B of shared memory per "
          f"CTA, grid {matmul.grid}")
except NeedsNewerJax:
    raise
except NotImplementedError:
    print("implement wgmma_matmul first")

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
