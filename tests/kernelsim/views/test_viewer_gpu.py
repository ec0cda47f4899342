"""The viewer's data for a Mosaic GPU kernel (``kernelsim.gpu``): the GPU's memories as lanes,
each warpgroup's events, and numbers equal to the GpuKernel's, in the GPU's words only."""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12):
    pytest.skip("plgpu.kernel binds mpmd_map from jax 0.12", allow_module_level=True)

from kernelsim import gpu  # noqa: E402
from kernelsim.chips import CHIPS  # noqa: E402
from kernelsim.mosaic_gpu import kernel_data  # noqa: E402
from kernelsim.views import palette  # noqa: E402
from kernelsim.views import viewer as v  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import gpu_kernels as gk  # noqa: E402

MM = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)


@pytest.fixture(scope="module")
def kernels():
    """The course's pipelined matmul (one warpgroup) and its warp-specialized form (three)."""
    one = functools.partial(gk.matmul_mgpu, tm=64, tn=64, tk=64, stages=2)
    ws = functools.partial(gk.matmul_mgpu_ws, tm=64, tn=64, tk=64, stages=2)
    return gpu.analyse(one, MM, MM, chip="h200")[0], gpu.analyse(ws, MM, MM, chip="h200")[0]


def test_numbers_are_the_kernels(kernels):
    for k in kernels:
        data = v.gpu_viewer_data(k)
        K = data["kernel"]
        assert (data["model"], data["chip"]) == ("gpu", "h200")
        assert K["smem_bytes"] == k.smem_bytes and K["chip_smem"] == CHIPS["h200"].vmem_bytes
        assert (K["gmem_read"], K["gmem_write"], K["flops"]) == (
            k.gmem_read_bytes, k.gmem_write_bytes, k.flops)
        assert (K["compute_s"], K["memory_s"], K["estimate_s"]) == (
            k.compute_seconds, k.memory_seconds, k.estimated_seconds)
        assert K["ctas"] == k.ctas and K["warpgroups"] == k.num_threads
        assert [a["bytes"] for a in data["allocations"]] == [a.bytes for a in k.allocations]
        # per warpgroup, its events in program order, each with the bytes the model counted
        for w, events in enumerate(data["events"]):
            mine = [e for e in k.events if e.warpgroup == w]
            assert K["event_counts"][w] == len(mine) == len(events)
            assert [(e["kind"], e["bytes"]) for e in events] == [(e.kind, e.bytes) for e in mine]
        # a CTA's global-memory traffic, per operand, adds up to the launch's over its CTAs
        # (reads: at most that, the reads neighbouring CTAs share come from L2)
        assert sum(g["read"] for g in data["gmem"]) * k.ctas >= k.gmem_read_bytes > 0
        assert sum(g["written"] for g in data["gmem"]) * k.ctas == k.gmem_write_bytes
    assert len(v.gpu_viewer_data(kernels[1])["events"]) == 3


def test_lanes_and_words_are_the_gpus(kernels):
    one, ws = kernels
    data = v.gpu_viewer_data(one)
    assert [(lane["id"], lane["kind"]) for lane in data["lanes"]] == [
        ("global", "gmem"), ("shared", "smem"), ("registers", "regs"), ("warpgroups", "events")]
    load = next(e for e in data["events"][0] if e["kind"] == "tma_load")
    first = one.events[0]
    assert load["touch"] == [first.src, first.dst, first.barrier]
    assert load["text"] == (f"loop 0 step 0: TMA copy {first.src} → {first.dst} (global → "
                            f"shared memory), 8 KiB, lands on {first.barrier}")
    assert set(data["kinds"]) == set(kernel_data.EVENT_KINDS) == set(palette.EVENT_COLORS)
    said = json.dumps([data["lanes"], data["kinds"], data["events"]])
    assert not re.search(r"VMEM|SMEM|HBM|scalar", said)
    # the producer warpgroup of the warp-specialized kernel copies; it does no WGMMA
    producer = {e["kind"] for e in v.gpu_viewer_data(ws)["events"][2]}
    assert "tma_load" in producer and "wgmma" not in producer


def test_each_kind_of_event_has_its_own_colour():
    """The strip and the legend tell kinds apart by colour alone, a barrier's wait from its
    arrive included (issue 37: lesson 16's legend gave both one purple)."""
    colours = palette.EVENT_COLORS
    assert len(set(colours.values())) == len(colours), colours


def test_show_and_to_html(kernels, tmp_path):
    k = kernels[0]
    out = k.show()  # no notebook front end here: the standalone viewer
    assert isinstance(out, v.Standalone)
    bundle = out._repr_mimebundle_()
    assert bundle["text/html"].startswith('<div class="ks-viewer-host"')
    assert f"{len(k.events)} events" in bundle["text/plain"]
    page = k.to_html(tmp_path / "k.html")
    assert page.startswith("<!DOCTYPE html>") and (tmp_path / "k.html").read_text() == page
    assert '"kind":"gpu_kernel"' in page
    w = v.gpu_viewer(k)  # the live form carries the same data
    assert w.data == json.loads(json.dumps(v.gpu_viewer_data(k))) and w.model == "gpu"
