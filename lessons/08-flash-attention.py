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
# # Lesson 8 — Flash attention
#
# **Learning objectives.** After this lesson you can
#
# 1. count the HBM traffic of naive attention and of a blocked (flash) schedule;
# 2. derive the online softmax: running maximum, running sum, rescaled accumulator;
# 3. write a Pallas forward kernel with the key/value loop innermost — once as an
#    `"arbitrary"` grid axis with VMEM scratch, once as a loop inside the kernel;
# 4. compare kernelsim's traffic with the FlashAttention IO bound;
# 5. check the kernel against `jax.nn.dot_product_attention`;
# 6. make it causal: mask scores inside a block, and skip the key/value blocks above the
#    diagonal — their work with `pl.when`, their copies with an index map that clamps;
# 7. draw dropout's random bits inside the kernel, a key of its own for every grid step, and
#    check a kernel whose output is random by what a right one shows.
#
# Rules here: [Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html),
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html) and
# [TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html).
# Matching exercises: [`../exercises/`](../exercises/).

# %%
import functools
import math

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose, platform

LESSON = "08-flash-attention"
_course.versions()
H, N, D = 2, 256, 64  # heads, sequence length, head dimension
kq, kk, kv = jax.random.split(jax.random.key(8), 3)
q = jax.random.normal(kq, (H, N, D), jnp.float32)
k = jax.random.normal(kk, (H, N, D), jnp.float32)
v = jax.random.normal(kv, (H, N, D), jnp.float32)
SCALE = 1 / math.sqrt(D)


def show(rows):
    """Print a list of rows (first row = header) as aligned columns."""
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths, strict=True)))


def attention_reference(q, k, v):
    """Plain JAX, one softmax over each full row of scores."""
    scores = jnp.einsum("hqd,hkd->hqk", q, k, precision="highest") * SCALE
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), v, precision="highest")


# jax.nn.dot_product_attention wants (batch, sequence, heads, head_dim).
to_bshd = functools.partial(jnp.transpose, axes=(1, 0, 2))
with jax.default_matmul_precision("highest"):  # float32 in float32, as the reference (a TPU's
    # default multiplies float32 in one bfloat16 pass: lesson 7)
    library = jax.nn.dot_product_attention(to_bshd(q)[None], to_bshd(k)[None], to_bshd(v)[None])
np.testing.assert_allclose(attention_reference(q, k, v), to_bshd(library[0]),
                           rtol=1e-5, atol=1e-5)
print("plain-JAX reference agrees with jax.nn.dot_product_attention")

# %% [markdown]
# ## Where naive attention's bytes go
#
# Naive attention puts the `N × N` scores in main memory (HBM on an accelerator), then the `N × N`
# probabilities. Even an optimistic count — each matrix written once and read once — gives four
# passes over `N²` elements, against `4·N·d` for `Q`, `K`, `V` and the output. Lesson 1's CPU HLO
# makes five: its first fusion writes the exponentiated scores, which are read twice (for the row
# sums and for the normalisation), and the normalised probabilities are written and read once.
# At `N = 4096`, `d = 128` four passes are already 32 times the linear term.

# %% [markdown]
# ## The online softmax
#
# The fix is to never hold a full row of scores. Process keys in blocks; for each query row
# keep three running quantities: the maximum `m` seen so far, the sum `denom` of
# `exp(score - m)`, and the accumulator `acc` of `exp(score - m) · v`. When a new block of
# scores `s` arrives:
#
# * `m_new = max(m, rowmax(s))`;
# * `alpha = exp(m - m_new)` rescales everything accumulated under the old maximum;
# * `denom = alpha · denom + rowsum(exp(s - m_new))`;
# * `acc = alpha · acc + exp(s - m_new) @ v_block`.
#
# After the last block, `acc / denom` is the softmax-weighted sum — exactly, not approximately.
# Subtracting the running maximum keeps every `exp` at most 1, as a stable softmax does.

# %%
def online_softmax_attention(q, k, v, block):
    """The same recurrence in plain JAX, one key block at a time (one head)."""
    m = jnp.full((q.shape[0], 1), -jnp.inf)
    denom = jnp.zeros((q.shape[0], 1))
    acc = jnp.zeros_like(q)
    for start in range(0, k.shape[0], block):
        s = jnp.dot(q, k[start:start + block].T, precision="highest") * SCALE
        m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        denom = alpha * denom + p.sum(axis=1, keepdims=True)
        acc = alpha * acc + jnp.dot(p, v[start:start + block], precision="highest")
        m = m_new
    return acc / denom


np.testing.assert_allclose(online_softmax_attention(q[0], k[0], v[0], 64),
                           attention_reference(q, k, v)[0], rtol=1e-4, atol=1e-5)
print("online softmax over 64-key blocks equals the full softmax")

