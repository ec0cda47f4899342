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
# # Lesson 4 — Index maps
#
# **Learning objectives.** After this lesson you can
#
# 1. write index maps in *block* coordinates, not element offsets;
# 2. transpose, broadcast and reverse data purely through an index map;
# 3. choose a grid order that makes consecutive steps reuse a block;
# 4. write a reduction along an `"arbitrary"` grid axis, with `pl.when` for the first and
#    last step;
# 5. say what `"parallel"` promises, and watch TPU interpret mode test that promise.
#
# Rules here: [Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html),
# [TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html) and the
# [TPU matmul guide](https://docs.jax.dev/en/latest/pallas/tpu/matmul.html).
# Matching exercises: [`../exercises/`](../exercises/).

# %%
import functools

import _course
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose

LESSON = "04-index-maps"
_course.versions()
keys = jax.random.split(jax.random.key(4), 4)
run = choose(tpu_features=False, gpu_ok=True)
B = 128  # block edge used throughout


def show(rows):
    """Print a list of rows (first row = header) as aligned columns."""
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths, strict=True)))


# %% [markdown]
# ## Block coordinates
#
# An index map receives the grid indices and returns *which block* to use, counted in blocks.
# Pallas multiplies each entry by the block's size along that dimension to find the first
# element. Returning `(i, j)` with a `(128, 128)` block means rows `128·i …` and columns
# `128·j …` — not row `i`, column `j`.

# %% [markdown]
# ## Transpose through the map
#
# Output block `(i, j)` of `xᵀ` is the transpose of input block `(j, i)`. The index map does
# the block-level swap; the kernel transposes inside the block.

# %%
def transpose_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


