# %% [markdown]
# # Assignment 7 — flash attention
#
# Attention `softmax(q k^T / sqrt(d)) v` for one head, `q` of shape `(Lq, d)`, `k` and `v` of
# shape `(Lk, d)`. Flash attention never stores the `(Lq, Lk)` scores in HBM: for each block of
# queries it walks the key blocks keeping a running max `m`, a running sum `l` and an unnormalised
# accumulator in VMEM scratch (the online softmax). Task 4 writes the backward pass, as the
# op of lesson 12 does: its kernels rebuild the scores block by block from what the forward
# saved; task 5 attaches it to the forward with `jax.custom_vjp`. Task 6 drops out
# attention probabilities with random bits drawn inside the kernel. Do tasks 1-3 and 6 after
# lesson 8, tasks 4 and 5 after lessons 10 and 12 (the backward pass and `jax.custom_vjp`).
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check flash_attention.ipynb`.

# %% nbgrader={"grade_id": "setup", "locked": true}
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader.learner import course
from kernelsim.backend import choose

# Compiled on a GPU or TPU, interpreted on a CPU. TPU_INTERPRET is for kernels that use
# TPU-only features (VMEM/SMEM scratch, scalar prefetch).
INTERPRET = choose().interpret
TPU_INTERPRET = choose(tpu_features=True).interpret

# %% [markdown]
# ## Task 1 — `attention_scores(q, k, bq, bk)` (3 points)
#
# `q @ k.T / sqrt(d)` in the dtype of `q` (float32 accumulation), grid
# `(cdiv(Lq, bq), cdiv(Lk, bk))`, output blocks `(bq, bk)`.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Grid step `(i, j)` reads query block `i` and key block `j`, each with all `d` columns, and
# writes score block `(i, j)`: the query block times the key block transposed, a contraction
# over `d` with a float32 result, then scaled and rounded to `q`'s dtype. Contract inside the
# kernel rather than passing `k.T`: a transpose outside is one more pass of `k` through HBM.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# `jax.lax.dot_general` takes the two blocks and dimension numbers
# `((contracting_a, contracting_b), (batch_a, batch_b))`, each a tuple of axes. Here both blocks
# contract their axis 1, `d`, and there are no batch axes, so `(bq, d)` and `(bk, d)` give
# `(bq, bk)`. Its `preferred_element_type` asks for the float32 result.
#
# </details>

# %% nbgrader={"grade_id": "attention_scores_solution", "solution": true}
def attention_scores(q, k, bq, bk):
    ### BEGIN SOLUTION
    lq, d = q.shape
    lk = k.shape[0]
    scale = 1.0 / math.sqrt(d)
    # float32: several MXU passes, exact; bfloat16: one pass (Mosaic refuses "highest" there)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    def kernel(q_ref, k_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                precision=precision, preferred_element_type=jnp.float32)
        o_ref[...] = (s * scale).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(pl.cdiv(lq, bq), pl.cdiv(lk, bk)),
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((bk, d), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((bq, bk), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype), interpret=INTERPRET,
    )(q, k)
    ### END SOLUTION


# %% nbgrader={"grade_id": "attention_scores_visible", "grade": true, "points": 1}
course.check("attention_scores", attention_scores)

# %% nbgrader={"grade_id": "attention_scores_hidden", "grade": true, "points": 2}
# Hidden tests: non-divisible lengths, bfloat16.
### BEGIN HIDDEN TESTS
course.check("attention_scores", attention_scores, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — `flash_attention(q, k, v, bq, bk)` (3 points)
#
# The forward pass with grid `(cdiv(Lq, bq), Lk // bk)` (`Lk` is a multiple of `bk`), the key
# axis last, as in lesson 8's first kernel. Write the body of one grid step in `flash_kernel`
# and the call in `flash_attention`. Task 3 reuses `flash_kernel` with `causal=True`; leave
# that branch for then. Budget: the only HBM write is the output, `k` is read once per query
# block. Graded too, the fast form of lesson 8: the running max and sum are two `(bq, 128)`
# float32 scratch buffers, every lane of a row holding that row's value (a `(bq, 1)` column
# is spread across the 128 lanes at every step, which made lesson 8's first kernel 1.6-1.8
# times slower on a TPU v5e).

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Step `(i, j)` folds key block `j` into query block `i`'s state: scores `q k^T * scale` in
# float32, the new running max (the old one or this block's row max, whichever is larger), the
# probabilities `exp(s - m_new)`, and the factor `exp(m_old - m_new)` that rescales the old sum
# and the old accumulator before this block's terms are added. Initialise the state at `j == 0`
# (max `-inf`, sum and accumulator 0) and write `acc / l` at the last `j`. The query block and
# the output block keep their index along `j`, so they stay on chip; the scratch is
# `(bq, 128)`, `(bq, 128)` and `(bq, d)`, float32. A row's max of the scores,
# `jnp.max(s, axis=1, keepdims=True)`, combines with a `(bq, 128)` row as it is; to subtract
# the max from `(bq, bk)` scores or scale the `(bq, d)` accumulator, widen the `(bq, 128)`
# rows with lesson 8's `widen` (`jnp.tile`, then a cut to the width).
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The order is what goes wrong. Compute the rescale factor from `m_ref` *before* it is overwritten
# with the new max; multiply both `l_ref` and `acc_ref` by it, then add this block's row sums of `p`
# to the first and the product of `p` (cast to `v`'s dtype, float32 result) with the value block to
# the second; store the new max last.
#
# </details>

# %% nbgrader={"grade_id": "flash_attention_solution", "solution": true}
def flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, causal=False):
    """One grid step (query block i, key block j) of the online softmax.

    q_ref (bq, d), k_ref and v_ref (bk, d), o_ref (bq, d); scratch, float32, kept across the
    j steps: m_ref (bq, 128) the running row max of the scores, l_ref (bq, 128) the running
    sum of exp(score - max), each row's value in all 128 lanes, acc_ref (bq, d) the
    unnormalised output. causal: query t sees keys <= t (task 3).
    """
    ### BEGIN SOLUTION
    def widen(stat, width):  # (bq, 128) rows as `width` lanes: whole registers copied
        return jnp.tile(stat, (1, pl.cdiv(width, 128)))[:, :width]

    i, j = pl.program_id(0), pl.program_id(1)
    (bq, d), bk = q_ref.shape, k_ref.shape[0]
    # float32: several MXU passes, exact; bfloat16: one pass (Mosaic refuses "highest" there)
    precision = jax.lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def fold_in_block():
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                precision=precision,
                                preferred_element_type=jnp.float32) / math.sqrt(d)
        if causal:  # a block straddling the diagonal: hide the keys after each query
            q_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            k_pos = j * bk + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(k_pos <= q_pos, s, -jnp.inf)
        m_new = jnp.maximum(m_ref[...], jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - widen(m_new, bk))
        alpha = jnp.exp(m_ref[...] - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        acc_ref[...] = widen(alpha, d) * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], precision=precision,
            preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    if causal:  # a block wholly above the diagonal (first key after the last query) adds nothing
        pl.when(j * bk <= i * bq + bq - 1)(fold_in_block)
    else:
        fold_in_block()

    @pl.when(j == pl.num_programs(1) - 1)
    def _finalize():
        o_ref[...] = (acc_ref[...] / widen(l_ref[...], d)).astype(o_ref.dtype)
    ### END SOLUTION


