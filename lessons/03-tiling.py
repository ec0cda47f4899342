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
# # Lesson 3 — Tiling: grids and BlockSpecs
#
# **Learning objectives.** After this lesson you can
#
# 1. hand each grid step one block of every operand with `pl.BlockSpec`;
# 2. say which bytes are on chip at a given step, and what double buffering costs;
# 3. apply the TPU's (8, 128) rule for block shapes;
# 4. handle shapes that the block size does not divide;
# 5. read kernelsim's per-step table for a tiled add and a tiled matmul;
# 6. predict how block size changes HBM traffic;
# 7. drop a block dimension with `pl.Squeezed()` (or `None`), so the kernel sees a Ref without
#    that axis.
#
# Rules here: [Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html),
# [software pipelining](https://docs.jax.dev/en/latest/pallas/pipelining.html) and
# [TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html).
# Matching exercises: [`../exercises/`](../exercises/).

# %%
import functools
import logging

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose

LESSON = "03-tiling"
_course.versions()
keys = jax.random.split(jax.random.key(3), 4)

# %% [markdown]
# ## From "every program sees everything" to blocks
#
# In lesson 2 each program received whole arrays and sliced them itself. A `BlockSpec` moves
# that slicing out of the kernel: `pl.BlockSpec(block_shape, index_map)` says that at grid
# point `(i, j)` the kernel's Ref is the block number `index_map(i, j)` of shape `block_shape`.
# The kernel body no longer mentions positions at all.

# %%
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def tiled_add(x, y, *, block=(128, 128), interpret):
    bm, bn = block
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    # Each block is used by exactly one grid step: nothing is reused.
    return pl.pallas_call(
        add_kernel,
        grid=(pl.cdiv(x.shape[0], bm), pl.cdiv(x.shape[1], bn)),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, y)


x = jax.random.normal(keys[0], (256, 512), jnp.float32)
y = jax.random.normal(keys[1], (256, 512), jnp.float32)
run = choose(tpu_features=False, gpu_ok=True)
_course.check(LESSON, "tiled_add", tiled_add, lambda a, b: a + b, (x, y), run, rtol=0, atol=0)

# %% [markdown]
# ## Which bytes are on chip
#
# On TPU the grid runs sequentially, in row-major order (lesson 4: on megacore chips the
# compiler may split an axis declared `"parallel"` between two cores). Steps count from 0
# here and in kernelsim's tables. Before step `s` the pipeline copies the input blocks that
# step needs from HBM into VMEM; after it, it copies the output block back if the next step
# writes a different output block or the grid ends. While step `s` computes, the copy for
# step `s + 1` is already under way into a *second* buffer — double buffering — so each
# pipelined operand holds two blocks of VMEM. An input block whose index does not change
# between consecutive steps is not copied again
# ([software pipelining](https://docs.jax.dev/en/latest/pallas/pipelining.html)).
#
# The buffer count is per operand: `pl.BlockSpec(..., pipeline_mode=pl.Buffered(n))`, default
# 2 ([TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html)).
# `pl.Buffered(1)` halves the footprint and gives up the overlap. Two cases get one buffer
# without asking: the pinned release's TPU lowering forces it for a VMEM operand whose block is
# the whole array and whose index map returns only zeros; and Mosaic's compiler single-buffers
# a block with no `pipeline_mode` whose index never moves during the grid (JAX's own test
# `test_automatic_single_buffering` relies on it; kernelsim counts both).
#
# kernelsim evaluates the index maps (never the kernel body) and lists these copies step by
# step. `bufs` is the number of VMEM buffers per operand, `on-chip B` their bytes.

# %%
t_add = kernelsim.trace(functools.partial(tiled_add, interpret=True), x, y,
                        model="tpu", chip="tpu-v5e")
print(t_add.summary(steps=2))

# %% [markdown]
# The same schedule in kernelsim's viewer: press **next**, **play** or the arrow keys. Steps
# count from 0, as in the table: step 5 of the `(2, 4)` grid is grid point `(1, 1)`. Each
# operand is drawn as its HBM array cut into blocks, the block in use coloured and patterned
# by what the pipeline does with it. Below, the two VMEM buffers per operand: the one the
# kernel uses now, and the one being filled for the next step (or drained, for the output).

# %%
t_add.show()