def transpose(x, *, interpret):
    m, n = x.shape
    # Every input block is read exactly once; nothing is reused.
    return pl.pallas_call(
        transpose_kernel,
        grid=(n // B, m // B),
        in_specs=[pl.BlockSpec((B, B), lambda i, j: (j, i))],
        out_specs=pl.BlockSpec((B, B), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        interpret=interpret,
    )(x)


x = jax.random.normal(keys[0], (256, 512), jnp.float32)
_course.check(LESSON, "transpose", transpose, lambda a: a.T, (x,), run, rtol=0, atol=0)

t = kernelsim.trace(functools.partial(transpose, interpret=True), x)
rows = [["step", "grid (i, j)", "x block", "x first element"]]
for e in t.steps(0):
    if e.operand == "x_ref":
        rows.append([e.step, e.grid_index, e.block_index,
                     tuple(int(b) * B for b in e.block_index)])
show(rows)

# %% [markdown]
# ## Broadcast through the map
#
# A bias row of shape `(1, N)` is added to every row of `x`. Its BlockSpec has block shape
# `(1, 128)` — legal on TPU because the `1` equals the array's first dimension — and an index
# map that ignores `i`. Every row block of `x` sees the same bias block.

# %%
def bias_add_kernel(x_ref, bias_ref, o_ref):
    o_ref[...] = x_ref[...] + bias_ref[...]


def bias_add(x, bias, *, j_inner=True, interpret):
    m, n = x.shape
    if j_inner:   # grid (i, j): j innermost, the bias block changes every step
        grid, ij = (m // B, n // B), (lambda i, j: (i, j))
    else:         # grid (j, i): i innermost, the bias block is reused down each column
        grid, ij = (n // B, m // B), (lambda j, i: (i, j))
    return pl.pallas_call(
        bias_add_kernel,
        grid=grid,
        in_specs=[pl.BlockSpec((B, B), ij),
                  pl.BlockSpec((1, B), lambda *g: (0, ij(*g)[1]))],
        out_specs=pl.BlockSpec((B, B), ij),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, bias)


bias = jax.random.normal(keys[1], (1, 512), jnp.float32)
for j_inner in (True, False):
    _course.check(LESSON, f"bias_add_j_inner_{j_inner}",
                  functools.partial(bias_add, j_inner=j_inner), lambda a, b: a + b,
                  (x, bias), run, rtol=0, atol=0)

rows = [["grid order", "bias fetches", "bias skips", "bias HBM bytes"]]
for j_inner in (True, False):
    t = kernelsim.trace(functools.partial(bias_add, j_inner=j_inner, interpret=True), x, bias)
    op = t.calls[0].operand("bias_ref")
    rows.append(["(i, j)" if j_inner else "(j, i)", op.fetches, op.skips, op.hbm_read_bytes])
    # j innermost: a new bias block at every step; i innermost: once per column of blocks
    assert op.fetches == ((x.shape[0] // B) * (x.shape[1] // B) if j_inner else x.shape[1] // B)
show(rows)

# %% [markdown]
# Same kernel, same blocks, different order: with `i` innermost the bias block's index stays
# the same for consecutive steps, so its copy is skipped. The bias is only a few kilobytes, so
# the saving is small here; the next section applies the same rule to whole matrix panels.

# %% [markdown]
# ## Reversal through the map
#
# Reversing the order of row blocks is a map that counts backwards. The kernel only copies.

# %%
def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def reverse_row_blocks(x, *, interpret):
    n_blocks = x.shape[0] // B
    # Each input block is read once, by the step that writes its mirror position.
    return pl.pallas_call(
        copy_kernel,
        grid=(n_blocks,),
        in_specs=[pl.BlockSpec((B, x.shape[1]), lambda i: (n_blocks - 1 - i, 0))],
        out_specs=pl.BlockSpec((B, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x)


def reverse_row_blocks_reference(x):
    return x.reshape(-1, B, x.shape[1])[::-1].reshape(x.shape)


_course.check(LESSON, "reverse_row_blocks", reverse_row_blocks, reverse_row_blocks_reference,
              (x,), run, rtol=0, atol=0)

# %% [markdown]
# ## Grid order decides reuse: two orders of one matmul
#
# Take the panel matmul of lesson 3 — step `(i, j)` reads row panel `i` of `A` and column panel
# `j` of `B`. With `j` innermost, `A`'s panel is reused across a row of steps and `B` is re-read
# once per row panel. With `i` innermost it is the other way round. For a tall `A`
# (`M = 1024`, `N = 256`, `K = 512`) the two orders move different amounts of data.

# %%
def panel_kernel(a_ref, b_ref, c_ref):
    c_ref[...] = jnp.dot(a_ref[...], b_ref[...],
                         precision="highest", preferred_element_type=jnp.float32)


def panel_matmul(a, b, *, j_inner, interpret):
    m, k = a.shape
    n = b.shape[1]
    if j_inner:   # A's row panel is reused while j sweeps; B is re-read M/B times
        grid, i_of, j_of = (m // B, n // B), (lambda g0, g1: g0), (lambda g0, g1: g1)
    else:         # B's column panel is reused while i sweeps; A is re-read N/B times
        grid, i_of, j_of = (n // B, m // B), (lambda g0, g1: g1), (lambda g0, g1: g0)
    return pl.pallas_call(
        panel_kernel,
        grid=grid,
        in_specs=[pl.BlockSpec((B, k), lambda g0, g1: (i_of(g0, g1), 0)),
                  pl.BlockSpec((k, B), lambda g0, g1: (0, j_of(g0, g1)))],
        out_specs=pl.BlockSpec((B, B), lambda g0, g1: (i_of(g0, g1), j_of(g0, g1))),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        interpret=interpret,
    )(a, b)


M, N, K = 1024, 256, 512
# the reference multiplies float32 in float32 on every backend (a TPU's default is one bf16 pass)
exact_matmul = functools.partial(jnp.dot, precision="highest")
a = jax.random.normal(keys[2], (M, K), jnp.float32)
b = jax.random.normal(keys[3], (K, N), jnp.float32)
# On a GPU these are interpreted: Triton stages both 512-deep panels in shared memory, over
# the limit of an H200 (bench/recorded/lessons_gpu-h200.json).
for j_inner in (True, False):
    _course.check(LESSON, f"panel_matmul_j_inner_{j_inner}",
                  functools.partial(panel_matmul, j_inner=j_inner), exact_matmul, (a, b),
                  choose(tpu_features=False, gpu_ok=False),
                  rtol=1e-4, atol=1e-3)

rows = [["order", "A fetches", "A bytes", "B fetches", "B bytes", "total HBM bytes",
         "formula"]]
for j_inner in (True, False):
    call = kernelsim.trace(functools.partial(panel_matmul, j_inner=j_inner, interpret=True),
                           a, b).calls[0]
    A, Bop = call.operand("a_ref"), call.operand("b_ref")
    # analytic count: the reused operand once, the other once per panel, the output once
    reads = M * K + (M // B) * K * N if j_inner else K * N + (N // B) * M * K
    formula = 4 * (reads + M * N)
    rows.append(["j inner" if j_inner else "i inner", A.fetches, f"{A.hbm_read_bytes:,}",
                 Bop.fetches, f"{Bop.hbm_read_bytes:,}",
                 f"{call.hbm_read_bytes + call.hbm_write_bytes:,}", f"{formula:,}"])
    assert call.hbm_read_bytes + call.hbm_write_bytes == formula
    # which operand is re-read: j inner re-fetches B at every step, i inner re-fetches A
    steps = (M // B) * (N // B)
    assert (A.fetches, Bop.fetches) == ((M // B, steps) if j_inner else (steps, N // B))
show(rows)

# %% [markdown]
# `kernelsim.compare` draws the two orders side by side: cumulative HBM bytes as the grid
# advances, and the roofline estimate of each on a TPU v5e.

# %%
orders = [kernelsim.trace(functools.partial(panel_matmul, j_inner=j_inner, interpret=True),
                          a, b, chip="tpu-v5e") for j_inner in (True, False)]
kernelsim.compare(*orders, labels=["j innermost", "i innermost"]).figure()

# %% [markdown]
# With `i` innermost, `B` (the small operand) is fetched once per column panel and kept, and
# `A` is re-read instead: every step fetches a new `A` block (16 fetches against `B`'s 2). Each
# `A` panel is read only `N/B = 2` times, against `B`'s `M/B = 8` with `j` innermost, so the
# traffic drops. The assert above holds these counts.
# The rule behind it is the pipeline's: a block whose index is the same at two consecutive
# steps is not copied again. Only *consecutive* steps count — a block that comes back later is
# fetched again.

# %% [markdown]
# ## Reductions along an "arbitrary" axis
#
# To bound the footprint for any `K`, split `K` too: grid `(i, j, k)` with `k` innermost.
# Output block `(i, j)` has the same index for all `k`, so it stays on chip across the `k`
# steps and is written back once, when its index changes or the grid ends. The kernel
# accumulates into it: `pl.when(k == 0)` zeroes it at the first step. (With a narrower output
# dtype one would accumulate in an f32 VMEM scratch and cast at the last step,
# `k == pl.num_programs(2) - 1`; lesson 5 covers scratch.)
#
# The `k` axis carries a dependency from step to step, so it is declared `"arbitrary"`, via
# `pltpu.CompilerParams` — a **TPU-only** compiler parameter. On the CPU such a kernel runs
# in TPU interpret mode. Without `dimension_semantics` the pinned release's TPU lowering
# treats every axis as `"arbitrary"`, which is always correct; declaring `i` and `j`
# `"parallel"` is what gives the compiler the freedom the next section describes.

# %%
def matmul_acc_kernel(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...],
                          precision="highest", preferred_element_type=jnp.float32)


def matmul(a, b, *, semantics=("parallel", "parallel", "arbitrary"), interpret):
    m, k = a.shape
    n = b.shape[1]
    # k innermost: output block (i, j) stays on chip for all k, written back once at the end.
    return pl.pallas_call(
        matmul_acc_kernel,
        grid=(m // B, n // B, k // B),
        in_specs=[pl.BlockSpec((B, B), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((B, B), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((B, B), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=interpret,
    )(a, b)


a2 = jax.random.normal(keys[0], (256, 512), jnp.float32)
b2 = jax.random.normal(keys[1], (512, 256), jnp.float32)
tpu_run = choose(tpu_features=True)
_course.check(LESSON, "matmul_k_arbitrary", matmul, exact_matmul, (a2, b2), tpu_run,
              rtol=1e-4, atol=1e-3)
t_acc = kernelsim.trace(functools.partial(matmul, interpret=True), a2, b2)
print(t_acc.summary(steps=1))
assert (t_acc.calls[0].steps, t_acc.calls[0].operand("o_ref").writebacks) == (16, 4)

# %% [markdown]
# kernelsim's table shows the output with 4 writebacks for 16 steps: one per `(i, j)`. In the
# viewer, `o_ref`'s block stays in its VMEM slot (*keep*) through the `k` steps and is written
# back at the last one, while `a_ref` and `b_ref` fetch a new block at every step.

# %%
t_acc.show()

# %% [markdown]
# ## What "parallel" promises
#
# Declaring an axis `"parallel"` promises that its steps are independent — any order, or
# split over several cores, gives the same result
# ([TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html), "Multicore TPU
# configurations").
#
# * On megacore chips — two TensorCores behind one JAX device; JAX's TPU hardware table in the
#   pinned release lists v4 and v5p — the compiler may split a parallel axis between the two
#   cores.
# * On one-core chips (v5e, v6e) the grid still runs in order, so a false `"parallel"` goes
#   unnoticed there — until the kernel runs on a megacore chip.
# * Two cores do not make a megacore chip. The same table gives TPU7x two TensorCores per
#   chip but no megacore: each core is its own JAX device (the table calls this "split"
#   mode), so one `pallas_call` runs on one core and `"parallel"` has no second core to
#   split over.
# * `"arbitrary"` axes always run in order on one core.
#
# The docs describe `dimension_semantics` as some parallel axes followed by arbitrary ones;
# TPU interpret mode in the pinned release enforces that order with a `ValueError`.
#
# The promise is yours to keep. TPU interpret mode tests it: it visits the indices of each
# parallel axis in a shuffled order (seeded by `InterpretParams(random_seed=...)`). Declare
# the reduction axis `"parallel"` and the `k == 0` initialisation no longer comes first.

# %%
lie = ("parallel", "parallel", "parallel")
plain = matmul(a2, b2, semantics=lie, interpret=True)
shuffled = matmul(a2, b2, semantics=lie, interpret=pltpu.InterpretParams())
want = exact_matmul(a2, b2)
print("interpret=True, k declared parallel    : max error", float(jnp.abs(plain - want).max()))
print("TPU interpret, k declared parallel     : max error",
      float(jnp.abs(shuffled - want).max()))
assert float(jnp.abs(shuffled - want).max()) > 1.0, "the shuffle should expose the lie"

# %% [markdown]
# `interpret=True` walks the grid in order and hides the mistake; TPU interpret mode exposes
# it. And an `"arbitrary"` axis placed before a parallel one is rejected outright:

# %%
try:
    matmul(a2, b2, semantics=("arbitrary", "parallel", "arbitrary"),
           interpret=pltpu.InterpretParams())
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## Check yourself
#
# 1. A `(64, 256)` block's index map returns `(3, 1)`. Where does the block start?
# 2. How does the bias BlockSpec make one bias row serve every row block?
# 3. For `float32` `A` of shape `(4096, 512)` and `B` of shape `(512, 256)`, which panel-matmul
#    order moves fewer bytes, and why? And with `B` of shape `(512, 128)`?
# 4. Why does the accumulating matmul not need to write the output at every step?
# 5. What goes wrong if the `k` axis is declared `"parallel"`, and which interpreter shows it?
#
# <details><summary>Answer</summary>
#
# 1. At element `(192, 256)`: `3·64` rows, `1·256` columns.
# 2. Its index map ignores the row index and always returns block row 0.
# 3. `i` innermost: `B` (0.5 MiB) is read once and `A` (8 MiB) `N/128 = 2` times, 16.5 MiB of
#    input; with `j` innermost `A` is read once but `B` `M/128 = 32` times, 24 MiB. With
#    `B` of shape `(512, 128)` the orders tie: there is a single column panel, so `B`'s block
#    index never changes in either order and both read `A` once and `B` once.
# 4. Its block index `(i, j)` is the same for all consecutive `k` steps, so the block stays on
#    chip and is written back once, when the index changes or the grid ends.
# 5. The steps may run in any order, so the `k == 0` initialisation can wipe partial sums.
#    TPU interpret mode shuffles parallel axes and gives a wrong result; `interpret=True`
#    runs in order and does not.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 3 — index
# maps](../exercises/03_index_maps/index_maps.ipynb).
