"""kernelsim's Mosaic GPU model (kernelsim.gpu): one CTA's TMA copies, barrier waits and WGMMAs,
and a shared-memory footprint equal to what JAX's Mosaic GPU lowering allocates -- read from the
lowering itself (its limit set to 0 B, it names the bytes it needs), on the course's kernels and
on every bundled Mosaic GPU op the lowering accepts on a CPU. Left out, as they do not lower
here: attention_mgpu (asserts a CUDA runtime version), transposed_ragged_dot_mgpu (reads
``jax.devices()[0].core_count``), the Blackwell and collective ops (sm_100 instructions; several
devices); the Triton ops (``pallas_call``) allocate no shared memory in the lowering at all
(see test_gpu_rules.py)."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12):
    pytest.skip("plgpu.kernel binds mpmd_map from jax 0.12", allow_module_level=True)
pytest.importorskip("absl", reason="JAX's bundled Mosaic GPU ops import jax's test_util")

from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.mosaic.gpu import core as mgpu_core  # noqa: E402
from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: E402

from kernelsim import adapter, gpu  # noqa: E402
from kernelsim.mosaic_gpu.kernel_data import WgmmaOperand  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_kernels as gk  # noqa: E402

S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16


def lowering_smem_bytes(fn, *shapes) -> int:
    """The shared memory the Mosaic GPU lowering allocates for ``fn``'s kernel, in bytes."""
    with mgpu_core.artificial_shared_memory_limit(0), pytest.raises(ValueError) as err:
        jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    return int(re.search(r"smem_bytes=(\d+)", str(err.value)).group(1))


def gpu_mesh(num_cores=132):
    """An abstract H100-like device: what the bundled matmul asks for its SM count."""
    return adapter.on_abstract_gpu("NVIDIA H100 80GB HBM3", num_cores)


MM = S((512, 512), BF16)
QKV = (S((1, 512, 2, 128), BF16),) * 3


def _ragged(lhs, rhs, sizes):
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

    return ragged_dot_mgpu.ragged_dot(lhs, rhs, group_sizes=sizes, block_m=64, block_n=128,
                                      block_k=64, max_concurrent_steps=2, grid_block_n=2)


def _hopper_matmul(a, b):
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    with gpu_mesh():
        return hm.matmul(a, b, None, hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64,
                                                     max_concurrent_steps=4))


