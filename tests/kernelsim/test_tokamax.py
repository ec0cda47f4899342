"""tokamax 0.0.17's public TPU ops (installed from PyPI), traced and checked against TPU interpret
mode: every call, pipeline copy and body DMA the interpreter performs, forward and backward.

Skipped where tokamax is not installed (it needs Python >= 3.12 and jax >= 0.11.1; CI does not
install it: ``pip install tokamax==0.0.17`` adds about 45 packages, so the same cases are
recorded by ``bench/third_party_ops.py`` in ``bench/recorded/tokamax-0.0.17-cpu.json``).
tokamax refuses to run its TPU kernels on a CPU unless asked to cross-compile
(``tokamax.config.cross_compile``), which is how these run in interpret mode here.

``OPS``: name -> builder returning ``(fn, wrt_argnums, args)``; ``wrt_argnums == ()`` means the
op is forward only (tokamax tags its arg specs ``forward_only``). ``CHIPS``: the TPU an op needs
where v5e (kernelsim's default) lacks what it uses: the SparseCore ops run on v6e (on v5e tokamax
takes an XLA path, so there is no kernel to check). ``NOT_INTERPRETED``: the ops TPU interpret
mode cannot run on a CPU with jax 0.12.0.1, with the error it raises; they have a test that the
interpreter still fails that way instead of a comparison.
"""

import importlib

import jax
import jax.numpy as jnp
import pytest

import kernelsim
from kernelsim.verify import verify

tokamax = pytest.importorskip("tokamax", minversion="0.0.17")
pytestmark = pytest.mark.interpret


def _key(i):
    return jax.random.key(i)


def ragged_dot():
    """tokamax.ragged_dot (megablox's grouped matmul): gmm forward; gmm and tgmm backward."""
    args = (jax.random.normal(_key(0), (512, 256)), jax.random.normal(_key(1), (4, 256, 256)),
            jnp.array([128, 64, 192, 128], jnp.int32))
    return (lambda lhs, rhs, sizes: tokamax.ragged_dot(lhs, rhs, sizes, implementation="mosaic"),
            (0, 1), args)


def attention():
    """tokamax.dot_product_attention: splash attention forward; forward and dkv backward."""
    q, k, v = (jax.random.normal(_key(i), (1, 256, 2, 128)) for i in range(3))
    return (lambda q, k, v: tokamax.dot_product_attention(q, k, v, implementation="mosaic"),
            (0, 1, 2), (q, k, v))


def cross_entropy():
    """tokamax.linear_softmax_cross_entropy_loss: pl.kernel on a TensorCore mesh, both ways."""
    args = (jax.random.normal(_key(0), (256, 256)), jax.random.normal(_key(1), (256, 512)),
            jax.random.randint(_key(2), (256,), 0, 512))
    return (lambda x, w, labels: tokamax.linear_softmax_cross_entropy_loss(
        x, labels, w, implementation="mosaic_tpu"), (0, 1), args)


def router_topk():
    """tokamax.ops.router_topk: k passes of row max over a block of token rows."""
    scores = jax.random.normal(_key(0), (64, 256))
    return (lambda s: tokamax.ops.router_topk(s, 8, implementation="mosaic_tpu"), (), (scores,))


def deepseek_rope():
    """tokamax.ops.deepseek_rope: a per-token gather of cos/sin rows, then the rotation."""
    args = (jax.random.normal(_key(0), (16, 4, 512), jnp.bfloat16),
            jax.random.randint(_key(1), (16,), 0, 1024),
            jax.random.normal(_key(2), (1024, 64)))
    return (lambda x, pos, cache: tokamax.ops.deepseek_rope(
        x, pos, cache, mode="rope", implementation="mosaic_tpu"), (), args)


_MHC_STREAMS, _MHC_HIDDEN = 4, 256


def _mhc_gates():
    m = _MHC_STREAMS
    return (0.02 * jax.random.normal(_key(5), (m * (m + 2), m * _MHC_HIDDEN)),
            jnp.array([1.0, 0.9, 1.1]), 0.5 * jax.random.normal(_key(6), (m * (m + 2),)))


