"""The third-party cases of ``trace_speed.py --sizes production``: each library op at a size
its users run, from the library's own benchmark specs, README or a model config it names.

Each builder returns ``(op, argnums to differentiate, operands)`` like the tests' ``OPS``, and
takes ``op`` and the argnums from the test's builder of the same name, so the function timed here
is the one ``tests/kernelsim/test_tokamax.py``, ``test_flywheel.py`` and ``test_deltanet.py``
check against TPU interpret mode; only the operands are larger. Those tests are this file's
correctness check: ``kernelsim.verify`` at these sizes would run the interpreter for minutes per
case, so it is not repeated here (same code path, smaller shape).

Where a production spec has more tokens (or a longer sequence, or a larger batch) than one cold
interpreted run on a 2-core CPU finishes in a few minutes (the longest here, ragged_dot's
backward, takes about four), the per-token dimensions (heads, head_dim, hidden size, vocabulary,
expert count) stay as the spec gives them and only the token count is cut; each builder's
docstring says which.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _normal(i: int, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(dtype)


# --- tokamax 0.0.17: sizes from tokamax/_src/ops/<op>/arg_specs.py (its benchmark specs) ---


def _tokamax_op(name: str):
    import test_tokamax

    op, wrt, _ = test_tokamax.OPS[name]()
    return op, wrt


def tokamax_ragged_dot():
    """ragged_dot/arg_specs.py 'compute_bound': 8 experts, k = n = 4096 (m = 4096 tokens there;
    1,024 here, 128 routed to each expert). f32 operands, as in the test."""
    experts, tokens, k, n = 8, 1024, 4096, 4096
    op, wrt = _tokamax_op("ragged_dot")
    sizes = jnp.full((experts,), tokens // experts, jnp.int32)
    return op, wrt, (_normal(0, (tokens, k)), 0.02 * _normal(1, (experts, k, n)), sizes)


def tokamax_attention():
    """attention/arg_specs.py 'mixtral 8x7b_bf16': 32 query heads, 8 KV heads, head_dim 128
    (batch 32 x 4,096 tokens there; 1 x 1,024 here). Layout (batch, seq, heads, head_dim); the
    test's op is non-causal."""
    batch, seq, heads, kv_heads, dim = 1, 1024, 32, 8, 128
    op, wrt = _tokamax_op("dot_product_attention")
    return op, wrt, (_normal(0, (batch, seq, heads, dim)), _normal(1, (batch, seq, kv_heads, dim)),
                     _normal(2, (batch, seq, kv_heads, dim)))


def tokamax_cross_entropy():
    """linear_softmax_cross_entropy_loss/arg_specs.py 'qwen3-8b' vocabulary, 151,936; hidden
    1,024 is Qwen3-0.6B's (the same vocabulary; qwen3-8b's 4,096 puts a 2.5 GB f32 weight on
    this CPU), 256 tokens (1,024 to 131,072 there)."""
    tokens, hidden, vocab = 256, 1024, 151936
    op, wrt = _tokamax_op("linear_softmax_cross_entropy_loss")
    return op, wrt, (_normal(0, (tokens, hidden)), 0.02 * _normal(1, (hidden, vocab)),
                     jax.random.randint(jax.random.key(2), (tokens,), 0, vocab))


def tokamax_router_topk():
    """router_topk/arg_specs.py 'e256_k8_t8192' as it is (DeepSeek-V3's 256 experts, top 8 --
    the test's op takes k = 8 -- over 8,192 tokens)."""
    op, wrt = _tokamax_op("router_topk")
    return op, wrt, (_normal(0, (8192, 256)),)


def tokamax_deepseek_rope():
    """deepseek_rope/arg_specs.py 'dsv4_rope_kv_t4096_d512' as it is: the compressed KV of
    4,096 tokens, width 512, rotary width 64, positions below 65,536 (the test's op is mode
    "rope")."""
    tokens, width, rotary, max_position = 4096, 512, 64, 65536
    op, wrt = _tokamax_op("deepseek_rope")
    return op, wrt, (_normal(0, (tokens, width), jnp.bfloat16),
                     jax.random.randint(jax.random.key(1), (tokens,), 0, max_position),
                     _normal(2, (max_position, rotary)))


# mhc/arg_specs.py: DeepSeek-V4's 4 residual streams of hidden size 7,168; its specs run 16, 512
# and 8,192 tokens: 8,192 here. The Sinkhorn rounds are the test op's (4; 20 there).
_MHC_STREAMS, _MHC_HIDDEN, _MHC_TOKENS = 4, 7168, 8192


def _mhc_gates():
    m, h = _MHC_STREAMS, _MHC_HIDDEN
    return (0.02 * _normal(5, (m * (m + 2), m * h)), jnp.array([1.0, 0.9, 1.1]),
            0.5 * _normal(6, (m * (m + 2),)))