# %% [markdown]
# ## Kernel 1: the key/value loop as an "arbitrary" grid axis
#
# Grid `(heads, query blocks, key/value blocks)`, the last axis innermost and `"arbitrary"`.
# The query block and the output block keep the same index for all key/value steps, so they
# stay on chip; `m`, `denom` and `acc` live in VMEM scratch and persist across those steps.
# `pl.when` initialises them at the first key/value step and writes `acc / denom` at the last.
# The head axis is squeezed out of the blocks with `None`. VMEM scratch and
# `pltpu.CompilerParams` make this kernel **TPU-only**. The `causal` switch stays off until
# the section on causal attention below.
#
# `m` and `denom` are `(bq, 128)`, not `(bq, 1)`: every lane of a row holds the same value,
# as in the kernel that ships with JAX (`jax.experimental.pallas.ops.tpu.flash_attention`).
# A vector register is 8 rows by 128 lanes (TPU details, "Array Layouts"); a `(bq, 1)` column
# fills one lane of each, and using it against the `(bq, bkv)` scores or the `(bq, d)`
# accumulator first spreads that lane across the other 127, at every step. Rows that already
# hold their value in every lane are widened by `jnp.tile`, which copies whole registers side
# by side (`widen` below). The section "The ladder" measures what this is worth on a chip.
# The max of a block's scores along its rows is already in every lane: a reduction across
# lanes leaves its result in all of them.
#
# `chunk` splits a key/value block into sub-blocks the body folds in one after another (a
# Python loop, unrolled): the pipeline still copies `bkv` keys per step, so the steps, and
# their fixed cost, stay few, while the `(bq, chunk)` scores and probabilities stay small.

# %%
LANES = 128  # lanes of a vector register: the width of the running max and sum


def last_kv_block(i, bq, bkv):
    """The last key/value block holding a key at or before query block i's last query."""
    return (i * bq + bq - 1) // bkv


def widen(stat, width):
    """A (bq, LANES) statistic whose lanes hold one value per row, as ``width`` lanes: whole
    registers copied side by side, then cut to ``width``; no value crosses lanes. A (bq, 1)
    column (the ladder's first rung, below) is left for the arithmetic to broadcast."""
    if stat.shape[1] == 1:
        return stat
    return jnp.tile(stat, (1, pl.cdiv(width, LANES)))[:, :width]


def flash_step(i, j, last, q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref, *, causal,
               chunk=None, drop=None):
    """Fold key/value block j into query block i's running max, sum and accumulator; write
    the output at block ``last``, the last one i needs. ``chunk``: keys per sub-block (None:
    the whole block); ``drop``: None, or a function of a block's probabilities that drops
    some (dropout, below)."""
    (bq, d), bkv = q_ref.shape, k_ref.shape[0]
    chunk = chunk or bkv
    # float32 blocks: several MXU passes, exact; bfloat16 blocks: one pass, the MXU's own type
    # (Mosaic refuses a bfloat16 dot at "highest"). Lesson 7 says why.
    precision = "highest" if q_ref.dtype == jnp.float32 else None

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        denom_ref[...] = jnp.zeros_like(denom_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def fold_in(start):
        keys = pl.ds(start, chunk)
        # q kᵀ as one dot_general contracting both operands' last axis: no transpose written
        s = jax.lax.dot_general(q_ref[...], k_ref[keys, :], (((1,), (1,)), ((), ())),
                                precision=precision, preferred_element_type=jnp.float32) * SCALE
        if causal:  # Python `if`: decided at trace time, giving two kernels
            q_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            k_pos = j * bkv + start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(k_pos <= q_pos, s, -jnp.inf)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - widen(m_new, chunk))
        alpha = jnp.exp(m_prev - m_new)
        denom_ref[...] = alpha * denom_ref[...] + p.sum(axis=1, keepdims=True)
        kept = p if drop is None else drop(p)  # the sum above counts every key, dropped or not
        acc_ref[...] = widen(alpha, d) * acc_ref[...] + jnp.dot(
            kept.astype(v_ref.dtype), v_ref[keys, :], precision=precision,
            preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    for start in range(0, bkv, chunk):
        if causal:  # a sub-block wholly above the diagonal contributes nothing: skip its work
            pl.when(j * bkv + start <= i * bq + bq - 1)(functools.partial(fold_in, start))
        else:
            fold_in(start)

    @pl.when(j == last)
    def _finalize():  # one division per query block, not one per step
        o_ref[...] = (acc_ref[...] / widen(denom_ref[...], d)).astype(o_ref.dtype)


def flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref, *, causal, chunk=None,
                 drop=None):
    i, j = pl.program_id(1), pl.program_id(2)
    last = last_kv_block(i, q_ref.shape[0], k_ref.shape[0]) if causal else pl.num_programs(2) - 1
    flash_step(i, j, last, q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref,
               causal=causal, chunk=chunk, drop=drop)


def statistics_scratch(bq, d, lanes=None):
    """VMEM for the running max and sum, (bq, lanes) each (None: LANES), and the
    accumulator, (bq, d)."""
    lanes = lanes or LANES
    return [pltpu.VMEM((bq, lanes), jnp.float32), pltpu.VMEM((bq, lanes), jnp.float32),
            pltpu.VMEM((bq, d), jnp.float32)]


def flash_attention(q, k, v, *, bq=128, bkv=128, chunk=None, causal=False, vmem_limit=None,
                    lanes=None, interpret):
    # vmem_limit: scoped VMEM bytes for the compiler (None: its default; lesson 7); lanes: the
    # statistics' width (None: LANES; 1: a (bq, 1) column, the ladder's first rung)
    heads, n, d = q.shape

    def kv_map(h, i, j):
        # causal: past the query block's last needed key block, repeat that block's index, so
        # the pipeline sees no change and fetches nothing
        return h, jnp.minimum(j, last_kv_block(i, bq, bkv)) if causal else j, 0

    # kv innermost: the q block, the output block and the m/denom/acc scratch stay on chip while
    # K and V stream past; K and V are re-read once per query block.
    return pl.pallas_call(
        functools.partial(flash_kernel, causal=causal, chunk=chunk),
        grid=(heads, n // bq, n // bkv),
        in_specs=[pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0)),
                  pl.BlockSpec((None, bkv, d), kv_map),
                  pl.BlockSpec((None, bkv, d), kv_map)],
        out_specs=pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0)),
        scratch_shapes=statistics_scratch(bq, d, lanes),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
    )(q, k, v)