# %% [markdown]
# Every input block is fetched once and every output block written once, so the HBM traffic is
# the three arrays' bytes: an elementwise kernel cannot do better. Its on-chip footprint is
# `3 operands × 2 buffers × 128·128·4 B`, independent of the array size.

# %%
add_call = t_add.to_dict()["calls"][0]
print("kernelsim HBM bytes:", add_call["hbm_read_bytes"] + add_call["hbm_write_bytes"])
print("three arrays       :", 3 * x.size * 4)
print("on-chip peak       :", add_call["onchip_peak_bytes"], "=", 3 * 2 * 128 * 128 * 4)

# %% [markdown]
# ## TPU's (8, 128) rule
#
# On TPU ([TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html)), the last two
# dimensions of a block must be divisible by 8 and by 128 respectively, unless they equal the
# corresponding dimensions of the whole array.
#
# The numbers come from the vector registers: 8 sublanes × 128 lanes of 32-bit words, and
# loads and stores move whole `(8, 128)` tiles of the two minor-most dimensions.
#
# In the pinned release the TPU lowering checks exactly this rule, with the same 8 for every
# dtype, and raises a `ValueError` when a block breaks it. (A 1-D block has its own rule: the
# whole array, a multiple of `sublanes × 128` elements — 1024 on the chips this course
# models — or a power of two of at least `128 × 32 / bits`.)
# Interpret mode checks none of it; kernelsim's TPU model checks the 2-D rule and warns.

# %%
bad = kernelsim.trace(functools.partial(tiled_add, block=(4, 100), interpret=True), x, y,
                      model="tpu")
for warning in bad.calls[0].warnings[:1]:
    print("kernelsim:", warning)
full_rows = kernelsim.trace(functools.partial(tiled_add, block=(256, 128), interpret=True),
                            x, y, model="tpu")
print("block (256, 128), the full row count:", full_rows.calls[0].warnings or "no warning")

# %% [markdown]
# Narrower dtypes are *packed*: a 32-bit word holds two `bfloat16` or four `int8` values, one
# above the other along the second-minor dimension, so a full vector register holds a
# `(16, 128)` `bfloat16` or `(32, 128)` `int8` tile. JAX's TPU hardware table
# (`jax/_src/tpu_info.py`, `infer_tiling`) computes this packing as `4 // itemsize` values
# per word. How XLA lays out such an array in HBM depends on the generation: the same file's
# `get_sublane_tiling` notes that before TPU7x XLA tiles 16-bit arrays by 8 rows by default
# (a flag makes it 16) and 8-bit arrays by 32. The lowering's check above accepts an `(8, 128)`
# `bfloat16` block either way; row counts that are multiples of 16 (`bfloat16`) or 32 (`int8`)
# fit whole packed tiles on every generation.

# %% [markdown]
# ## Dropping a block dimension: `pl.Squeezed()`
#
# A batch of matrices `(batch, M, K)` is usually cut one matrix at a time. A block of shape
# `(1, 128, K)` would hand the kernel a 3-D Ref of leading size 1; writing `pl.Squeezed()` (or
# `None`, the same thing) for that dimension instead gives the kernel a 2-D `(128, K)` Ref.
# The index map still returns one index per array dimension: for a squeezed dimension the
# index counts single elements, here the batch element. The (8, 128) rule still sees a
# squeezed dimension: the TPU lowering counts it as a block dimension of size 1. Squeezing a
# leading dimension, as here, is free; squeezing one of the last two is refused unless the
# array itself has size 1 there (the next cell asks the lowering).

# %%
def batched_matmul_kernel(x_ref, w_ref, o_ref):
    seen_shapes.append(x_ref.shape)  # recorded at trace time
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...],
                         precision="highest", preferred_element_type=jnp.float32)


