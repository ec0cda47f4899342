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
# # Lesson 16 — Mosaic GPU: TMA, barriers, pipelines and WGMMA
#
# **Learning objectives.** After this lesson you can
#
# 1. stage a tile from global to shared memory with a TMA copy that completes on a barrier,
#    wait for it, and send a result back to global memory through shared memory;
# 2. pipeline a sequential loop with `plgpu.emit_pipeline`, and say how many copies are in
#    flight and how much shared memory its stages take;
# 3. multiply tiles on the tensor cores with `plgpu.wgmma`, the accumulator in registers
#    (`plgpu.ACC`), and say which thread holds which of its elements (`plgpu.Layout.WGMMA`);
# 4. read kernelsim's Mosaic GPU model (`kernelsim.gpu`): one CTA's TMA copies, barrier waits
#    and WGMMAs, and its shared memory as the lowering allocates it, against the 227 KiB a
#    CTA may use;
# 5. say what changes from the TPU model: no BlockSpec pipeline around the kernel, no scalar
#    prefetch, a grid of concurrent CTAs, atomics.
#
# Lesson 11 met Mosaic GPU through toy kernels that read global memory straight into
# registers. Here are the parts that make a Hopper kernel fast, each run on this CPU in GPU
# interpret mode and each lowered for CUDA from this CPU; where the interpreter cannot run a
# feature, the lesson says so and shows its structure through kernelsim instead.
# Rules here: the Mosaic GPU [quickstart](https://docs.jax.dev/en/latest/pallas/gpu/quickstart.html),
# [reference](https://docs.jax.dev/en/latest/pallas/gpu/reference.html) and
# [pipelining guide](https://docs.jax.dev/en/latest/pallas/gpu/pipelining.html).
# Matching exercises: [`../exercises/`](../exercises/) (assignment `15_mosaic_gpu`).

# %%
import functools
import json
import re
import sys
import textwrap
from pathlib import Path

import _course
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernelsim
from kernelsim.backend import Execution, gpu_interpret, platform

LESSON = "16-mosaic-gpu"
ROOT = Path(_course.__file__).resolve().parents[1]
_course.versions()
# Mosaic GPU kernels: compiled on a GPU, in GPU interpret mode anywhere else
# (``interpret=True``, which kernelsim.backend.gpu_interpret turns into that mode)
mgpu_run = Execution(False, "compiled for GPU") if platform() == "gpu" else Execution(
    True, f"GPU interpret mode on {platform().upper()}")


def lowering_smem_bytes(fn, *args):
    """Shared memory the Mosaic GPU lowering allocates for ``fn``'s kernel, in bytes: with its
    limit set to 0 B the lowering refuses the kernel and names what it needs (nothing runs)."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    with mgpu_core.artificial_shared_memory_limit(0):
        try:
            jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
        except ValueError as err:
            return int(re.search(r"smem_bytes=(\d+)", str(err)).group(1))
    return 0


def cuda_lowering_error(fn, *args):
    """What JAX's Mosaic GPU lowering says about ``fn(*args)`` for CUDA: its error, or None."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    try:
        jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    except Exception as err:  # noqa: BLE001 - the error is the answer
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return None


def event_table(kernel, limit=12):
    """One CTA's events as kernelsim.gpu lists them, one line each."""
    for e in kernel.events[:limit]:
        where = f"loop {e.loop} step {e.step[-1]}" if e.step else "outside loops"
        what = f"{e.src} -> {e.dst}" if e.src else ""
        print(f"  wg{e.warpgroup} {e.kind:14} {where:18} {what:18} {e.barrier:9} "
              f"{e.bytes or '':>7} {e.flops or ''}")
    if len(kernel.events) > limit:
        print(f"  ... {len(kernel.events) - limit} more")


# %% [markdown]
# ## Memory on a Hopper GPU, and who moves it
#
# A Mosaic GPU kernel (`plgpu.kernel`) receives its operands in **global memory** (GMEM,
# the HBM). The grid is the CUDA grid: each point is one CTA (a thread block) on one SM,
# and the CTAs run at the same time in no promised order. A CTA has **shared memory**
# (SMEM, up to 227 KiB on an H100 or H200) and each of its warpgroups (4 warps, 128 threads,
# the "thread" of Pallas' GPU model) has **registers**. Nothing moves by itself: there is no
# BlockSpec pipeline around the kernel as on a TPU. The kernel moves tiles with the **TMA**,
# the copy engine that takes a whole tile between global and shared memory in one
# instruction; a copy into shared memory completes on a **barrier**, which the kernel waits
# on before it reads the tile.
#
# The first kernel does exactly that, once per CTA: copy a `(64, n)` band of rows into
# shared memory, wait, scale it, and send it back by TMA. `commit_smem` makes the kernel's
# own stores to shared memory visible to the copy engine before the copy starts, and
# `wait_smem_to_gmem(0)` keeps the CTA alive until its last copy out has finished.