_course.check(LESSON, "flash_attention_grid", flash_attention, attention_reference, (q, k, v),
              choose(tpu_features=True), rtol=1e-4, atol=1e-5)

# %% [markdown]
# ## Kernel 2: the loop inside the kernel
#
# The same recurrence with `jax.lax.fori_loop` in the body: each grid step owns one query
# block, receives the whole of this head's `K` and `V`, and walks them in `bkv` slices with
# `pl.ds`. No scratch and no TPU compiler parameters are needed — the running values are loop
# carries — so this version is also a candidate for the GPU lowering. The price: `K` and `V`
# for a head must fit on chip at once. On TPU the pinned release's lowering turns the
# `fori_loop` into a real loop, unrolled only as far as `unroll=` asks (lesson 1).

# %%
def flash_loop_kernel(q_ref, k_ref, v_ref, o_ref, *, bkv):
    q_block = q_ref[...]
    n_kv = k_ref.shape[0] // bkv

    def body(j, carry):
        m, denom, acc = carry
        rows = pl.ds(j * bkv, bkv)
        s = jnp.dot(q_block, k_ref[rows, :].T, precision="highest",
                    preferred_element_type=jnp.float32) * SCALE
        m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        denom = alpha * denom + p.sum(axis=1, keepdims=True)
        acc = alpha * acc + jnp.dot(p, v_ref[rows, :], precision="highest",
                                    preferred_element_type=jnp.float32)
        return m_new, denom, acc

    bq = q_block.shape[0]
    init = (jnp.full((bq, 1), -jnp.inf, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
            jnp.zeros((bq, q_block.shape[1]), jnp.float32))
    _, denom, acc = jax.lax.fori_loop(0, n_kv, body, init)
    o_ref[...] = (acc / denom).astype(o_ref.dtype)


def flash_attention_loop(q, k, v, *, bq=128, bkv=64, interpret):
    heads, n, d = q.shape
    # i innermost: this head's whole K and V stay on chip while the query blocks go by.
    return pl.pallas_call(
        functools.partial(flash_loop_kernel, bkv=bkv),
        grid=(heads, n // bq),
        in_specs=[pl.BlockSpec((None, bq, d), lambda h, i: (h, i, 0)),
                  pl.BlockSpec((None, n, d), lambda h, i: (h, 0, 0)),
                  pl.BlockSpec((None, n, d), lambda h, i: (h, 0, 0))],
        out_specs=pl.BlockSpec((None, bq, d), lambda h, i: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
    )(q, k, v)


_course.check(LESSON, "flash_attention_loop", flash_attention_loop, attention_reference,
              (q, k, v), choose(tpu_features=False, gpu_ok=True), rtol=1e-4, atol=1e-5)

# %% [markdown]
# ## Traffic: kernelsim against the IO bound
#
# For kernel 1 with `kv` innermost, each `(head, query block)` pair reads its `Q` block once
# and writes its output once, but reads all of `K` and `V`. Per head that is
# `s·(2·N·d + 2·N²·d / bq)` bytes, `s` bytes per element.
#
# The FlashAttention paper (Dao et al., 2022, arXiv:2205.14135) counts, for `M` elements of
# fast memory with `d ≤ M ≤ N·d`: standard attention makes `Θ(N·d + N²)` HBM accesses,
# FlashAttention `Θ(N²·d² / M)` (Theorem 2). Its Proposition 3 is the lower bound: no exact
# attention algorithm makes `o(N²·d² / M)` accesses for every `M` in that range.
#
# Our count has the same shape: with `bq` proportional to `M / d`, the re-read term
# `2·N²·d / bq` becomes proportional to `N²·d² / M`.
# kernelsim counts the blocks the pipeline actually moves for `N = 4096`, `d = 128`, `bfloat16`,
# one head:

# %%
NB, DB = 4096, 128
shape = jax.ShapeDtypeStruct((1, NB, DB), jnp.bfloat16)
s_bytes = 2
naive = s_bytes * (4 * NB * DB + 4 * NB * NB)  # q, k, v, out + S and P each written and read
rows = [["bq", "bkv", "kernelsim HBM bytes", "formula", "on-chip peak", "vs naive"]]
sweep = []
for bq in (128, 256, 512, 1024):
    fn = functools.partial(flash_attention, bq=bq, bkv=128, interpret=True)
    d = kernelsim.trace(fn, shape, shape, shape, chip="tpu-v5e").to_dict()["calls"][0]
    total = d["hbm_read_bytes"] + d["hbm_write_bytes"]
    formula = s_bytes * (2 * NB * DB + 2 * NB * NB * DB // bq)
    assert total == formula, (bq, total, formula)
    sweep.append((bq, total))
    rows.append([bq, 128, f"{total:,}", f"{formula:,}", f"{d['onchip_peak_bytes']:,}",
                 f"{naive / total:.1f}x less"])
show(rows)
print(f"naive attention, same shape, optimistic four-pass count: {naive:,} bytes")

# %%
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 3.4))
ax.plot([b for b, _ in sweep], [t / 2**20 for _, t in sweep], marker="o", label="kernelsim")
ax.axhline(naive / 2**20, color="gray", linestyle="--", label="naive, four passes over N²")
ax.axhline(s_bytes * 4 * NB * DB / 2**20, color="black", linestyle=":",
           label="Q, K, V, O once")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("bq (query rows per block)")
ax.set_ylabel("HBM traffic (MiB)")
ax.legend()
fig.tight_layout()

# %% [markdown]
# Traffic falls like `1 / bq` — doubling the query block halves the `K`/`V` re-reads — until
# it nears the compulsory `4·N·d` elements. The key/value block size does not appear: `bkv`
# changes how many steps there are, not how often each byte moves.
#
# Where the re-reads happen is clearer per block. For `N = 1024`, `bq = 256`, `bkv = 128`,
# each `Q` block and each output block moves once, and every `K` and `V` block `N / bq = 4`
# times, once per query block.

# %%
shape_1k = jax.ShapeDtypeStruct((1, 1024, DB), jnp.bfloat16)
t_flash = kernelsim.trace(functools.partial(flash_attention, bq=256, bkv=128, interpret=True),
                          shape_1k, shape_1k, shape_1k, chip="tpu-v5e")
t_flash.heatmap()

# %% [markdown]
# Step through the run in the viewer. At step 11, grid point `(head 0, query block 1, key
# block 3)`, the `Q` block and the output block stay put while `K` and `V` stream past, and
# the three scratch buffers hold `m`, `denom` and `acc`.

# %%
step_11 = {e.operand: e for e in t_flash.steps(0) if e.step == 11}
assert step_11["q_ref"].grid_index == (0, 1, 3)
assert step_11["q_ref"].action == "skip" and step_11["k_ref"].action == "fetch"
t_flash.show()

# %% [markdown]
# ## Causal attention
#
# In a decoder, query `t` may attend only to keys `0 … t`: the scores above the diagonal are
# set to `-inf` before the softmax, so their weights are zero. The plain-JAX reference masks
# the full score matrix; `jax.nn.dot_product_attention(..., is_causal=True)` agrees with it.

# %%
def causal_attention_reference(q, k, v):
    scores = jnp.einsum("hqd,hkd->hqk", q, k, precision="highest") * SCALE
    visible = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    scores = jnp.where(visible, scores, -jnp.inf)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), v, precision="highest")


