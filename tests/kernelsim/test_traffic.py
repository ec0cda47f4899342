"""Traffic, footprint, cost and capture through JAX transformations."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim import examples as ex


def _zeros(*shape, dtype=jnp.float32):
    return jnp.zeros(shape, dtype)


@pytest.mark.parametrize("m,k,n,bm,bk,bn", [
    (1024, 1024, 1024, 128, 128, 128),
    (512, 1024, 256, 256, 256, 128),
    (256, 512, 512, 128, 256, 256),
])
def test_matmul_traffic_matches_the_analytic_formula(m, k, n, bm, bk, bn):
    e = 4
    t = kernelsim.trace(functools.partial(ex.matmul, bm=bm, bk=bk, bn=bn),
                        _zeros(m, k), _zeros(k, n))
    c = t.calls[0]
    assert c.operand("x_ref").hbm_read_bytes == m * k * e * (n // bn)
    assert c.operand("y_ref").hbm_read_bytes == k * n * e * (m // bm)
    assert c.hbm_write_bytes == m * n * e
    assert c.hbm_read_bytes + c.hbm_write_bytes == (
        m * k * e * (n // bn) + k * n * e * (m // bm) + m * n * e)


def test_matmul_with_one_k_block_reads_a_once():
    m, k, n = 512, 128, 1024
    t = kernelsim.trace(functools.partial(ex.matmul, bm=128, bk=128, bn=128),
                        _zeros(m, k), _zeros(k, n))
    x = t.calls[0].operand("x_ref")
    assert x.hbm_read_bytes == m * k * 4  # the formula would say m*k*4*(n/bn) = 8x more
    assert (x.fetches, x.skips) == (m // 128, (m // 128) * (n // 128 - 1))


def test_matmul_flops_and_footprint():
    t = kernelsim.trace(ex.matmul, _zeros(256, 256), _zeros(256, 256))
    c = t.calls[0]
    dot_flops = 2 * 256 ** 3
    # plus one add per accumulator element per step and a few scalar ops
    assert dot_flops <= c.flops <= dot_flops + c.steps * (128 * 128 + 16)
    # x, y, o double-buffered (128x128 f32 = 64 KiB each) plus the f32 accumulator
    assert c.cost.vmem_bytes == 3 * 2 * 65536 + 65536
    assert c.onchip_peak_bytes == c.cost.vmem_bytes


def test_gpu_model_reuses_nothing():
    t = kernelsim.trace(ex.matmul, _zeros(256, 256), _zeros(256, 256), model="gpu")
    c = t.calls[0]
    assert t.chip.name == "h100"
    assert c.operand("x_ref").fetches == c.steps == 8
    assert c.operand("o_ref").writebacks == 8
    assert c.operand("x_ref").buffers == 1
    assert c.cost.overhead_seconds == 0.0


def test_estimate_is_roofline_plus_step_overhead():
    """A chip without a fitted time model (v4): the roofline plus the per-step cost."""
    t = kernelsim.trace(ex.matmul, _zeros(1024, 1024, dtype=jnp.bfloat16),
                        _zeros(1024, 1024, dtype=jnp.bfloat16), chip="tpu-v4")
    c = t.calls[0]
    chip = kernelsim.chips.CHIPS["tpu-v4"]
    assert c.cost.compute_seconds == pytest.approx(c.flops / chip.peak_flops_bf16)
    bytes_ = c.hbm_read_bytes + c.hbm_write_bytes
    assert c.cost.memory_seconds == pytest.approx(bytes_ / chip.hbm_bytes_per_second)
    assert c.estimated_seconds == pytest.approx(
        max(c.cost.compute_seconds, c.cost.memory_seconds) + 512 * 0.27e-6)


def test_fitted_tpu_time_model_terms():
    """v5e's fitted model: matmuls at mxu_efficiency of the peak or the vector work, the
    larger, plus the lane broadcasts; copies at dma_efficiency of the bandwidth, the longer
    of the reads and the writes (the DMAs move both at once), a fixed cost per call and per
    working step."""
    t = kernelsim.trace(ex.matmul, _zeros(1024, 1024, dtype=jnp.bfloat16),
                        _zeros(1024, 1024, dtype=jnp.bfloat16), chip="tpu-v5e")
    c, chip = t.calls[0], kernelsim.chips.CHIPS["tpu-v5e"]
    assert c.cost.working_steps == c.steps == 512
    vector = 512 * c.call.vector_vregs_per_step / chip.vector_vregs_per_second
    broadcasts = 512 * c.call.lane_broadcast_vregs_per_step * chip.lane_broadcast_seconds
    assert c.call.vector_vregs_per_step > 0
    assert c.cost.compute_seconds == pytest.approx(
        max(c.flops / (chip.peak_flops_bf16 * chip.mxu_efficiency), vector) + broadcasts)
    assert c.cost.memory_seconds == pytest.approx(
        max(c.cost.hbm_read_bytes, c.cost.hbm_write_bytes)
        / (chip.hbm_bytes_per_second * chip.dma_efficiency))
    assert c.cost.overhead_seconds == pytest.approx(
        chip.call_seconds + 512 * chip.per_step_seconds)


def _last_step_division(x_ref, d_ref, o_ref):
    """o = x / d at the last step only, d a (rows, 1) column: a lane broadcast and a division
    under ``pl.when``, the shape of lesson 8's last-step normalisation."""
    o_ref[...] = x_ref[...]

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = x_ref[...] / d_ref[...]


