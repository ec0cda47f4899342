"""kernelsim's TPU time model against the chip's device time (issue 51, item 4), and its VMEM
footprint against the compiler's own figure (item 4, "follows what Mosaic allocates"), as
recorded on a TPU v5e by ``bench/tpu_perf.py --model`` (``bench/recorded/tpu_perf_model-v5e.json``).
Nothing here times anything: the record holds the chip's times, the tests hold the model to
them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "bench" / "recorded" / "tpu_perf_model-v5e.json"
BAND = (0.8, 1.25)  # measured / estimated, every held-out row


def _tpu_perf():
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("tpu_perf", ROOT / "bench" / "tpu_perf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record() -> dict:
    return json.loads(RECORDED.read_text())


def held_out(rows) -> list[dict]:
    from bench.model_kernels import HELD_OUT

    return [r for r in rows if r["family"] in HELD_OUT and r["measured_s"]]


def test_the_sweep_holds_at_least_six_kernel_families_out_of_the_fit():
    rows = _record()["rows"]
    families = {r["family"] for r in held_out(rows)}
    assert len(families) >= 6, families
    assert not any(r["fitted"] for r in held_out(rows))
    assert {r["family"] for r in rows if r["fitted"]} <= {"matmul", "flash_attention",
                                                         "elementwise", "reduction"}


# Held-out rows the model misses, each with its measured / estimated ratio today and why:
# issue 51's band is not met for these (the report says so); a change that moves any of them,
# either way, shows here.
MISSES = {
    # float32 at DEFAULT: one bf16 pass, but the operands are twice bf16's bytes and the
    # model's DMAs make it memory-bound; the chip read them at ~1 TB/s, faster than the
    # 819 GB/s datasheet rate the model divides by
    ("matmul_dtype", 2048, "float32", "DEFAULT", 512): 0.78,
    ("matmul_dtype", 4096, "float32", "DEFAULT", 512): 0.72,
    ("matmul_dtype", 4096, "float32", "DEFAULT", 256): 0.72,
    ("matmul_dtype", 2048, "int8", "DEFAULT", 256): 0.77,  # int8 in 256-blocks, a small n
    # a transpose's output blocks land column-wise in HBM: at n = 8192 the chip took 8x the
    # time of n = 4096 for 4x the bytes, which no term of the model has
    ("transpose", 4096, None, None, 256): 0.78,
    ("transpose", 8192, None, None, 512): 2.00,
}


def _key(r):
    c = r["config"]
    return (r["family"], c.get("n"), c.get("dtype"), c.get("precision"),
            c.get("bm", c.get("block")))


def test_every_held_out_row_is_within_the_band():
    out, missed = [], {}
    for r in held_out(_record()["rows"]):
        ratio = r["measured_s"] / r["estimated_s"]
        if _key(r) in MISSES:
            missed[_key(r)] = round(ratio, 2)
        elif not BAND[0] <= ratio <= BAND[1]:
            out.append((r["family"], r["config"], round(ratio, 3)))
    assert not out, out
    assert missed == MISSES


def test_the_recorded_estimates_are_the_current_models():
    """One row of each held-out family, re-estimated now: what the record says kernelsim
    estimated is what it estimates today (change the model, then ``--re-estimate`` the file)."""
    tp = _tpu_perf()
    seen = set()
    for r in held_out(_record()["rows"]):
        key = (r["family"], r["config"].get("dtype"), r["config"].get("precision"))
        if key in seen:
            continue
        seen.add(key)
        est = tp.estimate(*tp.row_call(r, None, None))
        assert est["estimated_seconds"] == pytest.approx(r["estimated_s"], rel=1e-9), key


VMEM_RECORDED = ROOT / "bench" / "recorded" / "tpu_perf_vmem-v5e.json"


def test_a_probe_kernelsim_keeps_nothing_beside_its_buffers_for_compiled_there():
    """Each probe compiled on the v5e at kernelsim's buffers plus 64 KiB exactly where
    kernelsim counts at most 64 KiB of values the body keeps (today's count); where refused,
    kernelsim's footprint is within 6 % of the compiler's figure at its refusal (a lower
    bound: Mosaic names the total at the allocation that crossed the limit)."""
    tp = _tpu_perf()
    recorded = json.loads(VMEM_RECORDED.read_text())
    margin = recorded["margin_bytes"]
    assert len(recorded["vmem_figures"]) >= 19
    for f in recorded["vmem_figures"]:
        (now,) = tp.vmem_figures([(f["kernel"], f["config"])], compile_=False)
        assert now["kernelsim_buffers_bytes"] + margin == f["limit_bytes"]
        assert (now["kernelsim_body_values_bytes"] <= margin) == f["compiled"], f["config"]
        if not f["compiled"]:
            assert f["compiler_vmem_bytes"] <= 1.06 * now["kernelsim_mosaic_vmem_bytes"]


@pytest.mark.parametrize("kernel, config", [
    ("rms_norm_residual", {"shape": [2048, 8192], "block": 128}),
    ("sigmoid_bce", {"shape": [2048, 1024], "block": 2048}),
    ("pairwise_distance", {"shape": [256, 32]}),
])
def test_pallasbenchs_kernels_that_compiled_on_a_v6e_are_not_warned(kernel, config):
    """Issue 51: these compiled and ran on a v6e (32 MiB scoped limit); kernelsim counted 33.56,
    41.9 and 34.2 MB with the values their bodies keep. Mosaic streams their element-wise work
    and lane reductions through vector registers (on a v5e each compiled at its buffers plus
    64 KiB, ``tpu_perf_vmem-v5e.json``)."""
    import kernelsim
    from bench.model_kernels import VMEM_PROBES
    from kernelsim.cost import lint

    fn, args = VMEM_PROBES[kernel](config, True)
    call = kernelsim.trace(fn, *args, chip="tpu-v6e").calls[0]
    assert call.cost.body_values_vmem_bytes == 0
    assert not [w for w in call.warnings if lint.rule_of(w) == lint.SCOPED_VMEM]


def test_a_tpu_matmul_is_priced_by_its_dtype_and_precision():
    """bf16 and float32 at DEFAULT at the bf16 peak (one MXU pass), float32 at HIGHEST at a
    sixth of it, int8 at tpu_info's integer rate (twice bf16's on v5e); v4 has none."""
    from kernelsim.chips import get_chip
    from kernelsim.find.flops import precision_name
    from kernelsim.model import Matmul

    v5e = get_chip("tpu-v5e")
    rate = lambda dtype, p="DEFAULT": v5e.matmul_flops_per_second(  # noqa: E731
        Matmul(dtype, 1, True, precision=p))
    assert rate("bfloat16") == rate("float32") == v5e.peak_flops_bf16
    assert rate("float32", "HIGHEST") == v5e.peak_flops_bf16 / 6
    assert rate("float32", "HIGH") == v5e.peak_flops_bf16 / 3
    assert rate("int8") == 394e12
    assert get_chip("tpu-v4").matmul_flops_per_second(Matmul("int8", 1, True)) == 275e12
    import jax

    assert precision_name(None) == "DEFAULT"
    assert precision_name(jax.lax.Precision.HIGHEST) == "HIGHEST"
    assert precision_name((jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH)) == "HIGH"
    assert precision_name(jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6) == "HIGHEST"