with jax.default_matmul_precision("highest"):
    library_causal = jax.nn.dot_product_attention(to_bshd(q)[None], to_bshd(k)[None],
                                                  to_bshd(v)[None], is_causal=True)
np.testing.assert_allclose(causal_attention_reference(q, k, v), to_bshd(library_causal[0]),
                           rtol=1e-5, atol=1e-5)
print("causal reference agrees with jax.nn.dot_product_attention(is_causal=True)")

# %% [markdown]
# Kernel 1 with `causal=True` handles the diagonal in two ways, one per kind of block:
#
# * a block that **straddles** the diagonal is masked inside the kernel: each score's query
#   and key position come from `program_id` times the block size plus an iota (lesson 3's
#   ragged mask), and scores with `key > query` become `-inf`;
# * a block wholly **above** it — its first key after the query block's last query — would
#   contribute nothing. `pl.when(kv_step <= last_kv_block(...))` skips its work, and the
#   key/value index map clamps `j` to that same last block, so for the remaining steps the
#   block index repeats and the pipeline fetches nothing (lesson 6's repeated index).
#
# The grid keeps its shape, so the last step still writes `acc / denom`. No row divides by
# zero or meets `exp(-inf - (-inf))`: key block 0 comes first and holds key 0, which every
# query sees, so each row's running maximum is finite from the first step on.

# %%
_course.check(LESSON, "flash_attention_causal",
              functools.partial(flash_attention, bkv=64, causal=True),
              causal_attention_reference, (q, k, v), choose(tpu_features=True),
              rtol=1e-4, atol=1e-5)

# %% [markdown]
# kernelsim shows the skipped copies. For `N = 1024`, `bq = 256`, `bkv = 128` query block `i`
# needs key blocks `0 … 2i + 1`: 2, 4, 6 and 8 of the 8, 20 of the grid's 32 key steps. The
# heatmap counts each `K` block's copies: block 0 by every query block, block 7 by the last
# one only. (kernelsim's FLOP count evaluates each `pl.when` too, as for the broadcasts
# above, so the skipped steps' arithmetic is not counted either.)

# %%
rows = [["kernel", "K fetches", "K skips", "K bytes", "total HBM bytes"]]
traces = {}
for causal in (False, True):
    traces[causal] = kernelsim.trace(
        functools.partial(flash_attention, bq=256, bkv=128, causal=causal, interpret=True),
        shape_1k, shape_1k, shape_1k, chip="tpu-v5e")
    call = traces[causal].calls[0]
    k_op = call.operand("k_ref")
    rows.append(["causal" if causal else "full", k_op.fetches, k_op.skips,
                 f"{k_op.hbm_read_bytes:,}", f"{call.hbm_read_bytes + call.hbm_write_bytes:,}"])