def _when_call(kernel, steps=4, prefetch=None, **kw):
    """``kernel`` over ``steps`` steps of (8, 128) float32 blocks, with a (8, 1) column."""
    x_spec = pl.BlockSpec((8, 128), lambda i, *_: (i, 0))
    d_spec = pl.BlockSpec((8, 1), lambda i, *_: (0, 0))
    shapes = dict(out_shape=jax.ShapeDtypeStruct((8 * steps, 128), jnp.float32), **kw)
    if prefetch is None:
        return pl.pallas_call(kernel, grid=(steps,), in_specs=[x_spec, d_spec],
                              out_specs=x_spec, **shapes)
    return pl.pallas_call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(steps,), in_specs=[x_spec, d_spec], out_specs=x_spec),
        **shapes)


def test_a_pl_when_counts_its_work_at_the_steps_its_predicate_takes_it():
    """The predicate of a ``pl.when`` over program ids is evaluated at every grid step: the
    last step's division and its lane broadcast count once, not at every step (as lesson 8's
    last-step normalisation did before, at every step), in the FLOPs and the time model."""
    x, d = _zeros(32, 128), jnp.ones((8, 1), jnp.float32)
    c = kernelsim.trace(_when_call(_last_step_division), x, d, chip="tpu-v5e").calls[0]
    work = c.call.step_work
    assert work.evaluated and work.unevaluated == () and c.work_unevaluated == ()
    column = 8 * 128 * 4 // 4096  # an (8, 1) float32 column fills one (8, 128) vreg
    assert list(work.lane_broadcast_vregs) == [0, 0, 0, column]
    assert c.call.lane_broadcast_vregs_per_step == column  # one invocation, branch taken
    assert list(work.flops) == [1, 1, 1, 1 + 8 * 128]  # the == and its division
    assert c.flops == 3 + 1 + 8 * 128
    assert c.cost.time_terms.lane_broadcast_vregs == column
    assert list(work.computes) == [True] * 4 and c.cost.working_steps == 4  # each stores


def _skipped_by_prefetch(s_ref, x_ref, d_ref, o_ref):
    @pl.when(s_ref[pl.program_id(0)] > 0)
    def _():
        o_ref[...] = x_ref[...] * 2.0 + d_ref[...]


def test_a_predicate_on_scalar_prefetch_is_evaluated_and_skipped_steps_do_not_work():
    x, d = _zeros(32, 128), jnp.ones((8, 1), jnp.float32)
    live = jnp.array([1, 0, 0, 1], jnp.int32)
    c = kernelsim.trace(_when_call(_skipped_by_prefetch, prefetch=True), live, x, d,
                        chip="tpu-v5e").calls[0]
    assert list(c.call.step_work.computes) == [True, False, False, True]
    # every step copies its x block, but only the two the predicate keeps are working steps
    assert (c.cost.working_steps, c.cost.time_terms.idle_steps) == (2, 2)
    assert c.flops == 4 + 2 * 2 * 8 * 128  # the > at each step; * and + where it runs


