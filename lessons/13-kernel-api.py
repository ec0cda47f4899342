# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 13 — The kernel API of today: pl.kernel, meshes and two TensorCores
#
# **Learning objectives.** After this lesson you can
#
# 1. write a kernel with `pl.kernel` on a `pltpu.TensorCoreMesh`, whose operands stay in HBM,
#    and move data with `pltpu.sync_copy`;
# 2. overlap copies with work using `pltpu.async_copy` and DMA semaphores that `pl.run_scoped`
#    allocates for one region of the kernel;
# 3. write the same matmul with `pl.pallas_call` and with `pl.kernel` plus
#    `pltpu.emit_pipeline`, and say when each one fits;
# 4. split a pipeline's parallel axis between two TensorCores with `core_axis_name` (or a
#    `"core_parallel"` grid axis), and say what a megacore chip does to a `"parallel"` axis.
#
# Lessons 2 to 12 wrote every kernel with `pl.pallas_call`: a grid, BlockSpecs, and a pipeline
# the compiler builds. JAX's [TPU quickstart](https://docs.jax.dev/en/latest/pallas/tpu/quickstart.html)
# now starts one level lower, from `pl.kernel`: a function that runs once per TensorCore,
# with its operands left in HBM and every copy written by you or by `emit_pipeline`. Lesson 5
# met the parts (`pl.ANY`, async copies, semaphores, `emit_pipeline` inside a `pallas_call`);
# here they become the whole kernel. Everything runs in TPU interpret mode on this CPU.
# References: [Pallas core-specific programming](https://docs.jax.dev/en/latest/pallas/tpu/core_map.html),
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html).
# Matching exercises: [`../exercises/`](../exercises/) (assignment 12).

# %%
import contextlib
import functools

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import Execution, choose, platform, tensorcores

LESSON = "13-kernel-api"
_course.versions()
keys = jax.random.split(jax.random.key(13), 4)
tpu_run = choose(tpu_features=True)  # TPU-only features: compiled on a TPU, interpreted elsewhere
print(tpu_run.label)


def tensorcore_mesh(axis_name, num_cores):
    """``pltpu.TensorCoreMesh(axis_name=..., num_cores=...)``, the pinned release's mesh of a
    chip's TensorCores. The last JAX release for Python 3.11 has no such class and
    spells it ``pltpu.create_tensorcore_mesh(axis_name, num_cores=...)`` (which newer
    releases deprecate): the lesson runs on both."""
    if hasattr(pltpu, "TensorCoreMesh"):
        return pltpu.TensorCoreMesh(axis_name=axis_name, num_cores=num_cores)
    return pltpu.create_tensorcore_mesh(axis_name, num_cores=num_cores)

# %% [markdown]
# `emit_pipeline`, and `pl.kernel`'s mesh, ask which TPU they target while they are traced.
# On a TPU the chip answers; elsewhere `jax.sharding.use_abstract_mesh` names one (lesson 5
# did the same). A TPU v5e has one TensorCore; for two we name a v5p, whose chip holds two.

# %%
def traced_for_tpu(cores=1):
    """A context naming the TPU to trace for: none where the kernel runs on a TPU, else a v5e
    (1 core) or v5p (2): off a TPU, and on a TPU machine's CPU (interpret mode there)."""
    here = jax.config.jax_default_device or jax.devices()[0]
    if getattr(here, "platform", here) == "tpu":
        return contextlib.nullcontext()
    device = jax.sharding.AbstractDevice("TPU v5p" if cores == 2 else "TPU v5e", cores, "tpu")
    return jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("chip",), abstract_device=device))


# %% [markdown]
# ## A kernel with no grid: `pl.kernel` and `sync_copy`
#
# `pl.kernel(body, out_type=..., mesh=..., scratch_types=...)` returns a function of arrays.
# The body runs once on every core of the mesh. A `pltpu.TensorCoreMesh(axis_name=...,
# num_cores=...)` is the TensorCores of one device; its default memory space is `pl.ANY`, so
# the inputs and outputs the body receives are HBM refs, not blocks. `scratch_types` adds VMEM
# buffers after them. There is no BlockSpec and no pipeline: the body loads nothing unless it
# copies it. `pltpu.sync_copy(src, dst)` starts a DMA and waits for it (in the pinned release:
# a `run_scoped` DMA semaphore, `make_async_copy(...).start()`, then `.wait()`).

