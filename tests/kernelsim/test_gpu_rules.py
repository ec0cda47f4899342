"""``kernelsim.gpu_lowering_error`` runs JAX's real Triton lowering of ``pallas_call`` on this
CPU: what it accepts and rejects is JAX's own answer, not a copy of its rules."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _blocked_copy(block):
    def fn(x):
        grid = tuple(-(-s // b) for s, b in zip(x.shape, block, strict=True))
        spec = pl.BlockSpec(block, lambda *i: i)
        return pl.pallas_call(_copy_kernel, grid=grid, in_specs=[spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    return fn


@pytest.mark.parametrize("block,lowers", [((8, 128), True), ((16, 64), True),
                                          ((24, 128), False), ((8, 96), False)])
def test_triton_wants_power_of_two_blocks(block, lowers):
    x = jnp.zeros((48, 384), jnp.float32)
    error = kernelsim.gpu_lowering_error(_blocked_copy(block), x)
    assert (error is None) == lowers, error
    if not lowers:
        assert "power of 2" in error or "power of two" in error, error


def test_scalar_prefetch_has_no_triton_lowering():
    def kernel(ids_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def fn(ids, x):
        spec = pl.BlockSpec((8, 128), lambda i, ids: (ids[i], 0))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
                              grid_spec=pltpu.PrefetchScalarGridSpec(
                                  num_scalar_prefetch=1, grid=(2,), in_specs=[spec],
                                  out_specs=pl.BlockSpec((8, 128), lambda i, ids: (i, 0))))(ids, x)

    assert kernelsim.gpu_lowering_error(fn, jnp.array([1, 0], jnp.int32),
                                        jnp.zeros((16, 128), jnp.float32)) is not None
    assert kernelsim.tpu_lowering_error(fn, jnp.array([1, 0], jnp.int32),
                                        jnp.zeros((16, 128), jnp.float32)) is None


def test_unknown_gpu_is_named():
    with pytest.raises(kernelsim.TraceError, match="unknown GPU 'v100'.*h100"):
        kernelsim.gpu_lowering_error(_blocked_copy((8, 128)), jnp.zeros((8, 128)), chip="v100")


def _mha_backward(q, k, v):
    import warnings

    with warnings.catch_warnings():  # the op announces its move to tokamax
        warnings.simplefilter("ignore")
        from jax.experimental.pallas.ops.gpu import attention

    loss = lambda *a: attention.mha(*a, segment_ids=None).sum()  # noqa: E731
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def test_triton_blocks_are_not_shared_memory():
    """JAX's own mha backward at a real sequence length: each program's key/value blocks span
    the whole sequence (2 MiB here), which the Triton lowering accepts -- it allocates no shared
    memory for blocks, the body loads slices into registers -- so the GPU model does not warn
    about shared memory, and its views name the spaces as a GPU has them (on chip: registers,
    with shared memory where the compiler stages a dot's operands)."""
    qkv = [jnp.zeros((1, 4096, 2, 128), jnp.bfloat16)] * 3
    assert kernelsim.gpu_lowering_error(_mha_backward, *qkv) is None
    t = kernelsim.trace(_mha_backward, *qkv, model="gpu", chip="h100")
    assert max(c.cost.vmem_bytes for c in t.calls) > 227 * 1024  # blocks bigger than SMEM
    assert [w for c in t.calls for w in c.warnings] == []
    names = [s["name"] for s in t.to_dict()["memory_spaces"]]
    assert names == ["global memory", "shared memory / registers"]
    assert not {"VMEM", "SMEM (scalars)", "HBM"} & set(names)
    tpu = kernelsim.trace(_blocked_copy((8, 128)), jnp.zeros((8, 128)), model="tpu")
    assert [s["name"] for s in tpu.to_dict()["memory_spaces"]] == ["HBM", "VMEM",
                                                                   "SMEM (scalars)"]
