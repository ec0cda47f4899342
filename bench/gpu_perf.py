"""The course's GPU kernels at production sizes against XLA, on an H200 (or any GPU).

Per kernel and block configuration (a small sweep): compiled, checked against plain JAX at run
time, timed; the XLA path it competes with (cuBLAS through ``jnp.dot``, cuDNN through
``jax.nn.dot_product_attention(implementation="cudnn")``, XLA's own ``jnp.sum`` and
``lax.ragged_dot``) timed the same way. Reports achieved TFLOP/s or GB/s, the fraction of the
chip's peak (datasheet and measured ceilings, below), the ratio to XLA, and kernelsim's
roofline estimate (``kernelsim.trace(..., model="gpu", chip="h200")``; for Mosaic GPU kernels
``kernelsim.gpu.analyse``, which also gives their shared memory) beside the measured time,
with the calibration factor measured / estimated that closes the gap. JAX's bundled Mosaic GPU
ops (``jax.experimental.pallas.ops.gpu``) run beside the course's kernels as the
reference of what Mosaic GPU reaches.

Every kernel fails softly: a compile or check error is recorded in its row and the run goes
on. The whole run keeps within a time budget (``--budget``, seconds; later configurations are
skipped, and say so, once it is spent).

``--dry-run``: tiny sizes on any machine (a CPU is enough): Triton kernels in interpret mode,
Mosaic GPU kernels in GPU interpret mode, each checked against plain JAX, and every kernel
also *lowered* for CUDA at its production size (JAX's real lowering, nothing executes), so a
configuration the lowering refuses (shared memory over the 227 KiB limit, say) shows before a
GPU is lent.

``--reestimate RECORD``: no GPU needed. Recomputes kernelsim's estimate of every kernel row of
a recorded run (``RECORD``, a JSON this script wrote on a GPU) from the current model, at the
production sizes (kernelsim traces shapes, nothing runs), and writes the record back (or to
``--out``) with each row's new figures under ``kernelsim_reestimated`` beside the original
``kernelsim``, the summary's under ``kernelsim_reestimated_s`` / ``calibration_reestimated``,
and a top-level ``reestimated`` saying when and by which model (the git commit of the tree).
Measured seconds are kept as recorded.

Usage: python bench/gpu_perf.py [--dry-run] [--out PATH] [--budget SECONDS] [--only NAME ...]
       python bench/gpu_perf.py --reestimate RECORD [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_kernels as gk  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kernelsim  # noqa: E402
from kernelsim.chips import get_chip  # noqa: E402

CHIP = "h200"
# Ceilings, all from kernelsim's H200 entry (kernelsim/chips.py, sources there). Datasheet:
# 989 TFLOP/s bf16, 4.8 TB/s. Measured on the H200s lent here: an 8192³ bf16 product through
# PyTorch at 769-798 TFLOP/s on random data, a device-to-device copy at ~4.3 TB/s (kernelsim's
# estimate divides by these). TF32 (float32 inputs at JAX's default precision on a GPU):
# 494.7 TFLOP/s dense, the H100 SXM datasheet (the H200 has the H100's tensor cores).
MEASURED_BF16_FLOPS = get_chip(CHIP).sustained_flops_bf16
MEASURED_HBM_BYTES_PER_S = get_chip(CHIP).sustained_hbm_bytes_per_second
TF32_FLOPS = get_chip(CHIP).peak_flops_tf32


@dataclass
class Case:
    """One kernel at one configuration, and the XLA computation it competes with."""

    family: str  # matmul_bf16, matmul_f32, attention_4k, ... (one XLA baseline per family)
    name: str  # kernel name
    backend: str  # "triton", "mosaic_gpu" or "xla"
    config: dict[str, Any]
    build: Callable[..., Any]  # (*args, interpret) -> output
    traced: bool = True  # kernelsim models it (a pallas_call, or a plgpu.kernel)
    bundled: bool = False  # one of JAX's bundled ops, not the course's
    lowers_in_dry_run: bool = True


@dataclass
class Family:
    """A problem: inputs at production and dry-run sizes, reference, work and tolerance."""

    name: str
    make_inputs: Callable[[bool], tuple]  # dry -> args
    reference: Callable[..., Any]
    flops: Callable[..., float]
    bytes: Callable[..., float]
    bound: str  # "compute" or "memory"
    tolerance: float
    peak: str  # "bf16", "tf32" or "hbm"
    cases: list[Case] = field(default_factory=list)


def _rand(i, shape, dtype):
    return jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(dtype)


def _relative_error(out, ref) -> float:
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


# ---------------------------------------------------------------------------------------------
# The problems


def _matmul_family(dtype, label):
    def inputs(dry):
        n = 256 if dry else 4096
        return _rand(1, (n, n), dtype), _rand(2, (n, n), dtype)

    def reference(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)

    fam = Family(f"matmul_{label}", inputs, reference,
                 lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1],
                 lambda a, b: (a.size + b.size + a.shape[0] * b.shape[1]) * a.dtype.itemsize,
                 "compute", 2e-2, "bf16" if dtype == jnp.bfloat16 else "tf32")
    fam.cases.append(Case(fam.name, "jnp.dot", "xla", {}, lambda a, b, interpret: jnp.dot(a, b),
                          traced=False))
    for bm, bn, bk, warps, stages, group in [(128, 128, 64, 4, 3, 8), (128, 256, 64, 8, 3, 8),
                                             (256, 128, 64, 8, 3, 8), (128, 128, 32, 4, 4, 8)]:
        if dtype == jnp.float32 and bn * bm > 128 * 128:
            continue  # f32 tiles twice the bytes: the big ones spill
        cfg = dict(bm=bm, bn=bn, bk=bk, num_warps=warps, num_stages=stages, group=group)
        fam.cases.append(Case(fam.name, "matmul_triton", "triton", cfg,
                              functools.partial(_dry_blocks(gk.matmul_triton), **cfg)))
    if dtype == jnp.float32:  # the first H200 run: 70-80 TFLOP/s with B row-major
        for bk, stages in [(32, 3), (64, 3)]:
            cfg = dict(bm=128, bn=128, bk=bk, num_warps=4, num_stages=stages, group=8)
            fam.cases.append(Case(fam.name, "matmul_triton, B K-major (transpose timed)",
                                  "triton", cfg, functools.partial(_k_major_b, **cfg)))
    if dtype == jnp.bfloat16:  # tf32 WGMMA needs B K-major ("Only f16 WGMMA supports transposes")
        for tm, tn, tk, stages in [(128, 128, 64, 4), (128, 128, 64, 5), (64, 256, 64, 4)]:
            cfg = dict(tm=tm, tn=tn, tk=tk, stages=stages)
            fam.cases.append(Case(fam.name, "matmul_mgpu", "mosaic_gpu", cfg,
                                  functools.partial(_dry_blocks(gk.matmul_mgpu), **cfg)))
        cfg = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4)
        fam.cases.append(Case(fam.name, "hopper_matmul_mgpu (JAX bundled)", "mosaic_gpu", cfg,
                              functools.partial(_bundled_matmul, **cfg), bundled=True,
                              lowers_in_dry_run=False))
    return fam


def _attention_family(seq):
    def inputs(dry):
        shape = (1, 256, 2, 64) if dry else (1, seq, 16, 128)  # (batch, seq, heads, head_dim)
        return tuple(_rand(i, shape, jnp.bfloat16) for i in (3, 4, 5))

    fam = Family(f"attention_{seq // 1024}k", inputs, gk.attention_reference,
                 lambda q, k, v: 4 * q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1]
                 * q.shape[3],
                 lambda q, k, v: (2 * q.size + k.size + v.size) * q.dtype.itemsize,
                 "compute", 2e-2, "bf16")
    fam.cases.append(Case(fam.name, "dot_product_attention (cudnn)", "xla", {}, _cudnn_attention,
                          traced=False))
    for bq, bk, warps, stages in [(128, 64, 4, 2), (128, 128, 8, 2), (64, 64, 4, 3)]:
        cfg = dict(bq=bq, bk=bk, num_warps=warps, num_stages=stages)
        fam.cases.append(Case(fam.name, "flash_triton", "triton", cfg,
                              functools.partial(_dry_blocks(gk.flash_triton), **cfg)))
    for bq, bk, stages in [(64, 64, 2), (64, 128, 2), (64, 64, 3)]:
        cfg = dict(bq=bq, bk=bk, stages=stages)
        fam.cases.append(Case(fam.name, "flash_mgpu", "mosaic_gpu", cfg,
                              functools.partial(_dry_blocks(gk.flash_mgpu), **cfg)))
    cfg = dict(block_q=64, block_kv=128, max_concurrent_steps=2)
    fam.cases.append(Case(fam.name, "attention_mgpu (JAX bundled)", "mosaic_gpu", cfg,
                          functools.partial(_bundled_attention, **cfg), bundled=True,
                          lowers_in_dry_run=False))
    return fam


def _row_sums_family():
    def inputs(dry):
        return (_rand(6, (64, 512) if dry else (32768, 16384), jnp.float32),)

    fam = Family("row_sums_f32", inputs, lambda x: jnp.sum(x, axis=1),
                 lambda x: x.size, lambda x: (x.size + x.shape[0]) * x.dtype.itemsize,
                 "memory", 1e-4, "hbm")
    fam.cases.append(Case(fam.name, "jnp.sum", "xla", {},
                          lambda x, interpret: jnp.sum(x, axis=1), traced=False))
    for bm, bn, warps, stages in [(16, 1024, 4, 3), (32, 512, 4, 3), (8, 2048, 8, 2)]:
        cfg = dict(bm=bm, bn=bn, num_warps=warps, num_stages=stages)
        fam.cases.append(Case(fam.name, "row_sums_triton", "triton", cfg,
                              functools.partial(_dry_blocks(gk.row_sums_triton), **cfg)))
    return fam


GROUP_SIZES = (1024, 3072, 512, 2560, 2048, 3584, 1536, 2048)  # multiples of 512, sum 16384


def _grouped_family():
    def inputs(dry):
        sizes = (64, 0, 128, 64) if dry else GROUP_SIZES
        m, k, n = (256, 128, 128) if dry else (sum(sizes), 4096, 2048)
        return (_rand(7, (m, k), jnp.bfloat16), _rand(8, (len(sizes), k, n), jnp.bfloat16),
                jnp.asarray(sizes, jnp.int32))

    def reference(lhs, rhs, sizes):
        return jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32
                                  ).astype(lhs.dtype)

    fam = Family("grouped_matmul_bf16", inputs, reference,
                 lambda lhs, rhs, sizes: 2 * lhs.shape[0] * lhs.shape[1] * rhs.shape[2],
                 lambda lhs, rhs, sizes: (lhs.size + rhs.size + lhs.shape[0] * rhs.shape[2])
                 * lhs.dtype.itemsize, "compute", 2e-2, "bf16")
    fam.cases.append(Case(fam.name, "lax.ragged_dot", "xla", {},
                          lambda lhs, rhs, sizes, interpret: jax.lax.ragged_dot(lhs, rhs, sizes),
                          traced=False))
    for bm, bn, bk, warps, stages in [(128, 128, 64, 4, 3), (128, 256, 64, 8, 3)]:
        cfg = dict(bm=bm, bn=bn, bk=bk, num_warps=warps, num_stages=stages)
        fam.cases.append(Case(fam.name, "grouped_matmul_triton", "triton", cfg,
                              functools.partial(_dry_blocks(gk.grouped_matmul_triton), **cfg)))
    cfg = dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=8)
    fam.cases.append(Case(fam.name, "ragged_dot_mgpu (JAX bundled)", "mosaic_gpu", cfg,
                          functools.partial(_bundled_ragged_dot, **cfg), bundled=True,
                          lowers_in_dry_run=False))
    return fam


def _warp_specialized_family():
    """The warp-specialized matmul, run last: a kernel whose warpgroups wait on each other's
    barriers is the one that could hang, and the rows before it are written already."""
    bf16 = _matmul_family(jnp.bfloat16, "bf16")
    fam = Family(bf16.name, bf16.make_inputs, bf16.reference, bf16.flops, bf16.bytes,
                 bf16.bound, bf16.tolerance, bf16.peak)
    for tm, tn, tk, stages in [(128, 128, 64, 3), (64, 256, 64, 3)]:
        cfg = dict(tm=tm, tn=tn, tk=tk, stages=stages)
        fam.cases.append(Case(fam.name, "matmul_mgpu_ws", "mosaic_gpu", cfg,
                              functools.partial(_dry_blocks(gk.matmul_mgpu_ws), **cfg)))
    return fam


def families() -> list[Family]:
    return [_matmul_family(jnp.bfloat16, "bf16"), _matmul_family(jnp.float32, "f32"),
            _attention_family(4096), _attention_family(16384), _row_sums_family(),
            _grouped_family(), _warp_specialized_family()]


# ---------------------------------------------------------------------------------------------
# Kernels that are not the course's: XLA and JAX's bundled Mosaic GPU ops


def _k_major_b(a, b, interpret, **cfg):
    """The Triton matmul fed Bᵀ (XLA's transpose of B is part of the timed call)."""
    return _dry_blocks(gk.matmul_triton)(a, b.T, b_transposed=True, interpret=interpret, **cfg)


def _cudnn_attention(q, k, v, interpret):
    impl = None if interpret else "cudnn"  # cuDNN needs a GPU; XLA's own path elsewhere
    return jax.nn.dot_product_attention(q, k, v, implementation=impl)


def _bundled_matmul(a, b, interpret, **cfg):
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    return hm.matmul(a, b, None, hm.TuningConfig(**cfg))


def _bundled_attention(q, k, v, interpret, **cfg):
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    return am.attention(q, k, v, am.TuningConfig(**cfg))


def _bundled_ragged_dot(lhs, rhs, sizes, interpret, **cfg):
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd

    return rd.ragged_dot(lhs, rhs, group_sizes=sizes, **cfg)


DRY_BLOCK = 64  # every block edge in the dry run (the dry-run arrays are 64..256 wide)


def _dry_blocks(kernel):
    """``kernel`` whose block sizes shrink to ``DRY_BLOCK`` when it runs interpreted (the dry
    run's tiny arrays); compiled, the configuration is used as given."""
    @functools.wraps(kernel)
    def call(*args, interpret, **cfg):
        if interpret:
            cfg = {k: (min(v, DRY_BLOCK) if k in _BLOCK_KEYS else v) for k, v in cfg.items()}
            if kernel is gk.flash_mgpu:  # GPU interpret mode takes WGMMA operands from SMEM
                cfg["p_in_smem"] = True
        return kernel(*args, **cfg, interpret=interpret)

    return call


_BLOCK_KEYS = {"bm", "bn", "bk", "bq", "tm", "tn", "tk"}


# ---------------------------------------------------------------------------------------------
# Measuring


def _time(fn: Callable, args: tuple, rounds: int = 3, min_seconds: float = 0.05) -> float:
    """Seconds per call (the first call, compile included, has been made): the best of
    ``rounds``, each enough back-to-back calls to run ``min_seconds`` (launches queue
    asynchronously; one wait per round)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = max(time.perf_counter() - start, 1e-6)
    if rounds == 1:
        return once
    reps = max(1, min(200, int(min_seconds / once)))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def _peak(fam: Family, chip) -> dict[str, float]:
    if fam.peak == "hbm":
        return {"datasheet": chip.hbm_bytes_per_second, "measured": MEASURED_HBM_BYTES_PER_S}
    if fam.peak == "tf32":
        return {"datasheet": TF32_FLOPS}
    return {"datasheet": chip.peak_flops_bf16, "measured": MEASURED_BF16_FLOPS}


def _kernelsim(case: Case, args: tuple) -> dict[str, Any]:
    """kernelsim's GPU-model estimate of the case's kernel at these sizes: ``kernelsim.trace``
    for a pallas_call (Triton), ``kernelsim.gpu.analyse`` for a Mosaic GPU kernel."""
    fn = functools.partial(case.build, interpret=False)
    if case.backend == "mosaic_gpu":
        k = kernelsim.gpu.analyse(fn, *args, chip=CHIP)[0]
        return {"estimated_s": k.estimated_seconds, "compute_s": k.compute_seconds,
                "memory_s": k.memory_seconds, "hbm_bytes": k.gmem_read_bytes
                + k.gmem_write_bytes, "flops": k.flops, "programs": k.ctas,
                "smem_bytes": k.smem_bytes, "tma_loads_per_cta": k.count("tma_load"),
                "bound": "compute" if k.compute_seconds >= k.memory_seconds else "memory"}
    t = kernelsim.trace(fn, *args, model="gpu", chip=CHIP)
    c = t.calls[0]
    return {"estimated_s": c.estimated_seconds, "compute_s": c.cost.compute_seconds,
            "memory_s": c.cost.memory_seconds, "hbm_bytes": c.hbm_read_bytes + c.hbm_write_bytes,
            "flops": c.flops, "programs": c.steps,
            "bound": "compute" if c.cost.compute_seconds >= c.cost.memory_seconds else "memory"}


@contextlib.contextmanager
def _sm_count(sms: int):
    """JAX's bundled Hopper matmul asks the device for its SM count while it traces; with no
    GPU (a re-estimate) it is told the modelled chip's."""
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    saved = hm.get_num_sms
    hm.get_num_sms = lambda: sms
    try:
        yield
    finally:
        hm.get_num_sms = saved


def _model_version() -> str:
    """The git commit of the tree kernelsim is imported from ("+ changes" if it differs)."""
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "kernelsim")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"kernelsim at commit {commit or 'unknown'}" + (" + changes" if dirty else "")


