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
# # Lesson 15 — Kernels in production: quantized matmul and paged attention
#
# **Learning objectives.** After this lesson you can
#
# 1. quantize a weight matrix to int8 or fp8 with one scale per block, and dequantize it
#    inside a matmul kernel;
# 2. predict the error quantization adds, and choose the tolerance a quantized kernel is
#    checked with;
# 3. multiply int8 activations by int8 weights on the MXU's int8 path, summing exactly in int32
#    and applying per-row and per-column scales once, and say which of v5e, v6e and TPU7x
#    multiply int8 and fp8 natively;
# 4. read JAX's ragged paged attention: its page table and sequence lengths as scalar
#    prefetch, its KV pages left in HBM and copied page by page;
# 5. write a smaller paged attention whose index maps follow a page table, skipping the pages
#    past each sequence's length;
# 6. update a paged KV cache in place with `input_output_aliases` and a page table.
#
# Two kinds of kernel carry most of today's serving and training traffic. Quantized matmuls
# store weights in 8 bits and multiply faster where the chip has 8-bit units; paged attention
# lets a server keep thousands of sequences' keys and values in fixed-size pages instead of one
# long buffer per sequence. We build the numerics first, then read JAX's own ragged paged
# attention, then write a smaller one. References:
# [scalar prefetch](https://docs.jax.dev/en/latest/pallas/tpu/sparse.html),
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html).
# Matching exercises: [`../exercises/`](../exercises/) (assignment 14).

# %%
import functools
import inspect

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

import kernelsim
from kernelsim.backend import choose

LESSON = "15-production-kernels"
_course.versions()
keys = jax.random.split(jax.random.key(15), 8)
tpu_run = choose(tpu_features=True)  # scratch and scalar prefetch: TPU-only features

# %% [markdown]
# ## Quantizing with one scale per block
#
# An 8-bit format holds few values: int8 the integers -127 to 127 (we leave -128 unused so
# the range is symmetric), fp8 `e4m3` 3 mantissa bits and magnitudes up to 448. A weight
# matrix `w` of shape `(K, N)` is stored as `q = round(w / s)` with a float scale `s` chosen so
# that the largest `|w|` in its group maps to the format's largest value. One scale for the
# whole matrix lets one outlier coarsen every weight; one scale per **block** of `bk` rows of
# one column keeps the damage local. Here the scales have shape `(K // bk, 1, N)`: the middle
# axis of 1 lets a kernel take a `(1, bn)` slice of them with the row-block axis squeezed,
# which the (8, 128) rule accepts because 1 is the array's own size there (lesson 3).

# %%
FORMATS = {"int8": (jnp.int8, 127.0), "fp8": (jnp.float8_e4m3fn, 448.0)}


