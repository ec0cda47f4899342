"""kernelsim's TPU memory rules against JAX's own TPU lowering, run on this CPU, and against
the real compiler's verdicts recorded on a TPU v5e (``chip_verdicts_v5e``).

``kernelsim.tpu_lowering_error`` runs JAX's Mosaic lowering (``jax.export`` for platform
"tpu"), so every case here is judged by JAX itself, not by a second copy of its rule. That
lowering is the compiler's front end only: where the chip's compiler rejected what it accepts
(packed int8 rows, float16 loads), the recorded verdict is the expected value instead.
Block-shape cases: the 30 of ``test_block_spec_valid_block_shapes`` in JAX's
tests/pallas/pallas_test.py (int32 unless noted there), plus dtype, squeezed and memory-space
cases of our own for the rules that test does not reach.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from chip_verdicts_v5e import (
    COPY_BLOCKS,
    DEFAULT_SCOPED_VMEM,
    MATMUL_VMEM,
    TWO_9_MIB_WINDOWS_COMPILED,
)
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim import examples
from kernelsim.cost import lint

ROOT = Path(__file__).resolve().parents[2]

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
CHIP_SHAPES = [case for case in COPY_BLOCKS if case not in OUR_SHAPES]


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


@pytest.mark.parametrize("shape,block,dtype", JAX_TEST_SHAPES + OUR_SHAPES + CHIP_SHAPES,
                         ids=lambda v: str(v).replace(" ", ""))
def test_block_shape_lint_agrees_with_the_compiler(shape, block, dtype):
    """The lint flags a block exactly when the compiler rejects it: the chip's recorded
    verdict where there is one, else JAX's TPU lowering run here."""
    x = jnp.zeros(shape, dtype)
    fn = _blocked_copy(shape, block)
    rejected = kernelsim.tpu_lowering_error(fn, x)
    assert rejected is None or "block" in rejected, rejected  # no unrelated lowering failure
    if (shape, block, dtype) in COPY_BLOCKS:
        rejected = None if COPY_BLOCKS[shape, block, dtype] else "rejected on a TPU v5e"
    flagged = _block_warnings(fn, x)
    assert bool(flagged) == (rejected is not None), (flagged, rejected)


def test_packed_dtype_messages_name_the_tiling_and_a_legal_block():
    x = jnp.zeros((64, 256), jnp.int8)
    w, _ = _block_warnings(_blocked_copy((64, 256), (16, 256)), x)  # x and o
    assert "(32, 128) tiling rule (int8)" in w and "Nearest legal block: (32, 256)" in w
    h = jnp.zeros((32, 256), jnp.float16)
    w, _ = _block_warnings(_blocked_copy((32, 256), (32, 256)), h)  # whole: still refused
    assert "Invalid vector type for load" in w and "as bfloat16" in w and "float32" in w


def test_the_recorded_lint_sweep_agrees_with_the_chip():
    """bench/recorded/tpu_perf-v5e.json's ``lint`` verdicts (a copy kernel compiled on the chip
    over 42 (array, block, dtype) cases): kernelsim rejects exactly what failed there."""
    recorded = json.loads((ROOT / "bench" / "recorded" / "tpu_perf-v5e.json").read_text())
    assert len(recorded["lint"]) == 42
    for case in recorded["lint"]:
        shape, block = tuple(case["shape"]), tuple(case["block"])
        x = jnp.zeros(shape, case["dtype"])
        spec = pl.BlockSpec(block, lambda i: (i, 0))
        fn = pl.pallas_call(_copy_kernel, grid=(shape[0] // block[0],), in_specs=[spec],
                            out_specs=spec, out_shape=jax.ShapeDtypeStruct(shape, x.dtype))
        rejected = [w for w in kernelsim.trace(fn, x, chip="tpu-v5e").calls[0].warnings
                    if lint.BLOCK_SHAPE_REJECTED in w]
        assert bool(rejected) == (not case["compiled"]), (case, rejected)


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


MiB = 1 << 20


def _one_window(grid, index_map, mib, mode=None, prefetch=0):
    """An output of (100 MiB,) int8 written in (mib MiB,) blocks, as JAX's
    test_automatic_single_buffering (tests/pallas/tpu_pallas_test.py) builds its cases."""
    kw = {} if mode is None else {"pipeline_mode": mode}
    spec = pl.BlockSpec((mib * MiB,), index_map, **kw)
    out = jax.ShapeDtypeStruct((100 * MiB,), jnp.int8)
    if not prefetch:
        return pl.pallas_call(lambda o_ref: None, grid=grid, out_specs=spec, out_shape=out), ()
    assert prefetch == 2
    grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, out_specs=spec)
    scalars = (jnp.zeros((1,), jnp.int32),) * 2
    return pl.pallas_call(lambda s0_ref, s1_ref, o_ref: None, grid_spec=grid_spec,
                          out_shape=out), scalars


