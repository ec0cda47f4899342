"""Ref views in kernel bodies: ``ref.reshape``, ``ref.bitcast`` and masked loads and stores.

TPU interpret mode cannot start a DMA on a reshaped or bitcast ref (its DMA callback reads
only indexers), so such a kernel's DMAs are compared with the interpreter's DMAs for the same
kernel written with plain slices: they move the same bytes between the same places.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.verify import verify

pytestmark = pytest.mark.interpret

X = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)


def _row_block_copy(view):
    """Row block i of x (HBM) is DMA'd into VMEM and written out doubled; ``view`` picks
    block i of the HBM ref."""
    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.async_copy(view(x_hbm, pl.program_id(0)), buf, sem).wait()
        o_ref[...] = buf[...] * 2

    def call(x):
        rows = 8 * x.dtype.itemsize // 4 if x.dtype.itemsize < 4 else 8
        return pl.pallas_call(
            kernel, grid=(x.shape[0] // rows,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
            out_shape=jax.ShapeDtypeStruct((x.shape[0] // rows * 8, 128), jnp.float32))(x)

    return call


sliced = _row_block_copy(lambda x, i: x.at[pl.ds(i * 8, 8)])
reshaped = _row_block_copy(lambda x, i: x.reshape(4, 8, 128).at[i])
reshaped_twice = _row_block_copy(lambda x, i: x.reshape(2, 2, 8, 128).at[i // 2].at[i % 2])


@pytest.mark.parametrize("kernel", [reshaped, reshaped_twice])
def test_dma_on_a_reshaped_ref_moves_what_the_sliced_kernel_moves(kernel):
    v = verify(sliced, X)
    assert v.ok, v.report()
    t = kernelsim.trace(kernel, X)
    assert [c.bytes for c in t.body_dmas()] == v.body_dma_checks[0].interpreter_bytes
    assert [c.bytes for c in t.body_dmas()] == [8 * 128 * 4] * 4
    assert t.calls[0].hbm_read_bytes == v.trace.calls[0].hbm_read_bytes == X.nbytes


def _bitcast_block_copy(view):
    """Block i of a bf16 (32, 128) array, 4 KiB, copied by a DMA into a bf16 buffer."""
    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.async_copy(view(x_hbm, pl.program_id(0)), buf, sem).wait()
        o_ref[...] = buf[...]

    def call(x, buf_type):
        rows = 8 if buf_type == jnp.uint32 else 16
        out_rows = x.shape[0] * x.dtype.itemsize // np.dtype(buf_type).itemsize
        return pl.pallas_call(
            kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((rows, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.VMEM((rows, 128), buf_type), pltpu.SemaphoreType.DMA],
            out_shape=jax.ShapeDtypeStruct((out_rows, 128), buf_type))(x)

    return call


def test_dma_on_a_bitcast_ref_moves_what_the_sliced_kernel_moves():
    x = X.astype(jnp.bfloat16)
    plain = _bitcast_block_copy(lambda x, i: x.at[pl.ds(i * 16, 16)])
    v = verify(lambda x: plain(x, jnp.bfloat16), x)
    assert v.ok, v.report()
    packed = _bitcast_block_copy(lambda x, i: x.bitcast(jnp.uint32).at[pl.ds(i * 8, 8)])
    t = kernelsim.trace(lambda x: packed(x, jnp.uint32), x)
    assert [c.bytes for c in t.body_dmas()] == v.body_dma_checks[0].interpreter_bytes
    assert [c.bytes for c in t.body_dmas()] == [16 * 128 * 2] * 2


def _half_row_store(x_ref, o_ref):
    """Keeps the first 64 lanes of each row of the block, zeros elsewhere."""
    o_ref[...] = jnp.zeros_like(o_ref)
    lanes = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 1)
    pltpu.store(o_ref, x_ref[...], mask=lanes < 64)


def half_rows(x):
    return pl.pallas_call(_half_row_store, grid=(x.shape[0] // 8,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_masked_store_is_verified_and_writes_only_the_kept_elements():
    v = verify(half_rows, X)
    assert v.ok, v.report()
    np.testing.assert_array_equal(v.outputs, jnp.where(jnp.arange(128) < 64, X, 0))
    t = kernelsim.trace(half_rows, X, record_access=True)
    writes = [a for a in t.calls[0].accesses.accesses if a.kind == "write" and a.step == 0]
    assert [a.box for a in writes] == [((0, 8, 1), (0, 128, 1)), None]
    masked = writes[1].points
    assert len(masked) == 8 * 64 and masked[:, 1].max() == 63


def test_a_read_through_a_bitcast_view_touches_the_packed_rows_of_the_ref():
    def body(x_ref, o_ref):  # u32 rows 0..3 of a bf16 block pack its rows 0..7
        o_ref[...] = x_ref.bitcast(jnp.uint32)[pl.ds(0, 4), :]

    def fn(x):
        return pl.pallas_call(body, grid=(2,), in_specs=[pl.BlockSpec((16, 128),
                                                                      lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((4, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.uint32))(x)

    t = kernelsim.trace(fn, X.astype(jnp.bfloat16), record_access=True)
    read = [a for a in t.calls[0].accesses.accesses if a.kind == "read" and a.step == 1][0]
    assert read.operand == "x_ref" and read.box is None
    assert sorted({int(r) for r in read.points[:, 0]}) == list(range(8))
    assert len(read.points) == 8 * 128