# %%
def scale_shift_kernel(x_hbm, o_hbm, x_vmem):
    pltpu.sync_copy(x_hbm, x_vmem)           # HBM -> VMEM, waits until it has arrived
    x_vmem[...] = 2.0 * x_vmem[...] + 1.0    # compute on VMEM only
    pltpu.sync_copy(x_vmem, o_hbm)           # VMEM -> HBM


def scale_shift(x, *, interpret):
    with traced_for_tpu():
        return pl.kernel(
            scale_shift_kernel,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=tensorcore_mesh("core", num_cores=1),
            scratch_types=[pltpu.VMEM(x.shape, x.dtype)],
            interpret=interpret,
        )(x)


x = jax.random.normal(keys[0], (64, 256), jnp.float32)
_course.check(LESSON, "scale_shift_sync_copy", scale_shift, lambda a: 2.0 * a + 1.0, (x,),
              tpu_run, rtol=0, atol=0)

# %% [markdown]
# The whole array passed through VMEM in one copy, so this shape only works while the array
# fits there. kernelsim traces a `pl.kernel` the way JAX runs it on a CPU: one grid step per
# core, every operand a whole array in `pl.ANY`, and the body's copies counted one by one.

# %%
t_sync = kernelsim.trace(functools.partial(scale_shift, interpret=True), x)
print(t_sync)
assert t_sync.calls[0].hbm_read_bytes == t_sync.calls[0].hbm_write_bytes == x.nbytes

# %% [markdown]
# ## Copies in flight: `async_copy` and `run_scoped`
#
# `sync_copy` waits for every copy before the next line runs. To compute on one half of `x`
# while the other half is still arriving, start both copies with `pltpu.async_copy(src, dst,
# sem)`, which returns a descriptor, and wait on each just before its data is needed.
#
# The semaphores come from `pl.run_scoped(fn, *types)`: it allocates the buffers and
# semaphores `types` describe, calls `fn` with them, and frees them when `fn` returns. Lesson
# 5 asked `pallas_call` for scratch that lives for the whole call; `run_scoped` is the same
# memory for one region of a kernel, which is how `sync_copy` gets its own semaphore.

# %%
def scale_shift_halves_kernel(x_hbm, o_hbm, x_vmem):
    half = x_hbm.shape[0] // 2
    rows = (pl.ds(0, half), pl.ds(half, half))

    def region(sems):
        copies = [pltpu.async_copy(x_hbm.at[r], x_vmem.at[r], sems.at[h])
                  for h, r in enumerate(rows)]      # both halves in flight at once
        for h, r in enumerate(rows):
            copies[h].wait()                        # half 1 may still be arriving here
            x_vmem[r, :] = 2.0 * x_vmem[r, :] + 1.0
        pltpu.sync_copy(x_vmem, o_hbm)

    pl.run_scoped(region, pltpu.SemaphoreType.DMA((2,)))


def scale_shift_halves(x, *, interpret):
    with traced_for_tpu():
        return pl.kernel(
            scale_shift_halves_kernel,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=tensorcore_mesh("core", num_cores=1),
            scratch_types=[pltpu.VMEM(x.shape, x.dtype)],
            interpret=interpret,
        )(x)


_course.check(LESSON, "scale_shift_async_copy", scale_shift_halves, lambda a: 2.0 * a + 1.0,
              (x,), tpu_run, rtol=0, atol=0)
# The race detector raises on a race; its vector clock needs room for each DMA (lesson 5).
checked = pltpu.InterpretParams(detect_races=True, vector_clock_size=64)
with _course.on_host():  # interpret mode runs on the CPU, also on a TPU machine (below)
    race_free = jax.jit(functools.partial(scale_shift_halves, interpret=checked))(x)
print("race detector: no race; result right:", bool(jnp.all(race_free == 2.0 * x + 1.0)))

# %% [markdown]
# kernelsim lists the three copies the body issues: two reads of half of `x` each, one write.

# %%
t_halves = kernelsim.trace(functools.partial(scale_shift_halves, interpret=True), x)
copies = t_halves.calls[0].call.body_copies
print([(c.src, c.dst, c.bytes) for c in copies])
assert sorted(c.bytes for c in copies) == [x.nbytes // 2, x.nbytes // 2, x.nbytes]

# %% [markdown]
# ## One matmul, two APIs
#
# The tiled matmul of lesson 4, with a float32 accumulator in VMEM scratch (lesson 5), first
# as a `pallas_call`: the grid and the BlockSpecs are the pipeline.

# %%
def matmul_body(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...],
                            precision="highest", preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_specs(bm, bk, bn):
    # k innermost: the output block (i, j) and the accumulator stay on chip for all k.
    return ([pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
             pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
            pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)))