# %%
ROWS = 64


def scale_rows(x, s, *, interpret):
    """``x * s``: CTA i stages rows [64·i, 64·i + 64) through shared memory."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(m // ROWS,), grid_names=("rows",),
        scratch_types=dict(tile=plgpu.SMEM((ROWS, n), x.dtype), landed=plgpu.Barrier()),
        interpret=gpu_interpret(interpret))
    def kernel(x_gmem, o_gmem, tile, landed):
        rows = pl.ds(jax.lax.axis_index("rows") * ROWS, ROWS)
        plgpu.copy_gmem_to_smem(x_gmem.at[rows], tile, landed)  # TMA: GMEM -> SMEM
        plgpu.barrier_wait(landed)  # the tile has landed
        tile[...] = tile[...] * s  # SMEM -> registers -> SMEM
        plgpu.commit_smem()  # our stores, visible to the TMA
        plgpu.copy_smem_to_gmem(tile, o_gmem.at[rows])  # TMA: SMEM -> GMEM
        plgpu.wait_smem_to_gmem(0)

    return kernel(x)


x = jax.random.normal(jax.random.key(16), (256, 128), jnp.float32)
_course.check(LESSON, "scale_rows", functools.partial(scale_rows, s=3.0),
              lambda x: 3.0 * x, (x,), mgpu_run, rtol=1e-6, atol=1e-6)

# %% [markdown]
# `kernelsim.gpu.analyse(fn, *args, chip=...)` traces the function (nothing runs) and walks
# one CTA's body in program order: the events below are CTA 0's. It also sums the shared
# memory the kernel allocates with the Mosaic GPU lowering's own rules (each allocation
# rounded up to 1024 bytes, 8 bytes per barrier), which the cell checks against the
# lowering itself.

# %%
compiled_scale = functools.partial(scale_rows, s=3.0, interpret=False)
(scale_kernel,) = kernelsim.gpu.analyse(compiled_scale, x, chip="h200")
print(f"grid {scale_kernel.grid}, {scale_kernel.num_threads} warpgroup per CTA, shared memory "
      f"{scale_kernel.smem_bytes:,} B ({scale_kernel.barriers} barrier)")
event_table(scale_kernel)
assert [e.kind for e in scale_kernel.events] == [
    "tma_load", "barrier_wait", "commit_smem", "tma_store", "wait_tma_store"]
assert scale_kernel.smem_bytes == lowering_smem_bytes(compiled_scale, x) == 64 * 128 * 4 + 8

# %% [markdown]
# ## A pipeline: `plgpu.emit_pipeline`
#
# One copy, then one wait, leaves the SM idle while the tile travels. A loop over many
# tiles should keep several copies in flight: while the kernel adds tile `j`, tiles `j + 1`
# and `j + 2` are already on their way. `plgpu.emit_pipeline(body, grid=..., in_specs=...,
# max_concurrent_steps=S)` builds that loop inside the kernel. Its grid, unlike the kernel's,
# runs **in order**; each input gets `S` slots in shared memory, and each of the `S` slot
# positions one barrier, which every input's copy into that position completes on.
#
# The kernel folds a row band's column tiles into one: `o[i, c] = Σ_j x[i, j·tn + c]`. The
# running total is the pipeline's carry, held in registers from step to step.

# %%
def fold_tiles(x, *, tm, tn, stages, interpret):
    """Sum of the ``tn``-wide column tiles of each ``tm``-row band, ``stages`` copies ahead."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, tn), x.dtype),
        grid=(m // tm,), grid_names=("rows",),
        scratch_types=dict(o_smem=plgpu.SMEM((tm, tn), x.dtype)),
        interpret=gpu_interpret(interpret))
    def kernel(x_gmem, o_gmem, o_smem):
        rows = pl.ds(jax.lax.axis_index("rows") * tm, tm)

        def step(_, x_smem, total):  # x_smem: this step's slot, already landed
            return total + x_smem[...]

        # the pipeline walks this band's column tiles in order, `stages` of them in flight
        total = plgpu.emit_pipeline(
            step, grid=(n // tn,), max_concurrent_steps=stages,
            in_specs=[plgpu.BlockSpec((tm, tn), lambda j: (0, j))],
            init_carry=jnp.zeros((tm, tn), x.dtype),
        )(x_gmem.at[rows])
        o_smem[...] = total
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[rows])
        plgpu.wait_smem_to_gmem(0)

    return kernel(x)


def fold_tiles_reference(x, tn=128):
    return x.reshape(x.shape[0], -1, tn).sum(axis=1)