def _mhc_post_operands():
    m, h, t = _MHC_STREAMS, _MHC_HIDDEN, _MHC_TOKENS
    return (_normal(0, (t, h), jnp.bfloat16), _normal(1, (t, m * h), jnp.bfloat16),
            jax.nn.sigmoid(_normal(2, (t, m))), jax.nn.softmax(_normal(3, (t, m, m)), axis=-1))


def tokamax_mhc_pre():
    """mhc/arg_specs.py 'dsv4_t8192_m4_h7168' (mhc_pre)."""
    op, wrt = _tokamax_op("mhc_pre")
    residual = _normal(0, (_MHC_TOKENS, _MHC_STREAMS * _MHC_HIDDEN), jnp.bfloat16)
    return op, wrt, (residual, *_mhc_gates())


def tokamax_mhc_post():
    """mhc/arg_specs.py 'dsv4_t8192_m4_h7168' (mhc_post)."""
    op, wrt = _tokamax_op("mhc_post")
    return op, wrt, _mhc_post_operands()


def tokamax_mhc_fused_post_pre():
    """mhc/arg_specs.py 'dsv4_t8192_m4_h7168' (mhc_fused_post_pre)."""
    op, wrt = _tokamax_op("mhc_fused_post_pre")
    return op, wrt, (*_mhc_post_operands(), *_mhc_gates())


def tokamax_kimi_delta_attention():
    """kda/arg_specs.py 'kimi_linear_48b_a3b': 32 heads, head_dim 128, batch 1 (8,192 tokens
    there; 2,048 here). Layout (heads, batch, seq, head_dim); f32, as in the test."""
    heads, batch, seq, dim = 32, 1, 2048, 128
    op, wrt = _tokamax_op("kimi_delta_attention")
    shape = (heads, batch, seq, dim)
    q, k, v = (_normal(i, shape) for i in range(3))
    gate = -jax.nn.softplus(_normal(3, shape))
    beta = jax.nn.sigmoid(_normal(4, (heads, batch, seq)))
    return op, wrt, (q, k, v, gate, beta)


def tokamax_grouped_lowrank_proj():
    """grouped_lowrank_proj/arg_specs.py 'dsv4_t1024_g16_r1024' as it is: 1,024 tokens, 16
    groups of 8 heads of 512, LoRA rank 1,024, fp8 weight; positions below 65,536."""
    tokens, groups, rank, head_dim, rotary, max_position = 1024, 16, 1024, 512, 64, 65536
    heads_per_group = 8  # tokamax's grouped_lowrank_proj base.HEADS_PER_GROUP
    op, wrt = _tokamax_op("grouped_lowrank_proj")
    return op, wrt, (
        _normal(0, (tokens, groups * heads_per_group, head_dim), jnp.bfloat16),
        jax.random.randint(jax.random.key(1), (tokens,), 0, max_position),
        _normal(2, (max_position, rotary)),
        _normal(3, (heads_per_group * head_dim, groups * rank)).astype(jnp.float8_e4m3fn),
        jax.random.uniform(jax.random.key(4), (groups * rank,)))


def tokamax_splash_attention():
    """experimental/tpu/splash_attention/arg_specs.py 'q32_kv8_s4096_dqk128_dv128' as it is:
    32 query heads, 8 KV heads, 4,096 tokens, head_dim 128. Layout (heads, seq, head_dim); f32,
    as in the test."""
    heads, kv_heads, seq, dim = 32, 8, 4096, 128
    op, wrt = _tokamax_op("splash_attention")
    return op, wrt, (_normal(0, (heads, seq, dim)), _normal(1, (kv_heads, seq, dim)),
                     _normal(2, (kv_heads, seq, dim)))


# --- flywheel-tpu 0.3.0: its README's attention benchmark (32 query heads, 4 KV heads,
# head_dim 256, causal, batch 1, sequences from 1K to 128K tokens); bf16, as flywheel requires ---

_FLY_HEADS, _FLY_KV_HEADS, _FLY_DIM = 32, 4, 256


def flywheel_flash_attention():
    """flash_attn_func at 2,048 tokens (the README benchmark's second-shortest sequence)."""
    import test_flywheel

    op, wrt, _ = test_flywheel.OPS["flash_attn_func"]()
    seq = 2048
    return op, wrt, (_normal(0, (1, _FLY_HEADS, seq, _FLY_DIM), jnp.bfloat16),
                     _normal(1, (1, _FLY_KV_HEADS, seq, _FLY_DIM), jnp.bfloat16),
                     _normal(2, (1, _FLY_KV_HEADS, seq, _FLY_DIM), jnp.bfloat16))