_MHC_CONSTANTS = (1e-6, 1e-6, 1e-6, 2.0, 4)  # rms, pre, sinkhorn eps; post scale; rounds


def _mhc_post_args(tokens=16):
    m, h = _MHC_STREAMS, _MHC_HIDDEN
    comb = jax.nn.softmax(jax.random.normal(_key(3), (tokens, m, m)), axis=-1)
    return (jax.random.normal(_key(0), (tokens, h), jnp.bfloat16),
            jax.random.normal(_key(1), (tokens, m * h), jnp.bfloat16),
            jax.nn.sigmoid(jax.random.normal(_key(2), (tokens, m))), comb)


def mhc_pre():
    """tokamax.ops.mhc_pre: gate projection, Sinkhorn and stream collapse per token block."""
    residual = jax.random.normal(_key(0), (16, _MHC_STREAMS * _MHC_HIDDEN), jnp.bfloat16)
    return (lambda *a: tokamax.ops.mhc_pre(*a, *_MHC_CONSTANTS, implementation="mosaic_tpu"),
            (), (residual, *_mhc_gates()))


def mhc_post():
    """tokamax.ops.mhc_post: the sublayer output mixed back into the residual streams."""
    return (lambda *a: tokamax.ops.mhc_post(*a, implementation="mosaic_tpu"), (),
            _mhc_post_args())


def mhc_fused_post_pre():
    """tokamax.ops.mhc_fused_post_pre: mhc_post then the next mhc_pre in one pass."""
    return (lambda *a: tokamax.ops.mhc_fused_post_pre(*a, *_MHC_CONSTANTS,
                                                      implementation="mosaic_tpu"),
            (), (*_mhc_post_args(), *_mhc_gates()))


def ragged_gather():
    """tokamax.ops.ragged_gather: rows of x gathered by index between start and end."""
    args = (jax.random.normal(_key(0), (512, 128), jnp.bfloat16),
            jax.random.randint(_key(1), (256,), 0, 512), jnp.array([10], jnp.int32),
            jnp.array([200], jnp.int32))
    return (lambda *a: tokamax.ops.ragged_gather(*a, implementation="mosaic"), (), args)


def ragged_gather_reduce():
    """tokamax.ops.ragged_gather_reduce: gathered rows, weighted and summed per group of 4."""
    rows = 8192  # smaller inputs take tokamax's XLA path (2 x x under 60% of VMEM)
    args = (jax.random.normal(_key(0), (rows, 2048), jnp.bfloat16),
            jax.random.randint(_key(1), (rows,), 0, rows),
            jax.random.uniform(_key(2), (rows,), jnp.bfloat16),
            jax.random.bernoulli(_key(3), 0.8, (rows,)))
    return (lambda *a: tokamax.ops.ragged_gather_reduce(*a, 4, implementation="mosaic_tpu"),
            (), args)


def top_k():
    """tokamax.ops.top_k: SparseCore top-k over rows of scores."""
    scores = jax.random.normal(_key(0), (8, 1024))
    return (lambda s: tokamax.ops.top_k(s, 128, implementation="mosaic_tpu"), (), (scores,))