def matmul_call(a, b, *, bm=128, bk=128, bn=128, interpret):
    (m, k), n = a.shape, b.shape[1]
    in_specs, out_spec = matmul_specs(bm, bk, bn)
    return pl.pallas_call(
        matmul_body,
        grid=(m // bm, n // bn, k // bk),
        in_specs=in_specs, out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(a, b)


a = jax.random.normal(keys[1], (256, 384), jnp.float32)
b = jax.random.normal(keys[2], (384, 256), jnp.float32)
matmul_reference = functools.partial(jnp.dot, precision="highest")
_course.check(LESSON, "matmul_pallas_call", matmul_call, matmul_reference, (a, b), tpu_run,
              rtol=1e-4, atol=1e-3)

# %% [markdown]
# Now with `pl.kernel`. The body gets HBM refs and builds the same pipeline with
# `emit_pipeline`, which takes the same grid, BlockSpecs and body; the accumulator is the
# kernel's scratch. The pipeline's `dimension_semantics` are `pltpu.PARALLEL` and
# `pltpu.ARBITRARY` (the default is all arbitrary) and matter once there are several cores,
# below.

# %%
def matmul_mesh(a, b, *, bm=128, bk=128, bn=128, cores=1, interpret):
    (m, k), n = a.shape, b.shape[1]
    in_specs, out_spec = matmul_specs(bm, bk, bn)

    def kernel(a_hbm, b_hbm, o_hbm, acc_ref):
        pltpu.emit_pipeline(
            lambda a_ref, b_ref, o_ref: matmul_body(a_ref, b_ref, o_ref, acc_ref),
            grid=(m // bm, n // bn, k // bk),
            in_specs=in_specs, out_specs=[out_spec],
            core_axis_name="core",
            dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL, pltpu.ARBITRARY),
        )(a_hbm, b_hbm, o_hbm)

    with traced_for_tpu(cores):
        return pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
            mesh=tensorcore_mesh("core", num_cores=cores),
            scratch_types=[pltpu.VMEM((bm, bn), jnp.float32)],
            interpret=interpret,
        )(a, b)


_course.check(LESSON, "matmul_pl_kernel", matmul_mesh, matmul_reference, (a, b), tpu_run,
              rtol=1e-4, atol=1e-3)

# %% [markdown]
# Same blocks, same order, so the same bytes: kernelsim counts the grid pipeline's copies for
# the first and `emit_pipeline`'s copies in the body for the second.

# %%
t_call = kernelsim.trace(functools.partial(matmul_call, interpret=True), a, b).calls[0]
t_mesh = kernelsim.trace(functools.partial(matmul_mesh, interpret=True), a, b).calls[0]
for label, t in (("pallas_call", t_call), ("pl.kernel", t_mesh)):
    print(f"{label:12s} HBM read {t.hbm_read_bytes:>9,} B  write {t.hbm_write_bytes:>7,} B  "
          f"on-chip peak {t.onchip_peak_bytes:>7,} B")
assert (t_call.hbm_read_bytes, t_call.hbm_write_bytes) == \
    (t_mesh.hbm_read_bytes, t_mesh.hbm_write_bytes)

# %% [markdown]
# When each fits:
#
# * `pallas_call` when the work is a grid of blocks that index maps can name: the compiler
#   writes the copies, `vmap` adds a grid axis (lesson 10), and the lowering checks every
#   block. Most kernels in this course are of this kind.
# * `pl.kernel` when the kernel decides what to copy and when: data-dependent copies (a page
#   table), several pipelines one after another in one kernel, copies between chips, or code
#   that must know which core it runs on. A `pallas_call` can start copies by hand too:
#   lesson 14's collectives copy between chips from VMEM operands, and lesson 15's paged
#   attention copies pages of a cache left in `pl.ANY`. `pl.kernel` is also the form the
#   quickstart teaches first, and `pl.core_map` and `pltpu.create_tensorcore_mesh`, its older
#   spellings, print deprecation warnings in the pinned release.

# %% [markdown]
# ## Two TensorCores
#
# Some TPUs have two TensorCores per chip (the pinned release's `tpu_info` table: v4 and v5p,
# combined into one "megacore" device; v2, v3, TPU7, TPU7x and 8i, not combined). With
# `TensorCoreMesh(num_cores=2)` the body runs on both, and `jax.lax.axis_index("core")` tells
# them apart. `emit_pipeline(..., core_axis_name="core")` splits its grid between them: it
# takes the first `PARALLEL` axis whose size the core count divides and gives each core a
# contiguous range of it (`_partition_grid` in `pallas/mosaic/pipeline.py`). With no
# parallel axis it raises.
#
# To see the split, each core writes its own index into the output blocks it produced.

# %%
def which_core(m, n, *, bm=64, bn=128, interpret):
    def kernel(o_hbm):
        core = jax.lax.axis_index("core")

        def body(o_ref):
            o_ref[...] = jnp.full(o_ref.shape, core, jnp.int32)

        pltpu.emit_pipeline(body, grid=(m // bm, n // bn), in_specs=[],
                            out_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
                            core_axis_name="core",
                            dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL))(o_hbm)

    with traced_for_tpu(2):
        return pl.kernel(kernel, out_type=jax.ShapeDtypeStruct((m, n), jnp.int32),
                         mesh=tensorcore_mesh("core", num_cores=2),
                         interpret=interpret)()


def two_core_block_owners():
    """The core that wrote each (64, 128) block of ``which_core(256, 256)``, in TPU interpret
    mode (the mesh sets the interpreter's core count to 2)."""
    two_cores = pltpu.InterpretParams()
    owner = jax.jit(functools.partial(which_core, 256, 256, interpret=two_cores))()
    return np.asarray(owner)[::64, ::128].tolist()


# two simulated cores run in a CPU process of their own (why: below the next figure)
block_owner = np.array(_course.in_fresh_process(LESSON, two_core_block_owners, which_core,
                                                traced_for_tpu, tensorcore_mesh))
print("core of each output block (rows: i, columns: j):\n", block_owner)
assert (block_owner[:2] == 0).all() and (block_owner[2:] == 1).all()

# %%
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH * 0.6, 2.8))
# cells as wide as the axes (aspect="auto"): square ones were narrower than "core 0"
owners = ax.imshow(block_owner, cmap="coolwarm", vmin=0, vmax=1, aspect="auto")
for (i, j), c in np.ndenumerate(block_owner):  # black or white, whichever reads on the cell
    ax.text(j, i, f"core {c}", ha="center", va="center",
            color=_course.readable_ink(owners.cmap(owners.norm(c))))
