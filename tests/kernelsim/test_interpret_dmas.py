"""kernelsim's tpu model equals the pipeline copies TPU interpret mode really performs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernelsim import examples as ex
from kernelsim.verify import verify

pytestmark = pytest.mark.interpret


def _normal(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _assert_exact(v, expected_reference=None):
    assert v.checks, "no windowed operand was checked"
    for c in v.checks:
        assert c.interpreter_copies, f"the interpreter reported no {c.kind} for {c.operand}"
        assert c.copies_match, (c.operand, c.model_copies[:5], c.interpreter_copies[:5])
        assert c.bytes_match, (c.operand, c.model_bytes, c.interpreter_bytes)
    if expected_reference is not None:
        np.testing.assert_allclose(v.outputs, expected_reference, rtol=1e-4, atol=1e-3)


def test_add():
    x, y = _normal((512, 512), 0), _normal((512, 512), 1)
    v = verify(functools.partial(ex.add, block=(128, 256)), x, y)
    _assert_exact(v, x + y)
    assert [c.operand for c in v.checks] == ["x_ref", "y_ref", "o_ref"]
    assert len(v.checks[0].model_copies) == 8


def test_matmul_with_accumulator():
    x, y = _normal((256, 512), 0), _normal((512, 256), 1)
    v = verify(functools.partial(ex.matmul, bm=128, bk=128, bn=128), x, y)
    _assert_exact(v, x @ y)
    assert len(v.checks[2].model_copies) == 4  # one writeback per output block


def test_matmul_single_k_block_reads_x_once():
    x, y = _normal((256, 128), 0), _normal((128, 512), 1)
    v = verify(functools.partial(ex.matmul, bm=128, bk=128, bn=128), x, y)
    _assert_exact(v, x @ y)
    assert len(v.checks[0].model_copies) == 2  # x's block (i, 0) stays while j moves


def test_transpose():
    x = _normal((256, 384), 0)
    _assert_exact(verify(functools.partial(ex.transpose, block=128), x), x.T)


def test_block_sparse_with_scalar_prefetch():
    counts, rows, cols = ex.block_band_pattern(4, 3)
    x, y = _normal((512, 512), 0), _normal((512, 128), 1)
    v = verify(ex.block_sparse_matmul, counts, rows, cols, x, y)
    _assert_exact(v, ex.block_sparse_reference(counts, rows, cols, x, y))
    skips = v.trace.calls[0].operand("x_ref").skips
    assert skips == 3  # rows 2 and 3 are padded by 1 and 2 repeated entries


def test_vmapped_kernel():
    x, y = _normal((3, 256, 256), 0), _normal((3, 256, 256), 1)
    v = verify(jax.vmap(functools.partial(ex.add, block=(128, 128))), x, y)
    _assert_exact(v, x + y)
    assert v.trace.calls[0].grid == (3, 2, 2)


def test_ragged_edges_padded_bytes_match_the_interpreter_and_totals_stay_in_bounds():
    x, y = _normal((200, 300), 0), _normal((200, 300), 1)
    v = verify(functools.partial(ex.add, block=(128, 128)), x, y)
    _assert_exact(v, x + y)
    for c in v.checks:  # the interpreter copies whole padded edge blocks; so does the check
        assert c.model_bytes == c.interpreter_bytes == 2 * 3 * 128 * 128 * 4
    call = v.trace.calls[0]
    assert call.hbm_read_bytes == 2 * 200 * 300 * 4  # totals count in-bounds bytes
    assert call.hbm_write_bytes == 200 * 300 * 4
    assert call.cost.hbm_padded_bytes == 3 * 2 * 3 * 128 * 128 * 4


def _double_buffered_scale(x):
    """Manual double buffering from pl.ANY: step i starts block i + 1's copy into the other
    slot, waits for its own block, scales it and writes it back with a synchronous copy."""
    nblocks = x.shape[0] // 8

    def kernel(x_hbm, o_hbm, buf, sems):
        i = pl.program_id(0)

        def fetch(block, slot):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(block * 8, 8)], buf.at[slot],
                                         sems.at[slot])

        @pl.when(i == 0)
        def _():
            fetch(0, 0).start()

        @pl.when(i + 1 < nblocks)
        def _():
            fetch(i + 1, (i + 1) % 2).start()

        fetch(i, i % 2).wait()
        buf[i % 2] = buf[i % 2] * 2.0
        pltpu.sync_copy(buf.at[i % 2], o_hbm.at[pl.ds(i * 8, 8)])

    return pl.pallas_call(
        kernel, grid=(nblocks,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


def test_kernel_body_dmas_match_the_interpreter_copy_for_copy():
    x = _normal((48, 128), 0)
    v = verify(_double_buffered_scale, x)
    np.testing.assert_allclose(v.outputs, 2 * x)
    assert v.ok, v.report()
    routes = {d.route: d for d in v.body_dma_checks}
    assert routes["hbm -> vmem"].model_bytes == [8 * 128 * 4] * 6
    assert routes["vmem -> hbm"].interpreter_bytes == [8 * 128 * 4] * 6
    call = v.trace.calls[0]
    assert (call.hbm_read_bytes, call.hbm_write_bytes) == (x.nbytes, x.nbytes)
    assert call.warnings == []


def test_jvp_of_a_kernel_is_checked_under_positional_operand_names():
    """jax.jvp's pallas_call records no parameter names: model and interpreter both use in0..."""
    x, t = _normal((256, 256), 0), _normal((256, 256), 1)
    v = verify(lambda x, t: jax.jvp(functools.partial(ex.add, block=(128, 128)), (x, x),
                                    (t, t)), x, t)
    _assert_exact(v)
    assert [c.operand for c in v.checks] == ["in0", "in1", "in2", "in3", "out0", "out1"]


def test_dma_sized_by_block_data_matches_the_interpreter():
    """Each step copies as many rows as its SMEM block says (tests/kernelsim/test_capture.py)."""
    from test_capture import ROWS, leading_rows

    counts = jnp.array([3, 8, 0, 5], jnp.int32)
    v = verify(jax.jit(leading_rows), counts, ROWS)
    assert v.ok, v.report()
    assert v.body_dma_checks[0].interpreter_bytes == [1536, 2560, 4096]  # the 0-row copy: no bytes
    assert [c.bytes for c in v.trace.calls[0].call.body_copies] == [1536, 4096, 0, 2560]
    assert v.trace.calls[0].warnings == []
