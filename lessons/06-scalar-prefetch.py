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
# # Lesson 6 — Scalar prefetch
#
# **Learning objectives.** After this lesson you can
#
# 1. pass integer arrays to the index maps with `pltpu.PrefetchScalarGridSpec`;
# 2. turn a gather into an index map: an embedding-row lookup;
# 3. write a block-sparse matmul that reads only the listed blocks;
# 4. write a grouped (ragged) matmul driven by per-step metadata;
# 5. skip copies *and* work by repeating the last block index;
# 6. read kernelsim's data-dependent traffic.
#
# Scalar prefetch is **TPU-only** in the pinned release (its GPU lowering, Triton, does not
# implement it); on the CPU these kernels run in TPU interpret mode. Rules here:
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html) and
# [sparse kernels on TPU](https://docs.jax.dev/en/latest/pallas/tpu/sparse.html).
# Matching exercises: [`../exercises/`](../exercises/).

# %%
import functools

import _course
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose

LESSON = "06-scalar-prefetch"
_course.versions()
keys = jax.random.split(jax.random.key(6), 6)
tpu_run = choose(tpu_features=True)
print("kernels in this lesson run:", tpu_run.label)


def show(rows):
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths, strict=True)))


# %% [markdown]
# ## Integers for the index maps
#
# A gather asks for blocks whose positions are *data*. Index maps can only return block
# indices, but they may read small integer arrays that were copied to SMEM before the grid
# started. `pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=n, grid=..., in_specs=...,
# out_specs=...)` marks the first `n` arguments of the call as such arrays. Then
#
# * every index map is called as `index_map(*grid_indices, *prefetch_refs)`;
# * the kernel receives `(*prefetch_refs, *input_refs, *output_refs, *scratch_refs)`.
#
# Those arrays get no BlockSpec: each sits whole in SMEM for the entire call, so together they
# must fit in it (1 MiB per core on v4 and later, lesson 5).

# %% [markdown]
# ## Embedding-row gather
#
# `out[r] = table[ids[r]]`. Grid step `r` copies row `ids[r]` of the table. A row is one
# element tall, which the TPU's (8, 128) rule only allows when the dimension is the full
# array's; so we view the table as `(V, 1, D)` and squeeze the first dimension out of the
# block with `None` (the same as `pl.Squeezed()`, lesson 3): the kernel sees `(1, D)` Refs.

# %%
def gather_rows_kernel(ids_ref, row_ref, o_ref):
    del ids_ref  # used by the index map only
    o_ref[...] = row_ref[...]


def gather_rows(ids, table, *, interpret):
    vocab, dim = table.shape
    # Consecutive equal ids reuse the row already on chip: its copy is skipped.
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(ids.shape[0],),
        in_specs=[pl.BlockSpec((None, 1, dim), lambda r, ids_ref: (ids_ref[r], 0, 0))],
        out_specs=pl.BlockSpec((None, 1, dim), lambda r, ids_ref: (r, 0, 0)),
    )
    out = pl.pallas_call(
        gather_rows_kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((ids.shape[0], 1, dim), table.dtype),
        interpret=interpret,
    )(ids, table.reshape(vocab, 1, dim))
    return out.reshape(ids.shape[0], dim)


table = jax.random.normal(keys[0], (64, 256), jnp.float32)
ids = jnp.array([3, 3, 17, 5, 5, 5, 63, 0], jnp.int32)
_course.check(LESSON, "gather_rows", gather_rows, lambda i, t: t[i], (ids, table), tpu_run,
              rtol=0, atol=0)

t = kernelsim.trace(functools.partial(gather_rows, interpret=True), ids, table)
rows = [["step", "id", "table block", "action", "bytes"]]
for e in t.steps(0):
    if e.operand == "row_ref":
        rows.append([e.step, int(ids[e.step]), e.block_index, e.action, e.bytes])
show(rows)
row_op = t.calls[0].operand("row_ref")
assert (row_op.fetches, row_op.skips) == (5, 3)

