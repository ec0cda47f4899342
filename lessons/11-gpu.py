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
# # Lesson 11 — Pallas on GPU, honestly
#
# **Learning objectives.** After this lesson you can
#
# 1. explain why a kernel that revisits an output block across grid steps is right on a TPU
#    and a race on a GPU, and watch GPU interpret mode's race detector report it;
# 2. write a reduction the GPU-safe way: the whole reduction inside one program, a
#    `lax.fori_loop` over chunks, each output block written by exactly one program;
# 3. name the two GPU backends of the pinned release, the Triton lowering of `pallas_call`
#    (deprecated) and Mosaic GPU (`plgpu.kernel`), and the Triton lowering's rules:
#    power-of-two array sizes, no scalar prefetch, no scratch, no TPU compiler parameters;
# 4. ask JAX's real lowerings, from a CPU, which kernels compile where
#    (`kernelsim.gpu_lowering_error`, `kernelsim.tpu_lowering_error`), and say what a
#    successful lowering does not prove;
# 5. read kernelsim's `gpu` model: programs that run at once share reads through L2, and a
#    revisited output block costs one HBM write per program.
#
# Everything here runs on a CPU: kernels in interpret mode, lowerings for TPU and CUDA
# without either chip. On a GPU the GPU-safe kernels compile; TPU-only ones run in TPU
# interpret mode there.
# Rules here: the [Pallas quickstart](https://docs.jax.dev/en/latest/pallas/quickstart.html)
# ("Grid semantics"), [Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html),
# the Mosaic GPU [quickstart](https://docs.jax.dev/en/latest/pallas/gpu/quickstart.html),
# [reference](https://docs.jax.dev/en/latest/pallas/gpu/reference.html) and
# [pipelining guide](https://docs.jax.dev/en/latest/pallas/gpu/pipelining.html), and the
# [design note](https://docs.jax.dev/en/latest/pallas/design/design.html).
# Matching exercises: [`../exercises/`](../exercises/) (assignment `11_gpu`).

# %%
import collections
import contextlib
import functools
import logging
import re
import textwrap
import warnings

import _course
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash_attention
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import kernelsim
from kernelsim.backend import Execution, choose, gpu_interpret, platform

LESSON = "11-gpu"
_course.versions()
run = choose(tpu_features=False, gpu_ok=True)   # compiled on a GPU or TPU, interpreted here
tpu_run = choose(tpu_features=True)             # TPU-only kernels: TPU interpret mode off a TPU
keys = jax.random.split(jax.random.key(11), 4)

# %% [markdown]
# ## One grid, two machines
#
# A TPU TensorCore walks a `pallas_call`'s grid **in order**, one step after another
# (lesson 4); that is what lets a step add into an output block that the previous step left
# on chip. A GPU does not. In the pinned release, `pallas_call` on a GPU goes through the
# **Triton** lowering, which hands the grid to CUDA as the launch grid: every program is a
# CUDA thread block, and thread blocks run at the same time, on different SMs, in no promised
# order. The quickstart says it plainly: on GPUs each program runs in parallel, so programs
# should write to disjoint locations; and the Grids and BlockSpecs page: when several
# invocations write the same elements of the output, "the result is platform dependent".
#
# There are no `dimension_semantics` on this path: `"arbitrary"` is a TPU compiler
# parameter, and every grid axis of a Triton kernel is parallel.

# %% [markdown]
# ## A reduction that revisits its output
#
# The task: sum the `G` row chunks of `x` (shape `(G·16, N)`) into one `(16, N)` result.
# The TPU way (lesson 4) puts the chunks on a grid axis: program `g` reads chunk `g` and adds
# it into the one output block, which every program revisits; `pl.when(g == 0)` zeroes it
# first.

# %%
CHUNK, COLS = 16, 128  # rows per chunk; output columns per program of the GPU-safe kernels


