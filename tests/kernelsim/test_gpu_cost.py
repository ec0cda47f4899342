"""The GPU time estimate: L2 reuse between programs in launch order, the rates it divides by
(TF32 for float32 matmuls, the sustained H200 figures), and the TPU figures left as they were."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from kernelsim.chips import get_chip
from kernelsim.cost.l2 import l2_hits, launch_rank


def _copy_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] + w_ref[0:8, :]


def _with_table(x, w):
    """Program i reads row block i of ``x`` and, like the course's grouped matmul, the whole
    of ``w`` (its block is the array)."""
    return pl.pallas_call(
        _copy_kernel, grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)),
                  pl.BlockSpec(w.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, w)


def test_whole_array_block_crosses_hbm_once_on_a_gpu():
    """Every program points at the same whole-array block: on a GPU the first read brings it
    into L2 and the programs running beside it find it there (the grouped matmul's estimate
    was 60x its measured time when each of its 1024 programs counted the whole array)."""
    x = jax.ShapeDtypeStruct((8 * 400, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    (c,) = kernelsim.trace(_with_table, x, w, model="gpu", chip="h200").calls
    w_cost = next(o for o in c.cost.operands if o.shape == (512, 128))
    assert w_cost.fetches == 400  # every program still loads it (from L2 or HBM) ...
    assert w_cost.hbm_read_bytes == 512 * 128 * 4  # ... and it crosses HBM once
    assert w_cost.l2_hit_bytes == 399 * 512 * 128 * 4 == c.cost.l2_hit_bytes
    assert c.hbm_read_bytes == (8 * 400 + 512) * 128 * 4
    # the TPU pipeline skips the unchanged block: once as well, as before
    (t,) = kernelsim.trace(_with_table, x, w, model="tpu", chip="tpu-v5e").calls
    assert t.hbm_read_bytes == c.hbm_read_bytes


def _panel_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _panels(x, grid, index_map):
    return pl.pallas_call(
        _panel_kernel, grid=grid,
        in_specs=[pl.BlockSpec((8, 128), index_map)],
        out_specs=pl.BlockSpec((None, None, 8, 128), lambda i, j: (i, j, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((*grid, 8, 128), x.dtype))(x)


def test_reuse_window_follows_the_launch_order():
    """Grid dimension 0 launches fastest: a block read by programs (0, j) and (1, j) is
    reused by neighbours; one read by (i, 0) and (i, 1), 200 programs apart in launch order
    (more than the H200's 132 SMs), is read twice."""
    block = 8 * 128 * 4
    x = jax.ShapeDtypeStruct((8 * 200, 128), jnp.float32)
    near = functools.partial(_panels, grid=(2, 200), index_map=lambda i, j: (j, 0))
    far = functools.partial(_panels, grid=(200, 2), index_map=lambda i, j: (i, 0))
    (c_near,) = kernelsim.trace(near, x, model="gpu", chip="h200").calls
    (c_far,) = kernelsim.trace(far, x, model="gpu", chip="h200").calls
    read = [o.hbm_read_bytes for o in c_near.cost.operands if o.role == "input"]
    assert read == [200 * block]
    read = [o.hbm_read_bytes for o in c_far.cost.operands if o.role == "input"]
    assert read == [400 * block]


def test_launch_rank_and_hits():
    assert launch_rank((2, 3)).tolist() == [0, 2, 4, 1, 3, 5]  # row-major steps, dim 0 first
    blocks = np.array([[0], [1], [0], [0]])
    rank = np.array([0, 1, 2, 5])
    assert l2_hits(blocks, rank, window=3).tolist() == [False, False, True, False]
    assert not l2_hits(blocks, rank, window=0).any()


def _matmul(a, b, b_k_major=False):
    """``a @ b``, one (128, 128) output block per program. b_k_major: ``b`` is given as Bᵀ,
    ``(N, K)``, and the kernel transposes its block, so both operands are K-major."""
    def kernel(a_ref, b_ref, o_ref):
        b = b_ref[...].T if b_k_major else b_ref[...]
        o_ref[...] = jnp.dot(a_ref[...], b, preferred_element_type=jnp.float32
                             ).astype(o_ref.dtype)

    n = a.shape[0]
    b_spec = (pl.BlockSpec((128, n), lambda i, j: (j, 0)) if b_k_major else
              pl.BlockSpec((n, 128), lambda i, j: (0, j)))
    return pl.pallas_call(
        kernel, grid=(n // 128, n // 128),
        in_specs=[pl.BlockSpec((128, n), lambda i, j: (i, 0)), b_spec],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, n), a.dtype))(a, b)