# %% [markdown]
# kernelsim evaluated the index map with the real `ids`: eight steps, five row copies, three
# skips where an id repeats the previous one. The gather did not disappear; it became a
# schedule you can read before running anything.

# %% [markdown]
# ## Block-sparse matmul
#
# `x` is a `512 × 512` matrix of `128 × 128` blocks of which only some are nonzero. For each
# output row block `i` we list its nonzero blocks; grid step `(i, k)` multiplies the `k`-th
# listed block by the matching row panel of `y`. Rows have different numbers of nonzeros, so
# each row's list is padded to the same length **by repeating its last entry**. A repeated
# block index means no copy (the block is already on chip), and `pl.when(k < counts[i])`
# skips the arithmetic: padding costs neither bytes nor FLOPs, only one grid step each (the
# fixed per-step overhead lesson 7 counts). The
# [sparse kernels page](https://docs.jax.dev/en/latest/pallas/tpu/sparse.html) builds its
# block-sparse examples on the same mechanism.

# %%
B = 128


def band_pattern(n_row_blocks, per_row):
    """Row block i holds blocks i .. i+per_row-1 (clipped); lists padded by repetition."""
    counts, cols = [], []
    for i in range(n_row_blocks):
        real = min(per_row, n_row_blocks - i)
        counts.append(real)
        cols += [i + min(k, real - 1) for k in range(per_row)]
    return np.array(counts, np.int32), np.array(cols, np.int32)


def block_sparse_kernel(counts_ref, cols_ref, x_ref, y_ref, o_ref):
    del cols_ref  # used by the index maps only
    i, k = pl.program_id(0), pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(k < counts_ref[i])  # padded steps do no work
    def _accumulate():
        o_ref[...] += jnp.dot(x_ref[...], y_ref[...],
                              precision="highest", preferred_element_type=jnp.float32)


