# %% [markdown]
# # Assignment 12 — the kernel API of today
#
# Lesson 13 wrote kernels that make every copy themselves: `pltpu.sync_copy`,
# `pltpu.async_copy` with DMA semaphores from `pl.run_scoped`, and `pltpu.emit_pipeline`
# split between two TensorCores. Both tasks here use those tools inside a `pl.pallas_call`
# whose operands stay in HBM (`pl.BlockSpec(memory_space=pl.ANY)`): the body is exactly what
# a `pl.kernel` body would be, and the grader reads `pallas_call`s.
#
# **TPU-only**: on this machine the kernels run in TPU interpret mode (`TPU_INTERPRET`). The
# grader runs each case with the race detector on (`interpret=RACES` below): reading a buffer
# a copy may still be writing fails even where the values happen to be right.
#
# Rules: [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html),
# [Pallas core-specific programming](https://docs.jax.dev/en/latest/pallas/tpu/core_map.html).
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check kernel_api.ipynb`.

# %% nbgrader={"grade_id": "setup", "locked": true}
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader.learner import course
from grader.calling import softmax_rows, traced_as_tpu
from kernelsim.backend import choose, tensorcores

# Compiled on a TPU; TPU interpret mode anywhere else (these kernels are TPU-only).
TPU_INTERPRET = choose(tpu_features=True).interpret
# What the grader passes as interpret= where kernels are interpreted: the race detector, with
# room in its clocks to tell copies apart.
RACES = pltpu.InterpretParams(detect_races=True, vector_clock_size=64)

x = jax.random.normal(jax.random.key(12), (64, 256), jnp.float32)
expected = softmax_rows(x).astype(x.dtype)  # task 1's plain-JAX reference

# %% [markdown]
# ## Task 1 — `softmax_in_parts(x, parts, interpret=TPU_INTERPRET)` (3 points)
#
# The softmax of every row of `x` (shape `(M, N)`), computed in float32 and returned in
# `x.dtype`. `x` and the output stay in HBM; the kernel has no grid and one VMEM buffer the
# size of `x` (`scratch_shapes`). It copies `x` into that buffer in `parts` copies of
# `M / parts` rows (`parts` divides `M`), **all started before any is waited on**, then, part
# by part, waits for that part and computes its rows' softmax in the buffer, and finally
# copies the whole buffer to the output. The part after the first is arriving while the
# first is computed.
#
# The DMA semaphores are not scratch of the call: allocate them for the region of the kernel
# that needs them with `pl.run_scoped`.
#
# Graded on values (race detector on) and on kernelsim's trace: no grid, `x` and the output
# in `pl.ANY`, `x.nbytes` read and written (each byte once), and one scratch operand. Try
# `softmax_in_parts(x, 2, interpret=RACES)` against
# `expected`, and `print(kernelsim.trace(functools.partial(softmax_in_parts, parts=2), x))`.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Everything that needs the semaphores lives in one inner function that `pl.run_scoped`
# calls with an array of `parts` DMA semaphores. In it, a first Python loop starts one copy
# per part and keeps the descriptors; a second loop, over the same parts, waits on a
# descriptor and then computes that part's rows. Rows of part `p` are a `pl.ds` starting at
# `p` times the rows per part, the same slice on the HBM ref, the buffer and the semaphore
# index. The last line of the inner function copies the buffer out and waits for it.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The kernel's last line hands `pl.run_scoped` the inner function and one type: a DMA semaphore
# type from `pltpu.SemaphoreType` with a shape of one entry per part. The softmax of a part is
# the usual stable one (subtract the row maximum before `exp`), written back into that part's
# rows of the buffer.
#
# </details>

# %% nbgrader={"grade_id": "softmax_in_parts_solution", "solution": true}
def softmax_in_parts(x, parts, interpret=TPU_INTERPRET):
    ### BEGIN SOLUTION
    m, n = x.shape
    rows = m // parts

    def kernel(x_hbm, o_hbm, buf):
        def with_semaphores(sems):
            part_rows = [pl.ds(p * rows, rows) for p in range(parts)]
            copies = [pltpu.async_copy(x_hbm.at[r], buf.at[r], sems.at[p])
                      for p, r in enumerate(part_rows)]  # every part in flight
            for copy, r in zip(copies, part_rows, strict=True):
                copy.wait()
                v = buf[r, :].astype(jnp.float32)
                e = jnp.exp(v - jnp.max(v, axis=1, keepdims=True))
                buf[r, :] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(buf.dtype)
            pltpu.sync_copy(buf, o_hbm)

        pl.run_scoped(with_semaphores, pltpu.SemaphoreType.DMA((parts,)))

    # No grid: the body runs once and moves every byte of x and of the output itself.
    return pl.pallas_call(
        kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype)],
        interpret=interpret,
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "softmax_in_parts_visible", "grade": true, "points": 1}
course.check("softmax_in_parts", softmax_in_parts)

# %% nbgrader={"grade_id": "softmax_in_parts_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: four parts, one part, bfloat16, large logits.
### BEGIN HIDDEN TESTS
course.check("softmax_in_parts", softmax_in_parts, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `matmul_bias_relu_cores(a, b, bias, bm, bk, bn, interpret=...)` (4 points)
#
# `relu(a @ b + bias)` for `a` `(M, K)`, `b` `(K, N)` and `bias` `(1, N)`, accumulated in
# float32 and returned in `a.dtype`, on **every TensorCore** of the chip (two here), in the
# `pallas_call` form lesson 13 described but did not write:
#
# * the `pallas_call` has grid `(tensorcores(),)` whose one axis is `pltpu.CORE_PARALLEL`: one
#   index per core. `tensorcores()` (from `kernelsim.backend`) is the chip's count,
#   `pltpu.get_tpu_info().num_cores` on a TPU (1 on a v5e or v6e, 2 on a v4 or v5p), and 2
#   in interpret mode, which simulates two cores: a core-parallel axis larger than the chip's
#   cores does not compile. Every operand stays in HBM, and the accumulator, `(bm, bn)`
#   float32, is scratch.
# * the body runs a `pltpu.emit_pipeline` over the tiled matmul's grid
#   `(M // bm, N // bn, K // bk)` with `k` innermost and `dimension_semantics`
#   `(PARALLEL, PARALLEL, ARBITRARY)`, and hands the pipeline the core index through
#   `core_axis=`, the position of that axis in the `pallas_call`'s grid: each core then runs
#   only its share of the output blocks.
# * the bias and the ReLU are applied once per output block, at its last `k` step.
#
# On a TPU the pipeline asks the chip for its tiling; elsewhere call your function through
# `traced_as_tpu` (as in assignment 8):
# `traced_as_tpu(matmul_bias_relu_cores)(a, b, bias, 128, 128, 128, interpret=RACES)`.
# Graded on values and on kernelsim's trace: grid `(tensorcores(),)` (`(2,)` here), semantics
# `("core_parallel",)`, every operand in `pl.ANY`, the output written once (`M · N` elements)
# and at most the tiled matmul's reads (`a` once per column block, `b` and the bias once per
# row block). Two cores that both compute everything write the output twice and fail.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Start from lesson 13's `pl.kernel` matmul, whose pipeline split by the mesh's axis name.
# Here the split comes from the outer grid instead: the outer kernel's only job is to call
# the pipeline on the four HBM refs. The pipeline's body is lesson 4's accumulating matmul
# with one more input, the bias block of the current column block, used only in the branch
# for the last `k` step. The pipeline's `program_id`s are its own grid's.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The `pallas_call` gets `compiler_params=pltpu.CompilerParams(...)` whose `dimension_semantics`
# is a one-entry tuple holding `pltpu.CORE_PARALLEL`; the `emit_pipeline` call gets `core_axis`
# set to the number of that grid axis, which is the first. The bias's BlockSpec is `(1, bn)` and
# follows the column index only.
#
# </details>

# %% nbgrader={"grade_id": "matmul_bias_relu_cores_solution", "solution": true}
def matmul_bias_relu_cores(a, b, bias, bm, bk, bn, interpret=TPU_INTERPRET):
    ### BEGIN SOLUTION
    (m, k), n = a.shape, b.shape[1]
    # float32: several MXU passes, exact; bfloat16: one pass (Mosaic refuses "highest" there)
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None

    def block_body(a_ref, b_ref, bias_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=precision,
                                preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            out = acc_ref[...] + bias_ref[...].astype(jnp.float32)
            o_ref[...] = jnp.maximum(out, 0.0).astype(o_ref.dtype)

    def kernel(a_hbm, b_hbm, bias_hbm, o_hbm, acc_ref):
        # k innermost: the output block and the accumulator stay for all k; the cores split
        # the first parallel axis the core count divides.
        pltpu.emit_pipeline(
            lambda *refs: block_body(*refs, acc_ref),
            grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                      pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
            out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))],
            core_axis=0,
            dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL, pltpu.ARBITRARY),
        )(a_hbm, b_hbm, bias_hbm, o_hbm)

    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        grid=(tensorcores(),),  # one index per TensorCore: 1 on a v5e, 2 interpreted
        in_specs=[hbm, hbm, hbm],
        out_specs=hbm,
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=(pltpu.CORE_PARALLEL,)),
        interpret=interpret,
    )(a, b, bias)
    ### END SOLUTION


# %% nbgrader={"grade_id": "matmul_bias_relu_cores_visible", "grade": true, "points": 1}
course.check("matmul_bias_relu_cores", matmul_bias_relu_cores)

# %% nbgrader={"grade_id": "matmul_bias_relu_cores_hidden", "grade": true, "points": 3} timeout=180
# Hidden tests: an odd number of row blocks (the split falls on the columns), no axis the two
# cores divide, bfloat16 with other block sizes.
### BEGIN HIDDEN TESTS
course.check("matmul_bias_relu_cores", matmul_bias_relu_cores, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# kernelsim's view of your two-core matmul: every copy the nested pipeline made, both cores'
# shares added up.

# %%
a = jax.random.normal(jax.random.key(121), (256, 256), jnp.float32)
b = jax.random.normal(jax.random.key(122), (256, 256), jnp.float32)
bias = jax.random.normal(jax.random.key(123), (1, 256), jnp.float32)
course.view("matmul_bias_relu_cores", lambda: print(kernelsim.trace(traced_as_tpu(
    functools.partial(matmul_bias_relu_cores, bm=128, bk=128, bn=128, interpret=True)),
    a, b, bias)))

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