def chunk_sum_revisiting_kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _zero():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def chunk_sum_revisiting(x, *, interpret):
    """Sum of x's row chunks: x (G·CHUNK, N) -> (CHUNK, N), program g adding chunk g."""
    m, n = x.shape
    # every program revisits the one output block: right only if the grid runs in order
    return pl.pallas_call(
        chunk_sum_revisiting_kernel,
        grid=(m // CHUNK,),
        in_specs=[pl.BlockSpec((CHUNK, n), lambda g: (g, 0))],
        out_specs=pl.BlockSpec((CHUNK, n), lambda g: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((CHUNK, n), x.dtype),
        interpret=interpret,
    )(x)


def chunk_sum_reference(x):
    return x.reshape(-1, CHUNK, x.shape[1]).sum(axis=0)


def lowerings(fn, *args):
    """(TPU error, GPU error) of ``fn(*args)`` compiled (``interpret=False``); None: lowers."""
    compiled = functools.partial(fn, interpret=False)
    return (kernelsim.tpu_lowering_error(compiled, *args, chip="tpu-v5e"),
            kernelsim.gpu_lowering_error(compiled, *args, chip="h100"))


x = jax.random.normal(keys[0], (8 * CHUNK, 256), jnp.float32)
_course.check(LESSON, "chunk_sum_revisiting (grid in order)", chunk_sum_revisiting,
              chunk_sum_reference, (x,), tpu_run, rtol=1e-5, atol=1e-5)
print("TPU and GPU lowering errors:", lowerings(chunk_sum_revisiting, x))
assert lowerings(chunk_sum_revisiting, x) == (None, None)

# %% [markdown]
# Run in order (here in TPU interpret mode, `tpu_run`), it is right. And both lowerings
# accept it: neither checks what the grid does to an output. On a GPU its 8 programs run at
# once, each loading the output block, adding its chunk and storing it back; those
# sequences interleave as the hardware schedules them, updates are lost differently from run
# to run, and the zeroing may land after another program's addition.
#
# To *see* the race on this CPU we need an interpreter that knows GPU semantics. GPU
# interpret mode (`plgpu.InterpretGPUParams`) simulates a GPU's memories and threads and, with
# `detect_races=True`, tracks which accesses are ordered by what (a happens-before race
# detector, like TPU interpret mode's in lesson 9). In the pinned release it runs Mosaic GPU
# kernels (`plgpu.kernel`, next sections), but a `pallas_call` only with whole-array blocks.
# So here is the same schedule written as a Mosaic GPU kernel: the kernel receives
# whole arrays in GPU memory and slices its chunk itself with `pl.ds`; `grid_names` names
# the grid axis that `lax.axis_index` reads. Where the course falls back to `interpret=True`,
# `gpu_interpret` (from `kernelsim.backend`) turns it into GPU interpret mode: `pallas_call`'s
# plain interpreter cannot resolve a Mosaic GPU grid's axis names.


# %%
def chunk_sum_revisiting_mgpu(x, *, interpret):
    """chunk_sum_revisiting as a Mosaic GPU kernel: program g adds chunk g into the output."""
    m, n = x.shape

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((CHUNK, n), x.dtype),
                       grid=(m // CHUNK,), grid_names=("chunk",),
                       interpret=gpu_interpret(interpret))
    def kernel(x_gmem, o_gmem):
        g = jax.lax.axis_index("chunk")

        @pl.when(g == 0)
        def _zero():
            o_gmem[...] = jnp.zeros_like(o_gmem)

        o_gmem[...] += x_gmem[pl.ds(g * CHUNK, CHUNK), :]

    return kernel(x)


@contextlib.contextmanager
def race_reports():
    """Collect the race detector's reports (logged as warnings with on_race="warn")."""
    reports = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("RACE DETECTED"):
                reports.append(record.getMessage())

    handler, root = Collect(), logging.getLogger()
    root.addHandler(handler)
    try:
        yield reports
    finally:
        root.removeHandler(handler)


def as_a_gpu_runs_it(kernel, *args):
    """Run ``kernel`` in GPU interpret mode with the race detector on: (output, reports)."""
    params = _course.newer_api(plgpu, "InterpretGPUParams")(detect_races=True, on_race="warn")
    with race_reports() as reports:
        out = jax.block_until_ready(kernel(*args, interpret=params))
    return out, reports


def accesses(report):
    """The two unordered accesses a report names: [('write', '0:16, 0:256'), ...]."""
    found = re.findall(r"(read|write) of .*?\[\((slice.*?)\)\] from", report)
    return [(kind, re.sub(r"slice\((\d+), (\d+), 1\)", r"\1:\2", where))
            for kind, where in found]


out, reports = as_a_gpu_runs_it(chunk_sum_revisiting_mgpu, x)
pairs = collections.Counter(" / ".join(f"{k} of [{w}]" for k, w in accesses(r))
                            for r in reports)
print(f"revisiting kernel, GPU interpret mode: {len(reports)} race reports")
for pair, count in pairs.items():
    print(f"  {count} x  {pair}")
print("max error of this run:", float(jnp.abs(out - chunk_sum_reference(x)).max()))
assert reports and all(w == "0:16, 0:256" for r in reports for _, w in accesses(r))

# %% [markdown]
# Every report is a pair of accesses to the output, rows `0:16` and all 256 columns, that
# nothing orders: a write against a write, or a write against a read. The sum of this run is
# right, because the interpreter happens to run the programs one after another; the detector
# reports the race anyway, since on a GPU nothing makes them run that way.

# %% [markdown]
# ## The GPU-safe shape: the reduction inside one program
#
# Turn the reduction around. Split the grid over what the programs can own, the output's
# column blocks, and let each program walk over **all** chunks itself with `lax.fori_loop`,
# carrying the running sum as a value. Each output block is then written by exactly one
# program, once, and no order of programs can change the result. It is the quickstart's
# advice (disjoint writes), and the shape of JAX's own GPU kernels: the Triton attention in
# `jax/experimental/pallas/ops/gpu/attention.py` gives each program a block of queries and
# loops over all keys inside it.
#
# Own whole output blocks, not parts of a shared one. Triton stores straight to memory, so
# programs writing disjoint columns of one block would be safe there; but a pipeline that
# stages blocks, like a TPU's or Mosaic GPU's `plgpu.emit_pipeline` (lesson 16), copies each
# block back whole, and two programs' copies of one block collide. One block per program is
# safe on all of them.


# %%
def chunk_sum_owned_kernel(x_ref, o_ref):
    def add_chunk(g, total):
        return total + x_ref[pl.ds(g * CHUNK, CHUNK), :]

    o_ref[...] = jax.lax.fori_loop(0, x_ref.shape[0] // CHUNK, add_chunk,
                                   jnp.zeros(o_ref.shape, o_ref.dtype))


def chunk_sum_owned(x, *, interpret):
    """The same sum, program j owning output columns [j·COLS, (j+1)·COLS)."""
    m, n = x.shape
    # program j reads column band j of x and writes column block j of the output, once
    return pl.pallas_call(
        chunk_sum_owned_kernel,
        grid=(n // COLS,),
        in_specs=[pl.BlockSpec((m, COLS), lambda j: (0, j))],
        out_specs=pl.BlockSpec((CHUNK, COLS), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((CHUNK, n), x.dtype),
        interpret=interpret,
    )(x)


def chunk_sum_owned_mgpu(x, *, interpret):
    """chunk_sum_owned as a Mosaic GPU kernel: program j sums columns [j·COLS, (j+1)·COLS)."""
    m, n = x.shape

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((CHUNK, n), x.dtype),
                       grid=(n // COLS,), grid_names=("cols",),
                       interpret=gpu_interpret(interpret))
    def kernel(x_gmem, o_gmem):
        cols = pl.ds(jax.lax.axis_index("cols") * COLS, COLS)

        def add_chunk(g, total):
            return total + x_gmem[pl.ds(g * CHUNK, CHUNK), cols]

        o_gmem[:, cols] = jax.lax.fori_loop(0, m // CHUNK, add_chunk,
                                            jnp.zeros((CHUNK, COLS), x.dtype))

    return kernel(x)


_course.check(LESSON, "chunk_sum_owned", chunk_sum_owned, chunk_sum_reference, (x,), run,
              rtol=1e-5, atol=1e-5)
out, reports = as_a_gpu_runs_it(chunk_sum_owned_mgpu, x)
print(f"GPU-safe kernel, GPU interpret mode: {len(reports)} race reports")
assert not reports
# Mosaic GPU kernels: compiled on a GPU, in GPU interpret mode anywhere else
mgpu_run = run if platform() == "gpu" else Execution(  # True: see gpu_interpret
    True, f"GPU interpret mode on {platform().upper()}")
_course.check(LESSON, "chunk_sum_owned_mgpu", chunk_sum_owned_mgpu, chunk_sum_reference, (x,),
              mgpu_run, rtol=1e-5, atol=1e-5)

# %% [markdown]
# The same shape for a matmul, the kernel of lessons 3 and 4. The TPU way puts `K` on a third
# grid axis and accumulates into the output block; the GPU way gives each program one output
# block `(i, j)`, a `(bm, K)` row band of `A` and a `(K, bn)` column band of `B`, and loops
# over `K` in chunks of `bk` inside. On a GPU a block is not copied anywhere before the
# kernel starts: the Triton lowering turns each operand into a pointer, and each read of a
# ref into a load of exactly that slice (`jax/_src/pallas/triton/lowering.py`). So a
# `(bm, K)` band costs nothing until the loop loads its `(bm, bk)` chunks, and the chunks are
# what has to fit in registers and shared memory.

# %%
BM, BN, BK = 64, 128, 32  # GPU-safe matmul blocks: small tiles, every size a power of two
HIGHEST = jax.lax.Precision.HIGHEST  # float32 products in float32 on every backend


def matmul_revisiting_kernel(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _zero():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=HIGHEST,
                          preferred_element_type=jnp.float32)


def matmul_revisiting(a, b, *, bm=128, bn=128, bk=128, compiler_params=None, interpret):
    """The TPU shape: grid (i, j, k), output block (i, j) revisited for every k."""
    (m, k), n = a.shape, b.shape[1]
    # k innermost: a TPU keeps output block (i, j) on chip across the k steps
    return pl.pallas_call(
        matmul_revisiting_kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=compiler_params,
        interpret=interpret,
    )(a, b)


def matmul_gpu_safe_kernel(a_ref, b_ref, o_ref, *, bk):
    def add_chunk(c, acc):
        chunk = pl.ds(c * bk, bk)
        return acc + jnp.dot(a_ref[:, chunk], b_ref[chunk, :], precision=HIGHEST,
                             preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, a_ref.shape[1] // bk, add_chunk,
                            jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def matmul_gpu_safe(a, b, *, bm=BM, bn=BN, bk=BK, interpret):
    """The GPU shape: grid (i, j), the whole K loop inside each program."""
    (m, k), n = a.shape, b.shape[1]
    # one program per output block; A's row band and B's column band are re-read by every
    # program that needs them (no reuse between programs)
    return pl.pallas_call(
        functools.partial(matmul_gpu_safe_kernel, bk=bk),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        interpret=interpret,
    )(a, b)


a = jax.random.normal(keys[1], (128, 256), jnp.float32)
b = jax.random.normal(keys[2], (256, 256), jnp.float32)
exact_matmul = functools.partial(jnp.dot, precision=HIGHEST)  # the reference: float32 in float32
tpu_params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))
_course.check(LESSON, "matmul_revisiting", functools.partial(
    matmul_revisiting, compiler_params=tpu_params), exact_matmul, (a, b), tpu_run,
    rtol=1e-4, atol=1e-3)
_course.check(LESSON, "matmul_gpu_safe", matmul_gpu_safe, exact_matmul, (a, b), run,
              rtol=1e-4, atol=1e-3, cannot_compile={
                  "tpu": "written for Triton: its K chunks of BK = 32 columns miss the "
                         "TPU's 128-lane alignment (Mosaic's error E2003 on a v5e)"})

# %% [markdown]
# `lax.fori_loop` with Python bounds becomes a `scan` in the kernel's jaxpr, and the Triton
# lowering turns it into a real `scf.for` loop (its `scan` rule accepts only scans of this
# fori-loop form); the accumulator is the loop's carried value. The revisiting matmul runs
# in TPU interpret mode (`tpu_run`) off a TPU because of its `pltpu.CompilerParams`: the
# section after next shows what a GPU says to them.
#
# Both dots pass `precision=HIGHEST`. At JAX's default precision the Triton lowering
# multiplies float32 in TF32, 10 mantissa bits (`DEFAULT` and `HIGH` are its
# `_TF32_PRECISIONS`), as XLA's dots on a GPU do, interpret mode's too; a CPU multiplies in
# float32. The course sets no default precision: a float32 dot without one is TF32 here.

# %% [markdown]
# ## Atomics: many programs, one block
#
# Sometimes the programs cannot own disjoint outputs: a sum over a long axis wants more
# parallelism than the output has blocks. Triton's answer is atomic read-modify-write
# (`pltriton.atomic_add`, `atomic_max`, ... in `jax.experimental.pallas.triton`): the GPU
# performs each program's addition into memory indivisibly, so no update is lost. The design
# note counts atomics among the parts of Triton's model that "don't necessarily make sense
# on TPU". Two costs: the output must start at zero, here through `input_output_aliases`
# from a zeros array (lesson 10), and the programs' additions land in no fixed order, so a
# float sum can differ in its last bits from run to run.


# %%
def chunk_sum_atomic_kernel(x_ref, zeros_ref, o_ref):
    del zeros_ref  # the same buffer as o_ref (aliased): it only provides the zeros
    pltriton.atomic_add(o_ref, (slice(None), slice(None)), x_ref[...])


def chunk_sum_atomic(x, zeros, *, interpret):
    """The chunk sum again, every program adding its chunk into the output atomically."""
    m, n = x.shape
    # every program adds into the one output block, atomically
    return pl.pallas_call(
        chunk_sum_atomic_kernel,
        grid=(m // CHUNK,),
        in_specs=[pl.BlockSpec((CHUNK, n), lambda g: (g, 0)),
                  pl.BlockSpec((CHUNK, n), lambda g: (0, 0))],
        out_specs=pl.BlockSpec((CHUNK, n), lambda g: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((CHUNK, n), x.dtype),
        input_output_aliases={1: 0},
        interpret=interpret,
    )(x, zeros)


zeros = jnp.zeros((CHUNK, x.shape[1]), x.dtype)
_course.check(LESSON, "chunk_sum_atomic", chunk_sum_atomic,
              lambda x, zeros: chunk_sum_reference(x), (x, zeros), run, rtol=1e-5, atol=1e-5,
              cannot_compile={"tpu": "Triton's atomic_add has no TPU lowering (atomic_rmw)"})
on_tpu, on_gpu = lowerings(chunk_sum_atomic, x, zeros)
print("TPU lowering:", on_tpu.splitlines()[0][:96])
assert on_gpu is None and "atomic_rmw" in on_tpu

# %% [markdown]
# ## Two GPU backends in the pinned release
#
# **The Triton lowering of `pallas_call`.** With no compiler parameters, the pinned
# release's GPU rule for `pallas_call` substitutes Triton's `CompilerParams` and looks up the
# lowering registered for that type; Triton's is the only one registered for `"gpu"`
# (`jax/_src/pallas/pallas_call.py`, `jax/_src/pallas/triton/pallas_call_registration.py`).
# Every Triton lowering emits a `DeprecationWarning`: "The Pallas Triton backend is deprecated
# and will be removed in a future JAX version". What it refuses, from the same files and its
# `lowering.py`:
#
# * an array a kernel loads or stores whose size is not a power of two (the check runs on
#   every ref access: a `(16, 384)` block is fine if the kernel reads it 128 columns at a
#   time; the docs: "the size of the blocks themselves is not restricted, but each operation
#   must operate on arrays whose size is a power of 2");
# * scalar prefetch and dynamic grid bounds;
# * scratch operands — so no VMEM accumulators and no DMA semaphores;
# * a `pl.debug_print` format with a `{}` placeholder: Triton prints the format before the
#   values, so it must have none (`pl.debug_print("x", x)`, not `"x = {}"`);
# * TPU compiler parameters: `pltpu.CompilerParams` raises "Compiler params for platform tpu
#   cannot be used for gpu lowering" — once a TPU lowering has run in the process, since JAX
#   registers the TPU rule when it first lowers for a TPU; before that, the same kernel stops
#   at a bare `AssertionError`, like the Mosaic GPU parameters below.
#
# It does *not* look at a BlockSpec's memory space: every operand becomes a global-memory
# pointer, so `pl.ANY` or `pltpu.SMEM` on an input lowers and means nothing there.
#
# **Mosaic GPU** (`plgpu.kernel`, `jax/_src/pallas/mosaic_gpu/core.py`), for Hopper and
# newer, the backend the two `*_mgpu` kernels above use. It has no BlockSpecs and no
# automatic pipeline: the kernel receives whole arrays in GPU global memory (GMEM), `grid=`
# is the CUDA grid of parallel programs, and the kernel slices its share with `pl.ds`.
# Sequential work is a loop inside the program, or `plgpu.emit_pipeline`, whose grid "is
# guaranteed to run sequentially" (pipelining guide). The docs describe `pl.pallas_call` on
# Mosaic GPU too, but in the pinned release a `pallas_call` with `plgpu.CompilerParams` stops
# at the lowering rule's `assert rule is not None`: there is no such rule.

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lowerings(chunk_sum_owned, x)
warned = next((str(w.message) for w in caught if w.category is DeprecationWarning), "")
print("warned:", warned.split(". ")[0])
_course.pinned_claim(warned.startswith("The Pallas Triton backend is deprecated"),
                     "lowering a pallas_call for a GPU warns that Triton is deprecated")
for label, params in [("pltpu.CompilerParams", tpu_params),
                      ("plgpu.CompilerParams", plgpu.CompilerParams())]:
    _, refusal = lowerings(functools.partial(matmul_revisiting, compiler_params=params), a, b)
    print(f"pallas_call with {label} on a GPU: {refusal}")
    _course.pinned_claim(refusal in ("ValueError: Compiler params for platform tpu cannot be "
                                     "used for gpu lowering.", "AssertionError: "),
                         f"pallas_call with {label} is refused for a GPU")

# %% [markdown]
# Mosaic GPU's own rules are largely about register layouts. Every array value in a kernel is
# held in registers in some *layout* (which of the 128 lanes of a warpgroup holds which
# elements); Mosaic GPU infers the layouts from the operations that make and use the values,
# and refuses a kernel for which it finds no consistent set (the reference's "Array
# layouts"). A column sum, `jnp.sum(..., axis=0)` of a `(16, 128)` tile loaded from
# GMEM, is one. JAX's bundled Mosaic GPU attention, for its part, asks for query and key
# blocks that are multiples of 64 (`jax/experimental/pallas/ops/gpu/attention_mgpu.py`).


# %%
def column_sums_mgpu(x, *, interpret):
    """Column sums of each CHUNK-row block: one program per block, a reduction over axis 0
    of a register tile."""
    m, n = x.shape

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((m // CHUNK, n), x.dtype),
                       grid=(m // CHUNK,), grid_names=("rows",),
                       interpret=gpu_interpret(interpret))
    def kernel(x_gmem, o_gmem):
        i = jax.lax.axis_index("rows")
        o_gmem[pl.ds(i, 1), :] = jnp.sum(x_gmem[pl.ds(i * CHUNK, CHUNK), :], axis=0,
                                         keepdims=True)

    return kernel(x)


_, refusal = lowerings(column_sums_mgpu, x)
print("Mosaic GPU:", refusal.split(".")[0])
_course.pinned_claim(refusal.startswith("ValueError: Failed to infer a possible set of layouts"),
                     "Mosaic GPU finds no register layout for the column sums")

# %% [markdown]
# ## Which course kernels lower where
#
# `kernelsim.tpu_lowering_error(fn, *args, chip="tpu-v5e")` and
# `kernelsim.gpu_lowering_error(fn, *args, chip="h100")` run JAX's real lowerings, Mosaic TPU
# and CUDA, on this CPU and return the error, or `None`. Nothing executes and no chip is
# needed. The table lowers representative kernels of the course (the ones above, a
# scalar-prefetch gather, a manual DMA, JAX's bundled TPU flash attention, and three small
# probes of the Triton lowering's indifference to memory spaces and grid rank) for both, and
# says why when one is refused. Each row states what it expects, and the cell asserts it.


# %%
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add(x, y, *, block, interpret):
    """Elementwise add in `block`-shaped tiles (lessons 2 and 3)."""
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    # every block is read once and written once
    return pl.pallas_call(
        add_kernel, grid=(x.shape[0] // block[0], x.shape[1] // block[1]),
        in_specs=[spec, spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x, y)


def matmul_scratch(a, b, *, block=128, interpret):
    """Lesson 5's matmul: an f32 VMEM scratch accumulator across the k axis."""
    (m, k), n = a.shape, b.shape[1]

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _zero():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...],
                                precision="highest", preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    # the scratch block lives on chip for the whole k sweep of each (i, j)
    return pl.pallas_call(
        kernel, grid=(m // block, n // block, k // block),
        in_specs=[pl.BlockSpec((block, block), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((block, block), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((block, block), jnp.float32)], interpret=interpret)(a, b)


def gather_rows_kernel(ids_ref, row_ref, o_ref):
    del ids_ref  # the ids are read by the index map, not by the body
    o_ref[...] = row_ref[...]


def gather_rows(ids, table, *, interpret):
    """Lesson 6's gather: scalar-prefetched ids choose which (8, 128) row block to copy."""
    # the id of step i picks the table block; repeated ids skip the copy on a TPU
    return pl.pallas_call(
        gather_rows_kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(ids.shape[0],),
            in_specs=[pl.BlockSpec((8, 128), lambda i, ids: (ids[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, ids: (i, 0))),
        out_shape=jax.ShapeDtypeStruct((ids.shape[0] * 8, 128), table.dtype),
        interpret=interpret)(ids, table)


def copy_by_dma(x, *, interpret):
    """Lesson 5's manual DMA: x stays in HBM (pl.ANY); the kernel copies it into VMEM."""
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]

    # one step: the whole array, moved by the kernel's own DMA
    return pl.pallas_call(
        kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(x.shape, lambda: (0, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        interpret=interpret)(x)


def scale_kernel(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[0]


def scale_by_smem_scalar(s, x, *, interpret):
    """x times a scalar that lesson 5 would keep in SMEM."""
    whole = pl.BlockSpec(x.shape, lambda: (0, 0))
    # one step: the whole array, and the scalar in SMEM
    return pl.pallas_call(
        scale_kernel, in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), whole],
        out_specs=whole, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret)(s, x)


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def read_any_directly(x, *, interpret):
    """Reads a pl.ANY operand with x_ref[...]: a pointer on a GPU, an HBM ref on a TPU."""
    # one step: the whole array, read straight from where it lies
    return pl.pallas_call(
        copy_kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(x.shape, lambda: (0, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x)


def copy_4d_grid(x, *, interpret):
    """A copy over a 4-D grid: one (8, 128) tile per program, the two batch dims squeezed."""
    spec = pl.BlockSpec((None, None, 8, 128), lambda a, b, i, j: (a, b, i, j))
    # every block is read once and written once
    return pl.pallas_call(
        copy_kernel, grid=(x.shape[0], x.shape[1], x.shape[2] // 8, x.shape[3] // 128),
        in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret)(x)


REASONS = {  # what a refusal says -> the rule it breaks, in a few words
    "whose size is a power of 2": "load/store size not a power of 2",
    "divisible by 8 and 128": "block breaks the (8, 128) rule",
    "scalar prefetch not implemented": "no scalar prefetch",
    "scratch memory not implemented": "no scratch (VMEM, semaphores)",
    "Compiler params for platform tpu": "TPU compiler params",
    "Compiler params for platform gpu": "GPU (Triton) compiler params",
    "atomic_rmw": "no atomics",
    "mpmd_map requires the mesh": "not a TPU kernel (Mosaic GPU)",
    "Failed to infer a possible set of layouts": "register layouts",
    "Loads are only allowed on VMEM and SMEM": "loads from pl.ANY (HBM)",
}


def verdict(error):
    """'lowers', or the rule a lowering error names."""
    if error is None:
        return "lowers"
    return next((rule for text, rule in REASONS.items() if text in error), error[:60])


def bundled_tpu_flash_attention(q, k, v, *, interpret):
    """JAX's TPU flash attention op; it takes no interpret argument and always compiles."""
    assert interpret is False, "lowered only"
    return tpu_flash_attention.flash_attention(q, k, v)


q = jax.random.normal(keys[3], (1, 2, 256, 64), jnp.float32)  # batch, heads, sequence, dim
xs = jnp.zeros((64, 768), jnp.float32)
OK = "lowers"
NO_SCRATCH = "no scratch (VMEM, semaphores)"
rows = [  # name, function, arguments, expected on TPU, expected on GPU
    ("add, (8, 128) blocks", functools.partial(add, block=(8, 128)), (xs, xs), OK, OK),
    ("add, (8, 384) blocks", functools.partial(add, block=(8, 384)), (xs, xs), OK,
     "load/store size not a power of 2"),
    ("add, (4, 128) blocks", functools.partial(add, block=(4, 128)), (xs, xs),
     "block breaks the (8, 128) rule", OK),
    ("chunk sum, revisiting", chunk_sum_revisiting, (x,), OK, OK),
    ("chunk sum, GPU-safe loop", chunk_sum_owned, (x,), OK, OK),
    ("chunk sum, atomics", chunk_sum_atomic, (x, zeros), "no atomics", OK),
    ("chunk sum, Mosaic GPU", chunk_sum_owned_mgpu, (x,), "not a TPU kernel (Mosaic GPU)", OK),
    ("matmul, revisiting + TPU params", functools.partial(matmul_revisiting,
                                                           compiler_params=tpu_params),
     (a, b), OK, "TPU compiler params"),
    ("matmul, VMEM scratch", matmul_scratch, (a, b), OK, NO_SCRATCH),
    ("matmul, GPU-safe loop", matmul_gpu_safe, (a, b), OK, OK),
    ("row gather, scalar prefetch", gather_rows,
     (jnp.array([3, 0, 2, 1], jnp.int32), jnp.zeros((32, 128))), OK, "no scalar prefetch"),
    ("copy by manual DMA", copy_by_dma, (jnp.zeros((8, 128)),), OK, NO_SCRATCH),
    ("read a pl.ANY input directly", read_any_directly, (jnp.zeros((8, 128)),),
     "loads from pl.ANY (HBM)", OK),
    ("scale by a scalar in SMEM", scale_by_smem_scalar, (jnp.ones((1,)), jnp.zeros((8, 128))),
     OK, OK),
    ("copy over a 4-D grid", copy_4d_grid, (jnp.zeros((2, 2, 16, 128)),), OK, OK),
    ("flash attention (JAX's TPU op)", bundled_tpu_flash_attention, (q, q, q), OK,
     "TPU compiler params"),
]
table = []
for name, fn, args, want_tpu, want_gpu in rows:
    on_tpu, on_gpu = (verdict(e) for e in lowerings(fn, *args))
    table.append((name, on_tpu, on_gpu))
    _course.pinned_claim((on_tpu, on_gpu) == (want_tpu, want_gpu),
                         f"{name}: TPU {on_tpu!r}, GPU {on_gpu!r}")
width = max(len(r[0]) for r in table)
print(f"{'kernel':{width}}  {'TPU (Mosaic, v5e)':31}  GPU (Triton or Mosaic GPU, H100)")
for name, on_tpu, on_gpu in table:
    print(f"{name:{width}}  {on_tpu:31}  {on_gpu}")

# %%
fig = Figure(figsize=(_course.FIGURE_WIDTH, 0.5 * len(table) + 0.8))
ax = fig.subplots()
for r, (_, *verdicts) in enumerate(table):
    for c, text in enumerate(verdicts):
        ax.add_patch(Rectangle((c, r), 1, 1, color="#c7e9c0" if text == OK else "#fcbba1"))
        ax.text(c + 0.5, r + 0.5, textwrap.fill(text, 20), ha="center", va="center")
ax.set_xlim(0, 2)
ax.set_ylim(len(table), 0)
ax.set_xticks([0.5, 1.5], ["TPU lowering (v5e)", "GPU lowering (H100)"])
ax.xaxis.tick_top()
ax.set_yticks([r + 0.5 for r in range(len(table))], [t[0] for t in table])
ax.tick_params(length=0)
fig.tight_layout()
fig  # noqa: B018 - a cell's last expression is displayed

# %% [markdown]
# Read the green cells carefully. **Lowering is not compiling.** A lowering turns the kernel
# into the backend's IR (a Triton module, a Mosaic module) and checks what JAX checks on the
# way; Triton's compilation to PTX, and the Mosaic compilers' own passes, run later, when XLA
# compiles the program for the chip. Shared-memory and register limits, or tile shapes a
# tensor-core instruction rejects, are not seen here. And
# **lowering is not correctness**: the revisiting chunk sum lowers for both, and on a GPU it
# races. `_course.check` is the second half of the test: on a GPU machine it compiles the
# kernels marked for the GPU and says which ones ran compiled.

# %% [markdown]
# ## kernelsim's GPU model
#
# `kernelsim.trace(fn, *args, model="gpu", chip="h100")` models a grid as the Triton lowering
# launches it: one program per grid point, every program loading each of its input blocks
# and storing each of its output blocks (there is no pipeline to skip a copy). Programs run
# side by side, at least one per SM, so a block that another program read shortly before is
# still in L2: kernelsim counts a read as HBM traffic only when no program launched fewer
# places earlier than the chip has SMs (132 on an H100) read the same block, taking the
# launch order of the Triton lowering (grid dimension 0 fastest). Every store goes to HBM.
# The estimate takes the H100's peak FLOP/s (a float32 dot at TF32, which JAX's default
# precision picks) and HBM bandwidth and adds no per-step cost, since the programs run
# concurrently. Compare the two matmul shapes on a `1024³` float32 problem, both with
# `128`-wide blocks:

# %%
big_a = jnp.zeros((1024, 1024), jnp.float32)
big_b = jnp.zeros((1024, 1024), jnp.float32)
shapes = {"revisiting (grid i, j, k)": functools.partial(matmul_revisiting, interpret=True),
          "GPU-safe (grid i, j; loop over k)": functools.partial(
              matmul_gpu_safe, bm=128, bn=128, bk=128, interpret=True)}
gpu_traces = {label: kernelsim.trace(fn, big_a, big_b, model="gpu", chip="h100")
              for label, fn in shapes.items()}
for label, t in gpu_traces.items():
    call = t.calls[0]
    print(f"{label:34}: {call.steps:3} programs, HBM read {call.hbm_read_bytes / 2**20:3.0f} MiB,"
          f" write {call.hbm_write_bytes / 2**20:2.0f} MiB ({call.operand('o_ref').writebacks:3}"
          f" block stores); memory {call.cost.memory_seconds * 1e6:4.1f} us, compute "
          f"{call.cost.compute_seconds * 1e6:4.1f} us")
revisiting, safe = (t.calls[0] for t in gpu_traces.values())
assert revisiting.hbm_read_bytes == safe.hbm_read_bytes  # the same A and B bytes
assert revisiting.operand("o_ref").writebacks == 8 * safe.operand("o_ref").writebacks == 512
assert revisiting.hbm_write_bytes == 8 * safe.hbm_write_bytes

# %% [markdown]
# Both shapes read the same `A` and `B` bytes, each once: every output block needs its
# whole `A` row band and `B` column band either way, and the programs sharing a band run
# close enough together to find it in L2. The difference is the output. The revisiting
# shape stores every output block once per `k` step, 8 times here, and even if those
# stores did not race they would cost 8 times the output's bytes: 32 MiB instead of 4,
# which the memory time shows; it makes that shape's estimate memory-bound, while the
# GPU-safe shape's is compute-bound. The heatmaps count the stores per output block under
# the GPU model:

# %%
fig = Figure(figsize=(_course.FIGURE_WIDTH, 3.8), layout="constrained")
axes = fig.subplots(1, 2)
for ax, (label, t) in zip(axes, gpu_traces.items(), strict=True):
    sched = next(s for s in t.calls[0].schedule.operands if s.operand.name == "o_ref")
    counts = sched.transfer_counts()
    im = ax.imshow(counts, cmap="Oranges", vmin=0, vmax=8)
    for (r, c), n in np.ndenumerate(counts):
        ax.text(c, r, int(n), ha="center", va="center",
                color="white" if n > 4 else "black")
    ax.set_title(f"{label}\nstores per output block")
    ax.set_xlabel("block col")
    ax.set_ylabel("block row")
fig.colorbar(im, ax=axes, shrink=0.8, label="stores")
fig  # noqa: B018 - a cell's last expression is displayed

# %% [markdown]
# Limits of the model. Its L2 is a rule, not a cache: a re-read by a near neighbour in
# launch order is free, any other costs HBM bytes again, whatever the size of L2 and
# whatever order the hardware really dispatches programs in (not documented). It keys reuse
# by block, not by the part of it the body reads. It does not count the revisiting
# kernel's reads of its own output (`o_ref[...] += ...` loads the block before storing
# it), which a GPU pays too. And a block is not staged on
# chip: the Triton lowering makes each operand a pointer and allocates no shared memory for
# it, and the GPU-safe program never holds its `(128, 1024)` band at once (it loads
# `(128, 128)` chunks into registers). So the GPU model names its spaces "global memory" and
# "registers" and, unlike the TPU model with VMEM, does not hold a block's size against
# shared memory (Triton's compiler picks its own shared-memory buffers later, on the GPU).
# Shared memory is what Mosaic GPU kernels allocate themselves; lesson 16 measures it with
# `kernelsim.gpu`.

# %%
safe_trace = gpu_traces["GPU-safe (grid i, j; loop over k)"]
print("on-chip bytes of the blocks:", safe_trace.calls[0].cost.vmem_bytes,
      "| warnings:", safe_trace.calls[0].warnings,
      "| spaces:", [s["name"] for s in safe_trace.to_dict()["memory_spaces"]])
assert safe_trace.calls[0].cost.vmem_bytes > 227 * 1024 and not safe_trace.calls[0].warnings

# %% [markdown]
# ## On a GPU machine
#
# Run this notebook with a GPU (the pinned JAX and its CUDA plugin) and `_course.check`
# compiles what it can: `run` is `choose(gpu_ok=True)`, so the GPU-safe chunk sum, the
# atomic chunk sum and the GPU-safe matmul are compiled by Triton, and the Mosaic GPU chunk
# sum by Mosaic GPU. The revisiting kernels go through `tpu_run`, TPU interpret mode on any
# machine but a TPU: on a GPU the chunk sum would race, and no GPU lowering accepts the
# matmul's TPU compiler parameters. Each
# check prints where its kernel ran, and a kernel meant to compile that the GPU refuses is
# rerun interpreted with the refusal in its label. `bench/on_device.py` runs every lesson
# that way and records, per kernel, whether it compiled.

# %% [markdown]
# ## Check yourself
#
# 1. A kernel with grid `(4, 4, 8)` accumulates into output block `(i, j)` over the last axis.
#    Why is it right on a TPU and not on a GPU, and would `kernelsim.gpu_lowering_error` tell
#    you?
# 2. Rewrite that grid the GPU-safe way: what is the grid now, and where did the third axis go?
# 3. A kernel reads a `(16, 384)` float32 block whole (`x_ref[...]`). Which lowering refuses
#    it and why? How do you keep the block and satisfy that lowering?
# 4. Which of these does the pinned release's Triton lowering refuse: `pltpu.VMEM` scratch,
#    a `pltpu.SMEM` input, `PrefetchScalarGridSpec`, `pltpu.CompilerParams`, a 4-D grid?
# 5. Under kernelsim's GPU model, how many output bytes does the revisiting `1024³` float32
#    matmul with `128` blocks write, and why is even that an understatement of the problem?
# 6. `kernelsim.gpu_lowering_error` returns `None` for your kernel. What do you still not know?
#
# <details><summary>Answer</summary>
#
# 1. A TPU runs the grid in order, so the `k == 0` zeroing comes first and each step adds to
#    the previous step's block. On a GPU the 8 programs of one `(i, j)` run concurrently:
#    their load-add-store sequences interleave, updates are lost, and the zeroing can run
#    after other programs' additions. The lowering accepts the kernel: it does not check what
#    the grid does to an output. GPU interpret mode's race detector reports it.
# 2. Grid `(4, 4)`, one program per output block; the `k` axis became a `lax.fori_loop` inside
#    the program, with the accumulator as its carried value, and the output is written once.
# 3. The Triton (GPU) lowering: 16 × 384 = 6144 elements is not a power of two. Keep the
#    `(16, 384)` block and load it in power-of-two pieces, e.g. three `(16, 128)` chunks
#    `x_ref[:, pl.ds(c * 128, 128)]` in a loop. The TPU lowering accepts the block as it is.
# 4. It refuses the scratch ("scratch memory not implemented"), scalar prefetch and
#    `pltpu.CompilerParams` ("Compiler params for platform tpu cannot be used for gpu
#    lowering", or a bare `AssertionError` before any TPU lowering has run). The SMEM input
#    lowers, its memory space ignored, and so does a 4-D grid (the leading axes are folded
#    into the three CUDA launch dimensions).
# 5. 512 stores of a 64 KiB block: 32 MiB, 8 times the 4 MiB output. But the stores race,
#    so the result is wrong as well as slow; atomics would make it right at the price of
#    zero-initialisation and an unfixed summation order.
# 6. Whether it compiles (Triton's PTX generation, shared-memory and register limits happen
#    on the GPU), whether it is correct (races lower fine), and how fast it is.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 11 — Pallas on GPU](../exercises/11_gpu/gpu.ipynb).