def block_sparse_matmul(counts, cols, x, y, *, interpret):
    n_rows = x.shape[0] // B
    per_row = cols.shape[0] // n_rows

    def x_map(i, k, counts_ref, cols_ref):
        return i, cols_ref[i * per_row + k]

    def y_map(i, k, counts_ref, cols_ref):
        return cols_ref[i * per_row + k], 0

    # k innermost: the output row block stays on chip while its nonzero blocks stream in.
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(n_rows, per_row),
        in_specs=[pl.BlockSpec((B, B), x_map), pl.BlockSpec((B, y.shape[1]), y_map)],
        out_specs=pl.BlockSpec((B, y.shape[1]), lambda i, k, *_: (i, 0)),
    )
    return pl.pallas_call(
        block_sparse_kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(counts, cols, x, y)


def block_sparse_reference(counts, cols, x, y):
    n_rows = x.shape[0] // B
    per_row = cols.shape[0] // n_rows
    mask = np.zeros(x.shape, np.float32)
    for i in range(n_rows):
        for k in range(int(counts[i])):
            c = int(cols[i * per_row + k])
            mask[i * B:(i + 1) * B, c * B:(c + 1) * B] = 1
    return jnp.dot(x * mask, y, precision="highest")


counts, cols = band_pattern(4, 2)
print("counts:", counts, " cols:", cols)
x = jax.random.normal(keys[1], (512, 512), jnp.float32)
y = jax.random.normal(keys[2], (512, 256), jnp.float32)
sparse_args = (jnp.asarray(counts), jnp.asarray(cols), x, y)
# The kernel multiplies only listed blocks; the reference zeroes the others in a dense x.
_course.check(LESSON, "block_sparse_matmul", block_sparse_matmul,
              lambda _c, _l, a, b: block_sparse_reference(counts, cols, a, b), sparse_args,
              tpu_run, rtol=1e-4, atol=1e-3)

# %% [markdown]
# ## Data-dependent traffic
#
# kernelsim reads the prefetched arrays too. The last row block has one real nonzero and one
# padding entry; watch its step `(3, 1)`.

# %%
t_sparse = kernelsim.trace(functools.partial(block_sparse_matmul, interpret=True), *sparse_args)
print(t_sparse.summary(steps=2))

# %% [markdown]
# (kernelsim counts FLOPs as one kernel body per step; it does not evaluate `pl.when`, so
# its FLOP line includes the padded step the kernel skips.)
#
# The viewer shows the mechanism at work; press **End** for the last step, step 7 (steps
# count from 0) at grid point `(3, 1)`. The SMEM lane holds the prefetched `counts` and
# `cols`, with the entries the index maps just read filled in; `x` and `y` keep the block
# indices they had at step 6 (grid point `(3, 0)`), so neither is copied.

# %%
last_step = {e.operand: e for e in t_sparse.steps(0) if e.step == 7}
assert last_step["x_ref"].grid_index == (3, 1)
assert last_step["x_ref"].action == last_step["y_ref"].action == "skip"
t_sparse.show()

# %% [markdown]
# Compare with the same kernel given a fully dense pattern (all four blocks in every row): the
# bytes of `x` follow the number of listed blocks, and `y` is re-read once per listed block.

# %%
dense_counts = np.full(4, 4, np.int32)
dense_cols = np.tile(np.arange(4, dtype=np.int32), 4)
t_dense = kernelsim.trace(functools.partial(block_sparse_matmul, interpret=True),
                          jnp.asarray(dense_counts), jnp.asarray(dense_cols), x, y)
rows = [["pattern", "listed blocks", "x fetches", "x bytes", "y bytes", "total HBM bytes"]]
for name, tr, c in (("band", t_sparse, counts), ("dense", t_dense, dense_counts)):
    call = tr.calls[0]
    xo, yo = call.operand("x_ref"), call.operand("y_ref")
    rows.append([name, int(c.sum()), xo.fetches, f"{xo.hbm_read_bytes:,}",
                 f"{yo.hbm_read_bytes:,}", f"{call.hbm_read_bytes + call.hbm_write_bytes:,}"])
    assert xo.hbm_read_bytes == int(c.sum()) * B * B * 4
show(rows)

# %% [markdown]
# ## Grouped (ragged) matmul
#
# Mixture-of-experts layers multiply each token by *its* expert's weights: rows of `x` are
# sorted by group, group `g` has `sizes[g]` rows, and `out[rows of g] = x[rows of g] @ w[g]`.
# Group boundaries need not fall on row-block boundaries, so a row block may belong to two or
# more groups. We make a list of *work items* — pairs `(row block, group)` that overlap — and
# run one grid step per item. Each step masks the rows outside its group. Items are sorted by
# row block, so an output block is visited in consecutive steps and written back once, when
# its index changes or the grid ends.

# %%
def work_items(sizes, block):
    """Per grid step: row block, group, and whether it is the row block's first visit."""
    ends = np.cumsum(sizes)
    starts = ends - sizes
    tiles, groups, first = [], [], []
    for tile in range(int(ends[-1]) // block):
        lo, hi = tile * block, (tile + 1) * block
        overlapping = [g for g in range(len(sizes)) if starts[g] < hi and ends[g] > lo]
        for n, g in enumerate(overlapping):
            tiles.append(tile)
            groups.append(g)
            first.append(int(n == 0))
    as_i32 = functools.partial(np.array, dtype=np.int32)
    return as_i32(tiles), as_i32(groups), as_i32(first), as_i32(starts), as_i32(ends)


def grouped_kernel(tiles_ref, groups_ref, first_ref, starts_ref, ends_ref, x_ref, w_ref, o_ref):
    step = pl.program_id(0)
    g = groups_ref[step]

    @pl.when(first_ref[step] == 1)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    row = tiles_ref[step] * B + jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
    in_group = (row >= starts_ref[g]) & (row < ends_ref[g])
    product = jnp.dot(x_ref[...], w_ref[...],
                      precision="highest", preferred_element_type=jnp.float32)
    o_ref[...] += jnp.where(in_group, product, 0.0)


def grouped_matmul(tiles, groups, first, starts, ends, x, w, *, interpret):
    _, kdim = x.shape
    n = w.shape[2]
    # Steps are sorted by row block: x's block and the output block are reused across the
    # groups of one row block; w[g] is reused while consecutive steps share a group.
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(tiles.shape[0],),
        in_specs=[pl.BlockSpec((B, kdim), lambda s, t, g, *_: (t[s], 0)),
                  pl.BlockSpec((None, kdim, n), lambda s, t, g, *_: (g[s], 0, 0))],
        out_specs=pl.BlockSpec((B, n), lambda s, t, g, *_: (t[s], 0)),
    )
    return pl.pallas_call(
        grouped_kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(tiles, groups, first, starts, ends, x, w)


sizes = np.array([100, 200, 50, 162])
meta = tuple(jnp.asarray(a) for a in work_items(sizes, B))
print("work items (row block, group):", list(zip(meta[0].tolist(), meta[1].tolist(),
                                                   strict=True)))
xg = jax.random.normal(keys[3], (int(sizes.sum()), 256), jnp.float32)
wg = jax.random.normal(keys[4], (len(sizes), 256, 128), jnp.float32)


def grouped_reference(x, w):
    group_of_row = np.repeat(np.arange(len(sizes)), sizes)
    return jnp.einsum("rk,rkn->rn", x, w[group_of_row], precision="highest")


_course.check(LESSON, "grouped_matmul", grouped_matmul,
              lambda *a: grouped_reference(a[-2], a[-1]), (*meta, xg, wg), tpu_run,
              rtol=1e-4, atol=1e-3)
t_grouped = kernelsim.trace(functools.partial(grouped_matmul, interpret=True), *meta, xg, wg)
print(t_grouped)
grouped_call = t_grouped.calls[0]
assert grouped_call.steps == 7
assert grouped_call.operand("x_ref").fetches == grouped_call.operand("o_ref").writebacks == 4

# %% [markdown]
# Seven work items for four row blocks and four groups: `x` is fetched once per row block,
# each expert's weights once per run of consecutive steps that use it, and the output once per
# row block. The same idea, with many refinements, drives the grouped-matmul kernel that
# ships with JAX (`jax.experimental.pallas.ops.tpu.megablox`).

# %% [markdown]
# ## Check yourself
#
# 1. In what order does the kernel of a `PrefetchScalarGridSpec` call receive its arguments?
# 2. Why does the embedding gather view the table as `(V, 1, D)`?
# 3. Why is each row's list of nonzero blocks padded with its *last* entry, not with block 0?
# 4. kernelsim's trace of the block-sparse matmul never ran the kernel. How did it know which
#    blocks are read?
# 5. Why must the grouped matmul's work items be sorted by row block?
#
# <details><summary>Answer</summary>
#
# 1. Prefetched scalar refs first, then inputs, outputs and scratch.
# 2. A block one row tall breaks the (8, 128) rule unless that dimension is the whole array's;
#    with `(V, 1, D)` the block `(None, 1, D)` squeezes `V` and its last two dims are the full
#    `(1, D)`.
# 3. An unchanged block index between consecutive steps means no copy; padding with block 0
#    would fetch a block for nothing (and, without the `pl.when`, add a block that should
#    count as zero).
# 4. It evaluated the index maps with the actual prefetched `counts` and `cols`.
# 5. The output block accumulates across its groups; it must stay on chip over consecutive
#    steps. An output's default revisit mode, `pl.RevisitMode.IMMEDIATE`, allows a block to
#    come back only at the very next step; coming back later leaves its contents undefined
#    (the pipeline does not read a written-back block back in). `pl.Buffered(1,
#    revisit=pl.RevisitMode.ANY)` adds the copies that make a later return correct, at that
#    cost (the pinned release's lowering refuses `ANY` with double buffering). TPU interpret
#    mode raises a "Revisited block" error on a later return whatever the mode, unless the
#    output aliases an input.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 5 — scalar
# prefetch](../exercises/05_scalar_prefetch/scalar_prefetch.ipynb).
