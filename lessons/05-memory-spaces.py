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
# # Lesson 5 — Memory spaces
#
# **Learning objectives.** After this lesson you can
#
# 1. name the TPU's three memory spaces — HBM, VMEM, SMEM — and what each is for;
# 2. place an operand in SMEM and read scalars from it;
# 3. keep state across grid steps in a VMEM scratch buffer;
# 4. leave an operand in HBM with `pl.ANY` and move it yourself with
#    `pltpu.make_async_copy` and DMA semaphores;
# 5. let `pltpu.emit_pipeline` build the same pipeline inside a kernel;
# 6. judge when manual copies are worth the effort.
#
# Everything in this lesson except the first section is **TPU-only**: SMEM operands, scratch
# shapes from `pltpu`, async copies, semaphores and `emit_pipeline`. On this CPU the kernels
# run in TPU interpret mode (`pltpu.InterpretParams()`), which simulates the memory spaces and
# the DMAs.
# Rules here: [TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html),
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html) and
# [software pipelining](https://docs.jax.dev/en/latest/pallas/pipelining.html).
# Matching exercises: [`../exercises/`](../exercises/), assignment 8 above all.

# %%
import contextlib
import functools

import _course
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose
from kernelsim.chips import CHIPS

LESSON = "05-memory-spaces"
_course.versions()
keys = jax.random.split(jax.random.key(5), 4)
tpu_run = choose(tpu_features=True)
print("kernels in this lesson run:", tpu_run.label)

# %% [markdown]
# ## Three memory spaces
#
# * **HBM** — the chip's main memory: gigabytes, off the core. Arrays passed to a
#   `pallas_call` live here.
# * **VMEM** — vector memory on each TensorCore: 16 MiB on v4, 64 MiB on v5p and TPU7x,
#   128 MiB on v5e and v6e (JAX's TPU hardware table); the kernel's vector and matrix
#   operations take their operands from here. BlockSpec'd
#   operands are copied here by default.
# * **SMEM** — scalar memory: small (1 MiB per core on v4 and later in `tpu_info.py`), read
#   and written 32 bits at a time by the scalar unit that runs the control flow and computes
#   addresses. The TPU details page's rule of thumb: data that decides control flow goes here.
#
# The compiler also caps how much VMEM one kernel may use (a *scoped* limit), below the
# capacity. `pltpu.CompilerParams(vmem_limit_bytes=...)` overrides it for one kernel; the
# pinned release's docstring adds that this must go with the XLA flag
# `--xla_tpu_scoped_vmem_limit_kib=N`, `N` KiB above the new limit. JAX itself only writes the
# number into the kernel's custom call; the TPU compiler, outside JAX, applies it.
#
# kernelsim's chip table: VMEM and SMEM **per TensorCore** (from JAX's TPU hardware table,
# `jax/_src/tpu_info.py`, in the pinned release), HBM bandwidth **per chip** (Google Cloud's
# pages). On the two-core megacore chips, v4 and v5p, the two cores share that bandwidth;
# JAX's table records half of it per core.

# %%
print(f"{'chip':8}  {'VMEM':>8}  {'SMEM':>6}  {'HBM GB/s':>8}")
for name, chip in CHIPS.items():
    if chip.kind == "tpu":
        print(f"{name:8}  {chip.vmem_bytes >> 20:>5} MiB  {chip.smem_bytes >> 20:>2} MiB  "
              f"{chip.hbm_bytes_per_second / 1e9:>8.0f}")

# %% [markdown]
# ## An operand in SMEM
#
# `pl.BlockSpec(memory_space=pltpu.SMEM)` with no block shape puts the whole array in SMEM
# for the whole call. Here each row block of `x` is scaled by its own factor, read as a
# scalar with the step's `program_id`.

# %%
ROWS = 128