def flash_attention(q, k, v, bq, bk):
    ### BEGIN SOLUTION
    lq, d = q.shape
    kv = pl.BlockSpec((bk, d), lambda i, j: (j, 0))
    # j innermost: the q block, the output block and the scratch stay on chip while k and v
    # stream past; k and v are read once per query block
    return pl.pallas_call(
        flash_kernel, grid=(pl.cdiv(lq, bq), k.shape[0] // bk),
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)), kv, kv],
        out_specs=pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((lq, d), q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, 128), jnp.float32), pltpu.VMEM((bq, 128), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
        interpret=TPU_INTERPRET,
    )(q, k, v)
    ### END SOLUTION


# %% nbgrader={"grade_id": "flash_attention_visible", "grade": true, "points": 1}
course.check("flash_attention", flash_attention)

# %% nbgrader={"grade_id": "flash_attention_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: non-divisible Lq, bfloat16, other blocks, large logits.
### BEGIN HIDDEN TESTS
course.check("flash_attention", flash_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `causal_flash_attention(q, k, v, bq, bk)` (3 points)
#
# Query `t` attends to keys `<= t` (`Lq == Lk`). Lesson 8 builds this kernel in its section
# "Causal attention"; here `bq` and `bk` may differ. A key block that *straddles* the diagonal
# is masked inside the kernel: a score whose key comes after its query becomes `-inf` before the
# max. A block wholly *above* the diagonal adds nothing: skip its work with `pl.when`, and skip
# its copies by clamping the key/value index map to the last block the query block needs, so
# the pipeline sees the same block index again and fetches nothing. Write the `causal=True`
# branch of task 2's `flash_kernel` (the mask and the skip), then the call here. Budget: `k`
# reads only the blocks at or below the diagonal.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Think in positions, not block numbers: a score's query is `i * bq` plus its row and its key
# `j * bk` plus its column (`jax.lax.broadcasted_iota` gives rows and columns, as in lesson 3's
# ragged mask). Query block `i` needs the key blocks up to the one holding its *last* query; with
# `bq != bk` that is neither `i` nor the block of its first query. Later steps skip the work,
# and their index map returns that last block instead of `j`. Key block 0 comes first and holds
# key 0, which every query sees, so no row's max is still `-inf` when it is used.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# With `bq` 4 and `bk` 2, query block 1 holds queries 4 to 7, and its last query, 7, lies in key
# block 3. Write that block number for query block `i` as an integer expression of `i`, `bq` and
# `bk`; the key and value index maps return the smaller of `j` and that block.
#
# </details>

# %% nbgrader={"grade_id": "causal_flash_attention_solution", "solution": true}
def causal_flash_attention(q, k, v, bq, bk):
    ### BEGIN SOLUTION
    n, d = q.shape

    def kv_map(i, j):
        # past query block i's last needed key block, repeat that block's index: the pipeline
        # sees no change and fetches nothing
        return jnp.minimum(j, (i * bq + bq - 1) // bk), 0

    kv = pl.BlockSpec((bk, d), kv_map)
    return pl.pallas_call(
        functools.partial(flash_kernel, causal=True), grid=(pl.cdiv(n, bq), n // bk),
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)), kv, kv],
        out_specs=pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((n, d), q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, 128), jnp.float32), pltpu.VMEM((bq, 128), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
        interpret=TPU_INTERPRET,
    )(q, k, v)
    ### END SOLUTION