def _skipped_by_block_value(x_ref, d_ref, o_ref):
    @pl.when(d_ref[0, 0] > 0)
    def _():
        o_ref[...] = x_ref[...] * 2.0


def test_a_predicate_kernelsim_cannot_evaluate_counts_its_branch_and_says_so():
    x, d = _zeros(32, 128), jnp.ones((8, 1), jnp.float32)
    t = kernelsim.trace(_when_call(_skipped_by_block_value), x, d, chip="tpu-v5e")
    c = t.calls[0]
    assert not c.call.step_work.evaluated
    (why,) = c.work_unevaluated
    assert "cannot evaluate per grid step" in why and "every step" in why
    assert c.flops == 4 * c.call.flops_per_step
    assert t.to_dict()["calls"][0]["work_unevaluated"] == [why]
    assert f"work: {why}" in t.summary()


def test_cost_estimate_overrides_counted_flops():
    def fn(x):
        return pl.pallas_call(ex.add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              cost_estimate=pl.CostEstimate(
                                  flops=12345, transcendentals=0, bytes_accessed=0,
                                  remote_bytes_transferred=64))(x, x)
    c = kernelsim.trace(fn, _zeros(8, 128)).calls[0]
    assert (c.flops, c.cost.flops_source) == (12345, "pl.CostEstimate")
    # the kernel's own count stays beside it, and the trace reports the whole estimate
    assert c.own_flops == 8 * 128
    assert c.to_dict()["cost_estimate"] == {"flops": 12345, "bytes_accessed": 0,
                                            "transcendentals": 0,
                                            "remote_bytes_transferred": 64}


def test_a_kernel_drawing_random_bits_from_a_key_is_counted():
    """A jax.random key in the body is an extended dtype with no NumPy one: it has no vector
    registers to count (the FLOP count once raised TypeError on it)."""
    def kernel(o_ref):
        key = jax.random.fold_in(jax.random.key(7), pl.program_id(0))
        o_ref[...] = jax.random.bits(key, o_ref.shape, jnp.uint32)

    def fn():
        return pl.pallas_call(kernel, grid=(2,),
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((16, 128), jnp.uint32))()
    c = kernelsim.trace(fn).calls[0]
    assert c.steps == 2 and c.call.vector_vregs_per_step > 0


def test_single_buffered_and_whole_array_blocks_use_one_buffer():
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...] + w_ref[pl.ds(pl.program_id(0) * 8, 8), :]

    def fn(x, w):
        return pl.pallas_call(
            kernel, grid=(4,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered(1)),
                      pl.BlockSpec((32, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32))(x, w)
    c = kernelsim.trace(fn, _zeros(32, 128), _zeros(32, 128)).calls[0]
    assert [o.buffers for o in c.operands] == [1, 1, 2]
    assert c.cost.vmem_bytes == 8 * 128 * 4 + 32 * 128 * 4 + 2 * 8 * 128 * 4
    w = c.operand("w_ref")
    assert (w.fetches, w.skips) == (1, 3)


def test_scalar_prefetch_counts_once_into_smem():
    target = ex.block_sparse_target()
    c = kernelsim.trace(*target[:1], *target[1]).calls[0]
    prefetch = [o for o in c.operands if o.role == "scalar_prefetch"]
    assert [o.name for o in prefetch] == ["counts_ref", "rows_ref", "cols_ref"]
    assert all(o.fetches == 1 and o.memory_space == "smem" for o in prefetch)
    windowed = sum(o.hbm_read_bytes for o in c.operands if o.role == "input")
    assert c.hbm_read_bytes == windowed + (8 + 24 + 24) * 4
    # HBM reads count the arrays; in SMEM Mosaic tiles each 1-D array in 128-word tiles
    assert c.cost.smem_bytes == 3 * 128 * 4


def test_any_operands_get_no_pipeline_copies_but_their_body_dmas_count():
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]

    def fn(x):
        return pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())])(x)
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out, t = kernelsim.run(fn, x)
    np.testing.assert_array_equal(out, x)  # ran in the TPU interpreter (manual DMA)
    c = t.calls[0]
    xin = c.operand("x_hbm")
    assert (xin.memory_space, xin.fetches, xin.hbm_read_bytes, xin.onchip_bytes) == (
        "any", 0, x.nbytes, 0)
    assert c.operand("sem").memory_space == "semaphore"
    assert c.call.body_copies[0].bytes == x.nbytes
    assert c.warnings == []