def scale_rows_kernel(scales_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * scales_ref[pl.program_id(0)]


def scale_row_blocks(scales, x, *, interpret):
    # The scale table is copied to SMEM once; each x block is read once.
    return pl.pallas_call(
        scale_rows_kernel,
        grid=(x.shape[0] // ROWS,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                  pl.BlockSpec((ROWS, x.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((ROWS, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(scales, x)


x = jax.random.normal(keys[0], (512, 256), jnp.float32)
scales = jnp.arange(1, 5, dtype=jnp.float32)
_course.check(LESSON, "scale_row_blocks", scale_row_blocks,
              lambda s, a: a * jnp.repeat(s, ROWS)[:, None], (scales, x), tpu_run,
              rtol=0, atol=0)
t_smem = kernelsim.trace(functools.partial(scale_row_blocks, interpret=True), scales, x)
print(t_smem)
scales_op = t_smem.calls[0].operand("scales_ref")
assert (scales_op.operand.memory_space, scales_op.fetches, scales_op.skips) == ("smem", 1, 3)

# %% [markdown]
# kernelsim lists `scales_ref` in `smem` with one fetch and three skips: its block is the
# whole table and its index never changes, so the table arrives before the first step and
# stays. kernelsim still counts two buffers for it, as for any pipelined operand: the pinned
# release's lowering forces a single buffer only for such whole-array operands in VMEM.

# %% [markdown]
# ## Scratch: state that outlives a grid step
#
# `scratch_shapes=[pltpu.VMEM(shape, dtype)]` adds a buffer that is neither input nor output.
# It is allocated once for the call, appended to the kernel's arguments after the outputs, and
# keeps its contents from one grid step to the next. The standard use is a `float32`
# accumulator for a matmul whose output is `bfloat16`: accumulate across the `k` steps in
# full precision, cast once at the last step. The dot below is bfloat16 and passes no
# precision; a float32 dot passes `precision=jax.lax.Precision.HIGHEST`, since at the default
# a TPU multiplies float32 in one bfloat16 pass (lesson 7 measures it). The graders check both.

# %%
B = 128


def matmul_bf16_kernel(a_ref, b_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _finalize():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_bf16(a, b, *, interpret):
    m, kdim = a.shape
    n = b.shape[1]
    # k innermost: output block (i, j) and its accumulator stay on chip for all k.
    return pl.pallas_call(
        matmul_bf16_kernel,
        grid=(m // B, n // B, kdim // B),
        in_specs=[pl.BlockSpec((B, B), lambda i, j, k: (i, k)),
                  pl.BlockSpec((B, B), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((B, B), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((B, B), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        interpret=interpret,
    )(a, b)


def matmul_bf16_reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


a = jax.random.normal(keys[1], (256, 512), jnp.bfloat16)
b = jax.random.normal(keys[2], (512, 256), jnp.bfloat16)
# Outputs near 20 in magnitude; one bf16 rounding step there is 0.125.
_course.check(LESSON, "matmul_bf16_scratch", matmul_bf16, matmul_bf16_reference, (a, b),
              tpu_run, rtol=1e-2, atol=0.25)
t = kernelsim.trace(functools.partial(matmul_bf16, interpret=True), a, b)
print(t)
acc_op = t.calls[0].operands[-1]  # scratch comes after the inputs and the output
assert (acc_op.operand.role, acc_op.operand.memory_space, acc_op.buffers) == ("scratch", "vmem", 1)
assert acc_op.hbm_read_bytes == acc_op.hbm_write_bytes == 0

# %% [markdown]
# The accumulator row says `scratch`, `vmem`, one buffer and no HBM traffic: scratch never
# leaves the chip. The viewer shows the footprint: two VMEM buffers for each pipelined block,
# a single one for the accumulator, which no copy ever touches, and their sum against the
# chip's VMEM.

# %%
t.show()

# %% [markdown]
# ## `pl.ANY`: leave it in HBM, copy it yourself
#
# `pl.BlockSpec(memory_space=pl.ANY)` tells Pallas not to pipeline an operand: the kernel gets
# a Ref to the array where it already is (HBM, on TPU). The pinned release's TPU lowering
# accepts such operands only whole — block shape equal to the array, an index map of zeros.
# Moving data is then the kernel's job
# ([TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html)):
#
# * `pltpu.make_async_copy(src_ref, dst_ref, sem)` describes a DMA;
# * `.start()` issues it and returns at once; `.wait()` blocks until the copy has signalled
#   its semaphore, i.e. until the data has landed;
# * `pltpu.SemaphoreType.DMA((2,))` in `scratch_shapes` allocates two DMA semaphores.
#
# The kernel below sums 64-row chunks of `x`, double buffering by hand: while it adds chunk
# `c`, the copy of chunk `c + 1` into the other buffer is in flight.

# %%
CHUNK = 64


def chunk_sum_kernel(x_hbm, o_ref, buf, sem):
    n_chunks = x_hbm.shape[0] // CHUNK

    def copy(c, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(c * CHUNK, CHUNK)], buf.at[slot],
                                     sem.at[slot])

    copy(0, 0).start()
    o_ref[...] = jnp.zeros_like(o_ref)

    def body(c, carry):
        slot = c % 2

        @pl.when(c + 1 < n_chunks)
        def _prefetch_next():
            copy(c + 1, 1 - slot).start()

        copy(c, slot).wait()
        o_ref[...] += buf[slot]
        return carry

    jax.lax.fori_loop(0, n_chunks, body, 0)


def chunk_sum(x, *, interpret):
    # No grid: one step; the kernel streams x from HBM through two VMEM buffers itself.
    return pl.pallas_call(
        chunk_sum_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((2, CHUNK, x.shape[1]), x.dtype),
                        pltpu.SemaphoreType.DMA((2,))],
        out_shape=jax.ShapeDtypeStruct((CHUNK, x.shape[1]), x.dtype),
        interpret=interpret,
    )(x)


def chunk_sum_reference(x):
    return x.reshape(-1, CHUNK, x.shape[1]).sum(axis=0)


_course.check(LESSON, "chunk_sum_manual_dma", chunk_sum, chunk_sum_reference, (x,), tpu_run,
              rtol=1e-5, atol=1e-5)

# %% [markdown]
# TPU interpret mode really performs these DMAs and blocks on the semaphores, so a kernel that
# waits on a semaphore nobody signals hangs here just as it would on a chip. By default
# (`dma_execution_mode="on_wait"`) it moves a copy's data only when someone waits for it, the
# latest moment a chip could; `"eager"` moves it at `.start()`. Its
# `InterpretParams(detect_races=True)` option adds a race detector for a buffer read and
# written without an ordering between the two. In the pinned release the first race it finds
# stops the kernel with an error (`on_race="raise"`, the default); `on_race="warn"` logs each
# race and lets the kernel finish. The run below uses it on the correct kernel; nothing is
# reported.

# %%
checked = pl.pallas_call(
    chunk_sum_kernel,
    in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
    out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
    scratch_shapes=[pltpu.VMEM((2, CHUNK, x.shape[1]), x.dtype), pltpu.SemaphoreType.DMA((2,))],
    out_shape=jax.ShapeDtypeStruct((CHUNK, x.shape[1]), x.dtype),
    interpret=pltpu.InterpretParams(detect_races=True),
)
jax.block_until_ready(checked(x))
print("race detector finished")

# %% [markdown]
# The detector orders events with vector clocks: one entry per core, the rest shared by the
# DMAs, each DMA drawing one at random from `[cores, vector_clock_size)`. At the default size,
# twice the number of cores, every DMA of a one-core kernel draws the same entry, and any two
# copies look ordered: a race between two *copies* (one writing a buffer that another is still
# reading) goes unreported. `InterpretParams(detect_races=True, vector_clock_size=64)` gives
# the DMAs 63 entries, and such a race is then missed only when both copies draw the same one.
# Task 3 of [assignment 8](../exercises/08_manual_dma/) is a race of that kind.

# %% [markdown]
# kernelsim interprets the kernel body, on zero-filled data, to find the copies it starts, and
# adds them to the table: `x_hbm` gets no pipeline fetch, yet all its 512 KiB are read, by the
# eight chunk copies.

# %%
t_manual = kernelsim.trace(functools.partial(chunk_sum, interpret=True), x)
print(t_manual)
manual = t_manual.calls[0]
assert manual.operand("x_hbm").fetches == 0
assert manual.operand("x_hbm").hbm_read_bytes == x.nbytes
assert [c.bytes for c in manual.call.body_copies] == [CHUNK * x.shape[1] * 4] * 8

# %% [markdown]
# ## A pipeline inside the kernel: `pltpu.emit_pipeline`
#
# The copy helper, the first `.start()`, the prefetch under `pl.when`, the wait and the slot
# arithmetic above are what the BlockSpec pipeline does for a grid. `pltpu.emit_pipeline(body,
# grid=..., in_specs=..., out_specs=...)` writes them for you *inside* a kernel: it returns a
# function of HBM refs that runs its own grid in order, allocates two VMEM buffers per operand
# and issues the copies and waits with semaphores of its own, while `body` sees one block of
# each operand, as a `pallas_call` kernel does. Its docstring: "the same semantics as
# pallas_call but is meant to be called inside pallas_call for nesting grids"
# ([`emit_pipeline`](https://docs.jax.dev/en/latest/_autosummary/jax.experimental.pallas.tpu.emit_pipeline.html)).
# Here it replaces every copy of `chunk_sum_kernel`: zeroing the output stays the kernel's,
# adding a chunk is the body.

# %%
def chunk_sum_pipelined_kernel(x_hbm, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)

    def add_chunk(x_ref):  # one (CHUNK, N) block of x, already in VMEM
        o_ref[...] += x_ref[...]

    pltpu.emit_pipeline(add_chunk, grid=(x_hbm.shape[0] // CHUNK,),
                        in_specs=[pl.BlockSpec((CHUNK, x_hbm.shape[1]), lambda c: (c, 0))])(x_hbm)


# %% [markdown]
# `emit_pipeline` asks which TPU it targets while it is traced (the tiling of its copies). On
# a TPU the chip answers. Anywhere else `jax.sharding.use_abstract_mesh` with a TPU device
# names one, the way `pltpu.InterpretParams`' docstring says to choose the TPU that interpret
# mode simulates; here a TPU v5e.

# %%
def traced_for_tpu():
    """A context naming the TPU to trace for: none needed on a TPU, a v5e elsewhere."""
    if jax.default_backend() == "tpu":
        return contextlib.nullcontext()
    v5e = jax.sharding.AbstractDevice("TPU v5e", 1, "tpu")
    return jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("core",), abstract_device=v5e))


def chunk_sum_pipelined(x, *, interpret):
    # No grid: one step; emit_pipeline streams x from HBM through its own two VMEM buffers.
    with traced_for_tpu():
        return pl.pallas_call(
            chunk_sum_pipelined_kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            out_shape=jax.ShapeDtypeStruct((CHUNK, x.shape[1]), x.dtype),
            interpret=interpret,
        )(x)


_course.check(LESSON, "chunk_sum_emit_pipeline", chunk_sum_pipelined, chunk_sum_reference,
              (x,), tpu_run, rtol=1e-5, atol=1e-5)

# %% [markdown]
# kernelsim counts its copies as it counted the hand-written ones: the same eight 64 KiB reads
# of `x`. It also counts the two VMEM buffers `emit_pipeline` allocates inside the kernel body
# for `x`'s blocks, so the on-chip peak is `o_ref` plus two chunks: what the hand-written
# kernel holds, there as its two scratch buffers.

# %%
t_pipelined = kernelsim.trace(functools.partial(chunk_sum_pipelined, interpret=True), x)
print(t_pipelined)
pipelined = t_pipelined.calls[0]
assert sorted(c.bytes for c in pipelined.call.body_copies) == \
    sorted(c.bytes for c in manual.call.body_copies)
assert pipelined.hbm_read_bytes == manual.hbm_read_bytes == x.nbytes
chunk_bytes = CHUNK * x.shape[1] * x.dtype.itemsize
assert pipelined.onchip_peak_bytes == pipelined.operand("o_ref").onchip_bytes + 2 * chunk_bytes
assert pipelined.onchip_peak_bytes == manual.onchip_peak_bytes

# %% [markdown]
# ## When manual copies pay off
#
# The BlockSpec pipeline already double-buffers, skips unchanged blocks and overlaps copies
# with compute; for anything an index map can express it is the simpler choice. Manual copies
# earn their complexity when:
#
# * the next block depends on data the kernel computes or reads as it goes (paged KV caches
#   are the usual example);
# * you want copies further ahead than the grid pipeline's two buffers (for the grid's
#   pipeline, the pinned release's TPU lowering accepts `pl.Buffered(buffer_count)` only with
#   1 or 2 buffers and rejects lookahead; `pltpu.emit_pipeline`, a pipeline built inside the
#   kernel, accepts more than two buffers (for outputs too, in the pinned release) and
#   lookahead for inputs);
# * only part of an operand is needed, or the same bytes go to several places.
#
# Manual DMAs are also where new bugs live: forgetting a `.wait()`, overwriting a buffer that
# is still being read. Test such kernels in TPU interpret mode.
#
# One bookkeeping rule catches a whole class of them before anything runs: every `.start()`
# signals its semaphore once, every `.wait()` consumes one signal (here each copy has the same
# size), so over the whole kernel each semaphore must be started and waited on equally often.
# A wait with no signal left blocks forever. Replaying `chunk_sum_kernel`'s schedule in
# Python counts both per semaphore slot:

# %%
def semaphore_counts(n_chunks, prefetch_slot):
    """(starts, waits) per DMA semaphore slot for chunk_sum_kernel's schedule, where
    ``prefetch_slot(slot)`` is the slot the copy of chunk ``c + 1`` uses."""
    starts, waits = [1, 0], [0, 0]  # copy(0, 0).start() before the loop
    for c in range(n_chunks):
        slot = c % 2
        if c + 1 < n_chunks:
            starts[prefetch_slot(slot)] += 1
        waits[slot] += 1
    return starts, waits


n_chunks = x.shape[0] // CHUNK
balanced = semaphore_counts(n_chunks, lambda slot: 1 - slot)
print(f"{n_chunks} chunks; starts per slot {balanced[0]}, waits per slot {balanced[1]}")
assert balanced[0] == balanced[1]
# check-yourself 4: reusing `slot` leaves slot 1 one signal short (3 starts, 4 waits)
assert semaphore_counts(n_chunks, lambda slot: slot) == ([5, 3], [4, 4])

# %% [markdown]
# ## Check yourself
#
# 1. Which memory does a BlockSpec'd operand land in by default on TPU?
# 2. Why put per-block constants in SMEM rather than VMEM?
# 3. What is the difference between a scratch buffer and an output block?
# 4. In `chunk_sum_kernel`, what would go wrong if `copy(c + 1, 1 - slot)` used `slot`
#    instead?
# 5. kernelsim shows no fetch of `x_hbm` in `chunk_sum`, yet 524,288 bytes read. Where do
#    those bytes come from?
# 6. What is left for `chunk_sum_pipelined_kernel` to do itself, and why is zeroing `o_ref`
#    not part of `add_chunk`?
#
# <details><summary>Answer</summary>
#
# 1. VMEM.
# 2. The scalar unit reads SMEM directly, which is what `scales_ref[i]` and index arithmetic
#    need; VMEM holds vectors for the vector and matrix units.
# 3. A scratch buffer is never copied to or from HBM and lives for the whole call; an output
#    block is written back to HBM when its index changes or the grid ends.
# 4. Two things. The copy of chunk `c + 1` would land in the buffer chunk `c` is being read
#    from — a race. And the semaphores no longer balance: slot 0 is started 5 times and
#    slot 1 only 3, but each is waited on 4 times, so the last `.wait()` (chunk 7, slot 1)
#    never returns. The kernel deadlocks, on a chip and in TPU interpret mode alike.
# 5. `x` is in `pl.ANY`, so the pipeline copies nothing for it; the bytes are the eight chunk
#    copies the kernel body starts, which kernelsim finds by interpreting the body.
# 6. Only the arithmetic: `add_chunk` adds one block, and the output starts at zero once,
#    before the pipeline runs. Zeroing inside `add_chunk` would run at every one of its grid
#    steps and keep only the last chunk.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 4 — memory
# spaces](../exercises/04_memory_spaces/memory_spaces.ipynb) and [Assignment 8 — manual
# DMA](../exercises/08_manual_dma/manual_dma.ipynb).