# %% nbgrader={"grade_id": "causal_flash_attention_visible", "grade": true, "points": 1}
course.check("causal_flash_attention", causal_flash_attention)

# %% nbgrader={"grade_id": "causal_flash_attention_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: other lengths, bq above and below bk, bfloat16, large logits.
### BEGIN HIDDEN TESTS
course.check("causal_flash_attention", causal_flash_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 4 — `flash_attention_backward(q, k, v, o, lse, do, bq, bk)` (4 points)
#
# *After lessons 10 and 12:* tasks 4 and 5 need lessons 10 (`jax.custom_vjp`) and 12 (a
# backward's kernels); the other tasks need only lesson 8. Written this way, the forward and
# backward of tasks 4-5 ran 1.12 times as fast as `jax.vjp` of JAX's bundled TPU flash attention
# on a TPU v5e (8 heads of `N = 2048`, `d = 128`, bfloat16, 512 blocks on both sides;
# `bench/recorded/speed-v5e.json`).
#
# The backward pass of task 2's attention, as FlashAttention-2 computes it. The forward saved
# its output `o` and, for each query row, the logsumexp of its scores, `lse = m + log(l)`
# (shape `(Lq, 1)`, float32). Lesson 12's op saves `m` and `l` apart instead; its backward
# kernels are built as yours will be. Given the cotangent `do` of the output, return
# `(dq, dk, dv)`, each in its input's dtype. `Lq` is a multiple of `bq`, `Lk` of `bk`. With
# `s = q k^T * scale` (`scale = 1 / sqrt(d)`) recomputed block by block, never stored:
#
# * `p = exp(s - lse)`: the probabilities, already normalised;
# * `dv = p^T do`, a sum over queries;
# * `dp = do v^T` and `ds = p * (dp - D)`, where `D = rowsum(do * o)`, one value per query
#   row (the softmax's Jacobian: `D` equals `rowsum(p * dp)`, so `o` spares the kernels the
#   whole row of `p`);
# * `dk = ds^T q * scale`, a sum over queries, and `dq = ds k * scale`, a sum over keys.
#
# Three `pallas_call`s: first `D`, `(Lq, 1)` float32, grid `(Lq // bq,)`; then `dk` and `dv`
# together, grid `(Lk // bk, Lq // bq)`: key block `j` outer, the query blocks streaming past
# as an `"arbitrary"` axis while two `(bk, d)` float32 VMEM accumulators sum over them; then
# `dq`, grid `(Lq // bq, Lk // bk)`: the forward's order, one `(bq, d)` accumulator. `D` is a
# kernel of its own, where lesson 12's op sums its `di` in plain JAX: every kernel's inputs must
# be your function's arguments or an earlier kernel's outputs.
#
# Graded beside the values: the two gradient kernels' grids as above; no `(Lq, Lk)` array
# reaches HBM (the only writes are `D`, `dq`, `dk` and `dv`); the `dk`/`dv` kernel reads `k`
# and `v` once and `q`, `do`, `lse` and `D` once per key block; the `dq` kernel reads `q`,
# `do`, `lse` and `D` once and `k` and `v` once per query block.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Both gradient kernels need the same two blocks at step (query block, key block): `p` and
# `ds`, each `(bq, bk)`, from the blocks of `q`, `k`, `v`, `do` and the rows of `lse` and `D`.
# Write that once as a helper both kernel bodies call. Each kernel zeroes its accumulators at
# its inner axis's first step and writes them out at its last, as task 2 does with `acc`. The
# `dk`/`dv` kernel's index maps for `q`, `do`, `lse` and `D` follow the *inner* grid index,
# those for `k`, `v`, `dk` and `dv` the outer one.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The transposes stay inside the kernel: `jnp.dot(p.T, do_block)` is `(bk, bq) @ (bq, d)`,
# a `(bk, d)` block of `dv`; `ds.T` with the `q` block gives `dk`'s. `ds` needs `D`'s rows
# subtracted *before* multiplying by `p`, and both `dk` and `dq` take the scale once more,
# since `s` was `q k^T` times it.
#
# </details>

# %% nbgrader={"grade_id": "flash_attention_backward_solution", "solution": true}
def probs_and_dscores(q, k, v, lse, delta, do):
    """p and ds for one (query block, key block) pair, both (bq, bk) float32.

    q and do (bq, d), k and v (bk, d), lse and delta (bq, 1) float32: the forward's logsumexp
    and D = rowsum(do * o) of these query rows.
    """
    ### BEGIN SOLUTION
    d = q.shape[1]
    # float32: several MXU passes, exact; bfloat16: one pass (Mosaic refuses "highest" there)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    rows_by_rows = (((1,), (1,)), ((), ()))  # contract d: (bq, d) x (bk, d) -> (bq, bk)
    s = jax.lax.dot_general(q, k, rows_by_rows, precision=precision,
                            preferred_element_type=jnp.float32) / math.sqrt(d)
    p = jnp.exp(s - lse)
    dp = jax.lax.dot_general(do, v, rows_by_rows, precision=precision,
                             preferred_element_type=jnp.float32)
    return p, p * (dp - delta)
    ### END SOLUTION


def delta_kernel(o_ref, do_ref, delta_ref):
    """delta_ref (bq, 1) float32: rowsum(do * o) of one query block's (bq, d) rows."""
    ### BEGIN SOLUTION
    delta_ref[...] = jnp.sum(o_ref[...].astype(jnp.float32) * do_ref[...].astype(jnp.float32),
                             axis=1, keepdims=True)
    ### END SOLUTION


def dkv_kernel(q_ref, k_ref, v_ref, lse_ref, delta_ref, do_ref, dk_ref, dv_ref, dk_acc, dv_acc):
    """One step (key block j, query block i): add query block i's terms to key block j's dk
    and dv. dk_acc and dv_acc (bk, d) float32 scratch, kept across the i steps."""
    ### BEGIN SOLUTION
    i = pl.program_id(1)
    d = q_ref.shape[1]
    precision = jax.lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None

    @pl.when(i == 0)
    def _init():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    q, do = q_ref[...], do_ref[...]
    p, ds = probs_and_dscores(q, k_ref[...], v_ref[...], lse_ref[...], delta_ref[...], do)
    # sums over queries: the (bq, bk) blocks transposed in VMEM, contracted with the query rows
    dv_acc[...] += jnp.dot(p.T.astype(do.dtype), do, precision=precision,
                           preferred_element_type=jnp.float32)
    dk_acc[...] += jnp.dot(ds.T.astype(q.dtype), q, precision=precision,
                           preferred_element_type=jnp.float32) / math.sqrt(d)

    @pl.when(i == pl.num_programs(1) - 1)
    def _finalize():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)
    ### END SOLUTION