def quantize(w, bk, fmt):
    """(q, scales): q = w / scale rounded to ``fmt``; one scale per bk rows of each column."""
    dtype, largest = FORMATS[fmt]
    k, n = w.shape
    blocks = w.reshape(k // bk, bk, n)
    scales = jnp.max(jnp.abs(blocks), axis=1, keepdims=True) / largest  # (K // bk, 1, N)
    q = blocks / scales
    q = jnp.round(q) if fmt == "int8" else q  # fp8's cast rounds to nearest itself
    return q.astype(dtype).reshape(k, n), scales.astype(jnp.float32)


def dequantize(q, scales):
    kb, _, n = scales.shape
    return (q.astype(jnp.float32).reshape(kb, -1, n) * scales).reshape(q.shape)


# %% [markdown]
# The kernel is lesson 4's accumulating matmul with one more input: step `(i, j, k)` gets the
# `(bk, bn)` block of `q` and the matching `(1, bn)` row of scales, and dequantizes the block
# in VMEM before the dot. HBM carries the 8-bit weights: a quarter of float32's bytes.

# %%
def quantized_matmul_kernel(x_ref, q_ref, s_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    w = q_ref[...].astype(jnp.float32) * s_ref[...]  # (bk, bn) * (1, bn): this block's scales
    acc_ref[...] += jnp.dot(x_ref[...], w, precision="highest", preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def quantized_matmul(x, q, scales, *, bm=128, bn=128, interpret):
    (m, k), n = x.shape, q.shape[1]
    bk = k // scales.shape[0]  # the quantization block is the reduction block
    # k innermost: the output block and its accumulator stay on chip for all k.
    return pl.pallas_call(
        quantized_matmul_kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((None, 1, bn), lambda i, j, kk: (kk, 0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(x, q, scales)


M, K, N = 128, 512, 256
x = jax.random.normal(keys[0], (M, K), jnp.float32)
w = jax.random.normal(keys[1], (K, N), jnp.float32).at[7, 3].set(40.0)  # one outlier
for fmt in FORMATS:
    q, scales = quantize(w, 128, fmt)
    # the kernel against plain JAX on the same dequantized weights: only summation order differs
    _course.check(LESSON, f"quantized_matmul_{fmt}", quantized_matmul,
                  lambda a, q, s: jnp.dot(a, dequantize(q, s), precision="highest"),
                  (x, q, scales), tpu_run, rtol=1e-4, atol=1e-3)

# %% [markdown]
# ## How much error, and which tolerance
#
# The kernel agrees with plain JAX on the *dequantized* weights to float32 rounding: that is
# the check of the kernel. Against the original float weights the difference is the
# quantization's, and it has a size we can predict. Rounding to int8 moves each weight by at
# most half a step, `s / 2`; fp8 `e4m3` keeps 3 mantissa bits, so each weight moves by at most
# `2⁻⁴` of itself (of its power of two). An output sums `K` products `x · Δw`; with errors of
# random sign the sum grows like `√K`, not `K`. A test of a quantized kernel against float
# weights therefore needs a tolerance derived from the scales, not float32's `1e-4`.

# %%
def quantization_error(bk, fmt):
    q, scales = quantize(w, bk, fmt)
    out = quantized_matmul(x, q, scales, interpret=tpu_run.interpret)
    exact = jnp.dot(x, w, precision="highest")
    return float(jnp.max(jnp.abs(out - exact)) / jnp.max(jnp.abs(exact)))


block_sizes = (128, 256, 512)
errors = {fmt: [quantization_error(bk, fmt) for bk in block_sizes] for fmt in FORMATS}
for fmt, errs in errors.items():
    print(fmt, "largest error / largest output, per block size:",
          {bk: f"{e:.2e}" for bk, e in zip(block_sizes, errs, strict=True)})
# int8: the column with the outlier has a coarse step in its block only
assert errors["int8"][0] < errors["int8"][-1]

# %%
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH * 0.7, 3.0))
for fmt, errs in errors.items():
    ax.plot(block_sizes, errs, marker="o", label=fmt)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("rows per scale (bk)")
ax.set_ylabel("max error / max |output|")
ax.set_title("one outlier weight, K = 512")
ax.legend()
fig.tight_layout()

# %% [markdown]
# With one scale per 512 rows the outlier's whole column gets a step of `40 / 127`, a third
# of a typical weight, and int8's error grows with the block; a 128-row block confines that
# coarse step to a quarter of the column. fp8 spends its bits on a floating exponent, so its
# error follows each weight's own size and barely depends on the block. Both are near 2 % of
# the largest output here: far outside float32's `1e-4`, and expected.
#
# 8-bit weights alone do not buy the chips' 8-bit rates. The pinned release's `tpu_info`
# lists int8 at twice bfloat16's rate on v5e and v6e, but its `is_matmul_supported` takes
# int8 there only when *both* operands are int8: the activations must be quantized too.
# `float8_e4m3fn`, the fp8 here, is native only from TPU 7 on (7, 7x, 8i and 8t: beside float32
# or bfloat16 activations, or on both sides), at two to eight times bfloat16's rate.
# This kernel dequantizes to float32 and reaches neither path: it saves HBM bytes on every
# chip but multiplies at the float rate.

# %% [markdown]
# ## Both operands int8: the MXU's int8 path
#
# The MXU of a v5e or v6e multiplies int8 by int8 into int32 at twice bfloat16's rate (the
# table below), but only with int8 on **both** sides: the activations are quantized too. Each
# row of `x` (one token) gets its own scale `sx[m]`, computed as the row arrives; each column
# of `w` its own `sw[n]`, fixed offline. Both scales are constant along `K`, so they leave the
# sum:
# `(x @ w)[m, n] ≈ sx[m] · sw[n] · Σₖ xq[m, k] · wq[k, n]`. What remains inside is a sum of
# integers. A product of two int8 values is at most `127² = 16,129`, so an int32 holds over
# 130,000 of them and the sum is **exact**: nothing is rounded until the two scales are applied,
# once, at the end. (float32 holds every integer only up to `2²⁴`, about a thousand such
# products.) A row of zeros, a padding token, has `max |x| = 0`: its scale is 0, and the
# division that makes `xq` must not become `0 / 0`.

# %%
def quantize_int8(a, axis):
    """(q, scale): a ≈ q * scale, q int8, one float32 scale per row (axis=1) or column (axis=0);
    an all-zero row or column gets scale 0 and q 0."""
    scale = jnp.max(jnp.abs(a), axis=axis, keepdims=True) / 127.0
    q = jnp.round(a / jnp.where(scale == 0, 1.0, scale))  # a zero row: 0 / 1, never 0 / 0
    return jnp.clip(q, -127, 127).astype(jnp.int8), scale.astype(jnp.float32)


x_padded = x.at[1].set(0.0)  # row 1: a padding token
xq, x_scale = quantize_int8(x_padded, axis=1)  # (M, K) int8, (M, 1) float32
wq, w_scale = quantize_int8(w, axis=0)  # (K, N) int8, (1, N) float32
print("row 1's scale:", float(x_scale[1, 0]), "and its int8 values:", set(xq[1].tolist()))
assert float(x_scale[1, 0]) == 0.0 and not xq[1].any()

# %% [markdown]
# In a kernel, the dot takes the two int8 blocks as they are and asks for int32:
# `jnp.dot(xq_block, wq_block, preferred_element_type=jnp.int32)`. Pallas's TPU lowering hands
# both int8 operands to one `tpu.matmul` with an int32 result (it refuses unsigned integers, so
# the int8 here is signed); converting either block to a float first would make a float dot,
# at the float rate. This kernel takes all of `K` in one block, so it has one dot per output
# block and applies the scales right after it.

# %%
def int8_matmul_kernel(xq_ref, xs_ref, wq_ref, ws_ref, o_ref):
    acc = jnp.dot(xq_ref[...], wq_ref[...], preferred_element_type=jnp.int32)  # exact
    o_ref[...] = acc.astype(jnp.float32) * xs_ref[...] * ws_ref[...]  # (bm, 1) and (1, bn)


def int8_matmul(xq, x_scale, wq, w_scale, *, bm=128, bn=128, interpret):
    (m, k), n = xq.shape, wq.shape[1]
    return pl.pallas_call(
        int8_matmul_kernel,
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        interpret=interpret,
    )(xq, x_scale, wq, w_scale)


def int8_matmul_reference(xq, x_scale, wq, w_scale):
    return jnp.dot(xq, wq, preferred_element_type=jnp.int32).astype(jnp.float32) * x_scale * \
        w_scale


# the same exact integer sums, then the same two float32 products: a few ulps apart at most
_course.check(LESSON, "int8_matmul", int8_matmul, int8_matmul_reference,
              (xq, x_scale, wq, w_scale), tpu_run, rtol=1e-6, atol=1e-6)

# %% [markdown]
# Quantizing the activations adds their rounding to the weights': against the float matmul the
# error grows, and it is still the quantization's, measured and expected, not the kernel's.

# %%
exact_padded = jnp.dot(x_padded, w, precision="highest")
weights_only = jnp.dot(x_padded, dequantize(*quantize(w, K, "int8")), precision="highest")
both = int8_matmul(xq, x_scale, wq, w_scale, interpret=tpu_run.interpret)
relative_errors = {
    label: float(jnp.max(jnp.abs(out - exact_padded)) / jnp.max(jnp.abs(exact_padded)))
    for label, out in (("int8 weights", weights_only), ("int8 weights and activations", both))}
for label, error in relative_errors.items():
    print(f"{label}: largest error / largest output {error:.2e}")
assert relative_errors["int8 weights"] < relative_errors["int8 weights and activations"] < 0.05

# %% [markdown]
# Which chips multiply what natively, from the pinned release's own table
# (`pltpu.get_tpu_info_for_chip`; on a TPU, `pltpu.get_tpu_info()` returns the record of the chip
# you are on). `is_matmul_supported(lhs, rhs)` says whether the MXU takes two dtypes without a
# cast; the rates are per TensorCore, as multiples of bfloat16's.

# %%
CHIPS = ("v5e", "v6e", "7x")
PAIRS = {"int8 × int8": (jnp.int8, jnp.int8), "bf16 × int8": (jnp.bfloat16, jnp.int8),
         "e4m3fn × e4m3fn": (jnp.float8_e4m3fn, jnp.float8_e4m3fn),
         "bf16 × e4m3fn": (jnp.bfloat16, jnp.float8_e4m3fn),
         "e5m2 × e5m2": (jnp.float8_e5m2, jnp.float8_e5m2)}
chip_version = _course.newer_api(pltpu, "ChipVersion")
infos = {chip: pltpu.get_tpu_info_for_chip(chip_version(chip), 1) for chip in CHIPS}
print(f"{'native on the MXU':16}" + "".join(f"{chip:>11}" for chip in CHIPS))
for label, (lhs, rhs) in PAIRS.items():
    print(f"{label:16}" + "".join(f"{'yes' if i.is_matmul_supported(lhs, rhs) else 'no':>11}"
                                  for i in infos.values()))
for rate in ("int8", "fp8"):  # 0: "Not Available" in the source
    ratios = [getattr(i, f"{rate}_ops_per_second") / i.bf16_ops_per_second for i in infos.values()]
    print(f"{rate + ' rate':16}" + "".join(f"{f'{r:.0f} × bf16' if r else 'none':>11}"
                                            for r in ratios))
if _course.platform() == "tpu":
    here = pltpu.get_tpu_info()
    print("this chip:", here.chip_version, "int8 × int8:", here.is_matmul_supported(jnp.int8,
                                                                                  jnp.int8))
assert [i.is_matmul_supported(jnp.int8, jnp.int8) for i in infos.values()] == [True, True, False]

# %% [markdown]
# Read by column: v5e and v6e take int8 only on both sides, at twice bfloat16's rate; int8
# weights beside bfloat16 activations, and `e4m3fn`, are not native there (a cast first), and
# their fp8 entry is `e5m2` (no fp8 rate listed on v5e, bfloat16's on v6e). TPU7x lists no int8
# path or rate at all and takes `e4m3fn` beside bfloat16 or on both sides, at twice bfloat16's
# rate. The kernel above, int8 on both sides, is the v5e and v6e form. On a tiled grid the int32 sum
# must outlive the `k` steps: assignment 14's `w8a8_matmul` keeps it in an int32 VMEM scratch
# and applies the scales once, at the last step. One TPU detail for its blocks: a TPU tiles
# int8 arrays `(32, 128)` (four values per 32-bit word along the rows, lesson 3), so an int8
# block's rows come in multiples of 32; kernelsim's lint says so for any other.

# %% [markdown]
# ## Reading JAX's ragged paged attention
#
# A server decodes many sequences at once, each of a different length, and appends one key
# and value per step to each. Paged attention stores the cache as fixed-size **pages**
# `(pages, page_size, heads, head_dim)` and gives every sequence a row of a **page table**:
# the page numbers that hold its tokens, in order. JAX ships a kernel for this,
# `jax.experimental.pallas.ops.tpu.ragged_paged_attention` ("ragged": queries of several
# sequences packed into one array, some decoding one token, some prefilling many). It keeps
# keys and values in one cache array, `kv_pages`, whose heads axis is twice the number of
# key/value heads: keys at the even head indices, values at the odd ones.

# %%
print(inspect.signature(rpa.ragged_paged_attention))

# %% [markdown]
# What its `pallas_call` is made of, in the pinned release:
#
# * **scalar prefetch** of five arrays: `kv_lens` (each sequence's length), `page_indices`
#   (the page table), `cu_q_lens` (where each sequence's queries start in `q`), a
#   sequence/buffer index pair, and `num_seqs`. All of them steer the kernel from SMEM
#   (lesson 6).
# * **grid** `(head blocks, query blocks)`, both `"arbitrary"`: a block of queries may span
#   sequences, and the kernel walks them in order.
# * **`q` and the output** in ordinary BlockSpecs; **`kv_pages` in `pl.ANY`**. A BlockSpec
#   moves one block per step, but a block of keys here is several pages scattered through
#   HBM, so the kernel copies them itself: its `MultiPageAsyncCopyDescriptor` starts one
#   `make_async_copy` per page, the source `kv_pages.at[page_indices[seq, page]]`, into a
#   double buffer of `num_kv_pages_per_block` pages, and prefetches the next block's pages
#   while computing on the current one (lesson 5's pattern, driven by a page table).
# * an online softmax (lesson 8) in `m`, `l` and `acc` scratch, with `m` and `l` 128 lanes
#   wide, and a causal mask from each query's position in its sequence.
#
# It does not write the cache: the new tokens' keys and values are put in their pages by the
# caller (its signature carries a `TODO` for a cache-writing kernel). It lowers for a TPU from
# this CPU; the pinned release's TPU interpret mode cannot run it (the kernel reshapes a ref,
# which the interpreter does not support), so on this machine we check the idea on a kernel
# of our own instead.

# %%
def rpa_example(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, interpret):
    del interpret  # the op has no interpret switch; the lowering below compiles it for TPU
    return rpa.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                                      sm_scale=0.1, num_kv_pages_per_block=2,
                                      num_queries_per_block=8)


rpa_args = (jax.ShapeDtypeStruct((8, 4, 128), jnp.float32),            # 8 query tokens
            jax.ShapeDtypeStruct((16, 16, 4, 128), jnp.float32),  # 16 pages of 16 tokens; K V K V
            jax.ShapeDtypeStruct((4,), jnp.int32), jax.ShapeDtypeStruct((4, 4), jnp.int32),
            jax.ShapeDtypeStruct((5,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32))
rpa_error = kernelsim.tpu_lowering_error(functools.partial(rpa_example, interpret=False),
                                         *rpa_args)
print("JAX's ragged paged attention for TPU v5e:", rpa_error or "lowers")
assert rpa_error is None

# %% [markdown]
# ## A smaller paged attention: decode, one page per step
#
# Our version keeps what matters and drops the rest: every sequence decodes one token, with
# `G` query heads sharing one key/value head (grouped-query attention, so a query block is
# `(G, D)` and meets the (8, 128) rule with `G = 8`). Keys and values live in pages
# `(pages, page_size, D)`. Grid `(sequence, page)`: step `(s, p)` gets page
# `page_indices[s, p]` of `K` and of `V` **through the index map**, so the pipeline, not the
# kernel, copies it, double-buffered as always. Pages past a sequence's length are skipped
# twice over, as lesson 6 skipped blocks: `pl.when` skips the work, and the index map repeats
# the last valid page, so no copy happens either.

# %%
def last_page(kv_len, page_size):
    return jnp.maximum(kv_len - 1, 0) // page_size


def paged_decode_kernel(kv_lens, page_table, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref,
                        acc_ref, *, scale):
    s, p = pl.program_id(0), pl.program_id(1)
    page_size = k_ref.shape[0]

    @pl.when(p == 0)
    def _():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(p * page_size < kv_lens[s])  # pages past the sequence's end: no work
    def _():
        scores = scale * jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                             precision="highest",
                                             preferred_element_type=jnp.float32)  # (G, page)
        pos = p * page_size + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
        scores = jnp.where(pos < kv_lens[s], scores, -jnp.inf)  # the last page's tail
        m_new = jnp.maximum(m_ref[...], jnp.max(scores, axis=1, keepdims=True))
        correction = jnp.exp(m_ref[...] - m_new)
        probs = jnp.exp(scores - m_new)
        l_ref[...] = correction * l_ref[...] + jnp.sum(probs, axis=1, keepdims=True)
        acc_ref[...] = correction * acc_ref[...] + jnp.dot(
            probs, v_ref[...], precision="highest", preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(p == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def paged_decode(q, k_pages, v_pages, kv_lens, page_indices, *, interpret):
    n_seq, g, d = q.shape
    page_size = k_pages.shape[1]

    slots = page_indices.shape[1]

    def page_map(s, p, kv_lens, page_table):
        # past the end: repeat the last valid page, so the pipeline copies nothing; the table
        # goes in flat: entry s * slots + slot
        slot = jnp.minimum(p, last_page(kv_lens[s], page_size))
        return (page_table[s * slots + slot], 0, 0)

    per_seq = pl.BlockSpec((None, g, d), lambda s, p, *_: (s, 0, 0))
    page = pl.BlockSpec((None, page_size, d), page_map)
    return pl.pallas_call(
        functools.partial(paged_decode_kernel, scale=d ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(n_seq, slots),
            in_specs=[per_seq, page, page],
            out_specs=per_seq,
            scratch_shapes=[pltpu.VMEM((g, 1), jnp.float32), pltpu.VMEM((g, 1), jnp.float32),
                            pltpu.VMEM((g, d), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        # p carries the running softmax: in order; s could be "parallel"
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(kv_lens, page_indices.reshape(-1), q, k_pages, v_pages)


def paged_decode_reference(q, k_pages, v_pages, kv_lens, page_indices):
    """Plain JAX: gather each sequence's pages, mask past its length, softmax."""
    n_seq, g, d = q.shape
    k = k_pages[page_indices].reshape(n_seq, -1, d)  # (S, pages * page_size, D)
    v = v_pages[page_indices].reshape(n_seq, -1, d)
    scores = jnp.einsum("sgd,std->sgt", q, k, precision="highest") * d ** -0.5
    valid = jnp.arange(k.shape[1])[None, None, :] < kv_lens[:, None, None]
    probs = jax.nn.softmax(jnp.where(valid, scores, -jnp.inf), axis=-1)
    return jnp.einsum("sgt,std->sgd", probs, v, precision="highest")


PAGES, PAGE_SIZE, D, G = 12, 16, 128, 8
lengths = jnp.array([40, 5, 16], jnp.int32)        # three sequences of different lengths
table = jnp.array([[3, 7, 1, 0], [9, 0, 0, 0], [4, 0, 0, 0]], jnp.int32)  # 4 slots each
qd = jax.random.normal(keys[2], (3, G, D), jnp.float32)
k_pages = jax.random.normal(keys[3], (PAGES, PAGE_SIZE, D), jnp.float32)
v_pages = jax.random.normal(keys[4], (PAGES, PAGE_SIZE, D), jnp.float32)
_course.check(LESSON, "paged_decode", paged_decode, paged_decode_reference,
              (qd, k_pages, v_pages, lengths, table), tpu_run, rtol=1e-4, atol=1e-4)

# %% [markdown]
# **Where an index map may look a page up.** `paged_decode`'s K and V index maps read the table
# at an index they computed from another prefetched array (`kv_lens[s]`), and on a TPU v5e
# (2026-12-05; its JAX release: lessons/CHECKED.md) it ran compiled and right. (JAX's own paged
# attention reads its table in the kernel body instead and starts each page's copy itself.)
# Assignment 14's append first did the same for its *output*, the cache page it writes
# (`page_indices[s, positions[s] // page_size]`), and that *halted the core* ("Core halted
# unexpectedly"; the process was dead after it), with the table 2-D or flattened, a shift or a
# division, while the same kernel reading the table or the positions at the step's own index ran
# (`bench/kv_halt_probe.py`, one process per variant). Interpret mode ran every form right, so
# only a chip shows it, and the compiler that decides it ships without source. The rule the
# course keeps: **an output's index map reads scalar prefetch at an index of the grid alone**;
# look a page up before the call (`page_indices[jnp.arange(S), positions // page_size]`, S
# integers) and prefetch the result. kernelsim warns and the grader refuses a kernel that breaks
# it (rule `dependent_prefetch_read`).

# %% [markdown]
# kernelsim evaluates the index maps with the real page table: sequence 0 (40 tokens) reads
# its three pages, sequences 1 and 2 one page each, and the padded slots of the table cost
# no copy. (kernelsim counts the kernel's FLOPs for every step; the skipped steps do none.)

# %%
t_paged = kernelsim.trace(functools.partial(paged_decode, interpret=True), qd, k_pages, v_pages,
                          lengths, table)
print(t_paged)
k_fetches = t_paged.calls[0].operand("k_ref").fetches
print("pages of K copied:", k_fetches)
assert k_fetches == 3 + 1 + 1

# %% [markdown]
# ## Writing to the cache
#
# After a step, each sequence's new key and value go into its pages. The page and the row
# come from the page table and the position, and only those pages may be touched: the cache
# is large and shared by every sequence. Lesson 10's `input_output_aliases` makes the output
# the cache's own buffer, and scalar prefetch turns the page table into index maps. A
# **prefill** writes whole pages: grid step `i` writes new page `i` into cache page
# `page_ids[i]`, and every other page keeps its bytes without being read or written.

# %%
def write_pages_kernel(page_ids, cache_ref, new_ref, out_ref):
    del page_ids, cache_ref  # the whole page is replaced; the aliased cache is not read
    out_ref[...] = new_ref[...]


def write_pages(cache, new_pages, page_ids, *, interpret):
    _, page_size, d = cache.shape
    to_cache = pl.BlockSpec((None, page_size, d), lambda i, page_ids: (page_ids[i], 0, 0))
    return pl.pallas_call(
        write_pages_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(new_pages.shape[0],),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec((None, page_size, d), lambda i, page_ids: (i, 0, 0))],
            out_specs=to_cache),
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={1: 0},  # operand 1 (after the prefetched ids) is the output
        interpret=interpret,
    )(page_ids, cache, new_pages)


fresh = jax.random.normal(keys[5], (2, PAGE_SIZE, D), jnp.float32)
ids = jnp.array([5, 2], jnp.int32)
_course.check(LESSON, "write_pages", write_pages,
              lambda c, n, i: c.at[i].set(n), (k_pages, fresh, ids), tpu_run, rtol=0, atol=0)
t_write = kernelsim.trace(functools.partial(write_pages, interpret=True), k_pages, fresh, ids)
page_bytes = PAGE_SIZE * D * 4
print(f"HBM written {t_write.calls[0].hbm_write_bytes:,} B: two pages of {page_bytes:,} B, "
      f"of a cache of {k_pages.nbytes:,} B")
assert t_write.calls[0].hbm_write_bytes == 2 * page_bytes

# %% [markdown]
# Decoding appends **one row** per sequence instead: a page is written at one row, and the
# rest of that page must keep its bytes. Assignment 14 asks for that kernel.
#
# ## Check yourself
#
# 1. Why are the scales stored as `(K // bk, 1, N)` and not `(K // bk, N)`, given a `(1, bn)`
#    slice per step?
# 2. A test compares an int8 matmul with the float32 one at `rtol=1e-4` and fails. Is the
#    kernel wrong? What should the test compare instead, and with what tolerance?
# 3. In JAX's ragged paged attention, why are the KV pages in `pl.ANY` rather than in a
#    BlockSpec driven by the page table, as in our kernel?
# 4. Sequence 1 above has 5 tokens in 4 page slots. How many copies of `K` does it cost, and
#    how many grid steps?
# 5. `write_pages` aliases the cache and never reads it. What would a fresh output buffer
#    (no alias) hold in the pages not written?
# 6. An int8 × int8 kernel tiles `K` over four grid steps. Why may its scales wait for the last
#    step, and why must they?
#
# <details><summary>Answer</summary>
#
# 1. A `(1, bn)` block over a `(K // bk, N)` array breaks the (8, 128) rule unless `K = bk`:
#    1 is neither a multiple of 8 nor the array's `K // bk`. With the middle axis of 1 the
#    row-block axis is squeezed and the last two dims are `(1, bn)` over `(1, N)`.
# 2. Not necessarily: the difference is the quantization's. Check the kernel against plain
#    JAX on the dequantized weights at float32's tolerance, and the quantization against the
#    float weights with a tolerance from the scales (about `s / 2 · √K · |x|` per output for
#    int8).
# 3. A block of keys there is several pages at once (`num_kv_pages_per_block`), scattered
#    through HBM, and its sequence changes inside a query block; one BlockSpec block per step
#    cannot name several scattered pages, so the kernel issues one copy per page itself.
# 4. One copy (its only page; the three padded slots repeat it) and four grid steps, of which
#    three do no work: a repeated block costs a step, not a copy.
# 5. Uninitialised memory (NaN in interpret mode): the pipeline writes back only the blocks
#    the grid visits.
# 6. A row's scale and a column's scale are the same at every `k`, so they factor out of the
#    sum and may wait; they must, because the running sum is int32: a float scale applied at
#    each step would make it a float sum, no longer exact, and no longer the int32 state the
#    int8 path accumulates into.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 14 — kernels in
# production](../exercises/14_production_kernels/production_kernels.ipynb).