CASES = {
    "course matmul_mgpu": (functools.partial(gk.matmul_mgpu, tm=128, tn=128, tk=64, stages=3),
                           (MM, MM)),
    "course matmul_mgpu_ws": (functools.partial(gk.matmul_mgpu_ws, tm=128, tn=128, tk=64,
                                                stages=3), (MM, MM)),
    "course flash_mgpu": (functools.partial(gk.flash_mgpu, bq=64, bk=64, stages=2), QKV),
    "course flash_mgpu, P in SMEM": (functools.partial(gk.flash_mgpu, bq=64, bk=64, stages=2,
                                                       p_in_smem=True), QKV),
    "bundled ragged_dot_mgpu": (_ragged, (MM, S((4, 512, 512), BF16), S((4,), jnp.int32))),
    "bundled hopper_matmul_mgpu": (_hopper_matmul, (MM, MM)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_shared_memory_equals_the_lowerings_allocation(name):
    fn, shapes = CASES[name]
    (kernel,) = gpu.analyse(fn, *shapes, chip="h200")
    assert kernel.smem_bytes == lowering_smem_bytes(fn, *shapes)
    assert not kernel.warnings


def test_matmul_events_per_pipeline_step():
    """The one-warpgroup matmul: per K step one TMA copy of A's and of B's tile onto one
    barrier, a wait on it, a WGMMA; the output leaves by one TMA store."""
    tm = tn = 128
    tk, stages, k_steps = 64, 3, 512 // 64
    fn = functools.partial(gk.matmul_mgpu, tm=tm, tn=tn, tk=tk, stages=stages)
    (kernel,) = gpu.analyse(fn, MM, MM, chip="h200")
    assert kernel.grid == (4, 4) and kernel.num_threads == 1
    loads = [e for e in kernel.events if e.kind == "tma_load"]
    assert len(loads) == 2 * k_steps and {e.src for e in loads} == {"in0", "in1"}
    assert all(e.bytes == tm * tk * 2 for e in loads)  # (128, 64) and (64, 128) bf16 tiles
    assert len({e.barrier for e in loads}) == 1 and loads[0].barrier.startswith("barrier")
    assert kernel.count("barrier_wait") == kernel.count("wgmma") == k_steps
    # the pipeline's prologue fills `stages` slots before the first wait
    first_wait = next(e.order for e in kernel.events if e.kind == "barrier_wait")
    assert sum(e.kind == "tma_load" and e.order < first_wait for e in kernel.events) == 2 * stages
    assert [e.kind for e in kernel.events[-3:]] == ["commit_smem", "tma_store",
                                                   "wait_tma_store"]
    assert kernel.flops == 2 * 512 ** 3
    # the 16 CTAs are one wave on an H200 (132 SMs): each A row panel and B column panel
    # crosses HBM once, the other CTAs of its row or column find it in L2
    assert kernel.gmem_read_bytes == 2 * 512 * 512 * 2
    assert kernel.gmem_write_bytes == 512 * 512 * 2
    d = kernel.to_dict()
    assert [s["name"] for s in d["memory_spaces"]] == ["global memory", "shared memory",
                                                       "registers"]
    assert {a["space"] for a in d["allocations"]} >= {"smem", "barrier", "regs"}


def test_wgmma_events_say_how_they_read_their_operands_and_what_they_add_onto():
    """Each WGMMA of the pipelined matmul reads A and B swizzled by 128 bytes and tiled (8, 64)
    (bfloat16 rows of tk = 64), neither transposed, and adds onto the accumulator the K loop
    keeps: the i-th is its i-th since it was allocated."""
    fn = functools.partial(gk.matmul_mgpu, tm=128, tn=128, tk=64, stages=3)
    (kernel,) = gpu.analyse(fn, MM, MM)
    wgmmas = [e for e in kernel.events if e.kind == "wgmma"]
    assert [e.accumulation for e in wgmmas] == list(range(1, 512 // 64 + 1))
    assert {e.operands for e in wgmmas} == {(
        WgmmaOperand("a", False, 128, (8, 64), False, 2),
        WgmmaOperand("b", False, 128, (8, 64), False, 2))}


def test_an_accumulator_allocated_in_the_k_loop_starts_again_at_every_step():
    """A ``run_scoped`` of the accumulator inside the loop: every WGMMA is the first onto it."""
    def restarts(a, b):
        @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((64, 64), a.dtype))
        def kernel(a_gmem, b_gmem, o_gmem):
            def step(_, a_smem, b_smem):
                def one(acc):
                    plgpu.wgmma(acc, a_smem.T, b_smem)
                    o_gmem[...] = acc[...].astype(o_gmem.dtype)

                pl.run_scoped(one, plgpu.ACC((64, 64), jnp.float32))

            plgpu.emit_pipeline(
                step, grid=(4,), in_specs=[plgpu.BlockSpec((64, 64), lambda k: (k, 0)),
                                           plgpu.BlockSpec((64, 64), lambda k: (k, 0))],
            )(a_gmem, b_gmem)

        return kernel(a, b)

    x = jax.ShapeDtypeStruct((256, 64), jnp.bfloat16)
    (kernel,) = gpu.analyse(restarts, x, x)
    wgmmas = [e for e in kernel.events if e.kind == "wgmma"]
    assert [e.accumulation for e in wgmmas] == [1, 1, 1, 1]
    # no transforms: neither swizzled nor tiled, and a read transposed
    assert {e.operands for e in wgmmas} == {(WgmmaOperand("a", False, 0, (), True, 2),
                                             WgmmaOperand("b", False, 0, (), False, 2))}


def test_hbm_reads_count_one_wave_of_ctas_sharing_l2():
    """256 CTAs on the H200's 132 SMs: per wave (launched in row-major grid order, the last
    axis fastest) each A row panel and B column panel the wave touches crosses HBM once; the
    rest are L2 hits. A's reads do not depend on n, B's not on m: on the (32, 8) grid a wave
    of 132 CTAs covers 17 values of m and all 8 of n (launched axis 0 first it would cover
    all 32 of m and 5 of n)."""
    t, k = 64, 1024
    fn = functools.partial(gk.matmul_mgpu, tm=t, tn=t, tk=t, stages=2)
    args = S((32 * t, k), BF16), S((k, 8 * t), BF16)
    (kernel,) = gpu.analyse(fn, *args, chip="h200")
    assert kernel.grid == (32, 8)
    panel = t * k * 2  # one CTA's A (or B) reads over the K loop, bytes
    per_cta = kernel.count("tma_load") * t * t * 2
    assert per_cta == 2 * panel
    assert kernel.gmem_read_bytes == round(256 * (17 + 8) * panel / 132)
    assert kernel.gmem_load_bytes == 256 * per_cta  # every copy, L2 hits included
    # a chip table without an SM count: every CTA's reads from HBM
    (flat,) = gpu.analyse(fn, *args, chip="tpu-v5e")
    assert flat.gmem_read_bytes == 256 * per_cta


def test_warp_specialized_matmul_splits_copies_and_math():
    """Warpgroup 2 issues every TMA copy; warpgroups 0 and 1 wait and multiply."""
    fn = functools.partial(gk.matmul_mgpu_ws, tm=128, tn=128, tk=64, stages=3)
    (kernel,) = gpu.analyse(fn, MM, MM, chip="h200")
    by_wg = {w: {e.kind for e in kernel.events if e.warpgroup == w} for w in range(3)}
    assert "tma_load" in by_wg[2] and "wgmma" not in by_wg[2]
    assert {"wgmma", "barrier_wait"} <= by_wg[0] and "tma_load" not in by_wg[0]


def test_over_the_limit_is_a_warning():
    fn = functools.partial(gk.matmul_mgpu, tm=128, tn=256, tk=64, stages=4)
    (kernel,) = gpu.analyse(fn, S((1024, 1024), BF16), S((1024, 1024), BF16), chip="h200")
    assert kernel.smem_bytes > 227 * 1024 and "exceeds" in kernel.warnings[0]


def test_a_refill_racing_an_in_flight_wgmma_is_a_warning():
    """The race the first H200 run found (wrong values from the 128x128 pipelined matmul): after
    wgmma_wait(1) the step's WGMMA may still read its slot, which the pipeline refills at once
    unless the BlockSpecs delay the release by a step. GPU interpret mode runs WGMMA
    synchronously and cannot show it; kernelsim follows the slots and says so."""
    racing = functools.partial(gk.matmul_mgpu, tm=128, tn=128, tk=64, stages=3,
                               delay_release=0)
    (kernel,) = gpu.analyse(racing, MM, MM, chip="h200")
    assert "refills" in kernel.warnings[0] and "delay_release=1" in kernel.warnings[0]
    assert "loop 1 step 0" in kernel.warnings[0]  # the first refill of the steady state
    refills = 2 * (512 // 64 - 3)  # A and B, every step that refills a slot
    assert kernel.warnings[1] == f"... and {refills - 1} more such refills"
    fixed = functools.partial(gk.matmul_mgpu, tm=128, tn=128, tk=64, stages=3)
    assert not gpu.analyse(fixed, MM, MM, chip="h200")[0].warnings