ax.set_xticks(range(block_owner.shape[1]), [f"j={j}" for j in range(block_owner.shape[1])])
ax.set_yticks(range(block_owner.shape[0]), [f"i={i}" for i in range(block_owner.shape[0])])
ax.set_title("emit_pipeline split axis i (4 blocks) between 2 cores")
fig.tight_layout()

# %% [markdown]
# The matmul needs no change but the mesh: two cores, each `m/2` rows of output. In TPU
# interpret mode the two simulated cores share one HBM, as the two cores of a chip do.
#
# Interpret mode is a simulation on the host, and on a TPU machine it must be asked for
# there: the TPU lowering of `pl.kernel` drops its `interpret=` argument
# (`mpmd_map_tpu_lowering_rule`, `del interpret`) and hands Mosaic the interpreter's host
# callbacks, which it cannot compile (measured on a TPU v5e). `_course.check` runs every
# kernel it interprets on a TPU on the CPU device (`_course.on_host()`). Two simulated cores
# need more: in a TPU machine's own process their callbacks lost the interpreter's simulated
# memory (on the v5e, with the last release for Python 3.11), so the lesson runs them in a
# CPU process of its own, `_course.in_fresh_process`, on every machine.

# %%
def two_core_matmul_check():
    """The matmul on a mesh of two TensorCores in TPU interpret mode, against plain JAX."""
    keys = jax.random.split(jax.random.key(13), 4)  # the lesson's a and b
    a = jax.random.normal(keys[1], (256, 384), jnp.float32)
    b = jax.random.normal(keys[2], (384, 256), jnp.float32)
    _course.check("13-kernel-api", "matmul_pl_kernel_two_cores",
                  functools.partial(matmul_mesh, cores=2),
                  functools.partial(jnp.dot, precision="highest"), (a, b),
                  Execution(pltpu.InterpretParams(),
                            "TPU interpret mode, two simulated TensorCores"),
                  rtol=1e-4, atol=1e-3)


