"""flywheel-tpu 0.3.0's public Pallas TPU attention (installed from PyPI), traced and checked
against TPU interpret mode (every pipeline copy and kernel-body DMA) and its values against
plain JAX attention: dense flash attention forward and backward, and packed (varlen) sequences.

Skipped where flywheel-tpu is not installed (CI does not install it). The KV-cache decode
kernels (``flash_attn_with_kvcache``) read the cache through a ref bitcast that TPU interpret
mode cannot run in jax 0.12 (``'BitcastTransform' object has no attribute 'indices'``), so they
are traced but cannot be verified.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelsim
from kernelsim.verify import verify

flywheel = pytest.importorskip("flywheel_tpu", minversion="0.3.0")
pytestmark = pytest.mark.interpret

HEADS, HEAD_DIM = 2, 128


def _bf16(i, shape):
    return jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(jnp.bfloat16)


def attention_reference(q, k, v, causal):
    """Softmax attention in f32 over (batch, heads, seq, head_dim); causal aligned bottom-right."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        keep = jnp.arange(lk)[None, :] <= jnp.arange(lq)[:, None] + (lk - lq)
        s = jnp.where(keep, s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def flash_attention():
    """flash_attn_func, causal, head-major (batch, heads, seq, head_dim)."""
    args = tuple(_bf16(i, (1, HEADS, 256, HEAD_DIM)) for i in range(3))
    return (lambda q, k, v: flywheel.flash_attn_func(q, k, v, causal=True),
            lambda q, k, v: attention_reference(q, k, v, causal=True), (0, 1, 2), args)


SEQ_LENS = (128, 256)


def varlen_attention():
    """flash_attn_varlen_func: two packed causal sequences, head-major (heads, tokens,
    head_dim)."""
    total = sum(SEQ_LENS)
    cu = jnp.array(np.cumsum((0, *SEQ_LENS)), jnp.int32)
    args = (*(_bf16(i, (HEADS, total, HEAD_DIM)) for i in range(3)), cu)

    def op(q, k, v, cu):
        return flywheel.flash_attn_varlen_func(q, k, v, cu, cu, max(SEQ_LENS), max(SEQ_LENS),
                                               causal=True)

    def ref(q, k, v, cu):
        outs = []
        for start, n in zip(np.cumsum((0, *SEQ_LENS[:-1])), SEQ_LENS, strict=True):
            one = [x[None, :, start:start + n] for x in (q, k, v)]
            outs.append(attention_reference(*one, causal=True)[0])
        return jnp.concatenate(outs, axis=1)

    return op, ref, (0, 1, 2), args


def kvcache_decode():
    """flash_attn_with_kvcache: one query token per row against a contiguous bf16 cache."""
    q = _bf16(0, (2, 1, HEADS, HEAD_DIM))
    k_cache, v_cache = (_bf16(i, (2, 256, HEADS, HEAD_DIM)) for i in (1, 2))
    lens = jnp.array([100, 200], jnp.int32)
    return (lambda q, kc, vc, lens: flywheel.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens)[0], None, (), (q, k_cache, v_cache, lens))


CASES = {"flash_attn_func": flash_attention, "flash_attn_varlen_func": varlen_attention}
TRACE_ONLY = {"flash_attn_with_kvcache": kvcache_decode}


def ops():
    """name -> builder of (op, argnums to differentiate, operands), as test_tokamax's OPS;
    the decode kernel has no backward (``argnums`` empty)."""
    def build(case):
        op, _, wrt, args = case()
        return op, wrt, args

    return {name: (lambda case=case: build(case)) for name, case in {**CASES, **TRACE_ONLY}.items()}


OPS = ops()


def _f32_sum(f):
    return lambda *a: f(*a).astype(jnp.float32).sum()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("name", list(CASES))
def test_flywheel_attention_equals_the_interpreter_and_plain_jax(name, direction):
    if direction == "bwd" and name != "flash_attn_func":
        pytest.skip("flash_attn_varlen_func is forward-only (jax.grad raises)")
    op, ref, wrt, args = CASES[name]()
    if direction == "bwd":
        op, ref = (jax.grad(_f32_sum(f), argnums=wrt) for f in (op, ref))
    v = verify(op, *args)
    t = kernelsim.trace(op, *args)
    assert v.ok, v.report()
    assert v.checks or v.body_dma_checks
    assert [(c.name, c.grid) for c in t.calls] == [(c.name, c.grid) for c in v.trace.calls]
    assert [c.call.body_copies for c in t.calls] == [c.call.body_copies for c in v.trace.calls]
    for got, want in zip(jax.tree_util.tree_leaves(v.outputs),
                         jax.tree_util.tree_leaves(ref(*args)), strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=3e-2, atol=3e-2)


def test_flywheel_kvcache_decode_traces():
    op, _, _, args = kvcache_decode()
    t = kernelsim.trace(op, *args)
    assert t.calls and all(c.call.body_copies for c in t.calls)
