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