def reestimate(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a GPU run of this script) with kernelsim's estimates recomputed by the
    current model; measured seconds untouched, the original estimates kept."""
    cases = {(c.family, c.name, json.dumps(c.config, sort_keys=True)): (fam, c)
             for fam in families() for c in fam.cases}
    shapes: dict[str, tuple] = {}
    with _sm_count(get_chip(CHIP).sms):
        for row in record["rows"]:
            if "kernelsim" not in row:
                continue
            found = cases.get((row["family"], row["kernel"],
                               json.dumps(row["config"], sort_keys=True)))
            if found is None:
                row["kernelsim_reestimated"] = {"error": "no such case in this script now"}
                continue
            fam, case = found
            if fam.name not in shapes:
                shapes[fam.name] = jax.eval_shape(functools.partial(fam.make_inputs, False))
            try:
                new = _kernelsim(case, shapes[fam.name])
            except Exception as err:  # noqa: BLE001 - one kernel's failure is recorded
                new = {"error": _error_text(err)}
            if "seconds" in row and "estimated_s" in new:
                new["calibration"] = row["seconds"] / new["estimated_s"]
            row["kernelsim_reestimated"] = new
    for fam_name, fam in record["summary"].items():
        for kernel, entry in fam["kernels"].items():
            row = next((r for r in record["rows"] if r["family"] == fam_name
                        and r["kernel"] == kernel and r["config"] == entry["config"]), {})
            new = row.get("kernelsim_reestimated", {})
            entry["kernelsim_reestimated_s"] = new.get("estimated_s")
            entry["calibration_reestimated"] = new.get("calibration")
    record["reestimated"] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": _model_version(), "jax": jax.__version__,
        "note": "kernelsim_reestimated / *_reestimated: recomputed without a GPU from the "
                "model named here; seconds are the measured ones of the run above; "
                "kernelsim / kernelsim_estimated_s / calibration: the estimates recorded "
                "with the run"}
    return record


def _print_reestimate(record: dict[str, Any]) -> None:
    meta = record["reestimated"]
    print(f"estimates recomputed {meta['when']} by {meta['model']}; measured seconds from the "
          f"run of {record['when']}")
    print(f"{'family':20} {'kernel':34} {'measured':>10} {'was':>10} {'cal':>6} "
          f"{'now':>10} {'cal':>6}")
    for fam, s in record["summary"].items():
        for k, b in s["kernels"].items():
            now, cal = b.get("kernelsim_reestimated_s"), b.get("calibration_reestimated")
            print(f"{fam:20} {k:34} {b['seconds'] * 1e3:8.3f}ms "
                  f"{(b['kernelsim_estimated_s'] or 0) * 1e3:8.3f}ms {b['calibration'] or 0:6.2f} "
                  + (f"{now * 1e3:8.3f}ms {cal:6.2f}" if now else "     (none)"))


def _lower(case: Case, args: tuple) -> str | None:
    """The CUDA lowering's error for the case at the production sizes (``args``: shapes and
    dtypes), or None."""
    fn = functools.partial(case.build, interpret=False)
    if case.backend == "triton":
        return kernelsim.gpu_lowering_error(fn, *args, chip=CHIP)
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except Exception as err:  # noqa: BLE001 - the error is the answer
        return f"{type(err).__name__}: {str(err)[:400]}"
    return None


def _error_text(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:400] if text else ''}"


def run_case(case: Case, fam: Family, args: tuple, ref, dry: bool, chip) -> dict[str, Any]:
    row: dict[str, Any] = {"family": fam.name, "kernel": case.name, "backend": case.backend,
                           "bundled": case.bundled, "config": case.config, "ok": False}
    fn = jax.jit(functools.partial(case.build, interpret=dry))
    try:
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        row["first_call_s"] = round(time.perf_counter() - start, 3)
        row["relative_error"] = _relative_error(out, ref)
        row["correct"] = row["relative_error"] <= fam.tolerance
        seconds = _time(fn, args, rounds=1 if dry else 3)
        row["seconds"] = seconds
        work = fam.flops(*args) if fam.bound == "compute" else fam.bytes(*args)
        rate = work / seconds
        row["tflops" if fam.bound == "compute" else "gb_per_s"] = rate / (
            1e12 if fam.bound == "compute" else 1e9)
        row["fraction_of_peak"] = {k: rate / v for k, v in _peak(fam, chip).items()}
        row["ok"] = row["correct"]
    except Exception as err:  # noqa: BLE001 - one kernel's failure is recorded, not fatal
        row["error"] = _error_text(err)
        row["traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
    if case.traced:
        try:
            row["kernelsim"] = _kernelsim(case, args)
            if "seconds" in row:
                row["kernelsim"]["calibration"] = row["seconds"] / row["kernelsim"]["estimated_s"]
        except Exception as err:  # noqa: BLE001
            row["kernelsim"] = {"error": _error_text(err)}
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny sizes, interpreted, plus CUDA lowering at production sizes")
    parser.add_argument("--out", type=Path, help="default: bench/results/gpu_perf.json; "
                        "with --reestimate, the record itself")
    parser.add_argument("--budget", type=float, default=270.0,
                        help="seconds; configurations after it is spent are skipped")
    parser.add_argument("--only", nargs="*", default=(), help="family names to run")
    parser.add_argument("--reestimate", type=Path, metavar="RECORD",
                        help="recompute kernelsim's estimates of a recorded run (no GPU)")
    args = parser.parse_args(argv)
    if args.reestimate:
        out = args.out or args.reestimate
        report = reestimate(json.loads(args.reestimate.read_text()))
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        _print_reestimate(report)
        print(f"wrote {out}")
        return 0
    dry = args.dry_run
    args.out = args.out or ROOT / "bench" / "results" / "gpu_perf.json"
    chip = get_chip(CHIP)
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for fam in families():
        if args.only and fam.name not in args.only:
            continue
        try:
            inputs = fam.make_inputs(dry)
            ref = jax.block_until_ready(jax.jit(fam.reference)(*inputs))
            # production shapes, never materialised: the dry run only lowers at these sizes
            production = (jax.eval_shape(functools.partial(fam.make_inputs, False)) if dry
                          else inputs)
        except Exception as err:  # noqa: BLE001
            rows.append({"family": fam.name, "kernel": "(inputs)", "ok": False,
                         "error": _error_text(err)})
            continue
        interpreted: set[str] = set()
        for case in fam.cases:
            if time.perf_counter() - began > args.budget:
                rows.append({"family": fam.name, "kernel": case.name, "config": case.config,
                             "backend": case.backend, "ok": False,
                             "skipped": f"time budget of {args.budget:.0f} s spent"})
                continue
            if dry and case.bundled:
                rows.append({"family": fam.name, "kernel": case.name, "config": case.config,
                             "backend": case.backend, "bundled": True, "ok": True,
                             "skipped": "JAX's bundled op: compiled runs only"})
                continue
            if dry and case.name in interpreted:  # same tiny blocks as the one run: lower only
                row = {"family": fam.name, "kernel": case.name, "backend": case.backend,
                       "config": case.config, "ok": True, "interpreted": False}
            else:
                row = run_case(case, fam, inputs, ref, dry, chip)
                interpreted.add(case.name)
            if dry and case.backend != "xla" and case.lowers_in_dry_run:
                row["cuda_lowering_error"] = _lower(case, production)
            rows.append(row)
            print(_line(row), flush=True)
            _write(args.out, rows, dry, began, finished=False)  # a hang still leaves rows
        del inputs, ref
    _write(args.out, rows, dry, began, finished=True)
    _summarise(rows)
    print(f"wrote {args.out} ({time.perf_counter() - began:.0f} s)")
    return 0


def _write(path: Path, rows: list[dict], dry: bool, began: float, finished: bool) -> None:
    import jaxlib

    chip = get_chip(CHIP)
    report = {"benchmark": "gpu_perf", "dry_run": dry, "finished": finished,
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"python": platform.python_version(), "system": platform.platform()},
              "jax": jax.__version__, "jaxlib": jaxlib.__version__,
              "backend": jax.default_backend(),
              "devices": [d.device_kind for d in jax.devices()],
              "chip": CHIP, "peaks": {"bf16_datasheet": chip.peak_flops_bf16,
                                      "bf16_measured": MEASURED_BF16_FLOPS,
                                      "tf32_datasheet": TF32_FLOPS,
                                      "hbm_datasheet": chip.hbm_bytes_per_second,
                                      "hbm_measured": MEASURED_HBM_BYTES_PER_S},
              "seconds": round(time.perf_counter() - began, 1),
              "summary": _best(rows), "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def _best(rows: list[dict]) -> dict[str, Any]:
    """Per family: XLA's time, and per (kernel, backend) the best correct configuration with
    its ratio to XLA (XLA time / kernel time: 1.0 is parity)."""
    out: dict[str, Any] = {}
    for fam in sorted({r["family"] for r in rows}):
        fam_rows = [r for r in rows if r["family"] == fam and r.get("ok") and "seconds" in r]
        xla = next((r for r in fam_rows if r["backend"] == "xla"), None)
        best: dict[str, Any] = {}
        for r in fam_rows:
            if r["backend"] == "xla":
                continue
            if r["kernel"] not in best or r["seconds"] < best[r["kernel"]]["seconds"]:
                best[r["kernel"]] = r
        out[fam] = {"xla_s": xla and xla["seconds"], "kernels": {
            k: {"seconds": r["seconds"], "config": r["config"],
                "of_xla": xla["seconds"] / r["seconds"] if xla else None,
                "fraction_of_peak": r.get("fraction_of_peak"),
                "kernelsim_estimated_s": r.get("kernelsim", {}).get("estimated_s"),
                "calibration": r.get("kernelsim", {}).get("calibration")}
            for k, r in best.items()}}
    return out


def _line(row: dict) -> str:
    cfg = ",".join(f"{k}={v}" for k, v in row.get("config", {}).items())
    low = row.get("cuda_lowering_error")
    low = f"  LOWERING: {low[:100]}" if low else ""
    if "error" in row:
        return f"{row['family']:20} {row['kernel']:34} {cfg:40} ERROR {row['error'][:120]}"
    if "seconds" not in row:
        return f"{row['family']:20} {row['kernel']:34} {cfg:40} lowered only{low}"
    rate = (f"{row['tflops']:7.1f} TFLOP/s" if "tflops" in row else
            f"{row.get('gb_per_s', 0):7.0f} GB/s")
    est = row.get("kernelsim", {}).get("estimated_s")
    return (f"{row['family']:20} {row['kernel']:34} {cfg:40} {row['seconds'] * 1e3:9.3f} ms "
            f"{rate} err {row['relative_error']:.1e}"
            + (f"  kernelsim {est * 1e3:.3f} ms" if est else "")
            + low)


def _summarise(rows: list[dict]) -> None:
    for fam, s in _best(rows).items():
        xla = s["xla_s"]
        print(f"{fam}: XLA {xla * 1e3:.3f} ms" if xla else f"{fam}: XLA did not run")
        for k, b in s["kernels"].items():
            ratio = f"{b['of_xla']:.0%} of XLA" if b["of_xla"] else ""
            print(f"  {k:34} {b['seconds'] * 1e3:9.3f} ms {ratio}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