def dq_kernel(q_ref, k_ref, v_ref, lse_ref, delta_ref, do_ref, dq_ref, dq_acc):
    """One step (query block i, key block j): add key block j's terms to query block i's dq.
    dq_acc (bq, d) float32 scratch, kept across the j steps."""
    ### BEGIN SOLUTION
    j = pl.program_id(1)
    d = q_ref.shape[1]
    precision = jax.lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None

    @pl.when(j == 0)
    def _init():
        dq_acc[...] = jnp.zeros_like(dq_acc)

    k = k_ref[...]
    _, ds = probs_and_dscores(q_ref[...], k, v_ref[...], lse_ref[...], delta_ref[...],
                              do_ref[...])
    dq_acc[...] += jnp.dot(ds.astype(k.dtype), k, precision=precision,
                           preferred_element_type=jnp.float32) / math.sqrt(d)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finalize():
        dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)
    ### END SOLUTION


def flash_attention_backward(q, k, v, o, lse, do, bq, bk):
    ### BEGIN SOLUTION
    (lq, d), lk = q.shape, k.shape[0]
    nq, nk = lq // bq, lk // bk
    delta = pl.pallas_call(
        delta_kernel, grid=(nq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0))] * 2,
        out_specs=pl.BlockSpec((bq, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((lq, 1), jnp.float32), interpret=INTERPRET,
    )(o, do)

    # dk, dv: key block j outer, kept on chip with its accumulators while the query blocks i
    # stream past; the sum over i makes that axis "arbitrary"
    def query_rows(width):
        return pl.BlockSpec((bq, width), lambda j, i: (i, 0))

    key_rows = pl.BlockSpec((bk, d), lambda j, i: (j, 0))
    dk, dv = pl.pallas_call(
        dkv_kernel, grid=(nk, nq),
        in_specs=[query_rows(d), key_rows, key_rows, query_rows(1), query_rows(1), query_rows(d)],
        out_specs=[key_rows, key_rows],
        out_shape=[jax.ShapeDtypeStruct((lk, d), k.dtype), jax.ShapeDtypeStruct((lk, d), v.dtype)],
        scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=TPU_INTERPRET,
    )(q, k, v, lse, delta, do)

    # dq: the forward's order, query block i outer, the key blocks j streaming past
    def query_block(width):
        return pl.BlockSpec((bq, width), lambda i, j: (i, 0))

    kv = pl.BlockSpec((bk, d), lambda i, j: (j, 0))
    dq = pl.pallas_call(
        dq_kernel, grid=(nq, nk),
        in_specs=[query_block(d), kv, kv, query_block(1), query_block(1), query_block(d)],
        out_specs=query_block(d),
        out_shape=jax.ShapeDtypeStruct((lq, d), q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=TPU_INTERPRET,
    )(q, k, v, lse, delta, do)
    return dq, dk, dv
    ### END SOLUTION


# %% nbgrader={"grade_id": "flash_attention_backward_visible", "grade": true, "points": 2}
course.check("flash_attention_backward", flash_attention_backward)

# %% nbgrader={"grade_id": "flash_attention_backward_hidden", "grade": true, "points": 2}
# Hidden tests: Lq != Lk, bq != bk, large logits.
### BEGIN HIDDEN TESTS
course.check("flash_attention_backward", flash_attention_backward, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 5 — `attention_with_grad(q, k, v, bq, bk)` (2 points)
#
# Task 2's forward and task 4's backward as one differentiable function, as lesson 12's op
# attaches its backward: `jax.custom_vjp`, so that `jax.grad` of a loss of
# `attention_with_grad` runs your kernels. The forward must now save `lse` for the backward:
# `flash_kernel_with_lse` is task 2's step, and at the last key block it also writes each
# row's logsumexp, `m + log(l)`, to a second output, `(Lq, 1)` float32. `attention_fwd`
# returns the output and the residuals task 4 reads; `attention_bwd` gets `bq` and `bk` (the
# arguments `nondiff_argnums` names) first, then the residuals and `do`, and returns one
# gradient per differentiable argument. The check calls `jax.vjp` of your function, applies
# the pullback to a cotangent, as `jax.grad` does, and compares the output and the three
# gradients. Graded beside the values: one forward kernel writing `o` and `lse`, on task 2's
# grid; the backward's kernels under task 4's rules; the forward's only writes are `o` and
# `lse`, the backward's task 4's.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# `flash_kernel_with_lse` can call `flash_kernel` and then, in a `pl.when` at the last key
# block, read the scratch `m_ref` and `l_ref` it leaves behind: after the last block they hold
# the row's max and sum. The forward's call is task 2's with a second output spec, `(bq, 1)`
# blocks that, like the output's, keep their index along the key axis.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The residuals are everything task 4's function takes but `do`: `q`, `k`, `v`, `o` and
# `lse`, in that order, so the backward is one call of `flash_attention_backward` with them
# unpacked, then `do`, `bq` and `bk`.
#
# </details>

# %% nbgrader={"grade_id": "attention_with_grad_solution", "solution": true}
def flash_kernel_with_lse(q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref):
    """Task 2's step; at the last key block also lse_ref (bq, 1) float32, the logsumexp of
    each query row's scaled scores."""
    ### BEGIN SOLUTION
    flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref)

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _save_lse():
        lse_ref[...] = m_ref[:, :1] + jnp.log(l_ref[:, :1])
    ### END SOLUTION


def flash_attention_with_lse(q, k, v, bq, bk):
    """Task 2's forward, returning (o, lse): o (Lq, d) in q's dtype, lse (Lq, 1) float32."""
    ### BEGIN SOLUTION
    lq, d = q.shape
    kv = pl.BlockSpec((bk, d), lambda i, j: (j, 0))
    return pl.pallas_call(
        flash_kernel_with_lse, grid=(pl.cdiv(lq, bq), k.shape[0] // bk),
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)), kv, kv],
        out_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                   pl.BlockSpec((bq, 1), lambda i, j: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((lq, d), q.dtype),
                   jax.ShapeDtypeStruct((lq, 1), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((bq, 128), jnp.float32), pltpu.VMEM((bq, 128), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
        interpret=TPU_INTERPRET,
    )(q, k, v)
    ### END SOLUTION


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def attention_with_grad(q, k, v, bq, bk):
    ### BEGIN SOLUTION
    return flash_attention_with_lse(q, k, v, bq, bk)[0]
    ### END SOLUTION


def attention_fwd(q, k, v, bq, bk):
    ### BEGIN SOLUTION
    o, lse = flash_attention_with_lse(q, k, v, bq, bk)
    return o, (q, k, v, o, lse)
    ### END SOLUTION


def attention_bwd(bq, bk, residuals, do):
    ### BEGIN SOLUTION
    return flash_attention_backward(*residuals, do, bq, bk)
    ### END SOLUTION


attention_with_grad.defvjp(attention_fwd, attention_bwd)


# %% nbgrader={"grade_id": "attention_with_grad_visible", "grade": true, "points": 1}
course.check("attention_with_grad", attention_with_grad)

# %% nbgrader={"grade_id": "attention_with_grad_hidden", "grade": true, "points": 1}
# Hidden tests: Lq != Lk.
### BEGIN HIDDEN TESTS
course.check("attention_with_grad", attention_with_grad, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 6 — `dropout_attention(q, k, v, seed, bq, bk, rate)` (3 points)
#
# Task 2's attention with dropout on the attention probabilities, drawn **inside the kernel**
# (lesson 8, "Dropout inside the kernel"): each probability is kept with probability
# `1 - rate` and then scaled by `1 / (1 - rate)`, or dropped (0). The softmax's sum runs over
# every key, dropped or not; only the product with `v` loses the dropped ones. `seed` is an
# int32 array of shape `(1,)`: put it in SMEM (`pl.BlockSpec(memory_space=pltpu.SMEM)`) and
# make a key from it in the kernel, with the grid step's block indices folded in, so that every
# `(bq, bk)` block draws its own bits and the same seed draws the same bits again. Return the
# output `(Lq, d)` in `q`'s dtype **and** the keep mask your kernel drew, `(Lq, Lk)` int32 (1
# kept, 0 dropped), written as a second output with `(bq, bk)` blocks.
#
# Draw with `jax.random` keys (`jax.random.key`, `jax.random.fold_in`, `jax.random.bits`):
# their bits are the same in interpret mode and on a TPU. The TPU's own generator
# (`pltpu.prng_seed`, `pltpu.prng_random_bits`) does less work on the chip (one operation a
# draw, where threefry runs twenty rounds), but TPU interpret mode returns zeros for it, so
# nothing here could check a kernel that uses it.
#
# The check cannot compare with a fixed answer (the mask is your kernel's draw), so it checks
# what a right dropout shows: the mask holds 0 and 1 and keeps `1 - rate` of the entries
# (within five binomial standard deviations); no two `(bq, bk)` blocks of it are alike;
# `seed + 1` draws another mask, differing in at least `rate · (1 - rate)` of the entries
# (half what two independent masks give); and the output is the attention with your mask,
# scaled by `1 / (1 - rate)`. It calls your function once per seed; each call is one
# `pallas_call` with grid `(Lq // bq, Lk // bk)`, reading `k` once per query block and
# writing nothing to HBM but the output and the int32 mask.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Task 2's kernel with one more input (the seed, first) and one more output (the mask block).
# At step `(i, j)`: `p = exp(s - m_new)` as before, and `l` sums all of `p`; draw `(bq, bk)`
# random bits from a key made of the seed with the step's position folded in, keep where the
# bits are at least `rate` of the way through the uint32 range, write the mask block, and add
# `where(keep, p, 0) @ v` to the accumulator. At the last step divide by `l` and by `1 - rate`.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The key line makes step `(i, j)`'s key: `jax.random.key` of the seed read from its SMEM ref,
# then `jax.random.fold_in` of one integer that differs at every grid step (the step's position
# in the grid, counted from `i`, `j` and `pl.num_programs(1)`). Draw `jax.random.bits` of the
# score block's shape as uint32 and compare them with `rate` times `2**32` (a NumPy uint32, not
# a JAX array, which a kernel cannot capture). The mask's output BlockSpec has the score block's
# shape, and its index map sends step `(i, j)` to block `(i, j)`.
#
# </details>

# %% nbgrader={"grade_id": "dropout_attention_solution", "solution": true}
def dropout_attention(q, k, v, seed, bq, bk, rate):
    ### BEGIN SOLUTION
    (lq, d), lk = q.shape, k.shape[0]
    # float32: several MXU passes, exact; bfloat16: one pass (Mosaic refuses "highest" there)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    # uint32 bits at or above this are kept: a fraction 1 - rate of them
    threshold = np.uint32(min(int(rate * 2**32), 2**32 - 1))

    def kernel(seed_ref, q_ref, k_ref, v_ref, o_ref, keep_ref, m_ref, l_ref, acc_ref):
        i, j = pl.program_id(0), pl.program_id(1)

        @pl.when(j == 0)
        def _init():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                precision=precision,
                                preferred_element_type=jnp.float32) / math.sqrt(d)
        m_new = jnp.maximum(m_ref[...], jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_ref[...] - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)  # every key
        # one key per grid step: every block draws its own bits, the same seed the same ones
        key = jax.random.fold_in(jax.random.key(seed_ref[0]), i * pl.num_programs(1) + j)
        keep = jax.random.bits(key, (bq, bk), jnp.uint32) >= threshold
        keep_ref[...] = keep.astype(jnp.int32)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            jnp.where(keep, p, 0.0).astype(v_ref.dtype), v_ref[...], precision=precision,
            preferred_element_type=jnp.float32)
        m_ref[...] = m_new

        @pl.when(j == pl.num_programs(1) - 1)
        def _finalize():
            o_ref[...] = (acc_ref[...] / (l_ref[...] * (1 - rate))).astype(o_ref.dtype)

    kv = pl.BlockSpec((bk, d), lambda i, j: (j, 0))
    return pl.pallas_call(
        kernel, grid=(lq // bq, lk // bk),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                  pl.BlockSpec((bq, d), lambda i, j: (i, 0)), kv, kv],
        out_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                   pl.BlockSpec((bq, bk), lambda i, j: (i, j))],
        out_shape=[jax.ShapeDtypeStruct((lq, d), q.dtype),
                   jax.ShapeDtypeStruct((lq, lk), jnp.int32)],
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
        interpret=TPU_INTERPRET,
    )(seed, q, k, v)
    ### END SOLUTION


# %% nbgrader={"grade_id": "dropout_attention_visible", "grade": true, "points": 1}
course.check("dropout_attention", dropout_attention)

# %% nbgrader={"grade_id": "dropout_attention_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: bfloat16, other rates and blocks, large logits.
### BEGIN HIDDEN TESTS
course.check("dropout_attention", dropout_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