show(rows)
needed = sum(last_kv_block(i, 256, 128) + 1 for i in range(1024 // 256))
assert needed == 20
assert traces[True].calls[0].operand("k_ref").fetches == needed
assert traces[False].calls[0].operand("k_ref").fetches == (1024 // 256) * (1024 // 128)
traces[True].heatmap()

# %% [markdown]
# ### Causal without idle steps
#
# The skipped steps still cost something: each is a grid step, and every step pays a fixed
# cost for the pipeline's bookkeeping (lesson 7), even when its body does nothing. At
# `N = 8192` with 512 blocks, 120 of each head's 256 steps are idle. A grid made of the
# needed `(query block, key block)` pairs alone has no idle step: list the pairs, query block
# by query block, in two int32 tables, and hand them to the kernel by scalar prefetch
# (lesson 6). Grid step `t` reads its pair from the tables, its index maps send `Q` and the
# output to block `q_of[t]` and `K` and `V` to block `kv_of[t]`, and the running state
# starts at key block 0 and is written out at the query block's last pair. The tables are 1-D:
# a 2-D table read in an index map halted the v5e's core with this JAX release
# (`bench/recorded/kv_halt_probe-v5e.json`).

# %%
def causal_flash_kernel(q_of, kv_of, q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref, *,
                        chunk=None):
    t = pl.program_id(1)
    i, j = q_of[t], kv_of[t]
    flash_step(i, j, last_kv_block(i, q_ref.shape[0], k_ref.shape[0]), q_ref, k_ref, v_ref,
               o_ref, m_ref, denom_ref, acc_ref, causal=True, chunk=chunk)


def causal_flash_attention(q, k, v, *, bq=128, bkv=128, chunk=None, vmem_limit=None,
                           interpret):
    heads, n, d = q.shape
    pairs = [(i, j) for i in range(n // bq) for j in range(last_kv_block(i, bq, bkv) + 1)]
    q_of = jnp.array([i for i, _ in pairs], jnp.int32)
    kv_of = jnp.array([j for _, j in pairs], jnp.int32)
    rows = pl.BlockSpec((None, bq, d), lambda h, t, q_of, kv_of: (h, q_of[t], 0))
    kv = pl.BlockSpec((None, bkv, d), lambda h, t, q_of, kv_of: (h, kv_of[t], 0))
    return pl.pallas_call(
        functools.partial(causal_flash_kernel, chunk=chunk),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(heads, len(pairs)), in_specs=[rows, kv, kv],
            out_specs=rows, scratch_shapes=statistics_scratch(bq, d)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
    )(q_of, kv_of, q, k, v)


_course.check(LESSON, "causal_flash_attention",
              functools.partial(causal_flash_attention, bq=128, bkv=64),
              causal_attention_reference, (q, k, v), choose(tpu_features=True),
              rtol=1e-4, atol=1e-5)

# %% [markdown]
# kernelsim counts the steps and the idle ones (a step whose body computes and stores
# nothing). The same 20 copies of `K` as the clamped kernel, in 20 steps instead of 32.

# %%
triangle = kernelsim.trace(
    functools.partial(causal_flash_attention, bq=256, bkv=128, interpret=True),
    shape_1k, shape_1k, shape_1k, chip="tpu-v5e").calls[0]
rectangle = traces[True].calls[0]
rows = [["causal kernel", "steps", "idle steps", "K fetches"]]
for name, call in (("rectangle, clamped", rectangle), ("needed pairs only", triangle)):
    rows.append([name, call.steps, call.steps - call.cost.working_steps,
                 call.operand("k_ref").fetches])
show(rows)
assert triangle.steps == triangle.cost.working_steps == needed
assert triangle.operand("k_ref").fetches == needed
assert rectangle.steps == 32 and rectangle.cost.working_steps == needed

# %% [markdown]
# ## The ladder: from the first kernel to the library's speed
#
# kernelsim's time is a model; the chip is the judge. Each rung below changes one thing, and
# each was timed on a TPU v5e (its JAX release: lessons/CHECKED.md) as device time: many
# calls inside one jitted loop (`kernelsim.timing`), bfloat16, `d = 128`, 32 heads of
# `N = 2048` and 8 of `N = 8192`.
# The rungs come from `bench/speed_probe.py` (`bench/recorded/speed_probe-v5e-flash.json`,
# 512 blocks); the last two rows from `bench/speed.py` (`bench/recorded/speed-v5e.json`),
# each kernel at its own fastest blocks.
#
# 1. **`(bq, 1)` statistics.** The running max and sum as one column: at every step,
#    `s - m_new` and `alpha * acc` first spread a column across the 128 lanes.
# 2. **`(bq, 128)` statistics**, every lane of a row holding its value, widened by
#    `jnp.tile`: no column crosses lanes. The largest gain, 1.6-1.8 times faster.
# 3. **The mask only where the diagonal runs** (causal): the iota, compare and select left
#    out of the blocks wholly below the diagonal. No gain: beside the `exp` of every score
#    they cost little, so kernel 1 keeps the simpler form.
# 4. **Needed pairs only** (causal): `causal_flash_attention`, no idle steps.
# 5. **Larger blocks.** Fewer steps, so less fixed cost per step; with `chunk`, a
#    key/value block of 1024 is folded in as two sub-blocks of 512, so the scores stay
#    `(bq, 512)`. The fastest: `bq = bkv = 1024` in chunks of 512 for the full kernel, and
#    for the causal one 512 blocks up to `N = 4096`, 1024 in chunks of 512 at 8192.
#
# The last rungs are 1.02-1.05 times the bundled kernel's speed at `N = 2048`, 4096 and
# 8192, causal and not (4096 is in the record, not plotted here). Two things it does that
# these kernels do not: it divides the accumulator by the running sum at every step, where
# these divide once, at the last; and its causal grid keeps the idle steps.

# %%
LADDER_MS = {  # device time (ms); the records named above
    "(bq, 1) statistics": {"2048": 0.898, "2048 causal": 0.672, "8192": 3.499,
                           "8192 causal": 2.088},
    "(bq, 128) statistics": {"2048": 0.518, "2048 causal": 0.420, "8192": 1.940,
                             "8192 causal": 1.261},
    "mask on the diagonal only": {"2048 causal": 0.426, "8192 causal": 1.278},
    "needed pairs only": {"2048 causal": 0.355, "8192 causal": 1.114},
    "fastest blocks": {"2048": 0.489, "2048 causal": 0.350, "8192": 1.833,
                       "8192 causal": 1.078},
    "JAX's bundled kernel, fastest blocks": {"2048": 0.498, "2048 causal": 0.358,
                                             "8192": 1.918, "8192 causal": 1.106},
}
columns = ["2048", "2048 causal", "8192", "8192 causal"]
show([["rung", *(f"N = {c} (ms)" for c in columns)]]
     + [[name, *(f"{ms[c]:.3f}" if c in ms else "-" for c in columns)]
        for name, ms in LADDER_MS.items()])
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 3.2))
names = list(LADDER_MS)
for offset, column in zip((-0.3, -0.1, 0.1, 0.3), columns, strict=True):
    ax.barh([i + offset for i, n in enumerate(names) if column in LADDER_MS[n]],
            [LADDER_MS[n][column] for n in names if column in LADDER_MS[n]],
            height=0.19, label=f"N = {column}")
ax.set_yticks(range(len(names)), names)
ax.invert_yaxis()
ax.set_xlabel("device time on a TPU v5e (ms)")
ax.legend(loc="lower right", fontsize="small")
fig.tight_layout()

# %% [markdown]
# kernelsim sees each rung as a different count, not as a different clock:
#
# * rungs 1 and 2 move the same bytes in the same steps; what differs is the vector
#   registers of columns spread across the lanes. With 512 blocks the column form spreads
#   two 64-register columns at every step, `m_new` over the scores and `alpha` over the
#   accumulator, and a third, `denom`, in the division of the last step; the lane form
#   spreads none. A reduction's result, such as `s.max(axis=1, keepdims=True)`, is in every
#   lane already and costs none. kernelsim charges each spread register a time of its own.
#   That charge was fitted on timings of these same two forms, the rungs plotted above
#   (`bench/fa_probe.py`'s column and tiled variants, fitted rows of
#   `bench/recorded/tpu_perf-v5e.json`), so kernelsim agreeing with them is by
#   construction, not a prediction;
# * rung 4 has the same working steps and bytes as the clamped kernel and no idle steps
#   (the table above: 20 steps instead of 32);
# * rung 5 has fewer steps for the same bytes of `Q` and the output, and fewer re-reads of
#   `K` and `V` when `bq` grows.

# %%
big = jax.ShapeDtypeStruct((1, 2048, DB), jnp.bfloat16)
rows = [["kernel 1, 512 blocks", "spread registers, key steps 0-3", "steps", "HBM bytes"]]
counts = {}
for lanes in (1, LANES):
    call = kernelsim.trace(functools.partial(flash_attention, bq=512, bkv=512, lanes=lanes,
                                             interpret=True), big, big, big,
                           chip="tpu-v5e").calls[0]
    counts[lanes] = call.call.step_work.lane_broadcast_vregs[:4].tolist()
    rows.append([f"({512}, {lanes}) statistics", counts[lanes], call.steps,
                 f"{call.hbm_read_bytes + call.hbm_write_bytes:,}"])
show(rows)
assert counts[1] == [2 * 512 // 8] * 3 + [3 * 512 // 8] and counts[LANES] == [0] * 4

# %% [markdown]
# ## Dropout inside the kernel
#
# Training drops attention probabilities: each entry of `P = softmax(q kᵀ / √d)` is kept with
# probability `1 - rate` and scaled by `1 / (1 - rate)` (so its expectation stays `P`), or set
# to 0. Flash attention never holds `P` in HBM, so the mask has to be drawn inside the kernel,
# one `(bq, bkv)` block per grid step. Two things must hold: every block draws **different**
# bits, and the same seed draws the **same** bits again (a backward pass redraws the mask
# rather than storing `N²` of it). Both follow from one rule: make each step's generator state
# from the seed and the step's grid position. That redraws the same mask only on the same
# tiles: a backward kernel with other blocks than the forward's (lesson 12's has them) would
# fold other positions into its keys. The end of this section shows the way out,
# `pltpu.sample_block`.
#
# Pallas on a TPU offers two generators.
#
# * The TensorCore's own: `pltpu.prng_seed(*seeds)` seeds it (pass the seed and the program
#   ids), `pltpu.prng_random_bits(shape)` draws int32 words of a 2-D or larger shape;
#   `pltpu.stateful_uniform` and `pltpu.stateful_bernoulli` are built on it, and so is
#   `pltpu.sample_block` given a key from `pltpu.to_pallas_key`. Mosaic lowers a draw to one
#   `tpu.prng_random_bits` operation, but TPU interpret mode returns zeros for it (an
#   unimplemented TODO in JAX's interpreter), and the plain interpreter cannot run it on a CPU
#   at all: off a TPU nothing checks a kernel that uses it.
# * `jax.random` itself: `jax.random.key(seed)`, `jax.random.fold_in(key, n)` and
#   `jax.random.bits(key, shape)` inside the kernel body. Mosaic lowers its threefry hash to
#   vector integer instructions (twenty rounds of add, rotate and xor per pair of words: more
#   work than the hardware's draw), and interpret mode runs the same hash, so the bits are the
#   same on the chip, in interpret mode, and outside any kernel. The kernel below uses it.
#
# The cell shows the first generator in this session's mode: on a CPU, zeros.

# %%
def hardware_bits(seed, *, interpret):
    def kernel(seed_ref, bits_ref):
        pltpu.prng_seed(seed_ref[0], pl.program_id(0))  # the seed and the step
        bits_ref[...] = pltpu.prng_random_bits(bits_ref.shape)

    return pl.pallas_call(
        kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int32), interpret=interpret,
    )(seed)


drawn = np.asarray(hardware_bits(jnp.array([42], jnp.int32),
                                 interpret=choose(tpu_features=True).interpret))
if platform() == "tpu":
    assert (drawn[:8] != drawn[8:]).any(), "the two steps drew the same bits"
    print(f"compiled on the TPU: {len(np.unique(drawn))} distinct words of {drawn.size}")
else:
    assert not drawn.any()  # TPU interpret mode's stand-in for the hardware generator
    print(f"TPU interpret mode ({platform()}): pltpu.prng_random_bits drew {drawn.size} zeros")

# %% [markdown]
# Kernel 1 takes the dropout as its `drop` hook: the running sum `denom` adds every
# probability, since the softmax normalises over all keys, and only the product with `V` loses
# the dropped ones. The seed travels as a `(1,)` int32 array in SMEM, so one compiled kernel
# serves every seed; step `(h, i, j)` folds its position in the grid into the key. The kernel
# also writes the mask it drew, `(N, N)` int32 per head: a production kernel would not spend
# those bytes, but it is how a random kernel is checked.

# %%
RATE = 0.25
THRESHOLD = np.uint32(RATE * 2**32)  # uint32 words at or above it are kept: 1 - RATE of them


def step_key(seed, h, i, j, q_blocks, kv_blocks):
    """The key of grid step (h, i, j): the seed's, with the step's position folded in."""
    return jax.random.fold_in(jax.random.key(seed), (h * q_blocks + i) * kv_blocks + j)


def dropout_flash_kernel(seed_ref, q_ref, k_ref, v_ref, o_ref, keep_ref, m_ref, denom_ref,
                         acc_ref):
    def drop(p):
        key = step_key(seed_ref[0], *(pl.program_id(a) for a in range(3)),
                       pl.num_programs(1), pl.num_programs(2))
        keep = jax.random.bits(key, p.shape, jnp.uint32) >= THRESHOLD
        keep_ref[...] = keep.astype(jnp.int32)
        return jnp.where(keep, p / (1 - RATE), 0.0)

    flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref, causal=False, drop=drop)


def flash_attention_dropout(q, k, v, seed, *, bq=128, bkv=128, interpret):
    heads, n, d = q.shape
    rows = pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0))
    kv = pl.BlockSpec((None, bkv, d), lambda h, i, j: (h, j, 0))
    return pl.pallas_call(
        dropout_flash_kernel, grid=(heads, n // bq, n // bkv),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), rows, kv, kv],
        out_specs=[rows, pl.BlockSpec((None, bq, bkv), lambda h, i, j: (h, i, j))],
        scratch_shapes=statistics_scratch(bq, d),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((heads, n, n), jnp.int32)],
        interpret=interpret,
    )(seed, q, k, v)