def _call(dtype, chip, b_k_major=False, model="gpu"):
    a = jax.ShapeDtypeStruct((1024, 1024), dtype)
    fn = functools.partial(_matmul, b_k_major=b_k_major)
    (c,) = kernelsim.trace(fn, a, a, model=model, chip=chip).calls
    assert c.flops == 2 * 1024 ** 3
    return c


def test_gpu_rates_tf32_and_sustained():
    """A float32 dot runs on the tensor cores as TF32 at JAX's default precision (an estimate
    at the 67 TF/s of the FP32 units was 3x slower than a measured Triton kernel); on the
    H200 the estimate divides by the measured sustained rates, scaled alike for TF32."""
    h200 = get_chip("h200")
    for dtype, rate in ((jnp.bfloat16, 790e12), (jnp.float32, 494.7e12 * 790 / 989)):
        c = _call(dtype, "h200", b_k_major=True)
        assert np.isclose(c.cost.compute_seconds, c.flops / rate)
        assert np.isclose(c.cost.memory_seconds, c.cost.hbm_bytes / 4.3e12)
    assert h200.flops_per_second(()) == h200.peak_flops_f32  # no matmul: the FP32 units
    assert get_chip("h100").flops_per_second(("float32",)) == 494.7e12  # nothing measured


def test_tf32_operand_not_k_major_runs_at_the_transposed_rate():
    """WGMMA reads TF32 operands from shared memory K-major only, so on a Hopper GPU Triton
    transposes a row-major B in registers and stops pipelining its load: the H200 record's
    float32 matmul with B row-major ran at 80 TFLOP/s, the same kernel fed Bᵀ at 217, and
    the estimate at TF32 for both was 4.9x the row-major time."""
    for chip in ("h200", "h100"):
        c = _call(jnp.float32, chip)
        assert np.isclose(c.cost.compute_seconds, c.flops / 80e12)
        assert c.cost.compute_seconds > 4 * _call(jnp.float32, chip, b_k_major=True
                                                  ).cost.compute_seconds
    # 16-bit WGMMA transposes in the instruction: a row-major bf16 B keeps the bf16 rate
    c = _call(jnp.bfloat16, "h200")
    assert np.isclose(c.cost.compute_seconds, c.flops / 790e12)
    # not modelled off Hopper: the A100 (mma.sync) and the TPUs keep their rates
    c = _call(jnp.float32, "a100")
    assert np.isclose(c.cost.compute_seconds, c.flops / 156e12)
    c = _call(jnp.float32, "tpu-v4", model="tpu")  # (v5e's rates are fitted: chips._FIT_V5E)
    assert np.isclose(c.cost.compute_seconds, c.flops / 275e12)


def _dot_kernel(form):
    def kernel(x_ref, y_ref, o_ref):
        x, y = x_ref[...], y_ref[...]
        if form == "x @ y":
            out = jnp.dot(x, y)
        elif form == "x @ y.T":
            out = jnp.dot(x, y.T)
        elif form == "x.T @ y":
            out = jnp.dot(x.T, y)
        elif form == "x @ y, HIGHEST":  # float32 products: the lowering asks for IEEE, not TF32
            out = jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)
        else:  # contract y's minor dimension directly
            out = jax.lax.dot_general(x, y, (((1,), (1,)), ((), ())))
        o_ref[...] = out

    return kernel


def test_k_major_follows_the_loaded_layout_through_transposes():
    """An operand is K-major when its contraction dimension is the minor one of the block it
    was loaded from; ``.T`` relabels dimensions and keeps the layout. Only a TF32 dot that is
    not K-major takes the transposed path."""
    x = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    h200 = get_chip("h200")
    for form, k_major, tf32 in (("x @ y", False, True), ("x @ y.T", True, True),
                                ("x.T @ y", False, True), ("dot_general", True, True),
                                ("x @ y, HIGHEST", False, False)):
        fn = functools.partial(pl.pallas_call, _dot_kernel(form),
                               out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32))
        (c,) = kernelsim.trace(lambda a, b, fn=fn: fn()(a, b), x, x, model="gpu",
                               chip="h200").calls
        (m,) = c.call.matmuls
        assert (m.k_major, m.tf32) == (k_major, tf32), form
        assert h200.transposes_in_registers(m) == (tf32 and not k_major), form


def test_tpu_rates_are_the_datasheet():
    for name in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"):
        chip = get_chip(name)
        assert chip.flops_per_second(("bfloat16",)) == chip.peak_flops_bf16
        assert chip.flops_per_second(("float32",)) == chip.peak_flops_f32
        assert chip.estimate_bytes_per_second == chip.hbm_bytes_per_second
        assert chip.sms == 0
    c = _call(jnp.bfloat16, "tpu-v4", model="tpu")  # v5e's time model is fitted on the chip
    assert np.isclose(c.cost.compute_seconds, 2 * 1024 ** 3 / 275e12)