def csa_gather():
    """tokamax.ops.csa_gather: paged KV cache rows gathered by token index (SparseCore)."""
    pages, page = 4, 256
    args = (jax.random.randint(_key(0), (pages, page, 128), -2**30, 2**30),
            jax.random.randint(_key(1), (pages, page // 4, 128), -2**30, 2**30),
            jax.random.randint(_key(2), (256,), 0, pages * page))
    return (lambda *a: tokamax.ops.csa_gather(*a, top_k=256, implementation="mosaic_tpu"),
            (), args)


def kimi_delta_attention():
    """tokamax.ops.kimi_delta_attention: chunked gated delta rule, forward and backward."""
    h, b, t, d = 2, 1, 128, 128
    q, k, v = (jax.random.normal(_key(i), (h, b, t, d)) for i in range(3))
    gate = -jax.nn.softplus(jax.random.normal(_key(3), (h, b, t, d)))
    beta = jax.nn.sigmoid(jax.random.normal(_key(4), (h, b, t)))
    return (lambda *a: tokamax.ops.kimi_delta_attention(*a, implementation="mosaic")[0],
            (0, 1, 2), (q, k, v, gate, beta))


def ragged_dot_v2():
    """tokamax.ragged_dot's second TPU kernel (``mosaic_tpu_v2``), forward and backward."""
    build = ragged_dot()
    return ((lambda lhs, rhs, sizes: tokamax.ragged_dot(lhs, rhs, sizes,
                                                        implementation="mosaic_tpu_v2")),
            build[1], build[2])


def grouped_lowrank_proj():
    """tokamax.ops.grouped_lowrank_proj: inverse RoPE, fp8 quantisation, per-group matmul."""
    tokens, groups, rank = 16, 2, 256
    heads = 8 * groups  # tokamax's HEADS_PER_GROUP
    args = (jax.random.normal(_key(0), (tokens, heads, 512), jnp.bfloat16),
            jax.random.randint(_key(1), (tokens,), 0, 1024),
            jax.random.normal(_key(2), (1024, 64)),
            jax.random.normal(_key(3), (8 * 512, groups * rank)).astype(jnp.float8_e4m3fn),
            jax.random.uniform(_key(4), (groups * rank,)))
    return (lambda *a: tokamax.ops.grouped_lowrank_proj(*a, implementation="mosaic_tpu"), (),
            args)


def splash_attention():
    """tokamax.ops.experimental.splash_attention: block-sparse attention, both ways."""
    q, k, v = (jax.random.normal(_key(i), (2, 256, 128)) for i in range(3))
    return (lambda q, k, v: tokamax.ops.experimental.splash_attention(
        q, k, v, implementation="mosaic_tpu"), (0, 1, 2), (q, k, v))


# The serving ops below take paged caches whose indices must agree with each other; their inputs
# are made the way tokamax's own test suites make them (``tokamax/_src/ops/*/test_base.py``,
# shipped in the wheel), at those suites' smallest sizes.


def _tokamax_test_base(op: str):
    return importlib.import_module(f"tokamax._src.ops.{op}.test_base")


def proj_and_save_state():
    """tokamax.ops.proj_and_save_state: the KV compressor's projection into a paged cache."""
    base = _tokamax_test_base("proj_and_save_state")
    geometry = base.GEOMETRIES["csa"]
    args = base.make_inputs(geometry, 8, hidden_size=512)
    return (lambda *a: tokamax.ops.proj_and_save_state(
        *a, compress_ratio=geometry.compress_ratio, implementation="mosaic_tpu"), (), args)


def dsv4_compressor():
    """tokamax.ops.dsv4_compressor: compress, RMS-norm, RoPE and store into the KV cache."""
    inputs = _tokamax_test_base("dsv4_compressor").make_case_inputs("csa_decode_batch_seq")
    call = inputs.with_cache_copies()
    return (lambda *a: tokamax.ops.dsv4_compressor(*a, **call.kwargs,
                                                   implementation="mosaic_tpu"),
            (), tuple(call.args))


def masked_dense_mla():
    """tokamax.ops.masked_dense_mla: MLA decode/prefill over a top-k-masked paged cache."""
    args, _ = _tokamax_test_base("masked_dense_mla").make_inputs(batch_size=2, num_heads=16,
                                                                 topk=64)
    return (lambda *a: tokamax.ops.masked_dense_mla(*a, implementation="mosaic"), (), args)


def sparse_mla():
    """tokamax.ops.sparse_mla: MLA over the top-k gathered pages of a paged cache."""
    args, _ = _tokamax_test_base("sparse_mla").make_inputs(batch_size=2, num_heads=16,
                                                           topk=128)
    return (lambda *a: tokamax.ops.sparse_mla(*a, implementation="mosaic_tpu"), (), args)


def lightning_indexer():
    """tokamax.ops.lightning_indexer: top-k cache positions per query from an fp8 cache."""
    inputs = _tokamax_test_base("lightning_indexer").make_test_inputs([1, 8], [256, 384])
    names = list(inputs)
    return (lambda *a: tokamax.ops.lightning_indexer(**dict(zip(names, a, strict=True)), k=16,
                                                     implementation="mosaic"),
            (), tuple(inputs.values()))


def mla_swa():
    """tokamax.ops.experimental.mla_swa: sliding-window MLA over a paged cache."""
    base = importlib.import_module("tokamax._src.ops.experimental.mla_swa.test_base")
    args, _ = base.make_inputs(batch_size=2, num_heads=16)
    return (lambda *a: tokamax.ops.experimental.mla_swa(
        *a, sliding_window=base.SLIDING_WINDOW, logical_page_size=base.PAGE_SIZE, sm_scale=1.0,
        implementation="mosaic"), (), args)


def ragged_paged_attention():
    """tokamax.ops.ragged_paged_attention (= batched_ragged_paged_attention): two decode tokens
    over one 128-row KV page each, their new K/V written into the cache, as tokamax's own
    ``batched_rpa/pallas_mosaic_tpu_test.py`` builds it."""
    seqs, heads, kv_heads, dim, page = 2, 4, 2, 128, 128
    args = (jax.random.normal(_key(0), (seqs, heads, dim), jnp.bfloat16),
            jax.random.normal(_key(1), (seqs, kv_heads, dim), jnp.bfloat16),
            jax.random.normal(_key(2), (seqs, kv_heads, dim), jnp.bfloat16),
            jax.random.normal(_key(3), (seqs, page, 2 * kv_heads, dim), jnp.bfloat16),
            jnp.full((seqs,), page, jnp.int32), jnp.arange(seqs, dtype=jnp.int32),
            jnp.arange(seqs + 1, dtype=jnp.int32), jnp.array([seqs] * 3, jnp.int32))
    return (lambda *a: tokamax.ops.ragged_paged_attention(*a, implementation="mosaic_tpu"), (),
            args)


OPS = {"ragged_dot": ragged_dot, "dot_product_attention": attention,
       "linear_softmax_cross_entropy_loss": cross_entropy, "router_topk": router_topk,
       "deepseek_rope": deepseek_rope, "mhc_pre": mhc_pre, "mhc_post": mhc_post,
       "mhc_fused_post_pre": mhc_fused_post_pre, "ragged_gather": ragged_gather,
       "ragged_gather_reduce": ragged_gather_reduce, "top_k": top_k, "csa_gather": csa_gather,
       "kimi_delta_attention": kimi_delta_attention, "ragged_dot_v2": ragged_dot_v2,
       "grouped_lowrank_proj": grouped_lowrank_proj, "splash_attention": splash_attention,
       "proj_and_save_state": proj_and_save_state, "dsv4_compressor": dsv4_compressor,
       "masked_dense_mla": masked_dense_mla, "sparse_mla": sparse_mla,
       "lightning_indexer": lightning_indexer, "mla_swa": mla_swa,
       "ragged_paged_attention": ragged_paged_attention}


# The SparseCore ops: v5e has no SparseCore, and on it tokamax falls back to XLA.
CHIPS = {name: "tpu-v6e" for name in (
    "ragged_gather", "ragged_gather_reduce", "top_k", "csa_gather", "masked_dense_mla",
    "sparse_mla", "lightning_indexer")}

# What TPU interpret mode (jax 0.12.0.1) raises on each op it cannot run on a CPU.
_SPARSECORE_PIPELINE = "'Fake' object has no attribute 'arg_names'"  # JAX's own error path
NOT_INTERPRETED = {
    # an operand placed in SMEM by the caller: the interpreter takes HBM/ANY operands only
    "ragged_dot_v2": "Unsupported memory space: smem",
    # ref.reshape / ref.bitcast views in a body DMA: the interpreter's get has no indices
    "proj_and_save_state": "'ReshapeTransform' object has no attribute 'indices'",
    "dsv4_compressor": "'BitcastTransform' object has no attribute 'indices'",
    "mla_swa": "'BitcastTransform' object has no attribute 'indices'",
    "ragged_paged_attention": "'BitcastTransform' object has no attribute 'indices'",
    # SparseCore kernels (pl.kernel on a VectorSubcoreMesh; kernelsim refuses them too): the
    # interpreter fails raising "JaxprInputEffect ... has no corresponding jaxpr input" in the
    # emit_pipeline loop, reads a vector as a DMA index, or (masked_dense_mla, after its
    # SparseCore mask kernel) meets a reshaped ref
    "ragged_gather": _SPARSECORE_PIPELINE,
    "top_k": _SPARSECORE_PIPELINE,
    "lightning_indexer": _SPARSECORE_PIPELINE,
    "csa_gather": "Only scalar arrays can be converted to Python scalars",
    "sparse_mla": "Only scalar arrays can be converted to Python scalars",
    "masked_dense_mla": "'ReshapeTransform' object has no attribute 'indices'",
    # needs 16 SparseCore lanes (TPU7x, which kernelsim does not model); on a TPU7x abstract
    # device, with inputs large enough to leave tokamax's XLA path, it fails as ragged_gather
    "ragged_gather_reduce": "Expected 16 SparseCore lanes, got 8",
}


def differentiated(build, direction: str):
    """(fn, args) of one case: the op itself, or the gradient of its sum w.r.t. ``wrt``."""
    op, wrt, args = build()
    if direction == "fwd":
        return op, args
    return jax.grad(lambda *a: op(*a).sum(), argnums=wrt), args


CASES = [pytest.param(name, direction, id=f"{name}-{direction}")
         for name in OPS if name not in NOT_INTERPRETED for direction in ("fwd", "bwd")]


@pytest.mark.parametrize(("name", "direction"), CASES)
def test_tokamax_op_equals_the_interpreter(name, direction):
    if direction == "bwd" and not OPS[name]()[1]:
        pytest.skip(f"{name} is forward only (its tokamax arg specs are tagged forward_only)")
    chip = CHIPS.get(name, "tpu-v5e")
    with tokamax.config.cross_compile(True):
        fn, args = differentiated(OPS[name], direction)
        v = verify(fn, *args, chip=chip)
        fn, args = differentiated(OPS[name], direction)  # deepseek_rope donates x
        t = kernelsim.trace(fn, *args, chip=chip)
    assert v.ok, v.report()
    assert v.checks or v.body_dma_checks
    assert len(v.trace.calls) >= (1 if direction == "fwd" else 2)
    assert [(c.name, c.grid) for c in t.calls] == [(c.name, c.grid) for c in v.trace.calls]
    assert [c.call.body_copies for c in t.calls] == [c.call.body_copies for c in v.trace.calls]
    assert [c.hbm_read_bytes for c in t.calls] == [c.hbm_read_bytes for c in v.trace.calls]


@pytest.mark.parametrize("name", list(NOT_INTERPRETED))
def test_interpret_mode_cannot_run_it_on_a_cpu(name):
    """Recorded instead of compared: if a JAX or tokamax release lets the interpreter run one,
    this fails, and the op moves to the comparison above."""
    from jax.experimental.pallas import tpu as pltpu

    from kernelsim.trace import abstract_tpu

    fn, args = differentiated(OPS[name], "fwd")
    with tokamax.config.cross_compile(True), pltpu.force_tpu_interpret_mode(), \
            abstract_tpu(CHIPS.get(name, "tpu-v5e")), pytest.raises(Exception) as err:
        jax.block_until_ready(fn(*args))
    assert NOT_INTERPRETED[name] in str(err.value)
