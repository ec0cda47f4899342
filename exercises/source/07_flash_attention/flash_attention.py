# %% [markdown]
# # Assignment 7 — flash attention
#
# Attention `softmax(q k^T / sqrt(d)) v` for one head, `q` of shape `(Lq, d)`, `k` and `v` of
# shape `(Lk, d)`. Flash attention never stores the `(Lq, Lk)` scores in HBM: for each block of
# queries it walks the key blocks keeping a running max `m`, a running sum `l` and an unnormalised
# accumulator in VMEM scratch (the online softmax).
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
# block.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Step `(i, j)` folds key block `j` into query block `i`'s state: scores `q k^T * scale` in
# float32, the new running max (the old one or this block's row max, whichever is larger), the
# probabilities `exp(s - m_new)`, and the factor `exp(m_old - m_new)` that rescales the old sum
# and the old accumulator before this block's terms are added. Initialise the state at `j == 0`
# (max `-inf`, sum and accumulator 0) and write `acc / l` at the last `j`. The query block and
# the output block keep their index along `j`, so they stay on chip; the scratch is
# `(bq, 1)`, `(bq, 1)` and `(bq, d)`, float32.
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
    j steps: m_ref (bq, 1) the running row max of the scores, l_ref (bq, 1) the running sum of
    exp(score - max), acc_ref (bq, d) the unnormalised output. causal: query t sees keys <= t
    (task 3).
    """
    ### BEGIN SOLUTION
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
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_ref[...] - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], precision=precision,
            preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    if causal:  # a block wholly above the diagonal (first key after the last query) adds nothing
        pl.when(j * bk <= i * bq + bq - 1)(fold_in_block)
    else:
        fold_in_block()

    @pl.when(j == pl.num_programs(1) - 1)
    def _finalize():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)
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
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
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
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
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
# ## Task 4 — `dropout_attention(q, k, v, seed, bq, bk, rate)` (3 points)
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
# (`pltpu.prng_seed`, `pltpu.prng_random_bits`) is faster on the chip, but TPU interpret mode
# returns zeros for it, so nothing here could check a kernel that uses it.
#
# The check cannot compare with a fixed answer (the mask is your kernel's draw), so it checks
# what a right dropout shows: the mask holds 0 and 1 and keeps about `1 - rate` of the entries;
# no two `(bq, bk)` blocks of it are alike; `seed + 1` draws another mask; and the output is the
# attention with your mask, scaled by `1 / (1 - rate)`.

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
# ## What passed
#
# The cell below lists every task of this notebook as passed, failed (with the first line of
# its message) or not checked in this kernel; run all cells above first.

# %%
course.summary()