_FLY_PACKED = (512, 1024, 256, 256)  # four packed requests, 2,048 tokens


def flywheel_varlen_attention():
    """flash_attn_varlen_func over four causal sequences packed into 2,048 tokens, the README
    benchmark's heads; as the test's op, with the longest sequence as max_seqlen."""
    import flywheel_tpu

    longest, total = max(_FLY_PACKED), sum(_FLY_PACKED)
    cu = jnp.array(np.cumsum((0, *_FLY_PACKED)), jnp.int32)

    def op(q, k, v, cu):
        return flywheel_tpu.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                   causal=True)

    return op, (0, 1, 2), (_normal(0, (_FLY_HEADS, total, _FLY_DIM), jnp.bfloat16),
                           _normal(1, (_FLY_KV_HEADS, total, _FLY_DIM), jnp.bfloat16),
                           _normal(2, (_FLY_KV_HEADS, total, _FLY_DIM), jnp.bfloat16), cu)


def flywheel_kvcache_decode():
    """flash_attn_with_kvcache: a decode step of 8 requests against a 4,096-token contiguous
    cache, the README benchmark's heads (traced only: the interpreter cannot run it)."""
    import test_flywheel

    op, wrt, _ = test_flywheel.OPS["flash_attn_with_kvcache"]()
    batch, cache = 8, 4096
    return op, wrt, (_normal(0, (batch, 1, _FLY_HEADS, _FLY_DIM), jnp.bfloat16),
                     _normal(1, (batch, cache, _FLY_KV_HEADS, _FLY_DIM), jnp.bfloat16),
                     _normal(2, (batch, cache, _FLY_KV_HEADS, _FLY_DIM), jnp.bfloat16),
                     jnp.linspace(1024, cache - 1, batch).astype(jnp.int32))


# --- deltanet-tpu 0.3.0: its README's example (batch 1, 2,048 tokens, 12 key heads, 24 value
# heads, K = V = 128); f32 and unit-norm keys, as in the test ---

_DN_BATCH, _DN_LEN, _DN_KEY_HEADS, _DN_VALUE_HEADS, _DN_DIM = 1, 2048, 12, 24, 128


def _deltanet_qkv():
    b, n, hk, hv, d = _DN_BATCH, _DN_LEN, _DN_KEY_HEADS, _DN_VALUE_HEADS, _DN_DIM
    k = _normal(1, (b, n, hk, d))
    return _normal(0, (b, n, hk, d)), k / jnp.linalg.norm(k, axis=-1, keepdims=True), \
        _normal(2, (b, n, hv, d))


def _deltanet(name: str, *decay):
    import test_deltanet

    op, wrt, _ = test_deltanet.OPS[name]()
    gate = jax.nn.sigmoid(_normal(4, (_DN_BATCH, _DN_LEN, _DN_KEY_HEADS)))
    return op, wrt, (*_deltanet_qkv(), *decay, gate)


def _log_decay(*channels):
    return -jax.nn.softplus(_normal(3, (_DN_BATCH, _DN_LEN, _DN_KEY_HEADS, *channels)))


def deltanet_gdn():
    """chunk_gdn: one log-decay per key head."""
    return _deltanet("chunk_gdn", _log_decay())


def deltanet_kda():
    """chunk_kda: channel-wise log-decay per key head."""
    return _deltanet("chunk_kda", _log_decay(_DN_DIM))


def deltanet_delta_rule():
    """chunk_delta_rule: no decay."""
    return _deltanet("chunk_delta_rule")


# library -> test OPS name -> production builder; every op the tests time is here
PRODUCTION = {
    "tokamax": {"ragged_dot": tokamax_ragged_dot, "dot_product_attention": tokamax_attention,
                "linear_softmax_cross_entropy_loss": tokamax_cross_entropy,
                "router_topk": tokamax_router_topk, "deepseek_rope": tokamax_deepseek_rope,
                "mhc_pre": tokamax_mhc_pre, "mhc_post": tokamax_mhc_post,
                "mhc_fused_post_pre": tokamax_mhc_fused_post_pre,
                "kimi_delta_attention": tokamax_kimi_delta_attention,
                "grouped_lowrank_proj": tokamax_grouped_lowrank_proj,
                "splash_attention": tokamax_splash_attention},
    "flywheel-tpu": {"flash_attn_func": flywheel_flash_attention,
                     "flash_attn_varlen_func": flywheel_varlen_attention,
                     "flash_attn_with_kvcache": flywheel_kvcache_decode},
    "deltanet-tpu": {"chunk_gdn": deltanet_gdn, "chunk_kda": deltanet_kda,
                     "chunk_delta_rule": deltanet_delta_rule},
}
