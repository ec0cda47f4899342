"""bench/gpu_perf.py's dry run: every course GPU kernel interpreted on the CPU at tiny sizes and
checked against plain JAX, and lowered for CUDA at its production size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dry_run_checks_and_lowers_every_kernel(tmp_path):
    out = tmp_path / "gpu_perf.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_perf.py"), "--dry-run",
                    "--out", str(out)], check=True, cwd=ROOT, timeout=600,
                   env={**os.environ, "JAX_PLATFORMS": "cpu"})
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["dry_run"] and not any("skipped" in r and "budget" in r["skipped"]
                                         for r in rows)
    failed = [(r["family"], r["kernel"], r.get("error")) for r in rows if not r["ok"]]
    assert not failed
    course = [r for r in rows if r["backend"] != "xla" and not r.get("bundled")]
    # every course kernel ran interpreted once per problem, and matched plain JAX
    ran = {(r["family"], r["kernel"]) for r in course if "relative_error" in r}
    assert ran == {(r["family"], r["kernel"]) for r in course}
    assert {r["backend"] for r in course} == {"triton", "mosaic_gpu"}
    # every configuration of the sweep lowers for CUDA at the production size
    assert all("cuda_lowering_error" in r and r["cuda_lowering_error"] is None for r in course)
    # kernelsim traced every Triton kernel and gave an estimate
    assert all(r["kernelsim"]["estimated_s"] > 0 for r in course if "kernelsim" in r)
    assert {r["family"] for r in rows} == {"matmul_bf16", "matmul_f32", "attention_4k",
                                          "attention_16k", "row_sums_f32",
                                          "grouped_matmul_bf16"}


@pytest.mark.slow
def test_reestimate_recomputes_a_recorded_run_without_a_gpu(tmp_path):
    """``--reestimate``: the recorded H200 run's grouped and float32 matmuls traced at their
    production sizes on the CPU; measured seconds and the estimates recorded with the run
    stay, the current model's estimates come beside them, with when and which model made
    them."""
    recorded = json.loads((ROOT / "bench" / "recorded" / "gpu_perf-h200.json").read_text())
    family, f32 = "grouped_matmul_bf16", "matmul_f32"
    trimmed = {**recorded, "rows": [r for r in recorded["rows"] if r["family"] in (family, f32)],
               "summary": {f: recorded["summary"][f] for f in (family, f32)}}
    trimmed.pop("reestimated", None)
    for r in trimmed["rows"]:
        r.pop("kernelsim_reestimated", None)
    record = tmp_path / "run.json"
    record.write_text(json.dumps(trimmed))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_perf.py"), "--reestimate",
                          str(record)], check=True, cwd=ROOT, timeout=600, capture_output=True,
                         text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
    report = json.loads(record.read_text())
    assert "estimates recomputed" in out and report["reestimated"]["model"].startswith(
        ("kernelsim at commit", "unknown"))
    traced = [r for r in report["rows"] if "kernelsim" in r]
    assert len(traced) == 3 + 4
    for new, old in zip(traced, [r for r in trimmed["rows"] if "kernelsim" in r], strict=True):
        assert (new["seconds"], new["kernelsim"]) == (old["seconds"], old["kernelsim"])
        again = new["kernelsim_reestimated"]
        assert again["calibration"] == new["seconds"] / again["estimated_s"]
    best = report["summary"][family]["kernels"]
    # the whole-array expert table was charged to every program: 0.016 with the run
    triton = best["grouped_matmul_triton"]
    assert triton["calibration"] < 0.02 and 0.5 < triton["calibration_reestimated"] < 2
    assert 0.5 < best["ragged_dot_mgpu (JAX bundled)"]["calibration_reestimated"] < 2
    # float32 with B row-major: 4.9 while the model ran every TF32 dot at the TF32 rate
    best = report["summary"][f32]["kernels"]
    assert 0.5 < best["matmul_triton"]["calibration_reestimated"] < 2
    assert 0.5 < best["matmul_triton, B K-major (transpose timed)"]["calibration_reestimated"] < 2
