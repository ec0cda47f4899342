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


def test_every_held_out_row_is_within_the_band():
    out = [(r["family"], r["config"], round(r["measured_s"] / r["estimated_s"], 3))
           for r in held_out(_record()["rows"])
           if not BAND[0] <= r["measured_s"] / r["estimated_s"] <= BAND[1]]
    assert not out, out


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