def test_an_any_operand_nothing_copies_is_flagged():
    def kernel(x_hbm, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

    def fn(x):
        return pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    c = kernelsim.trace(fn, jnp.zeros((8, 128))).calls[0]
    assert any("neither the pipeline nor the kernel body copies it" in w for w in c.warnings)


def test_capture_through_jit_scan_cond_custom_vjp_and_vmap():
    add = functools.partial(ex.add, block=(8, 128))

    @jax.custom_vjp
    def with_vjp(x, y):
        return add(x, y)

    with_vjp.defvjp(lambda x, y: (add(x, y), None), lambda _, g: (g, g))

    def fn(x, y):
        a = jax.jit(add)(x, y)
        a, _ = jax.lax.scan(lambda c, _: (add(c, y), None), a, None, length=3)
        a = jax.lax.cond(a.sum() > -1.0, lambda: add(a, y), lambda: a)
        b = jax.vmap(add)(jnp.stack([x, x]), jnp.stack([y, y]))
        return with_vjp(a, y) + b[0]

    x = jnp.ones((16, 256))
    out, t = kernelsim.run(fn, x, x)
    assert len(t.calls) == 7
    assert [c.grid for c in t.calls] == [(2, 2)] * 5 + [(2, 2, 2), (2, 2)]
    np.testing.assert_allclose(out, 7.0 + 2.0)  # 1+1, +3 in scan, +1 cond, +1 vjp; + b
    assert kernelsim.trace(fn, x, x).to_dict()["calls"][5]["grid"] == [2, 2, 2]


def test_to_dict_has_the_documented_shape_and_is_json():
    d = kernelsim.trace(*ex.block_sparse_target()[:1], *ex.block_sparse_target()[1]).to_dict()
    json.dumps(d)
    assert set(d) >= {"model", "chip", "calls"}
    call = d["calls"][0]
    assert set(call) >= {"name", "grid", "steps", "dimension_semantics", "operands",
                         "hbm_read_bytes", "hbm_write_bytes", "onchip_peak_bytes", "flops",
                         "estimated_seconds", "warnings"}
    assert [o["role"] for o in call["operands"]] == ["scalar_prefetch"] * 3 + ["input"] * 2 + [
        "output"]
    for o in call["operands"]:
        assert set(o) >= {"name", "role", "shape", "dtype", "block_shape", "memory_space",
                          "fetches", "skips", "writebacks", "hbm_read_bytes", "hbm_write_bytes"}
    assert call["dimension_semantics"] == ["parallel", "arbitrary"]


def test_squeezed_dims_report_none_in_block_shape():
    t = kernelsim.trace(jax.vmap(functools.partial(ex.add, block=(8, 128))),
                        _zeros(2, 8, 128), _zeros(2, 8, 128))
    assert t.to_dict()["calls"][0]["operands"][0]["block_shape"] == [None, 8, 128]


def test_run_outputs_match_reference_for_matmul():
    x = jax.random.normal(jax.random.key(0), (256, 256))
    out, t = kernelsim.run(ex.matmul, x, x)
    np.testing.assert_allclose(out, x @ x, rtol=1e-4, atol=1e-3)
    assert t.calls[0].steps == 8


def test_a_semaphore_output_is_an_operand_without_bytes():
    """A kernel may return the DMA semaphore its copy signals (JAX's async-copy tests do)."""
    def kernel(x_hbm, o_hbm, sem_out):
        pltpu.make_async_copy(x_hbm, o_hbm, sem_out).start()

    def fn(x):
        return pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=(pl.BlockSpec(memory_space=pl.ANY),
                       pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
            out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())))(x)

    c = kernelsim.trace(fn, _zeros(8, 128)).calls[0]
    sem = c.operand("sem_out")
    assert (sem.memory_space, sem.hbm_write_bytes, sem.onchip_bytes) == ("semaphore", 0, 0)
    assert (c.hbm_read_bytes, c.hbm_write_bytes) == (8 * 128 * 4, 8 * 128 * 4)