def batched_matmul(x, w, *, bm=128, interpret):
    batch, m, k = x.shape
    n = w.shape[1]
    # b outer, i inner: w's index never changes, so it is fetched once for the whole grid.
    return pl.pallas_call(
        batched_matmul_kernel,
        grid=(batch, m // bm),
        in_specs=[pl.BlockSpec((pl.Squeezed(), bm, k), lambda b, i: (b, i, 0)),
                  pl.BlockSpec((k, n), lambda b, i: (0, 0))],
        out_specs=pl.BlockSpec((None, bm, n), lambda b, i: (b, i, 0)),
        out_shape=jax.ShapeDtypeStruct((batch, m, n), jnp.float32),
        interpret=interpret,
    )(x, w)


seen_shapes = []
xb = jax.random.normal(keys[2], (3, 256, 128), jnp.float32)
wb = jax.random.normal(keys[3], (128, 256), jnp.float32)
_course.check(LESSON, "batched_matmul_squeezed", batched_matmul,
              lambda a, w: jnp.einsum("bmk,kn->bmn", a, w, precision="highest"), (xb, wb), run,
              rtol=1e-4, atol=1e-3)
print("the kernel saw x_ref of shape", seen_shapes[0])
assert seen_shapes[0] == (128, 128)
t_batched = kernelsim.trace(functools.partial(batched_matmul, interpret=True), xb, wb)
print(t_batched)
assert t_batched.calls[0].operand("w_ref").fetches == 1


# %% [markdown]
# Now one row at a time: `(None, 128)` on a `(64, 128)` array squeezes the second-to-last
# dimension. Interpret mode runs it; the TPU lowering sees a block of 1 × 128, and 1 is neither
# a multiple of 8 nor the array's 64. kernelsim's lint applies the same rule, so it warns
# without a TPU.

# %%
def scale_rows_kernel(x_ref, o_ref):
    o_ref[...] = 2.0 * x_ref[...]  # x_ref is (128,): the row dimension was squeezed


def scale_rows(x, *, interpret):
    row = pl.BlockSpec((None, x.shape[1]), lambda i: (i, 0))  # one row per step
    return pl.pallas_call(
        scale_rows_kernel, grid=(x.shape[0],), in_specs=[row], out_specs=row,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret,
    )(x)


xs = jax.random.normal(keys[0], (64, 128), jnp.float32)
np.testing.assert_array_equal(scale_rows(xs, interpret=True), 2.0 * xs)
squeezed_error = kernelsim.tpu_lowering_error(functools.partial(scale_rows, interpret=False), xs)
squeezed_lint = kernelsim.trace(functools.partial(scale_rows, interpret=True), xs).calls[0]
print("TPU lowering:", squeezed_error.splitlines()[0][:150])
print("kernelsim:", squeezed_lint.warnings[0])
assert squeezed_error.startswith("ValueError") and "divisible by 8 and 128" in squeezed_error
assert any("second-to-last dim 1" in w for w in squeezed_lint.warnings)

# %% [markdown]
# ## Shapes the block does not divide
#
# With `grid = pl.cdiv(n, block)` the last block hangs over the edge of the array
# ([Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html)). Pallas
# still hands the kernel a full block: values read beyond the array are unspecified, and
# values written beyond it are dropped.
#
# An elementwise kernel is therefore correct as it stands: the garbage lands only in dropped
# positions.

# %%
xr = jax.random.normal(keys[2], (200, 384), jnp.float32)
yr = jax.random.normal(keys[3], (200, 384), jnp.float32)
_course.check(LESSON, "tiled_add_ragged", tiled_add, lambda a, b: a + b, (xr, yr), run,
              rtol=0, atol=0)

# %% [markdown]
# A kernel that *combines* elements across the block is different: the garbage joins the
# result. Column sums over 128-row blocks of a 200-row array show it.
#
# Both interpreters fill the overhang with NaN (integers: the dtype's minimum with
# `interpret=True`, its maximum in TPU interpret mode), so the second block's partial sums are
# NaN. The fix is a mask built from the block's position: `program_id` times the block size
# plus a row iota.

# %%
ROWS = 128


def column_sums_kernel(x_ref, o_ref, *, n_rows, masked):
    block = x_ref[...]
    if masked:  # Python `if`: decided at trace time, giving two kernels
        row = pl.program_id(0) * ROWS + jax.lax.broadcasted_iota(jnp.int32, block.shape, 0)
        block = jnp.where(row < n_rows, block, 0.0)
    sums = jnp.sum(block, axis=0, keepdims=True)
    o_ref[...] = jnp.broadcast_to(sums, o_ref.shape)


def column_sums(x, *, masked, interpret):
    n_blocks = pl.cdiv(x.shape[0], ROWS)
    # One partial sum per row block; each input block is read once.
    partials = pl.pallas_call(
        functools.partial(column_sums_kernel, n_rows=x.shape[0], masked=masked),
        grid=(n_blocks,),
        in_specs=[pl.BlockSpec((ROWS, x.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((8 * n_blocks, x.shape[1]), x.dtype),
        interpret=interpret,
    )(x)
    return partials[::8].sum(axis=0)


unmasked = column_sums(xr, masked=False, interpret=True)
print("unmasked: NaN in the result:", bool(np.isnan(unmasked).any()))
# On a GPU this one is interpreted: the Triton lowering wants power-of-two array sizes, and
# 384 columns are not (lesson 11).
_course.check(LESSON, "column_sums_masked", lambda a, interpret: column_sums(
    a, masked=True, interpret=interpret), lambda a: a.sum(axis=0), (xr,),
    choose(tpu_features=False, gpu_ok=False),
    rtol=1e-5, atol=1e-4)

# %% [markdown]
# On compiled backends the overhang holds unspecified values rather than NaN, so the
# unmasked kernel may silently look right for one input and wrong for the next.

# %% [markdown]
# ## Out-of-bounds reads inside the kernel
#
# The overhang is one kind of bad read; the other is a kernel indexing past the end of its own
# Ref, for example with `pl.ds(start, size)` and a `start` computed from `program_id`. The two
# interpreters disagree here:
#
# * `interpret=True` evaluates the slice as `lax.dynamic_slice`, which *clamps* the start so
#   the slice fits: the kernel silently reads the wrong rows;
# * TPU interpret mode raises, because `InterpretParams(out_of_bounds_reads="raise")` is the
#   default; `"uninitialized"` returns NaN for the missing part instead.
#
# (An out-of-bounds slice with a static start fails at trace time in both.)

# %%
def shifted_rows_kernel(x_ref, o_ref):
    # Step 1 asks for rows 120..135 of a 128-row Ref: 8 rows past the end.
    o_ref[...] = x_ref[pl.ds(pl.program_id(0) * 120, 16), :]


def shifted_rows(x, interpret):
    return pl.pallas_call(
        shifted_rows_kernel,
        grid=(2,),
        out_specs=pl.BlockSpec((16, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype),
        interpret=interpret,
    )(x)


rows_iota = jnp.broadcast_to(jnp.arange(128, dtype=jnp.float32)[:, None], (128, 128))
clamped = shifted_rows(rows_iota, interpret=True)
print("interpret=True, step 1 read rows:", clamped[16:, 0].astype(int).tolist())
logging.disable(logging.ERROR)  # JAX also logs the failing callback's traceback; skip it
try:
    shifted_rows(rows_iota, interpret=pltpu.InterpretParams())
    jax.effects_barrier()  # a GPU reports the interpreter's error here, not at the call
except Exception as err:  # noqa: BLE001 - the interpreter's IndexError arrives wrapped
    print("TPU interpret mode raised:",
          next(line for line in str(err).splitlines() if "Out-of-bounds" in line).strip())
    pltpu.reset_tpu_interpret_mode_state()
finally:
    logging.disable(logging.NOTSET)

# %% [markdown]
# ## A tiled matmul
#
# For `C = A @ B` with `A` of shape `(M, K)` and `B` of shape `(K, N)`, give each grid step
# `(i, j)` a full row panel of `A` and a full column panel of `B`, and let it write block
# `(i, j)` of `C`. The reduction over `K` happens inside one step (lesson 4 splits it).

# %%
def matmul_kernel(a_ref, b_ref, c_ref):
    c_ref[...] = jnp.dot(a_ref[...], b_ref[...],
                         precision="highest", preferred_element_type=jnp.float32)


def panel_matmul(a, b, *, bm=128, bn=128, interpret):
    m, k = a.shape
    _, n = b.shape
    # j is innermost: A's row panel (i, 0) stays on chip while j sweeps B's column panels.
    return pl.pallas_call(
        matmul_kernel,
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        interpret=interpret,
    )(a, b)


a = jax.random.normal(keys[0], (256, 256), jnp.float32)
b = jax.random.normal(keys[1], (256, 256), jnp.float32)
# On a GPU this one is interpreted: Triton stages both 256-deep panels in shared memory, over
# the limit of an H200 (bench/recorded/lessons_gpu-h200.json).
_course.check(LESSON, "panel_matmul", panel_matmul,
              lambda a, b: jnp.dot(a, b, precision="highest"), (a, b),
              choose(tpu_features=False, gpu_ok=False),
              rtol=1e-4, atol=1e-3)

# %%
t_mm = kernelsim.trace(functools.partial(panel_matmul, interpret=True), a, b,
                       model="tpu", chip="tpu-v5e")
print(t_mm.summary(steps=3))

# %% [markdown]
# Look at `a_ref` in the step table: at steps 0 and 1 its block index is `(0, 0)` both times,
# so the second step *skips* the copy. `b_ref` changes every step and is fetched every step.
#
# The heatmap counts copies per block over the whole run: each row panel of `A` once, each
# column panel of `B` once per row panel (twice here), each output block once.

# %%
t_mm.heatmap()

# %% [markdown]
# ## Block size versus traffic
#
# With `j` innermost, `A` is read once (`M·K` elements) but `B` is read once per row panel:
# `(M / bm)·K·N` elements. Larger `bm` cuts `B`'s traffic and grows the on-chip footprint.
# kernelsim's totals follow that formula; we trace (not run) a 1024-cube matmul for several
# `bm`.

# %%
M = K = N = 1024
a_big = jnp.zeros((M, K), jnp.float32)
b_big = jnp.zeros((K, N), jnp.float32)
rows = [["bm", "kernelsim HBM B", "formula B", "on-chip peak B"]]
traffic = []
for bm in (128, 256, 512, 1024):
    fn = functools.partial(panel_matmul, bm=bm, interpret=True)
    call = kernelsim.trace(fn, a_big, b_big, model="tpu").to_dict()["calls"][0]
    total = call["hbm_read_bytes"] + call["hbm_write_bytes"]
    formula = 4 * (M * K + (M // bm) * K * N + M * N)
    assert total == formula, (bm, total, formula)
    traffic.append(total)
    rows.append([str(bm), f"{total:,}", f"{formula:,}", f"{call['onchip_peak_bytes']:,}"])
widths = [max(len(r[c]) for r in rows) for c in range(4)]
for r in rows:
    print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))

# %%
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 3.4))
ax.plot([128, 256, 512, 1024], [t / 2**20 for t in traffic], marker="o")
ax.set_xscale("log", base=2)
ax.set_xlabel("bm (rows of A per block)")
ax.set_ylabel("HBM traffic (MiB)")
ax.set_title("1024³ f32 panel matmul, bn = 128 (kernelsim)")
fig.tight_layout()

# %% [markdown]
# The footprint column is why block size is a trade-off: at `bm = 1024` the double-buffered
# panels of a 1024-wide `K` already take megabytes of VMEM. Splitting `K` as well (next
# lesson) keeps the footprint bounded for any `K`.

# %% [markdown]
# ## Check yourself
#
# 1. A `BlockSpec((128, 128), lambda i, j: (i, j))` is used at grid point `(2, 3)`. Which
#    element is the block's top-left corner?
# 2. Why does a pipelined input use two VMEM buffers?
# 3. Is a block of shape `(200, 384)` legal on TPU for an array of shape `(200, 384)`? And
#    `(100, 384)`?
# 4. Why is the unmasked column-sum wrong while the ragged add is right?
# 5. In the panel matmul with `j` innermost, which operand's traffic does `bm` control?
# 6. A kernel slices 8 rows past the end of its Ref with a `program_id`-dependent start. What
#    does each interpreter do?
# 7. An operand of shape `(4, 64, 256)` has the BlockSpec
#    `pl.BlockSpec((None, 64, 128), lambda b, j: (b, 0, j))`. What shape is its Ref in the
#    kernel, and which elements does grid point `(2, 1)` get?
#
# <details><summary>Answer</summary>
#
# 1. Element `(256, 384)`: block indices are multiplied by the block shape.
# 2. While the kernel computes on one buffer, the next step's block is copied into the other,
#    so the copy overlaps compute.
# 3. Yes — both dims equal the array's. `(100, 384)` is not: 100 is not a multiple of 8 and
#    not the full 200.
# 4. The add only writes the overhang, and those writes are dropped. The sum mixes overhang
#    values into in-bounds results.
# 5. `B`'s: it is read once per row panel, `M / bm` times.
# 6. `interpret=True` clamps the start and silently returns other rows; TPU interpret mode
#    raises an out-of-bounds error (or returns NaN with `out_of_bounds_reads="uninitialized"`).
# 7. `(64, 128)`: the `None` dimension is squeezed out. It gets `x[2, 0:64, 128:256]` — a
#    squeezed dimension's index counts elements, the others count blocks.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 2 — tiling](../exercises/02_tiling/tiling.ipynb).
