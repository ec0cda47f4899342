"""Every TraceError and every lint warning kernelsim promises, each produced by a kernel."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim import TraceError
from kernelsim import examples as ex


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _copy(x, block, in_map, grid, out_map=None, out_block=None, semantics=None):
    params = pltpu.CompilerParams(dimension_semantics=semantics) if semantics else None
    return pl.pallas_call(
        _copy_kernel, grid=grid, in_specs=[pl.BlockSpec(block, in_map)],
        out_specs=pl.BlockSpec(out_block or block, out_map or in_map),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), compiler_params=params)(x)


X = jnp.zeros((64, 256), jnp.float32)


def test_no_pallas_call():
    with pytest.raises(TraceError, match="reached no pallas_call"):
        kernelsim.trace(lambda x: x + 1, X)


def test_buffer_count_pair_is_refused_with_the_operand_named():
    """jax 0.12's Buffered takes an (input, output) pair, meant for emit_pipeline only."""
    def fn(x):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered((2, 1)))
        return pl.pallas_call(_copy_kernel, grid=(8,), in_specs=[spec],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pytest.raises(TraceError, match=r"args\[0\]: pl.Buffered\(\(2, 1\)\).*emit_pipeline"):
        kernelsim.trace(fn, X)


def test_index_map_leaving_the_array_names_call_operand_step_and_block_count():
    fn = functools.partial(_copy, block=(8, 128), in_map=lambda i: (i + 1, 0), grid=(8,),
                           out_map=lambda i: (i, 0))
    with pytest.raises(TraceError) as err:
        kernelsim.trace(fn, X)
    msg = str(err.value)
    for part in ("'_copy_kernel'", "'x_ref'", "block index (8, 0)", "grid step 7",
                 "has 8 blocks", "(0..7)"):
        assert part in msg, (part, msg)


def test_negative_block_index_is_rejected():
    fn = functools.partial(_copy, block=(8, 128), in_map=lambda i: (0, i - 1), grid=(2,),
                           out_map=lambda i: (0, i))
    with pytest.raises(TraceError, match=r"block index \(0, -1\) at grid step 0"):
        kernelsim.trace(fn, X)


def test_dynamic_grid_is_resolved_from_its_operand():
    """A traced grid bound (as megablox's gmm builds) is read from the concrete operand."""
    def fn(x, n):
        return _copy(x, (8, 128), lambda i: (i, 0), grid=(n,))

    static = kernelsim.trace(lambda x: fn(x, 8), X).calls[0]
    for traced in (kernelsim.trace(fn, X, jnp.int32(8)), kernelsim.trace(jax.jit(fn), X, 8)):
        call = traced.calls[0]
        assert call.grid == (8,) == static.grid
        assert call.hbm_read_bytes == static.hbm_read_bytes == 8 * (8 * 128 * 4)


def test_unsupported_block_dim_kind_is_named():
    def fn(x):
        return pl.pallas_call(
            _copy_kernel, grid=(8,),
            in_specs=[pl.BlockSpec((pl.BoundedSlice(8), 256), lambda i: (pl.ds(i * 8, 8), 0))],
            out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    with pytest.raises(TraceError, match="BoundedSlice is not supported"):
        kernelsim.trace(fn, X)


def test_unknown_model_and_chip():
    with pytest.raises(TraceError, match="unknown model"):
        kernelsim.trace(ex.add, X, X, model="cpu")
    with pytest.raises(TraceError, match="unknown chip 'tpu-v9'"):
        kernelsim.trace(ex.add, X, X, chip="tpu-v9")


def _warnings(fn, *args, **kw):
    return kernelsim.trace(fn, *args, **kw).calls[0].warnings


def test_lint_footprint_above_capacity():
    big = jnp.zeros((4096, 4096), jnp.float32)
    fn = functools.partial(_copy, block=(2048, 2048), in_map=lambda i, j: (i, j), grid=(2, 2))
    # 2 operands x 2 buffers x 16 MiB = 64 MiB: fits v5e's 128 MiB VMEM, not v4's 16 MiB --
    # but on v5e it is above the default scoped limit (test_tpu_rules.py has the chip's)
    (w,) = [w for w in _warnings(fn, big, chip="tpu-v5e") if "footprint" in w]
    assert "exceeds Mosaic's default scoped VMEM limit on tpu-v5e, 16,777,216 B" in w
    (w,) = [w for w in _warnings(fn, big, chip="tpu-v4") if "footprint" in w]
    assert "exceeds tpu-v4's VMEM of 16,777,216 B" in w and "67,108,864 B" in w
    with pytest.raises(TraceError, match="footprint"):
        kernelsim.trace(fn, big, chip="tpu-v4", strict=True)


def test_lint_footprint_above_the_calls_vmem_limit():
    x = jnp.zeros((1024, 1024), jnp.float32)

    def fn(x, limit):
        return pl.pallas_call(
            _copy_kernel, grid=(2,), in_specs=[pl.BlockSpec((512, 1024), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((512, 1024), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(vmem_limit_bytes=limit))(x)

    # 2 operands x 2 buffers x 2 MiB = 8 MiB
    (w,) = [w for w in _warnings(functools.partial(fn, limit=4 << 20), x) if "footprint" in w]
    assert "8,388,608 B exceeds the call's vmem_limit_bytes 4,194,304 B" in w
    assert "--xla_tpu_scoped_vmem_limit_kib" in w
    assert not any("footprint" in w for w in _warnings(functools.partial(fn, limit=8 << 20), x))


def test_lint_tiling_rule():
    fn = functools.partial(_copy, block=(4, 64), in_map=lambda i, j: (i, j), grid=(16, 4))
    warnings = [w for w in _warnings(fn, X) if "(8, 128)" in w]
    assert len(warnings) == 2  # input and output
    assert "last dim 64 is neither a multiple of 128 nor the array's 256" in warnings[0]
    assert "second-to-last dim 4" in warnings[0]
    full = functools.partial(_copy, block=(64, 256), in_map=lambda i: (0, 0), grid=(1,))
    assert not any("(8, 128)" in w for w in _warnings(full, X))
    assert not any("(8, 128)" in w for w in _warnings(fn, X, model="gpu"))


def test_lint_parallel_after_arbitrary():
    fn = functools.partial(_copy, block=(8, 128), in_map=lambda i, j: (i, j), grid=(8, 2),
                           semantics=("arbitrary", "parallel"))
    (w,) = [w for w in _warnings(fn, X) if "prefix" in w]
    assert "grid axis 1 is 'parallel' but comes after 'arbitrary' axis 0" in w


def test_lint_non_consecutive_output_revisit():
    # k outermost: output block (i, 0) comes back once per k step -> TPU writes partial sums.
    def fn(x, y):
        return pl.pallas_call(
            ex.matmul_kernel, grid=(2, 2, 2),
            in_specs=[pl.BlockSpec((128, 128), lambda kk, i, j: (i, kk)),
                      pl.BlockSpec((128, 128), lambda kk, i, j: (kk, j))],
            out_specs=pl.BlockSpec((128, 128), lambda kk, i, j: (i, j)),
            scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
            out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32))(x, y)
    z = jnp.zeros((256, 256))
    (w,) = [w for w in _warnings(fn, z, z) if "revisit" in w]
    assert "output 'o_ref' revisits block (0, 0) non-consecutively (first again at step 4" in w
    assert not any("revisit" in w for w in _warnings(ex.matmul, z, z))


def _maybe_copy(flag_ref, x_hbm, unused_hbm, o_ref, sem):
    """Copies x only where the flag says so; never names ``unused_hbm``."""
    @pl.when(flag_ref[0] > 0)
    def _():
        pltpu.async_copy(x_hbm.at[pl.ds(pl.program_id(0) * 8, 8)], o_ref, sem).wait()


def _maybe_copy_call(flag, x):
    return pl.pallas_call(
        _maybe_copy, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        scratch_shapes=[pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct((x.shape[0], 128), x.dtype))(flag, x, x)


def test_unused_operand_lint_fires_only_for_an_operand_the_body_never_names():
    x = jnp.zeros((32, 128), jnp.float32)
    for flag in (1, 0):  # at flag 0 no DMA runs, but the body still names x_hbm
        warnings = kernelsim.trace(_maybe_copy_call, jnp.array([flag], jnp.int32),
                                   x).calls[0].warnings
        unused = [w for w in warnings if "is it used?" in w]
        assert len(unused) == 1 and "'unused_hbm'" in unused[0], warnings


def test_vmapped_grid_axes_are_parallel_before_the_kernels_own_semantics():
    """The TPU lowering gives every axis vmap adds "parallel" (MosaicGridMapping)."""
    x = jnp.zeros((2, 256, 256), jnp.float32)
    fn = jax.vmap(functools.partial(ex.matmul, bm=128, bk=128, bn=128))
    call = kernelsim.trace(fn, x, x).calls[0]
    assert call.grid == (2, 2, 2, 2)
    assert call.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary")
    assert not [w for w in call.warnings if "comes after 'arbitrary'" in w]


def _softmax_rows(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - x.max(axis=1, keepdims=True))
    o_ref[...] = e / e.sum(axis=1, keepdims=True)


def softmax_rows(x, rows):
    return pl.pallas_call(_softmax_rows, grid=(x.shape[0] // rows,),
                          in_specs=[pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_values_mosaic_keeps_count_beside_the_buffers():
    """A softmax keeps its exp (read by the sum, then by the division); x - max streams into
    the exp, and the row max and sum are streamed to their one reader (a TPU v5e allocated
    3.8 MiB beside the buffers of a (256, 4096) float32 softmax, whose exp is 4 MiB:
    bench/recorded/tpu_perf_vmem-v5e.json)."""
    x = jax.ShapeDtypeStruct((2048, 8192), jnp.float32)
    small = kernelsim.trace(softmax_rows, jnp.zeros((64, 1024)), 8).calls[0]
    kept = small.cost.body_values_vmem_bytes
    assert kept == 8 * 1024 * 4  # the exp
    assert small.to_dict()["mosaic_vmem_bytes"] == small.cost.vmem_bytes + kept
    assert not [w for w in small.warnings if "VMEM" in w]
    # 1024-row blocks: 4 buffers of 32 MiB fill v5e's 128 MiB VMEM, the exp does not fit
    big = kernelsim.trace(softmax_rows, jnp.zeros(x.shape, x.dtype), 1024).calls[0]
    assert big.cost.vmem_bytes <= 128 * 2**20 < big.cost.mosaic_vmem_bytes
    (w,) = [w for w in big.warnings if kernelsim.cost.lint.rule_of(w) == "vmem_capacity"]
    assert "values the body keeps 33,554,432 B" in w and "blocks that would fit" in w  # the exp