wide = jax.random.normal(jax.random.key(17), (128, 1024), jnp.float32)
fold = functools.partial(fold_tiles, tm=64, tn=128, stages=3)
_course.check(LESSON, "fold_tiles", fold, fold_tiles_reference, (wide,), mgpu_run,
              rtol=1e-5, atol=1e-5)

# %% [markdown]
# kernelsim's events show the pipeline's shape. A first loop (the prologue) starts `S = 3`
# copies before anything waits; then each step of the second loop waits for its slot's
# barrier, adds, and refills the slot it just freed with the tile `S` steps ahead, until
# none is left. Every TMA copy here moves one `(64, 128)` float32 tile, 32 KiB.

# %%
compiled_fold = functools.partial(fold, interpret=False)
(fold_kernel,) = kernelsim.gpu.analyse(compiled_fold, wide, chip="h200")
event_table(fold_kernel, limit=9)
loads = [e for e in fold_kernel.events if e.kind == "tma_load"]
first_wait = next(e.order for e in fold_kernel.events if e.kind == "barrier_wait")
assert len(loads) == 1024 // 128 and {e.bytes for e in loads} == {64 * 128 * 4}
assert sum(e.order < first_wait for e in loads) == 3  # S copies in flight before the 1st wait

# %% [markdown]
# Shared memory is where the stages cost: each input takes `S` slots of one tile, plus `S`
# barriers shared by all inputs, plus the output tile. The table sweeps `S` for this kernel
# and checks kernelsim's count against the lowering's at each; past 227 KiB the lowering
# refuses the kernel (it asks the device for the limit, and assumes 227 KiB when none is
# attached).

# %%
print(" S   kernelsim    lowering")
for stages in (1, 2, 3, 4, 6):
    f = functools.partial(fold_tiles, tm=64, tn=128, stages=stages, interpret=False)
    (k,) = kernelsim.gpu.analyse(f, wide, chip="h200")
    lowered = lowering_smem_bytes(f, wide)
    print(f"{stages:2}  {k.smem_bytes:9,} B {lowered:9,} B")
    assert k.smem_bytes == lowered == (stages + 1) * 64 * 128 * 4 + 8 * stages
big = functools.partial(fold_tiles, tm=128, tn=128, stages=4, interpret=False)
print("tm=128, S=4:", cuda_lowering_error(big, wide))
assert "exceeds available shared memory" in cuda_lowering_error(big, wide)
assert kernelsim.gpu.analyse(big, wide, chip="h200")[0].warnings

# %% [markdown]
# ## WGMMA: the tensor cores, the accumulator in registers
#
# On Hopper a warpgroup multiplies tiles with **WGMMA**: `plgpu.wgmma(acc_ref, a, b)` adds
# `a @ b` into an accumulator that lives in the warpgroup's registers, allocated with
# `pl.run_scoped(..., plgpu.ACC((tm, tn), jnp.float32))`. `b` is read from shared memory,
# `a` from shared memory or registers, and both tiles must be laid out as the tensor cores
# read them: the BlockSpecs carry `plgpu.TilingTransform` and `plgpu.SwizzleTransform`
# (`plgpu.find_swizzle` picks the widest swizzle a row allows). WGMMA is asynchronous:
# `plgpu.wgmma_wait(1)` waits until at most one is still running, so this step's multiply
# runs on while the next tiles arrive. But its slot is still being read, so the pipeline may
# refill only the *previous* step's slot: `plgpu.BlockSpec(..., delay_release=1)` delays
# each refill by one step.
#
# The course's Mosaic GPU matmul (`bench/gpu_kernels.py`, the kernel the H200 benchmark
# times) puts the three parts together: one CTA per `(tm, tn)` output tile, an
# `emit_pipeline` over K that TMA-copies an A and a B tile per step, one WGMMA per step, and
# the accumulator sent back through shared memory:

# %%
sys.path.insert(0, str(ROOT / "bench"))
import gpu_kernels  # noqa: E402 - the benchmark's kernels, beside the course

a = jax.random.normal(jax.random.key(18), (256, 256), jnp.bfloat16)
b = jax.random.normal(jax.random.key(19), (256, 256), jnp.bfloat16)
matmul = functools.partial(gpu_kernels.matmul_mgpu, tm=64, tn=64, tk=64, stages=2)
_course.check(LESSON, "matmul_mgpu", matmul,
              lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype),
              (a, b), mgpu_run, rtol=2e-2, atol=2e-2)

# %% [markdown]
# Leave `delay_release` out and the kernel is still right here: GPU interpret mode runs each
# WGMMA to completion before the next line. On an H200 the first run of the benchmark gave
# wrong values for exactly that version (relative errors 0.19 and 0.06 for two `(128, 128)`
# configurations), while a `(64, 256)` one happened to pass. kernelsim follows which slot
# each WGMMA reads and which slot each TMA copy fills, and names the race without a GPU:

# %%
racing = functools.partial(gpu_kernels.matmul_mgpu, tm=128, tn=128, tk=64, stages=3,
                           delay_release=0, interpret=False)
(racing_kernel,) = kernelsim.gpu.analyse(racing, a, b, chip="h200")
print("\n".join(racing_kernel.warnings))
assert "delay_release=1" in racing_kernel.warnings[0]
assert not kernelsim.gpu.analyse(functools.partial(matmul, interpret=False), a, b)[0].warnings

# %% [markdown]
# GPU interpret mode runs WGMMA with both operands in shared memory, which this kernel
# uses. It does not implement an `a` operand in registers: the flash-attention kernel of
# the benchmark feeds its softmax probabilities to the second WGMMA from registers on a GPU,
# and from shared memory (`p_in_smem=True`) when interpreted. So that case is shown here
# by its structure only, and its lowering for CUDA.
#
# At the benchmark's size, `4096³` in bfloat16, kernelsim counts one CTA's copies and
# multiplies and the whole launch's bytes and FLOPs. Each CTA copies its whole A row band
# and B column band (2 GiB over the launch at 128 tiles), but the CTAs that run at once
# share L2: kernelsim walks a CTA's neighbours along each grid axis, sees that A's copies do
# not change with `n` nor B's with `m`, and counts each band once per wave of 132 CTAs (one
# per SM of the H200). What is left for HBM is a fraction of a GiB, and the estimate is
# compute-bound, as cuBLAS is.

# %%
big_a = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
production = functools.partial(gpu_kernels.matmul_mgpu, tm=128, tn=128, tk=64, stages=4,
                               interpret=False)
(mm_kernel,) = kernelsim.gpu.analyse(production, big_a, big_a, chip="h200")
print(f"{mm_kernel.ctas} CTAs, shared memory {mm_kernel.smem_bytes:,} B per CTA; per CTA "
      f"{mm_kernel.count('tma_load')} TMA loads, {mm_kernel.count('wgmma')} WGMMAs")
print(f"launch: {mm_kernel.gmem_read_bytes / 2**30:.2f} GiB read, "
      f"{mm_kernel.flops / 1e9:.0f} GFLOP; estimate {mm_kernel.estimated_seconds * 1e6:.0f} us"
      f" (compute {mm_kernel.compute_seconds * 1e6:.0f} us, memory "
      f"{mm_kernel.memory_seconds * 1e6:.0f} us)")
assert mm_kernel.flops == 2 * 4096 ** 3 and mm_kernel.count("wgmma") == 4096 // 64
assert mm_kernel.smem_bytes == lowering_smem_bytes(production, big_a, big_a)
qkv = jax.ShapeDtypeStruct((1, 4096, 16, 128), jnp.bfloat16)
attention = functools.partial(gpu_kernels.flash_mgpu, bq=64, bk=64, stages=2, interpret=False)
print("flash_mgpu (P from registers) lowers for CUDA:",
      cuda_lowering_error(attention, qkv, qkv, qkv) is None)
assert cuda_lowering_error(attention, qkv, qkv, qkv) is None

# %% [markdown]
# A `(128, 256)` tile would hold 128 KiB of float32 accumulator in one warpgroup's 128
# threads, 256 registers each against a limit of 255; the benchmark's warp-specialized
# kernel (`matmul_mgpu_ws`) splits a `(256, 128)` tile over two compute warpgroups instead,
# with a third issuing the TMA copies. kernelsim lists each warpgroup's events:

# %%
ws = functools.partial(gpu_kernels.matmul_mgpu_ws, tm=128, tn=128, tk=64, stages=3,
                       interpret=False)
(ws_kernel,) = kernelsim.gpu.analyse(ws, big_a, big_a, chip="h200")
for wg in range(ws_kernel.num_threads):
    kinds = sorted({e.kind for e in ws_kernel.events if e.warpgroup == wg})
    print(f"warpgroup {wg}: {', '.join(kinds)}")
assert "tma_load" in {e.kind for e in ws_kernel.events if e.warpgroup == 2}
assert "wgmma" not in {e.kind for e in ws_kernel.events if e.warpgroup == 2}

# %% [markdown]
# The first events of each warpgroup, in the order it issues them. The producer (warpgroup
# 2) starts with a prologue of six TMA loads, the A and B slices of three steps, one per
# pipeline slot; from then on it waits for a consumer to release a slot before refilling
# it. Each consumer waits for a slot's data, multiplies (`wgmma`), waits for the tensor cores
# and hands the slot back (`barrier_arrive`).