# %% [markdown]
# How to check a kernel whose output is random: not against a fixed answer, but against what
# a right dropout shows. Here the bits are `jax.random`'s, so plain JAX can draw the same mask
# block by block, outside any kernel, and the output must be the attention with that mask. A
# kernel on the TPU's own generator has no such twin; it is checked on the mask it writes: its
# kept fraction, blocks that differ, the same mask for the same seed, another for another
# seed, and the output equal to the attention with *its* mask. Assignment 7's task 6 grades
# all of these but the same seed's mask, which a function of its inputs draws by construction.

# %%
SEED = jnp.array([2026], jnp.int32)


def dropout_mask_reference(seed, heads, n, bq=128, bkv=128):
    """The keep mask, drawn in plain JAX block by block with the kernel's keys."""
    grid = (heads, n // bq, n // bkv)
    return jnp.stack([jnp.block([[
        jax.random.bits(step_key(seed[0], h, i, j, *grid[1:]), (bq, bkv), jnp.uint32) >= THRESHOLD
        for j in range(grid[2])] for i in range(grid[1])]) for h in range(heads)])


def dropout_attention_reference(q, k, v):
    scores = jnp.einsum("hqd,hkd->hqk", q, k, precision="highest") * SCALE
    kept = jnp.where(dropout_mask_reference(SEED, *q.shape[:2]),
                     jax.nn.softmax(scores, axis=-1) / (1 - RATE), 0.0)
    return jnp.einsum("hqk,hkd->hqd", kept, v, precision="highest")


_course.check(LESSON, "flash_attention_dropout",
              lambda q, k, v, interpret: flash_attention_dropout(q, k, v, SEED,
                                                                 interpret=interpret)[0],
              dropout_attention_reference, (q, k, v), choose(tpu_features=True),
              rtol=1e-4, atol=1e-5)

# %%
run = functools.partial(flash_attention_dropout, interpret=choose(tpu_features=True).interpret)
keep = np.asarray(run(q, k, v, SEED)[1])
again, other = (np.asarray(run(q, k, v, s)[1]) for s in (SEED, SEED + 1))
blocks = keep.reshape(H, N // 128, 128, N // 128, 128).transpose(0, 1, 3, 2, 4).reshape(-1, 128**2)
rows = [["property", "found"],
        ["kept fraction (1 - rate = 0.75)", f"{keep.mean():.4f}"],
        ["distinct (128, 128) blocks", f"{len(np.unique(blocks, axis=0))} of {len(blocks)}"],
        ["same seed, same mask", str(bool((again == keep).all()))],
        ["seed + 1: entries that differ (independent masks: 0.375)",
         f"{(other != keep).mean():.3f}"]]
show(rows)
assert abs(keep.mean() - (1 - RATE)) < 0.01 and len(np.unique(blocks, axis=0)) == len(blocks)
np.testing.assert_array_equal(keep, dropout_mask_reference(SEED, H, N))

# %% [markdown]
# A key per grid step ties the mask to the blocks. Drawn with `(64, 128)` blocks, the same
# seed gives another mask than with `(128, 128)` blocks, so a backward pass must use the
# forward's tiling to see the forward's mask. `pltpu.sample_block(sampler, key, block_size,
# tile_size, total_size, block_index)` (JAX's Pallas PRNG guide uses it for exactly this)
# cuts the whole array into tiles of `tile_size`, folds each tile's position in the *array*
# into the key, and draws the block tile by tile: any block made of whole tiles gets the same
# bits, whatever its shape. Pick the tile as a divisor of every block shape in use. Inside a
# kernel `block_index` defaults to the program ids; here it is given, block by block, in plain
# JAX, which runs the same `jax.random` hash as a kernel does.

# %%
def mask_by_tiles(seed, n, block, tile=(64, 128)):
    """One head's keep mask drawn block by block with pltpu.sample_block."""
    bits = functools.partial(jax.random.bits, dtype=jnp.uint32)
    rows, cols = n // block[0], n // block[1]
    return jnp.block([[pltpu.sample_block(bits, jax.random.key(seed[0]), block, tile, (n, n),
                                          block_index=(i, j)) for j in range(cols)]
                      for i in range(rows)]) >= THRESHOLD


by_step = [dropout_mask_reference(SEED, 1, N, bq=b, bkv=128)[0] for b in (128, 64)]
by_tile = [mask_by_tiles(SEED, N, (b, 128)) for b in (128, 64)]
print(f"a key per step: (128, 128) and (64, 128) blocks agree on "
      f"{float((by_step[0] == by_step[1]).mean()):.3f} of the mask; pltpu.sample_block: "
      f"{float((by_tile[0] == by_tile[1]).mean()):.3f}")
assert not (by_step[0] == by_step[1]).all() and (by_tile[0] == by_tile[1]).all()

# %% [markdown]
# ## Check yourself
#
# 1. Why does naive attention move `Θ(N²)` bytes even though XLA fuses the softmax?
# 2. In the online softmax, what is `alpha` for, and what would go wrong without it?
# 3. Why may the key/value axis not be declared `"parallel"` in kernel 1?
# 4. Kernel 2 has no scratch. Where do `m`, `denom` and `acc` live, and what limits its size?
# 5. In kernelsim's sweep, what happens to the bytes if you double `bkv` instead of `bq`?
# 6. The causal kernel keeps its `pl.when` but you drop the clamp from its index map. Is the
#    result still right, and what changes in kernelsim's table?
# 7. A dropout kernel makes every step's key from the seed alone. What does its mask look
#    like, and which of the checks above catches it?
#
# <details><summary>Answer</summary>
#
# 1. The algorithm produces the full score matrix before the row-wise softmax; fusion merges
#    loops, but the matrix still goes to HBM and back between them.
# 2. It rescales the running sum and accumulator when the running maximum grows, so that all
#    terms are relative to the same maximum. Without it, blocks seen earlier would be weighted
#    by `exp` of a different offset and the result would be wrong.
# 3. Its steps update shared state (`m`, `denom`, `acc`) in order; the first step initialises it
#    and the last writes the output.
# 4. In loop carries — values the compiler keeps in registers or VMEM. The whole of one head's
#    `K` and `V` must fit in VMEM at once (twice, with the default double buffering).
# 5. Nothing: `K` and `V` are still read once per query block. Only the step count halves.
# 6. Still right: the skipped steps do no work. But their blocks are fetched anyway — `K`
#    goes back to 32 fetches instead of 20, the full kernel's bytes for a causal kernel's
#    arithmetic.
# 7. The same `(bq, bkv)` tile of bits, repeated over the whole grid. It still keeps about
#    `1 - rate` of the entries, and the output is still the attention with *that* mask, so
#    those checks pass. Comparing the blocks with each other catches it, and here so do the
#    two checks against plain JAX's mask (the kernel's output against
#    `dropout_attention_reference`, and its mask against `dropout_mask_reference`): plain JAX
#    folds each block's position into its key, so its blocks differ where the kernel's
#    repeat. A kernel on the TPU's own generator has no such reference mask; for it, only the
#    comparison of blocks catches it, which is why assignment 7's task 6 grades it.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 7 — flash
# attention](../exercises/07_flash_attention/flash_attention.ipynb): tasks 1-3 and 6 now,
# tasks 4 and 5 after lessons 10 and 12 (the backward pass and `jax.custom_vjp`).