if platform() == "tpu" and tensorcores() == 2:  # v4, v5p: compiled, on the chip's two cores
    _course.check(LESSON, "matmul_pl_kernel_two_cores", functools.partial(matmul_mesh, cores=2),
                  matmul_reference, (a, b), tpu_run, rtol=1e-4, atol=1e-3)
else:  # a v5e or v6e has one TensorCore, a CPU none: two simulated ones
    _course.in_fresh_process(LESSON, two_core_matmul_check, matmul_mesh, matmul_specs,
                             matmul_body, traced_for_tpu, tensorcore_mesh)

# %% [markdown]
# ## What megacore does to a `"parallel"` axis, and `"core_parallel"`
#
# A `pallas_call` says nothing about cores. On a megacore chip (v4, v5p) its grid axes marked
# `"parallel"` are the compiler's licence to run them on both TensorCores; lesson 4 showed
# that TPU interpret mode tests this licence by shuffling. Given
# `InterpretParams(num_cores_or_threads=2)` it also simulates the split, after the shuffle:
# the shuffled order of the parallel grid points is cut into one contiguous range per core,
# each core walking its range with the `"arbitrary"` axes inside (`interpret_pallas_call.py`,
# `_execute_grid_for_core`). With one parallel axis of 64 blocks and the default seed, core 0
# gets blocks 43, 22, 49, 0, …, not 0 to 31. A `pl.kernel` over a `TensorCoreMesh` is not
# shuffled: its split is the fixed one above.
#
# To choose the split yourself in a `pallas_call`, mark one grid axis
# `pltpu.CORE_PARALLEL` (`"core_parallel"`): the lowering makes that axis's size the number
# of cores the custom call runs on (`tpu_custom_call.py`, `_get_active_core_count`), and each
# core runs one index of it. A pipeline inside the kernel then takes its share with
# `emit_pipeline(..., core_axis=0)`, the grid axis, where `pl.kernel` used `core_axis_name`.
# Assignment 12 asks you to build that form.
#
# The lowering accepts both of today's matmuls for a TPU v5e from this CPU:

# %%
for label, fn in (("pallas_call", matmul_call), ("pl.kernel", matmul_mesh)):
    error = kernelsim.tpu_lowering_error(functools.partial(fn, interpret=False), a, b)
    print(f"{label}: {error or 'lowers for TPU v5e'}")
    assert error is None

# %% [markdown]
# ## Check yourself
#
# 1. In `scale_shift_kernel`, what does the body see in `x_hbm[...]` if it computes on it
#    directly, and why does the lowering refuse it?
# 2. Why must `copies[1].wait()` come before the second half is computed, and what would the
#    race detector report without it?
# 3. `emit_pipeline` with `core_axis_name="core"` on a grid `(3, 2, 4)` and two cores: which
#    axis is split, and what happens if both parallel axes are odd?
# 4. Your kernel gathers rows whose positions it reads from an SMEM table as it goes. Which
#    API, and why?
# 5. On a megacore chip, what may happen to a `pallas_call` axis marked `"parallel"` that is
#    actually a reduction?
#
# <details><summary>Answer</summary>
#
# 1. An HBM ref: the TensorCore computes on VMEM (and SMEM scalars) only, so loads from HBM
#    are refused ("Loads are only allowed on VMEM and SMEM references", lesson 11). Copy first.
# 2. The copy of half 1 may still be writing `x_vmem[half:]` when it is read. With the wait
#    moved after the loop, TPU interpret mode's detector raises `RACE DETECTED`.
# 3. Axis 1 (size 2): the first parallel axis the core count divides; core 0 gets `j = 0`,
#    core 1 `j = 1`, each with all of `i` and `k`. When no parallel axis divides, the pinned
#    release cuts the largest one as evenly as it can (the first cores get one step more);
#    with no parallel axis at all it raises `NotImplementedError`.
# 4. `pl.kernel` (or a `pallas_call` with `pl.ANY` operands): the next copy depends on data
#    the kernel reads, which an index map evaluated before the step cannot always express.
# 5. The compiler may run its steps on both cores at once: two cores add into the same
#    output block and partial sums are lost. Mark reductions `"arbitrary"`.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 12 — the kernel API of
# today](../exercises/12_kernel_api/kernel_api.ipynb).
