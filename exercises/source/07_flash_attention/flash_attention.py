# %% [markdown]
# # Assignment 7 — flash attention
#
# Attention `softmax(q k^T / sqrt(d)) v` for one head, `q` of shape `(Lq, d)`, `k` and `v` of
# shape `(Lk, d)`. Flash attention never stores the `(Lq, Lk)` scores in HBM: for each block of
# queries it walks the key blocks keeping a running max `m`, a running sum `l` and an unnormalised
# accumulator in VMEM scratch (the online softmax).

# %% nbgrader={"grade_id": "setup", "locked": true}
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader import course
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

# %% nbgrader={"grade_id": "attention_scores_solution", "solution": true}
def attention_scores(q, k, bq, bk):
    ### BEGIN SOLUTION
    lq, d = q.shape
    lk = k.shape[0]
    scale = 1.0 / math.sqrt(d)

    def kernel(q_ref, k_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
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

# %%
def _flash(q, k, v, bq, bk, causal):
    """A flash-attention forward; yours to use, change or ignore."""
    lq, d = q.shape
    lk = k.shape[0]
    scale = 1.0 / math.sqrt(d)

    def last_block(i):  # the last key block holding a key <= the block's last query
        return jnp.minimum((i * bq + bq - 1) // bk, lk // bk - 1)

    def kv_map(i, j):
        return (jnp.minimum(j, last_block(i)) if causal else j, 0)

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        i, j = pl.program_id(0), pl.program_id(1)

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        def step():
            s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32) * scale
            if causal:
                qi = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
                ki = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
                s = jnp.where(qi >= ki, s, -jnp.inf)
            m_new = jnp.maximum(m_ref[...], jnp.max(s, axis=1, keepdims=True))
            p = jnp.exp(s - m_new)
            alpha = jnp.exp(m_ref[...] - m_new)
            l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
            acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
                p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
            m_ref[...] = m_new

        if causal:
            pl.when(j <= last_block(i))(step)
        else:
            step()

        @pl.when(j == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(pl.cdiv(lq, bq), lk // bk),
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((bk, d), kv_map), pl.BlockSpec((bk, d), kv_map)],
        out_specs=pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((lq, d), q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
        interpret=TPU_INTERPRET,
    )(q, k, v)

# %% [markdown]
# ## Task 2 — `flash_attention(q, k, v, bq, bk)` (3 points)
#
# The forward pass with grid `(cdiv(Lq, bq), Lk // bk)` (`Lk` is a multiple of `bk`). Budget: the
# only HBM write is the output, `k` is read once per query block.

# %% nbgrader={"grade_id": "flash_attention_solution", "solution": true}
def flash_attention(q, k, v, bq, bk):
    ### BEGIN SOLUTION
    return _flash(q, k, v, bq, bk, causal=False)
    ### END SOLUTION


# %% nbgrader={"grade_id": "flash_attention_visible", "grade": true, "points": 1}
course.check("flash_attention", flash_attention)

# %% nbgrader={"grade_id": "flash_attention_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: non-divisible Lq, bfloat16, other blocks.
### BEGIN HIDDEN TESTS
course.check("flash_attention", flash_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `causal_flash_attention(q, k, v, bq, bk)` (3 points)
#
# Query `t` attends to keys `<= t` (`Lq == Lk`). Skip the work above the diagonal *and* its
# copies: clamp the key/value index map to the last block a query block needs, so the pipeline
# sees the same block again and skips the fetch. Budget: `k` reads only the blocks at or below
# the diagonal.

# %% nbgrader={"grade_id": "causal_flash_attention_solution", "solution": true}
def causal_flash_attention(q, k, v, bq, bk):
    ### BEGIN SOLUTION
    return _flash(q, k, v, bq, bk, causal=True)
    ### END SOLUTION


# %% nbgrader={"grade_id": "causal_flash_attention_visible", "grade": true, "points": 1}
course.check("causal_flash_attention", causal_flash_attention)

# %% nbgrader={"grade_id": "causal_flash_attention_hidden", "grade": true, "points": 2} timeout=120
# Hidden tests: other lengths and blocks, bfloat16.
### BEGIN HIDDEN TESTS
course.check("causal_flash_attention", causal_flash_attention, hidden=True)
### END HIDDEN TESTS