@pytest.mark.parametrize("chip, mib", [("tpu-v5e", 10), ("tpu-v6e", 20)])
@pytest.mark.parametrize("grid, index_map, mode, prefetch, fits", [
    ((4, 1), lambda i, j: (j,), None, 0, True),      # only a size-1 grid axis: one window
    ((1, 4), lambda i, j: (i,), None, 0, True),
    ((4, 1), lambda i, j: (j + i,), None, 0, False),  # four windows: two buffers, too many
    ((4, 1), lambda i, j: (j + i,), pl.Buffered(1), 0, True),
    ((4, 1), lambda i, j, *_: (j + i,), None, 2, False),  # prefetch refs are not grid axes
])
def test_automatic_single_buffering_as_jax_tests_it(chip, mib, grid, index_map, mode,
                                                    prefetch, fits):
    """Where JAX's test compiles, kernelsim counts one buffer and says nothing; where it
    expects "Ran out of memory", kernelsim counts two and warns about the scoped limit."""
    fn, args = _one_window(grid, index_map, mib, mode, prefetch)
    call = kernelsim.trace(fn, *args, chip=chip).calls[0]
    assert call.operand("o_ref").buffers == (1 if fits else 2)
    assert call.cost.vmem_bytes == (1 if fits else 2) * mib * MiB
    scoped = [w for w in call.warnings if "scoped VMEM" in w]
    assert bool(scoped) != fits
    if scoped:
        assert "vmem_limit_bytes" in scoped[0] and "CompileTimeScopedVmemOom" in scoped[0]


