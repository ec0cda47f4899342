"""kernelsim's TPU memory rules against JAX's own TPU lowering, run on this CPU.

``kernelsim.tpu_lowering_error`` runs the real Mosaic lowering (``jax.export`` for platform
"tpu"), so every case here is judged by JAX itself, not by a second copy of its rule.
Block-shape cases: the 30 of ``test_block_spec_valid_block_shapes`` in JAX's
tests/pallas/pallas_test.py (int32 unless noted there), plus dtype, squeezed and memory-space
cases of our own for the rules that test does not reach.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim

JAX_TEST_SHAPES = [  # (array shape, block shape, dtype) as in JAX's test
    ((), (), "int32"), ((2,), (2,), "int32"), ((128,), (128,), "int32"),
    ((128,), (64,), "int16"), ((128,), (128,), "int16"), ((1024,), (128,), "int16"),
    ((1024,), (256,), "int16"), ((128,), (64,), "int32"), ((2, 2), (2, 2), "int32"),
    ((3, 3), (3, 3), "int32"), ((4, 2), (2, 2), "int32"), ((6, 2, 2), (2, 2, 2), "int32"),
    ((6, 2, 2), (3, 2, 2), "int32"), ((16, 128), (8, 128), "int32"),
    ((6, 16, 128), (2, 8, 128), "int32"), ((6, 16, 128), (3, 8, 128), "int32"),
    ((16, 64), (8, 64), "int32"), ((16, 128), (4, 128), "int32"),
    ((16, 128), (2, 128), "int32"), ((16, 128), (8, 64), "int32"),
    ((9, 128), (9, 64), "int32"), ((9, 128), (9, 128), "int32"), ((18, 128), (9, 128), "int32"),
    ((8, 129), (8, 129), "int32"), ((9, 129), (8, 129), "int32"), ((9, 129), (9, 129), "int32"),
    ((1, 128), (4, 128), "int32"), ((2, 128), (4, 128), "int32"), ((3, 128), (4, 128), "int32"),
    ((5, 128), (8, 128), "int32"),
]
OUR_SHAPES = [  # the 1-D rule's dtype dependence, and wider dtypes in 2-D
    ((4096,), (256,), "bfloat16"), ((4096,), (128,), "bfloat16"), ((4096,), (512,), "int8"),
    ((4096,), (256,), "int8"), ((4096,), (2048,), "float32"), ((4096,), (1536,), "float32"),
    ((4096,), (3072,), "float32"), ((256,), (128,), "bool"), ((256,), (64,), "bool"),
    ((32, 256), (16, 128), "bfloat16"), ((32, 256), (8, 256), "int8"),
    ((32, 256), (12, 256), "float32"),
]


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _blocked_copy(shape, block, specs=None):
    grid = tuple(-(-s // b) for s, b in zip(shape, block, strict=True))

    def fn(x):
        spec = pl.BlockSpec(block, lambda *i: i) if specs is None else specs
        return pl.pallas_call(_copy_kernel, grid=grid, in_specs=[spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    return fn


def _block_warnings(fn, x) -> list[str]:
    return [w for w in kernelsim.trace(fn, x).calls[0].warnings
            if "block" in w and ("reject" in w or "rank" in w or "must be whole" in w)]


@pytest.mark.parametrize("shape,block,dtype", JAX_TEST_SHAPES + OUR_SHAPES,
                         ids=lambda v: str(v).replace(" ", ""))
def test_block_shape_lint_agrees_with_the_tpu_lowering(shape, block, dtype):
    x = jnp.zeros(shape, dtype)
    fn = _blocked_copy(shape, block)
    rejected = kernelsim.tpu_lowering_error(fn, x)
    assert rejected is None or "block" in rejected, rejected  # no unrelated lowering failure
    flagged = _block_warnings(fn, x)
    assert bool(flagged) == (rejected is not None), (flagged, rejected)


def test_a_squeezed_last_dim_counts_as_size_one():
    """The lowering sizes a squeezed (None) dim as 1, so a squeezed lane dim is rejected."""
    x = jnp.zeros((8, 256, 4), jnp.float32)

    def fn(x):
        spec = pl.BlockSpec((8, 128, None), lambda i, j: (0, i, j))
        return pl.pallas_call(_copy_kernel, grid=(2, 4), in_specs=[spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    assert kernelsim.tpu_lowering_error(fn, x) is not None
    assert _block_warnings(fn, x)


@pytest.mark.parametrize("index_map,trivial", [(lambda i: (0, 0), True),
                                               (lambda i: (i * 0, 0), False)])
def test_any_memory_space_needs_a_trivial_window(index_map, trivial):
    x = jnp.zeros((16, 128), jnp.float32)

    def kernel(x_hbm, o_ref):
        pltpu.sync_copy(x_hbm, o_ref)

    def fn(x):
        return pl.pallas_call(
            kernel, grid=(1,),
            in_specs=[pl.BlockSpec((16, 128), index_map, memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((16, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    assert (kernelsim.tpu_lowering_error(fn, x) is None) == trivial
    assert (not _block_warnings(fn, x)) == trivial


@pytest.mark.parametrize("index_map,mode,buffers", [
    (lambda i: (0, 0), None, 1),                 # whole array, literal zeros: single buffer
    (lambda i: (0, 0), pl.Buffered(2), 1),       # forced to 1 whatever the spec asks
    (lambda i: (i * 0, 0), None, 2),             # whole array, computed index: double-buffered
    (lambda i: (i * 0, 0), pl.Buffered(1), 1),   # the spec asks for one
])
def test_buffer_count_follows_the_trivial_window_rule(index_map, mode, buffers):
    """Mosaic single-buffers a VMEM block only for a trivial window (whole array, index map
    returning literal zeros): jax/_src/pallas/mosaic/lowering.py, lower_jaxpr_into_pipelined_
    module. A whole-array block whose index map computes zeros keeps two buffers."""
    w = jnp.zeros((8, 128), jnp.float32)
    x = jnp.zeros((32, 128), jnp.float32)

    def kernel(w_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + w_ref[...]

    def fn(w, x):
        kw = {} if mode is None else {"pipeline_mode": mode}
        return pl.pallas_call(
            kernel, grid=(4,),
            in_specs=[pl.BlockSpec((8, 128), index_map, **kw),
                      pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(w, x)

    w_cost = kernelsim.trace(fn, w, x).calls[0].operand("w_ref")
    assert w_cost.buffers == buffers
    assert w_cost.onchip_bytes == buffers * w.nbytes
    assert kernelsim.tpu_lowering_error(fn, w, x) is None


def test_unknown_tpu_is_named():
    with pytest.raises(kernelsim.TraceError, match="tpu-v5e"):
        kernelsim.tpu_lowering_error(lambda x: x, np.zeros(1), chip="tpu-v9")


def _revisiting_reduction(buffers):
    """JAX's test_block_reduction_with_non_immediate_revisit (tests/pallas/tpu_pallas_test.py):
    output block j comes back every third step, accumulated with RevisitMode.ANY."""
    def body(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    out_spec = pl.BlockSpec((8, 128), lambda i, j: (0, j),
                            pipeline_mode=pl.Buffered(buffers, revisit=pl.RevisitMode.ANY))
    return pl.pallas_call(body, grid=(3, 3), out_specs=out_spec,
                          in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                          out_shape=jax.ShapeDtypeStruct((8, 3 * 128), jnp.float32))


def test_revisit_any_reads_back_each_block_that_comes_back():
    x = jnp.zeros((24, 384), jnp.float32)
    call = kernelsim.trace(_revisiting_reduction(1), x).calls[0]
    out = call.operand("o_ref")
    # steps 0-2 visit blocks 0, 1, 2 first; steps 3-8 come back to one each: 6 read-backs
    assert (out.fetches, out.writebacks) == (6, 9)
    assert (out.hbm_read_bytes, out.hbm_write_bytes) == (6 * 4096, 9 * 4096)
    assert [e.step for e in call.schedule.events() if e.operand == "o_ref"
            and e.action == "fetch"] == [3, 4, 5, 6, 7, 8]
    assert call.warnings == []  # the revisit is what the mode is for
    assert kernelsim.tpu_lowering_error(_revisiting_reduction(1), x) is None


def test_revisit_any_with_double_buffering_is_refused_as_mosaic_refuses_it():
    x = jnp.zeros((24, 384), jnp.float32)
    (w,) = kernelsim.trace(_revisiting_reduction(2), x).calls[0].warnings
    assert "RevisitMode.ANY is not supported with double buffering" in w
    assert "RevisitMode.ANY is not supported with double buffering" in (
        kernelsim.tpu_lowering_error(_revisiting_reduction(2), x))