# %%
import matplotlib.pyplot as plt  # noqa: E402

EVENTS_DRAWN = 24
MARKERS = {"tma_load": ("v", "tab:blue"), "barrier_wait": ("|", "tab:gray"),
           "wgmma": ("s", "tab:orange"), "wgmma_wait": ("x", "tab:brown"),
           "barrier_arrive": ("^", "tab:green")}
issued = {w: sorted((e for e in ws_kernel.events if e.warpgroup == w), key=lambda e: e.order)
          for w in range(ws_kernel.num_threads)}
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 3.4))
for kind, (marker, color) in MARKERS.items():
    at = [(i, w) for w, events in issued.items()
          for i, e in enumerate(events[:EVENTS_DRAWN]) if e.kind == kind]
    ax.scatter([i for i, _ in at], [w for _, w in at], marker=marker, color=color,
               label=kind, s=40)
ax.set_yticks(range(ws_kernel.num_threads),
              [f"warpgroup {w}" for w in range(ws_kernel.num_threads)])
ax.set_xlabel("event number in the warpgroup's program order")
ax.set_ylim(-0.6, ws_kernel.num_threads - 0.4)
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
fig.tight_layout()
assert [e.kind for e in issued[2][:7]] == ["tma_load"] * 6 + ["barrier_wait"]

# %% [markdown]
# kernelsim's viewer steps through the same events: step `i` is the `i`-th event of every
# warpgroup, with the buffers and the barrier it touches outlined in the shared-memory lane.

# %%
ws_kernel.show()

# %% [markdown]
# ## Registers: how a warpgroup holds a value
#
# A value a kernel body computes with (`acc_ref[...]`, `x_smem[...]`, an `exp` of them) lives
# in the registers of the warpgroup's 128 threads, each holding a few of its elements. Which
# thread holds which element is the value's **layout**. The Mosaic GPU lowering needs one for
# every value; it infers them from the layouts the instructions fix. WGMMA fixes one: its
# accumulator, and the value `acc_ref[...]` reads from it, are in `plgpu.Layout.WGMMA`.
#
# For an `(m, n)` array in that layout (`m` a multiple of 64, `n` of 8) the rows go in bands
# of 64; each of the warpgroup's 4 warps takes 16 rows of a band; within a warp every `8 × 8`
# block is spread over its 32 lanes, two neighbouring columns per lane (one vector of two
# elements), rows 8 to 15 of the warp's 16 on the same lanes again. So the thread holding
# element `(r, c)` is `32 · ((r mod 64) // 16) + 4 · (r mod 8) + (c mod 8) // 2`, and every
# thread holds `m · n / 128` elements: for a float32 accumulator, as many registers. JAX
# describes the layout as tiles applied one inside the other, `(64, 8)`, `(16, 8)`, `(8, 8)`,
# `(2,)`, with one dimension of the tiled array naming the warp, two the lane and the last
# the vector. The cell reads the owner of every element of a `(64, 16)` array from that
# description, checks the formula against it, prints the first rows, and checks the count
# per thread against `registers_shape` (vectors per thread, times their length).

# %%
import math  # noqa: E402

import numpy as np  # noqa: E402
from jax.experimental.mosaic.gpu import fragmented_array  # noqa: E402