def test_emit_pipeline_copies_are_counted_as_body_dmas():
    """pltpu.emit_pipeline builds its pipeline from async copies in the kernel body; tracing
    it asks which TPU it targets (tiling), so kernelsim presents the modelled chip."""
    def inner(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def outer(x_hbm, o_hbm):
        pltpu.emit_pipeline(inner, grid=(4,),
                            in_specs=[pl.BlockSpec((64, 128), lambda i: (i, 0))],
                            out_specs=[pl.BlockSpec((64, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

    def fn(x):
        return pl.pallas_call(outer, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec(memory_space=pl.ANY),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = _zeros(256, 128)
    c = kernelsim.trace(fn, x, chip="tpu-v6e").calls[0]
    routes = sorted((b.src_space, b.dst_space, b.bytes) for b in c.call.body_copies)
    assert routes == [("any", "vmem", 64 * 128 * 4)] * 4 + [("vmem", "any", 64 * 128 * 4)] * 4
    assert (c.hbm_read_bytes, c.hbm_write_bytes) == (x.nbytes, x.nbytes)


def test_steps_that_repeat_every_block_are_skipped_steps():
    """A causal-style index map repeats the last block it needs (no fetch) while the output
    stays: those steps are skipped (``cost.working_steps``), charged ``idle_step_seconds``."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def fn(x):
        return pl.pallas_call(
            kernel, grid=(2, 4),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, jnp.minimum(j, 1)))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype))(x)

    c = kernelsim.trace(fn, _zeros(16, 512), chip="tpu-v5e").calls[0]
    chip = kernelsim.chips.CHIPS["tpu-v5e"]
    assert (c.steps, c.cost.working_steps) == (8, 4)
    assert c.cost.overhead_seconds == pytest.approx(
        chip.call_seconds + 4 * chip.per_step_seconds + 4 * chip.idle_step_seconds)


def test_tiling_a_value_is_data_movement_like_concatenating_it():
    """``jnp.tile`` (pltpu.repeat) lowers to a concatenate of the same value: vector work of
    neither, only the add after it (as JAX's bundled flash attention repeats its statistics)."""

    def body(join):
        def kernel(x_ref, o_ref):
            o_ref[...] = join(x_ref[...]) + 1.0
        return kernel

    def call(join, x):
        return pl.pallas_call(body(join), out_shape=jax.ShapeDtypeStruct((64, 512), x.dtype),
                              interpret=True)(x)

    x = _zeros(64, 128)
    tiled = kernelsim.trace(lambda x: call(lambda v: jnp.tile(v, (1, 4)), x), x).calls[0]
    joined = kernelsim.trace(lambda x: call(lambda v: jnp.concatenate([v] * 4, 1), x), x)
    assert tiled.call.vector_vregs_per_step == joined.calls[0].call.vector_vregs_per_step == 32


def _column_kernel(widen):
    """A kernel that subtracts a (64, 1) running value, read from scratch (``load``) or made
    by a max along the lanes (``reduce``), from (64, 512) scores, widened by ``widen``."""
    def kernel(x_ref, o_ref, m_ref):
        s = x_ref[...]
        column = {"load": lambda: m_ref[...], "reduce": lambda: s.max(axis=1, keepdims=True),
                  "tile": lambda: jnp.tile(m_ref[...][:, :128], (1, 4))}[widen]()
        o_ref[...] = s - column
    return kernel


@pytest.mark.parametrize("widen, vregs", [("load", 8), ("reduce", 0), ("tile", 0)])
def test_a_column_read_from_scratch_is_broadcast_across_the_lanes(widen, vregs):
    """kernelsim counts the column vregs an operation spreads across the lanes (the TPU v5e
    measured that cost, bench/recorded/fa_probe-v5e.json): a (64, 1) float32 column from
    scratch is 8 vregs; the same from a max along the lanes is already in every lane, and
    ``jnp.tile`` of whole (64, 128) rows copies vregs."""
    def fn(x):
        return pl.pallas_call(_column_kernel(widen), out_shape=jax.ShapeDtypeStruct(x.shape,
                                                                                   x.dtype),
                              scratch_shapes=[pltpu.VMEM((64, 128 if widen == "tile" else 1),
                                                         jnp.float32)])(x)
    c = kernelsim.trace(fn, _zeros(64, 512)).calls[0]
    assert c.call.lane_broadcast_vregs_per_step == vregs