def test_scoped_allocations_count_at_their_peak():
    """Nested run_scoped buffers are live together; sequential ones reuse the space."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

        def add_through(ref):  # x passes through the buffer's first rows into o
            ref[pl.ds(0, 8), :] = x_ref[...]
            o_ref[...] += ref[pl.ds(0, 8), :]

        def outer(a):  # 4 KiB, and inside it 8 KiB: 12 KiB at once
            add_through(a)
            pl.run_scoped(add_through, pltpu.VMEM((16, 128), jnp.float32))

        def count(s):
            s[0] = 1
            o_ref[...] += s[0].astype(jnp.float32)

        pl.run_scoped(outer, pltpu.VMEM((8, 128), jnp.float32))
        pl.run_scoped(add_through, pltpu.VMEM((20, 128), jnp.float32))  # 10 KiB, afterwards
        pl.run_scoped(count, pltpu.SMEM((64,), jnp.int32))

    x = jnp.zeros((8, 128), jnp.float32)
    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
    call = kernelsim.trace(fn, x).calls[0]
    assert (call.call.scoped_vmem_bytes, call.call.scoped_smem_bytes) == (12 * 1024, 256)
    assert call.cost.vmem_bytes == 12 * 1024 + 2 * x.nbytes  # + the whole-array x and o
    assert call.cost.smem_bytes == 256


def test_emit_pipeline_buffers_are_on_chip():
    """JAX's PallasCallMultipleBufferedPipelineTest.test_copy: Buffered(4) in, Buffered(2) out
    of (128, 128) int32 blocks, allocated by emit_pipeline with run_scoped: 6 x 64 KiB."""
    from test_jax_test_kernels import emit_pipeline_multiple_buffered_copy

    fn, args = emit_pipeline_multiple_buffered_copy()
    call = kernelsim.trace(fn, *args).calls[0]
    assert call.call.scoped_vmem_bytes == 6 * 128 * 128 * 4
    assert call.cost.vmem_bytes == 6 * 128 * 128 * 4  # its operands stay in ANY


def test_two_9_mib_windows_are_warned_as_the_chip_refused_them():
    fn, args = _one_window((4, 1), lambda i, j: (j + i,), 9)
    call = kernelsim.trace(fn, *args, chip="tpu-v5e").calls[0]
    scoped = [w for w in call.warnings if lint.rule_of(w) == lint.SCOPED_VMEM]
    assert bool(scoped) == (not TWO_9_MIB_WINDOWS_COMPILED)
    assert "blocks that would fit: o_ref (" in scoped[0], scoped


def _matmul_call(blocks):
    """Lesson 7's matmul (kernelsim.examples.matmul is the same kernel) at the sweep's size."""
    a = jnp.zeros((4096, 4096), jnp.bfloat16)
    bm, bk, bn = blocks
    return kernelsim.trace(lambda x, y: examples.matmul(x, y, bm, bk, bn), a, a,
                           chip="tpu-v5e").calls[0]


def test_vmem_sweep_warns_every_configuration_the_chip_refused():
    """Every configuration Mosaic refused on a TPU v5e is warned, and at most one it compiled
    (kernelsim counts the dot's float32 result up to 2 MiB, as Mosaic allocated it)."""
    assert kernelsim.chips.CHIPS["tpu-v5e"].default_scoped_vmem_bytes == DEFAULT_SCOPED_VMEM
    false_alarms = []
    for blocks, mosaic_mib in MATMUL_VMEM.items():
        call = _matmul_call(blocks)
        warned = [w for w in call.warnings
                  if lint.rule_of(w) == lint.SCOPED_VMEM]
        if mosaic_mib is not None:
            assert warned, (blocks, call.cost.mosaic_vmem_bytes)
            assert call.cost.mosaic_vmem_bytes >= mosaic_mib * MiB * 0.98, blocks
            assert "vmem_limit_bytes" in warned[0] and "blocks that would fit" in warned[0]
        elif warned:
            false_alarms.append(blocks)
    assert len(false_alarms) <= 1, false_alarms


def test_a_fitting_block_the_warning_names_fits():
    """The blocks the warning proposes for (1024, 1024, 1024) trace without the warning."""
    (w,) = [w for w in _matmul_call((1024, 1024, 1024)).warnings if "would fit" in w]
    assert "x_ref (512, 512), y_ref (512, 512), o_ref (512, 512)" in w
    assert not [w for w in _matmul_call((512, 512, 512)).warnings if "scoped VMEM" in w]


def test_the_dots_float32_result_and_tile_padding_count():
    call = _matmul_call((512, 1024, 1024))
    buffers = 2 * (512 * 1024 * 2 + 1024 * 1024 * 2) + 2 * 512 * 1024 * 2 + 512 * 1024 * 4
    assert call.cost.vmem_bytes == buffers
    assert call.cost.body_values_vmem_bytes == 512 * 1024 * 4  # dot's f32 product
    assert call.to_dict()["mosaic_vmem_bytes"] == buffers + 512 * 1024 * 4
    x = jnp.zeros((40, 100), jnp.float32)  # a (20, 100) block takes (24, 128) words
    call = kernelsim.trace(_blocked_copy((40, 100), (20, 100)), x).calls[0]
    assert call.operand("x_ref").onchip_bytes == 2 * 24 * 128 * 4
    y = jnp.zeros((64, 128), jnp.int8)  # 8-bit rows tile in 32s
    call = kernelsim.trace(_blocked_copy((64, 128), (64, 128)), y).calls[0]
    assert call.operand("x_ref").onchip_bytes == 64 * 128


def test_vmem_limit_bytes_replaces_the_default_scoped_limit():
    spec = pl.BlockSpec((10 * MiB,), lambda i, j: (j + i,))

    def fn(limit):
        params = pltpu.CompilerParams(vmem_limit_bytes=limit)
        return pl.pallas_call(lambda o_ref: None, grid=(4, 1), out_specs=spec,
                              compiler_params=params,
                              out_shape=jax.ShapeDtypeStruct((100 * MiB,), jnp.int8))

    assert kernelsim.trace(fn(32 * MiB)).calls[0].warnings == []
    (w,) = kernelsim.trace(fn(16 * MiB)).calls[0].warnings
    assert "exceeds the call's vmem_limit_bytes 16,777,216 B" in w


def test_the_recorded_vmem_sweep_agrees_with_the_chip():
    """bench/recorded/tpu_perf-v5e.json's ``vmem`` verdicts (the chip's compile of lesson 7's
    matmul at 4096 over 12 block shapes): kernelsim warns exactly the refused ones."""
    recorded = json.loads((ROOT / "bench" / "recorded" / "tpu_perf-v5e.json").read_text())
    assert len(recorded["vmem"]) == 12
    for v in recorded["vmem"]:
        call = _matmul_call(tuple(v["blocks"]))
        warned = any(lint.rule_of(w) == lint.SCOPED_VMEM
                     for w in call.warnings)
        assert warned == (not v["compiled"]), (v["blocks"], call.cost.mosaic_vmem_bytes)


# Issue 34: on a held-out corpus of production kernels compiled on a TPU v6e, Mosaic refused
# three at their native shapes for scoped VMEM (a softmax at 2048 x 2048, 37 MiB with its max,
# sum and exp; a reduction, 33.7 MiB; a kernel that materialises a (c, n, n, n) product)
# where kernelsim had counted only the pipeline's buffers. These are kernels of those kinds at
# those sizes: each block is the whole array (grid (1,), so Mosaic single-buffers it) and the
# buffers alone fit v6e's 32 MiB; what does not fit is the values the body keeps.
def _softmax_rows(x_ref, o_ref):
    x = x_ref[...]
    m = x.max(axis=1, keepdims=True)
    e = jnp.exp(x - m)
    o_ref[...] = e / e.sum(axis=1, keepdims=True)


def _row_moments(x_ref, o_ref):
    """Per row: the sum of squares less the squared sum over the width, from float32."""
    x = x_ref[...].astype(jnp.float32)
    s1 = x.sum(axis=1, keepdims=True)
    o_ref[...] = (x * x).sum(axis=1, keepdims=True) - s1 * s1 / x.shape[1]


def _outer_product_max(a_ref, b_ref, o_ref):
    """A (c, n, n, n) broadcast product a[c, i, j] * b[c, j, k], then its max over j."""
    o_ref[...] = jnp.max(a_ref[...][:, :, :, None] * b_ref[...][:, None, :, :], axis=2)


def _whole_block_call(kernel, out, *ins):
    whole = lambda s: pl.BlockSpec(s.shape, lambda i: (0,) * len(s.shape))  # noqa: E731
    return pl.pallas_call(kernel, grid=(1,), in_specs=[whole(s) for s in ins],
                          out_specs=whole(out), out_shape=out)


_SQUARE = jax.ShapeDtypeStruct((2048, 2048), jnp.float32)
_CUBES = jax.ShapeDtypeStruct((8, 128, 128), jnp.float32)
_CORPUS_MISSES = {  # name -> (the call, its operands)
    "softmax": (_whole_block_call(_softmax_rows, _SQUARE, _SQUARE), (_SQUARE,)),
    "reduction": (_whole_block_call(_row_moments, jax.ShapeDtypeStruct((2048, 1), jnp.float32),
                                    jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)),
                  (jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16),)),
    "(c, n, n, n) product": (_whole_block_call(_outer_product_max, _CUBES, _CUBES, _CUBES),
                             (_CUBES, _CUBES)),
}


@pytest.mark.parametrize("name", list(_CORPUS_MISSES))
@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v6e"])
def test_the_corpus_native_shape_vmem_misses_are_warned(name, chip):
    """Refused on the chip => warned, at v5e's 16 MiB and v6e's 32 MiB default limits, the
    warning naming vmem_limit_bytes; the pipeline's buffers alone fit v6e's limit, so it is
    the body's kept values (the softmax's exp, the float32 copy and its square, the product)
    that make the footprint."""
    fn, args = _CORPUS_MISSES[name]
    c = kernelsim.trace(fn, *args, chip=chip).calls[0]
    limit = kernelsim.chips.get_chip(chip).default_scoped_vmem_bytes
    assert c.cost.vmem_bytes <= 32 * MiB < c.cost.mosaic_vmem_bytes
    assert c.cost.body_values_vmem_bytes >= 16 * MiB
    (w,) = [w for w in c.warnings if lint.rule_of(w) == lint.SCOPED_VMEM]
    assert "vmem_limit_bytes" in w and f"{limit:,} B" in w