def wgmma_thread(r, c):
    """The thread (0-127) of the warpgroup that holds element (r, c) in plgpu.Layout.WGMMA."""
    return 32 * ((r % 64) // 16) + 4 * (r % 8) + (c % 8) // 2


def owners_in(layout, shape):
    """The thread holding each element of an array of ``shape``, read from a TiledLayout:
    apply its tiles in turn (each splits the trailing dimensions into tiles and moves the
    within-tile ones last), then the dimensions it names give the warp and the lane."""
    tiled = np.arange(math.prod(shape)).reshape(shape)
    for tile in layout.tiling.tiles:
        lead, n = tiled.shape[:-len(tile)], len(tile)
        split = [x for size, t in zip(tiled.shape[-n:], tile, strict=True) for x in (size // t, t)]
        tiled = tiled.reshape(lead + tuple(split)).transpose(
            [*range(len(lead)), *(len(lead) + 2 * i for i in range(n)),
             *(len(lead) + 2 * i + 1 for i in range(n))])
    assert tiled.shape == layout.tiling.tile_shape(shape)  # JAX's own tiled shape
    (warp_dim,), (row_dim, pair_dim) = layout.warp_dims, layout.lane_dims
    owner = np.empty(math.prod(shape), int)
    for at in np.ndindex(tiled.shape):
        owner[tiled[at]] = 32 * at[warp_dim] + tiled.shape[pair_dim] * at[row_dim] + at[pair_dim]
    return owner.reshape(shape)


wgmma_layout = plgpu.Layout.WGMMA.to_mgpu()
owners = owners_in(wgmma_layout, (64, 16))
assert all(owners[r, c] == wgmma_thread(r, c) for r in range(64) for c in range(16))
for r in (0, 1, 7, 8, 16):
    print(f"row {r:2}: " + " ".join(f"{t:3}" for t in owners[r]))
held = np.bincount(owners.ravel())
for m, n in ((64, 16), (128, 128), (64, 256)):
    per_thread = wgmma_layout.vector_length * math.prod(wgmma_layout.registers_shape((m, n)))
    print(f"({m}, {n}): {per_thread} elements per thread")
    assert per_thread == m * n // 128
assert set(held) == {64 * 16 // 128} and len(held) == 128
assert wgmma_layout == fragmented_array.WGMMA_LAYOUT

# %% [markdown]
# A reduction keeps a layout too. The sums of each row of a WGMMA-layout array form a
# vector in `plgpu.Layout.WGMMA.reduce(1)` (each row's sum on the 4 lanes that held the row);
# a vector that is broadcast along the rows, such as a norm's weights, is in
# `plgpu.Layout.WGMMA.reduce(0)`. `plgpu.layout_cast(x, layout)` states a value's layout
# where nothing fixes it. A tile read from shared memory has none until something uses it,
# and a row sum alone does not say which layout to sum in: without the cast the lowering
# gives up ("Failed to infer a possible set of layouts"), with it the kernel lowers. GPU
# interpret mode does without layouts, so both run here:

# %%
assert plgpu.Layout.WGMMA.reduce(1).to_mgpu() == fragmented_array.WGMMA_ROW_LAYOUT
assert plgpu.Layout.WGMMA.reduce(0).to_mgpu() == fragmented_array.WGMMA_COL_LAYOUT


def row_sums(x, *, cast, interpret):
    """The sum of each row of a ``(64, n)`` tile staged by TMA; ``cast``: state its layout."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m,), x.dtype),
        scratch_types=dict(x_smem=plgpu.SMEM((m, n), x.dtype), o_smem=plgpu.SMEM((m,), x.dtype),
                           landed=plgpu.Barrier()),
        interpret=gpu_interpret(interpret))
    def kernel(x_gmem, o_gmem, x_smem, o_smem, landed):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, landed)
        plgpu.barrier_wait(landed)
        tile = x_smem[...]
        if cast:
            tile = plgpu.layout_cast(tile, plgpu.Layout.WGMMA)
        o_smem[...] = jnp.sum(tile, axis=1)  # in plgpu.Layout.WGMMA.reduce(1)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return kernel(x)


band = jax.random.normal(jax.random.key(20), (64, 128), jnp.float32)
for cast in (True, False):
    _course.check(LESSON, f"row_sums(cast={cast})", functools.partial(row_sums, cast=cast),
                  lambda x: x.sum(axis=1), (band,), mgpu_run, rtol=1e-5, atol=1e-5)
    error = cuda_lowering_error(functools.partial(row_sums, cast=cast, interpret=False), band)
    print(f"cast={cast}: lowering for CUDA: {error or 'lowers'}")
    assert (error is None) == cast and (cast or "Failed to infer" in error)

# %% [markdown]
# The tiles WGMMA reads from shared memory have layouts of their own: `(8, swizzle /
# itemsize)` tiles (`plgpu.TilingTransform`) whose rows are swizzled across the banks
# (`plgpu.SwizzleTransform(swizzle)`: 32, 64 or 128 bytes; it refuses the 16 that
# `plgpu.find_swizzle` can return). In the pinned release the lowering
# picks both for a tile given none; a tile given them must have both, the tiling must fit
# the swizzle, and A's and B's tiles must share one swizzle. GPU interpret mode ignores all
# of it, so assignment 15's WGMMA task checks it by structure. One tile product, A's rows 32
# bfloat16 (64 bytes) and B's 128 (256 bytes), lowered for CUDA:

# %%
def tile_product(a, b, *, a_swizzle, b_swizzle, interpret):
    """``a @ b`` for one ``(64, k)`` and one ``(k, n)`` bfloat16 tile, in one CTA; a swizzle
    of 0 leaves a tile without transforms."""
    def layout(swizzle):
        return (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle)) \
            if swizzle else ()

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32),
        scratch_types=dict(a_smem=plgpu.SMEM(a.shape, a.dtype, transforms=layout(a_swizzle)),
                           b_smem=plgpu.SMEM(b.shape, b.dtype, transforms=layout(b_swizzle)),
                           landed=plgpu.Barrier(num_arrivals=2)),
        interpret=gpu_interpret(interpret))
    def kernel(a_gmem, b_gmem, o_gmem, a_smem, b_smem, landed):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, landed)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, landed)
        plgpu.barrier_wait(landed)

        def multiply(acc):
            plgpu.wgmma(acc, a_smem, b_smem)
            o_gmem[...] = acc[...]

        pl.run_scoped(multiply, plgpu.ACC(o_gmem.shape, jnp.float32))

    return kernel(a, b)


a_tile = jax.random.normal(jax.random.key(21), (64, 32), jnp.bfloat16)
b_tile = jax.random.normal(jax.random.key(22), (32, 128), jnp.bfloat16)
lowered = {}
for swizzles in ((64, 64), (0, 0), (64, 128)):
    product = functools.partial(tile_product, a_swizzle=swizzles[0], b_swizzle=swizzles[1],
                                interpret=False)
    lowered[swizzles] = cuda_lowering_error(product, a_tile, b_tile)
    print(textwrap.fill(f"A swizzled {swizzles[0]:3} B, B {swizzles[1]:3} B: "
                        f"{lowered[swizzles] or 'lowers'}", 88, subsequent_indent="    "))
assert lowered[(64, 64)] is None and lowered[(64, 128)]
_course.pinned_claim(lowered[(0, 0)] is None, "a WGMMA tile given no transforms lowers: "
                     "the lowering picks its tiling and swizzle")

# %% [markdown]
# ## Measured on an H200
#
# `bench/gpu_perf.py` times these kernels and the Triton ones of lesson 11's shape at production
# sizes against XLA (cuBLAS for `jnp.dot`, cuDNN for `jax.nn.dot_product_attention`), checks
# each against plain JAX on the GPU, and puts kernelsim's estimate beside each measured time.
# Its record, when a run on an H200 has been made, is `bench/recorded/gpu_perf-h200.json`; the
# cell reads it. Its jaxlib may be older than the course's: the pinned JAX release accepts it.

# %%
record = ROOT / "bench" / "recorded" / "gpu_perf-h200.json"
if not record.exists():
    print("pending: no H200 run is recorded yet (bench/recorded/gpu_perf-h200.json); "
          "`python bench/gpu_perf.py --dry-run` checks and lowers every kernel on a CPU")
else:
    recorded = json.loads(record.read_text())
    print(f"{recorded['devices'][0]}, jax {recorded['jax']} with jaxlib {recorded['jaxlib']}")
    for family, s in recorded["summary"].items():
        xla = s["xla_s"]
        print(f"{family}: XLA {xla * 1e3:.3f} ms" if xla else f"{family}: XLA did not run")
        for name, k in s["kernels"].items():
            # the current model's estimate where the record was re-estimated, else the run's
            est = k.get("kernelsim_reestimated_s") or k["kernelsim_estimated_s"]
            cal = k.get("calibration_reestimated") or k["calibration"]
            print(f"  {name:34} {k['seconds'] * 1e3:8.3f} ms"
                  + (f"  {k['of_xla']:.0%} of XLA" if k["of_xla"] else "")
                  + (f"  kernelsim {est * 1e3:.3f} ms (x{cal:.2f})" if est and cal else ""))
    if "reestimated" in recorded:
        print(f"kernelsim's estimates recomputed {recorded['reestimated']['when']} by "
              f"{recorded['reestimated']['model']}")

# %% [markdown]
# What to read in it: the ratio to XLA says how close a Pallas kernel comes to the vendor
# library; the calibration factor (measured / estimated) says how far kernelsim's roofline
# is from the chip. The recorded run (2026-12-04; the record names the releases) gave, for
# `4096³` bfloat16: cuBLAS 752 TFLOP/s, the warp-specialized Mosaic GPU matmul 749 (100 %
# of it), the single-warpgroup one 688 (91 %), the Triton matmul 680 (90 %); for attention at
# sequence 4096 and 16384, cuDNN 598 and 670 TFLOP/s, the Mosaic GPU flash attention 81 % and
# 76 % of it, the Triton one 71 % and 69 %. An earlier run found the single-warpgroup matmul
# *wrong* at 4 and 5 pipeline stages (errors of 0.19 and 0.06): a TMA copy refilled a slot
# that a still-running WGMMA was reading, the race kernelsim now warns about (above).
#
# The factors printed are the current model's (`gpu_perf.py --reestimate` recomputes a
# record's estimates on a CPU; the record keeps the run's own beside them). With the run,
# they were 0.02 to 1.4: kernelsim charged every program the blocks it reads, so a matmul's
# row and column bands counted once per program and the grouped matmul's whole-array expert
# table 1024 times (an estimate 60 times the measured time). On a GPU, programs that run
# side by side share L2: kernelsim now counts a block as an L2 hit when a program launched
# fewer than 132 places earlier (the H200's SM count) read it. It also divides by what an
# H200 was measured to sustain (790 TFLOP/s, 4.3 TB/s) rather than the datasheet's 989 and
# 4.8, and runs float32 dots at TF32, as JAX's default precision does. Now the bf16 matmuls are at
# 1.0 to 1.2, the grouped ones at 1.3 (Triton) and 1.1 (JAX's Mosaic GPU op), the row sums at 1.0: a
# factor above 1 is time the kernel spends beyond the roofline. Flash attention sits at 1.6 to 1.9:
# its softmax (exponentials on the special-function units) is work the roofline leaves out. A
# float32 matmul needs a K-major B: Hopper's WGMMA transposes only 16-bit operands, so Triton
# transposes a row-major B in registers and stops pipelining its load. It ran at 80 TFLOP/s (fed
# Bᵀ, 217: factor 1.8); kernelsim charges that path the 80 measured here, so its factor is 1.0.

# %% [markdown]
# ## What changes from the TPU model
#
# * **No pipeline around the kernel.** A TPU `pallas_call` copies each step's blocks into
#   VMEM for you; a Mosaic GPU kernel gets global-memory refs and copies what it needs, by
#   TMA or by plain loads into registers. `emit_pipeline` is the closest thing, and you call
#   it inside the kernel.
# * **A parallel grid.** The kernel's grid is the CUDA grid: CTAs run concurrently in no
#   promised order, so each output tile belongs to one CTA (lesson 11). Sequential work is a
#   loop inside the CTA; only `emit_pipeline`'s own grid runs in order.
# * **No scalar prefetch.** There is no SMEM of scalars feeding index maps before the kernel
#   starts. A kernel that needs data-dependent indices loads them itself (from a global
#   ref into registers, or by TMA into shared memory) and computes its slices with `pl.ds`.
# * **Atomics.** Where several CTAs must update one location, `plgpu.atomic_add` (and
#   `atomic_max`, `atomic_min`, ...) does it in global memory; on a TPU the grid runs in
#   order and the lowering refuses atomics (lesson 11).

# %% [markdown]
# ## Check yourself
#
# 1. A kernel copies a tile into shared memory with `plgpu.copy_gmem_to_smem(src, dst,
#    barrier)` and reads `dst[...]` right after it. What is missing, and what would it read?
# 2. `emit_pipeline` with `max_concurrent_steps=4` over 2 inputs of `(128, 64)` bfloat16
#    tiles: how much shared memory do the slots take, and how many barriers?
# 3. Each CTA of the `4096³` matmul copies 2 MiB of A and B. Why does kernelsim count far
#    less than 1024 × 2 MiB as HBM reads?
# 4. Why does the course's single-warpgroup matmul stop at `(128, 128)` tiles?
# 5. On a TPU an embedding lookup reads its row indices through scalar prefetch. What does a
#    Mosaic GPU kernel do instead?
# 6. Which thread of the warpgroup holds element `(20, 5)` of a `plgpu.Layout.WGMMA` array?
#    A kernel sums the rows of a tile it read from shared memory, and its lowering for CUDA
#    fails with "Failed to infer a possible set of layouts": what is missing?
#
# <details><summary>Answer</summary>
#
# 1. The wait: `plgpu.barrier_wait(barrier)` before the read. Without it the read races the
#    copy and may see the tile's old contents.
# 2. Each input takes 4 slots of `128 · 64 · 2` = 16 KiB, so 2 · 64 KiB = 128 KiB (each
#    allocation rounded up to 1024 bytes, which these already are), and one barrier per
#    slot: 4 barriers of 8 bytes.
# 3. The CTAs of one wave (132 on an H200, one per SM) run side by side: those on one row
#    of the grid copy the same A band, those on one column the same B band. The first copy
#    brings a band into L2 and the others find it there, so each band crosses HBM once per
#    wave, not once per CTA, and the estimate is compute-bound.
# 4. Its float32 accumulator lives in one warpgroup's registers: `(128, 128)` is 64 KiB, 128
#    registers per thread; `(128, 256)` would need 256, more than the 255 a thread has.
#    Larger tiles split the accumulator over more warpgroups.
# 5. It reads the indices itself, from a global-memory ref (into registers) or by TMA into
#    shared memory, and slices the table with `pl.ds` from those values.
# 6. Thread 50: warp `20 // 16 = 1` (threads 32 to 63), lane `4 · (20 mod 8) + 5 // 2 = 18`.
#    The tile's layout: `plgpu.layout_cast(tile, plgpu.Layout.WGMMA)` before the sum, which
#    then lands in `plgpu.Layout.WGMMA.reduce(1)`.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 15 — Mosaic
# GPU](../exercises/15_mosaic_gpu/mosaic_gpu.ipynb).
