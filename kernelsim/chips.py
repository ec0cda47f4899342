"""Chip table for the roofline estimate. Every number carries its source.

Peaks are dense (no sparsity). TPU VMEM/SMEM are per TensorCore, as JAX's ``tpu_info.py`` encodes
them (the same values in jax 0.10.2 and 0.12.0.1). GPU "on-chip" is the shared memory one thread
block may use.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelsim.model import Matmul

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Chip:
    """One accelerator.

    peak_flops_bf16 / peak_flops_f32: FLOP/s of the matrix units for 16-bit / 32-bit inputs.
    hbm_bytes_per_second: HBM bandwidth, bytes/s.
    vmem_bytes / smem_bytes: on-chip capacity in bytes (GPU: shared memory per block; smem 0).
    per_step_seconds: fixed cost of one grid step of a sequential TPU pipeline, seconds.
    sources: where each number comes from.
    peak_flops_tf32: GPU only, FLOP/s of the tensor cores for float32 inputs at JAX's default
        precision (TF32; the Triton lowering of ``jnp.dot`` picks it for ``Precision.DEFAULT``);
        0 where a float32 matmul uses ``peak_flops_f32`` (TPU).
    sms: GPU only, streaming multiprocessors: the programs (thread blocks) resident at once
        are at least this many, which sets how far apart in launch order two programs may
        read the same block and still find it in L2 (``kernelsim.cost.estimate``); 0 on a TPU.
    sustained_flops_bf16 / sustained_hbm_bytes_per_second: what the chip was *measured* to
        sustain (a large cuBLAS product, a device-to-device copy), FLOP/s and bytes/s; the
        time estimate divides by these where known (0: by the datasheet peaks). The datasheet
        figures stay the peaks reported beside them.
    transposed_tf32_flops: GPU with WGMMA (sm_90) only, FLOP/s of a Triton (``pallas_call``)
        TF32 dot (float32 at JAX's default precision) with an operand that is not K-major
        (``kernelsim.model.Matmul``): WGMMA reads TF32 operands from shared memory K-major
        only (the PTX ISA's transpose bits are for .f16/.bf16), so Triton stores such an
        operand to shared memory K-major through a transpose in registers and does not
        pipeline its load. Calibrated from one recorded run (``_TRANSPOSED_TF32``); 0 where
        the rule is not modelled (TPUs, the A100).
    default_scoped_vmem_bytes: TPU only, Mosaic's default scoped VMEM limit: the VMEM a kernel
        may allocate without ``pltpu.CompilerParams(vmem_limit_bytes=...)``, bytes (its
        buffers, scratch and the body values Mosaic keeps, ``CallCost.mosaic_vmem_bytes``);
        0 where unknown. Each chip's source is in ``sources``.
    call_seconds, idle_step_seconds, mxu_efficiency, vector_vregs_per_second,
        lane_broadcast_seconds, dma_efficiency: TPU time model fitted on the chip
        (``_FIT_V5E``, on the device's time, not the host's dispatch): a fixed cost per call
        on the device (the pipeline's prologue and epilogue: the first blocks' DMA, the last
        write-back), seconds; the cost of a grid step the kernel
        skips (``per_step_seconds`` is then a working step's), seconds; the share of the
        matmul peak a kernel's dots reach; the rate of vector work, tile-padded vector
        registers produced per second (``KernelCall.vector_vregs_per_step``); the time of
        one column vreg broadcast across the lanes
        (``KernelCall.lane_broadcast_vregs_per_step``), seconds; the share of the HBM
        bandwidth the pipeline's DMAs reach. Defaults: no such terms (the plain roofline).
    int8_ops_per_second: TPU only, the matrix units' rate for int8 x int8 products, op/s, as
        JAX's ``tpu_info`` gives it (``int8_ops_per_second``); 0 where it has none (an int8
        matmul then runs at the bf16 peak).
    f32_high_passes / f32_highest_passes: TPU only, the bf16 passes of the matrix units a
        float32 matmul takes at ``Precision.HIGH`` / ``Precision.HIGHEST`` (Mosaic splits each
        float32 operand into bf16 parts; at DEFAULT it takes one pass, each operand rounded
        to bf16); 0: not modelled (such a matmul runs at ``peak_flops_f32``).
    """

    name: str
    kind: str  # "tpu" or "gpu"
    peak_flops_bf16: float
    peak_flops_f32: float
    hbm_bytes_per_second: float
    vmem_bytes: int
    smem_bytes: int
    per_step_seconds: float
    sources: tuple[str, ...]
    default_scoped_vmem_bytes: int = 0
    peak_flops_tf32: float = 0.0
    sms: int = 0
    sustained_flops_bf16: float = 0.0
    sustained_hbm_bytes_per_second: float = 0.0
    transposed_tf32_flops: float = 0.0
    call_seconds: float = 0.0
    idle_step_seconds: float = 0.0
    mxu_efficiency: float = 1.0
    vector_vregs_per_second: float = 0.0
    lane_broadcast_seconds: float = 0.0
    dma_efficiency: float = 1.0
    int8_ops_per_second: float = 0.0
    f32_high_passes: float = 0.0
    f32_highest_passes: float = 0.0

    @property
    def tpu_time_model(self) -> bool:
        """The chip has a TPU time model fitted on it (``vector_vregs_per_second`` set): the
        estimate adds the per-call cost, the vector work and skipped steps
        (``kernelsim.cost.estimate.compute``); otherwise it is the plain roofline plus per-step
        cost."""
        return self.vector_vregs_per_second > 0

    def flops_per_second(self, matmul_dtypes: tuple[str, ...]) -> float:
        """FLOP/s the time estimate assumes for a kernel whose matmuls take ``matmul_dtypes``:
        16-bit or narrower inputs run at the bf16 peak; float32 inputs at TF32 on a GPU that
        has it (JAX's default precision), else at ``peak_flops_f32``, which is also the rate
        of a kernel without a matmul. A matmul rate is scaled to the sustained bf16 rate
        where one was measured (the same tensor cores at the same clock run both types)."""
        if not matmul_dtypes:
            return self.peak_flops_f32
        narrow = all(d in ("bfloat16", "float16") or "float8" in d for d in matmul_dtypes)
        peak = self.peak_flops_bf16 if narrow else (self.peak_flops_tf32 or self.peak_flops_f32)
        if self.sustained_flops_bf16:
            peak *= self.sustained_flops_bf16 / self.peak_flops_bf16
        return peak

    def matmul_flops_per_second(self, matmul: Matmul) -> float:
        """FLOP/s the time estimate assumes for one ``matmul``. On a TPU it follows the dtype
        and precision: int8 inputs at ``int8_ops_per_second`` where known; float32 inputs at
        the bf16 peak divided by the passes their precision takes (one at DEFAULT,
        ``f32_high_passes`` / ``f32_highest_passes`` where modelled); others at the bf16 peak.
        On a GPU, ``flops_per_second`` of its dtype."""
        if self.kind != "tpu":
            return self.flops_per_second((matmul.dtype,))
        if matmul.dtype in ("int8", "uint8") and self.int8_ops_per_second:
            return self.int8_ops_per_second
        if matmul.dtype != "float32":
            return self.peak_flops_bf16
        if matmul.precision == "DEFAULT":
            return self.peak_flops_bf16
        passes = (self.f32_highest_passes if matmul.precision == "HIGHEST"
                  else self.f32_high_passes)
        return self.peak_flops_bf16 / passes if passes else self.peak_flops_f32

    def transposes_in_registers(self, matmul: Matmul) -> bool:
        """A Triton (``pallas_call``) ``matmul`` on this chip takes the slow path of
        ``transposed_tf32_flops``: TF32 inputs (float32 at JAX's default precision), an operand
        that is not K-major, and a chip with that rule."""
        return bool(self.transposed_tf32_flops) and matmul.tf32 and not matmul.k_major

    @property
    def estimate_bytes_per_second(self) -> float:
        """HBM bandwidth the time estimate assumes, bytes/s (sustained where measured)."""
        return self.sustained_hbm_bytes_per_second or self.hbm_bytes_per_second

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which a bf16 kernel is compute-bound."""
        return self.peak_flops_bf16 / self.hbm_bytes_per_second


_GCLOUD = "Google Cloud TPU system architecture pages (docs.cloud.google.com/tpu/docs/{})"
_TPU_INFO = ("jax 0.12.0.1 jax/_src/tpu_info.py (VMEM/SMEM per TensorCore; in 0.10.2 the table "
             "was jax/_src/pallas/mosaic/tpu_info.py, now a re-export, with the same values)")
_STEP = ("per-step cost 0.27 us: derived from the JAX TPU matmul guide's v5e 128-block table "
         "(0.35 us/step measured vs 0.08 us roofline); assumed for other TPUs")
_F32_TPU = ("f32 peak: the JAX TPU matmul guide quotes one figure for bf16/f32 on v5e; f32 at "
            "HIGHEST precision is multi-pass bf16, so this is an upper bound")
_GPU_STEP = "GPU programs run concurrently: no per-step serial cost is modelled"
_TF32 = "TF32 494.7 TF dense: NVIDIA H100 SXM datasheet (the H200 has the H100's tensor cores)"
_SMS = "132 SMs: H100 SXM datasheet; PyTorch on the H200s lent here reported 132 multiprocessors"
_SUSTAINED = ("sustained 790 TF bf16, 4.3 TB/s: measured on the H200s lent here "
              "(/work/.library/device/KINDS.md, 2026-10-28 and 2026-11-04: an 8192^3 bf16 "
              "PyTorch product at 769-798 TF on random data, SM clock 1980 MHz; a "
              "device-to-device copy at ~4.3 TB/s counting reads and writes)")
_TRANSPOSED_TF32 = (
    "float32 dot with an operand not K-major on sm_90: 80 TF, calibrated from "
    "bench/recorded/gpu_perf-h200.json, row matmul_f32 / matmul_triton (B row-major) bm=bn=128 "
    "bk=32 num_warps=4 num_stages=4: 1.722 ms at 4096^3 = 79.8 TF (H200; the H100 has the same "
    "SM and is assumed alike). The rule: PTX ISA 9.7.15.5.2 wgmma.mma_async (tf32 takes no "
    "imm-trans-a/b; 'The transpose operation is only supported for ... .f16/.bf16 types'); "
    "Triton lib/Dialect/TritonGPU/Transforms/AccelerateMatmul.cpp (BlockedToMMA: MMAv3 "
    "allowTranspose only for f16/bf16; getSharedMemoryMMAOperand forces K-major shared order "
    "and warns 'Registers will be transposed before SMEM store and the pipelined load for this "
    "operand will be disabled')")
_SCOPED_V5E = ("default scoped VMEM 16 MiB: measured on a TPU v5e (jax 0.10.2, libtpu 0.0.42.1, "
               "2026-12-05, /work/shared/notes/tpu-v5e.md): Mosaic's CompileTimeScopedVmemOom "
               "says 'limit 16.00M' for lesson 7's matmul with blocks (1024, 1024, 1024)")
_FIT_V5E = ("time model fitted on the TPU v5e's device time (kernelsim.timing.device_time: calls "
            "inside one jitted loop): bench/recorded/tpu_perf_model-v5e.json (jax 0.10.2, "
            "libtpu 0.0.42.1, 2026-12-07), on its 39 rows marked fitted (lesson 7's matmul at "
            "n = 4096 and 8192, lesson 8's flash attention and its variant with tiled "
            "statistics, elementwise add and row sum), minimising the worst |log(measured / "
            "estimated)| (bench/tpu_perf.py --fit; within 0.90-1.11): per call 8.2 us, per "
            "working step 0.223 us, per skipped step 0.165 us, matmuls at 0.982 of the peak, "
            "vector work at 3.57e9 vregs/s overlapping the matmuls, 7.04 ns per column vreg "
            "broadcast across the lanes on top, DMAs at 0.990 of the HBM bandwidth, reads and "
            "writes at once; held out: the matmuls at n = 2048, JAX's bundled flash attention "
            "and seven families the fit never saw (softmax, layer norm, a fused elementwise "
            "op, a transpose, float32 and int8 matmuls, a batched matmul, a gather)")
_INT8 = ("int8 rate: jax 0.12.0.1 jax/_src/tpu_info.py int8_ops_per_second (v5e 3.94e14, v5p "
         "9.18e14 per chip, v6e 1.84e15; v4 'Not Available')")
_F32_PASSES = ("float32 matmul passes: one bf16 pass at DEFAULT (a TPU v5e's float32 dot at "
               "DEFAULT was measured with bf16 rounding error, /work/shared/notes/tpu-v5e.md); "
               "3 at HIGH and 6 at HIGHEST, the bf16_3x / bf16_6x splits of JAX's "
               "DotAlgorithmPreset names (BF16_BF16_F32_X3 / _X6); assumed where not fitted")
_SCOPED_PRE_V6 = ("default scoped VMEM 16 MiB: assumed as measured on v5e (a chip before v6, like "
                  "it); consistent with JAX's test_automatic_single_buffering "
                  "(tests/pallas/tpu_pallas_test.py, jax 0.12.0.1), where before TPU v6 one 10 "
                  "MiB window compiles and two do not")
_SCOPED_V6E = ("default scoped VMEM 32 MiB: JAX's test_automatic_single_buffering "
               "(tests/pallas/tpu_pallas_test.py, jax 0.12.0.1) compiles one 20 MiB window and "
               "not two from TPU v6 on, so the limit lies in [20, 40) MiB; Mosaic's "
               "CompileTimeScopedVmemOom on v6e reports 'limit 32.00M' (public reports of the "
               "error; not measured here)")

CHIPS: dict[str, Chip] = {
    "tpu-v4": Chip("tpu-v4", "tpu", 275e12, 275e12, 1200e9, 16 * MiB, 1 * MiB, 0.27e-6,
                   (_GCLOUD.format("v4"), _TPU_INFO, _STEP, _F32_TPU, _SCOPED_PRE_V6,
                    _F32_PASSES),
                   default_scoped_vmem_bytes=16 * MiB, f32_high_passes=3, f32_highest_passes=6),
    "tpu-v5e": Chip("tpu-v5e", "tpu", 197e12, 197e12, 819e9, 128 * MiB, 1 * MiB, 0.2233e-6,
                    (_GCLOUD.format("v5e"), _TPU_INFO, _FIT_V5E, _F32_TPU, _SCOPED_V5E, _INT8,
                     _F32_PASSES),
                    default_scoped_vmem_bytes=16 * MiB, call_seconds=8.234e-6,
                    idle_step_seconds=0.1654e-6, mxu_efficiency=0.9819,
                    vector_vregs_per_second=3.575e9, lane_broadcast_seconds=7.043e-9,
                    dma_efficiency=0.9901, int8_ops_per_second=394e12, f32_high_passes=3,
                    f32_highest_passes=6),
    "tpu-v5p": Chip("tpu-v5p", "tpu", 459e12, 459e12, 2765e9, 64 * MiB, 1 * MiB, 0.27e-6,
                    (_GCLOUD.format("v5p"), _TPU_INFO, _STEP, _F32_TPU, _SCOPED_PRE_V6, _INT8,
                     _F32_PASSES),
                    default_scoped_vmem_bytes=16 * MiB, int8_ops_per_second=918e12,
                    f32_high_passes=3, f32_highest_passes=6),
    "tpu-v6e": Chip("tpu-v6e", "tpu", 918e12, 918e12, 1638e9, 128 * MiB, 1 * MiB, 0.27e-6,
                    (_GCLOUD.format("v6e"), _TPU_INFO, _STEP, _F32_TPU, _SCOPED_V6E, _INT8,
                     _F32_PASSES),
                    default_scoped_vmem_bytes=32 * MiB, int8_ops_per_second=1.84e15,
                    f32_high_passes=3, f32_highest_passes=6),
    "a100": Chip("a100", "gpu", 312e12, 19.5e12, 2039e9, 164 * KiB, 0, 0.0,
                 ("NVIDIA A100 datasheet (SXM 80GB): 312 TF bf16, 19.5 TF FP32, 156 TF TF32 "
                  "dense, 2039 GB/s, 108 SMs",
                  "NVIDIA Ampere tuning guide: up to 164 KB shared memory per SM", _GPU_STEP),
                 peak_flops_tf32=156e12, sms=108),
    "h100": Chip("h100", "gpu", 989e12, 67e12, 3.35e12, 227 * KiB, 0, 0.0,
                 ("NVIDIA H100 SXM datasheet: 989 TF bf16 dense, 67 TF FP32, 3.35 TB/s",
                  "Mosaic GPU core.py: 227 KiB shared memory per block", _GPU_STEP, _TF32,
                  _SMS, _TRANSPOSED_TF32), peak_flops_tf32=494.7e12, sms=132,
                 transposed_tf32_flops=80e12),
    "h200": Chip("h200", "gpu", 989e12, 67e12, 4.8e12, 227 * KiB, 0, 0.0,
                 ("NVIDIA H200 SXM datasheet: same die as H100, 4.8 TB/s HBM3e",
                  "Mosaic GPU core.py: 227 KiB shared memory per block", _GPU_STEP, _TF32,
                  _SMS, _SUSTAINED, _TRANSPOSED_TF32), peak_flops_tf32=494.7e12, sms=132,
                 sustained_flops_bf16=790e12, sustained_hbm_bytes_per_second=4.3e12,
                 transposed_tf32_flops=80e12),
}


# each pipeline model's chip when none is named
DEFAULT_CHIP = {"tpu": "tpu-v5e", "gpu": "h100"}


def get_chip(name: str) -> Chip:
    """The chip called ``name``; raises KeyError listing the known names."""
    try:
        return CHIPS[name]
    except KeyError:
        raise KeyError(f"unknown chip {name!r}; known: {', '.join(CHIPS)}") from None


# The device kind JAX reports for each TPU (jax/_src/tpu_info.py, chip_version_from_device_kind):
# what kernelsim.tpu_lowering_error lowers for, and the TPU a traced function is told it targets
# (the default for GPU chips is v5e).
TPU_DEVICE_KIND = {"tpu-v4": "TPU v4", "tpu-v5e": "TPU v5e", "tpu-v5p": "TPU v5p",
                   "tpu-v6e": "TPU v6e"}
# The device kind CUDA reports for each GPU (what kernelsim.gpu_lowering_error lowers for; the
# Triton lowering of pallas_call reads no chip detail from it today).
GPU_DEVICE_KIND = {"a100": "NVIDIA A100-SXM4-80GB", "h100": "NVIDIA H100 80GB HBM3",
                   "h200": "NVIDIA H200"}
