"""kernelsim on the Pallas kernels JAX itself ships (jax.experimental.pallas.ops).

Every op is traced (TPU ops under the ``tpu`` model, GPU ops under ``gpu``) with no error and no
lint warning, and every TPU op's copies -- the pipeline's and the DMAs its body starts -- equal,
copy for copy and byte for byte, what TPU interpret mode performs. Shapes are small but keep
each op's structure: causal masks, dynamic grids (megablox), paged KV caches read by hand.
"""

import functools
import importlib
import warnings

import jax
import jax.numpy as jnp
import pytest

import kernelsim
from kernelsim.verify import verify

with warnings.catch_warnings():  # the GPU ops announce their move to tokamax
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import (
        attention,
        decode_attention,
        layer_norm,
        rms_norm,
        softmax,
    )
    from jax.experimental.pallas.ops.gpu import paged_attention as gpu_paged
from jax.experimental.pallas.ops.tpu import example_kernel
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
from jax.experimental.pallas.ops.tpu import matmul as tpu_matmul
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as tpu_paged
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

# megablox's package re-exports gmm as a function, shadowing the module of the same name
gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def _n(*shape):
    return jax.random.normal(jax.random.key(sum(shape)), shape, jnp.float32)


def _qkv(*shape):
    return _n(*shape), _n(*shape), _n(*shape)


def _flash_grad(q, k, v):
    return jax.grad(lambda *a: tpu_flash.flash_attention(*a).sum(), argnums=(0, 1, 2))(q, k, v)


def _mha_grad(q, k, v):
    loss = lambda *a: attention.mha(*a, segment_ids=None).sum()  # noqa: E731
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def _splash_causal():
    size = 128
    mask = masks.MultiHeadMask([masks.CausalMask((256, 256)) for _ in range(2)])
    sizes = splash.BlockSizes(block_q=size, block_kv=size, block_kv_compute=size,
                              block_q_dkv=size, block_kv_dkv=size, block_kv_dkv_compute=size)
    return splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes)


GROUP_SIZES = jnp.array([128, 64, 192, 128], jnp.int32)  # uneven groups: a dynamic grid
PAGE_INDICES = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
LENGTHS = jnp.array([40, 64], jnp.int32)

TPU_OPS = {
    "example_double": lambda: (example_kernel.double, (_n(8, 128),)),
    "matmul": lambda: (functools.partial(tpu_matmul.matmul, block_shape=(128, 128),
                                         block_k=128), (_n(256, 256), _n(256, 256))),
    "flash_attention": lambda: (tpu_flash.flash_attention, _qkv(1, 2, 256, 128)),
    "flash_attention_causal": lambda: (functools.partial(tpu_flash.flash_attention,
                                                         causal=True), _qkv(1, 2, 256, 128)),
    "flash_attention_backward": lambda: (_flash_grad, _qkv(1, 1, 256, 128)),
    "megablox_gmm": lambda: (gmm.gmm, (_n(512, 128), _n(4, 128, 128), GROUP_SIZES)),
    "megablox_tgmm": lambda: (gmm.tgmm, (_n(128, 512), _n(512, 128), GROUP_SIZES)),
    "paged_attention": lambda: (functools.partial(tpu_paged.paged_attention,
                                                  pages_per_compute_block=2),
                                (_n(2, 4, 128), _n(2, 16, 16, 128), _n(2, 16, 16, 128),
                                 LENGTHS, PAGE_INDICES)),
    "splash_attention_causal": lambda: (_splash_causal(), _qkv(2, 256, 128)),
}
GPU_OPS = {
    "layer_norm": lambda: (layer_norm.layer_norm, (_n(2, 4, 256), _n(256), _n(256))),
    "rms_norm": lambda: (rms_norm.rms_norm, (_n(2, 4, 256), _n(256), _n(256))),
    "softmax": lambda: (softmax.softmax, (_n(4, 256),)),
    "mha": lambda: (functools.partial(attention.mha, segment_ids=None), _qkv(1, 256, 2, 64)),
    "mha_backward": lambda: (_mha_grad, _qkv(1, 128, 2, 64)),
    "decode_attention": lambda: (decode_attention.mqa, (_n(2, 4, 64), _n(2, 256, 64),
                                                        _n(2, 256, 64))),
    "paged_attention": lambda: (functools.partial(gpu_paged.paged_attention, k_splits=2,
                                                  pages_per_compute_block=2),
                                (_n(2, 4, 64), _n(2, 16, 16, 64), _n(2, 16, 16, 64),
                                 PAGE_INDICES, LENGTHS)),
}


@pytest.mark.parametrize("name", list(GPU_OPS))
def test_gpu_op_traces_cleanly(name):
    fn, args = GPU_OPS[name]()
    t = kernelsim.trace(fn, *args, model="gpu", chip="h100")
    assert t.calls and all(c.hbm_read_bytes > 0 for c in t.calls)
    assert [w for c in t.calls for w in c.warnings] == []


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(TPU_OPS))
def test_tpu_op_matches_interpret_mode_copy_for_copy(name):
    fn, args = TPU_OPS[name]()
    traced = kernelsim.trace(fn, *args)
    assert [w for c in traced.calls for w in c.warnings] == []
    v = verify(fn, *args)
    assert v.ok, v.report()
    # Tracing the jaxpr (no execution) and executing op by op see the same traffic.
    assert [_traffic(c) for c in v.trace.calls] == [_traffic(c) for c in traced.calls]


def _traffic(call) -> dict:
    d = call.to_dict()
    return {k: d[k] for k in ("name", "grid", "operands", "hbm_read_bytes", "hbm_write_bytes",
                              "hbm_padded_bytes", "onchip_peak_bytes")}


def test_paged_attention_counts_the_pages_its_body_copies():
    """The TPU paged-attention op keeps K and V pages in HBM and copies them by hand."""
    fn, args = TPU_OPS["paged_attention"]()
    call = kernelsim.trace(fn, *args).calls[0]
    page_copies = [c for c in call.call.body_copies if c.src in ("k_pages_hbm_ref",
                                                                  "v_pages_hbm_ref")]
    assert page_copies and all(c.dst_space == "vmem" for c in page_copies)
    assert call.hbm_read_bytes > sum(c.bytes for c in page_copies) > 0
