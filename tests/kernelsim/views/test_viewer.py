"""The viewer's data and its two forms: the standalone page and the anywidget."""

import base64
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from views_kernels import matmul

import kernelsim
from kernelsim.chips import CHIPS
from kernelsim.cost.schedule import build
from kernelsim.views import palette
from kernelsim.views import viewer as v


def _decode(typed: dict) -> np.ndarray:
    dtype = {"i8": "<i1", "u16": "<u2", "i32": "<i4", "f64": "<f8"}[typed["t"]]
    return np.frombuffer(base64.b64decode(typed["b"]), dtype)


def test_data_is_the_schedule_of_both_models_on_every_chip(mm_trace):
    data = v.viewer_data(mm_trace)
    call = data["calls"][0]
    assert call["total_steps"] == call["shown"] == 64
    assert _decode(call["steps"]).tolist() == list(range(64))
    ct = mm_trace.calls[0]
    for o in call["operands"]:
        op = ct.call.operands[[x.name for x in ct.call.operands].index(o["name"])]
        blocks = np.array(o["blocks"])[_decode(o["block_at"])]
        assert (blocks == op.block_indices).all()
    for model in ("tpu", "gpu"):
        m = call["models"][model]
        sched = build(ct.call, model)
        assert (_decode(m["cumulative"]) == sched.cumulative_bytes).all()
        for s in sched.operands:
            assert (_decode(m["operands"][s.operand.name]["actions"]) == s.actions).all()
        assert set(m["costs"]) == {n for n, c in CHIPS.items() if c.kind == model}
    gpu = call["models"]["gpu"]
    assert gpu["default_chip"] == "h100" and gpu["costs"]["h100"]["buffers"]["x_ref"] == 1
    # each model names its memory spaces for the view: no TPU word under gpu
    assert [s["name"] for s in gpu["memory_spaces"]] == ["global memory",
                                                          "shared memory / registers"]
    assert [s["name"] for s in call["models"]["tpu"]["memory_spaces"]][:2] == ["HBM", "VMEM"]
    # one buffer under gpu: every step uses slot 0
    assert set(_decode(gpu["operands"]["x_ref"]["slot"]).tolist()) == {0}
    assert set(_decode(call["models"]["tpu"]["operands"]["x_ref"]["slot"]).tolist()) == {0, 1}


def test_a_tpu_kernels_vmem_is_drawn_against_the_limit_mosaic_enforces(mm_trace):
    """The TPU model's capacity bar is Mosaic's allocation against the scoped limit (16 MiB
    by default on a v5e, measured), not against the chip's 128 MiB; the GPU model has none."""
    call = v.viewer_data(mm_trace)["calls"][0]
    v5e = call["models"]["tpu"]["costs"]["tpu-v5e"]
    cost = mm_trace.calls[0].cost
    assert v5e["vmem_limit"] == 16 * 2**20 and "default scoped" in v5e["vmem_limit_source"]
    assert v5e["mosaic_vmem"] == cost.mosaic_vmem_bytes > v5e["vmem"]
    assert call["models"]["gpu"]["costs"]["h100"]["vmem_limit"] is None


def test_prefetch_reads_and_accesses_travel_per_step():
    from views_kernels import gather_rows

    t = kernelsim.trace(gather_rows, jnp.array([3, 1, 1, 0], jnp.int32),
                        jnp.zeros((32, 128), jnp.float32), record_access=True)
    call = v.viewer_data(t)["calls"][0]
    (p,) = call["prefetch"]
    offsets, reads = _decode(p["read_offsets"]), _decode(p["reads"])
    reads_at = t.calls[0].prefetch_reads["idx_ref"]
    for step in range(8):
        assert reads[offsets[step]:offsets[step + 1]].tolist() == reads_at.at(step).tolist()
    assert p["values"] == [3, 1, 1, 0]
    acc = call["accesses"]["o_ref"]
    picture = acc["pictures"][_decode(acc["at"])[0]]
    assert set(picture) == {"2"}  # the body writes its whole output block


def test_page_is_self_contained_and_states_the_step_count(mm_trace, tmp_path):
    text = mm_trace.to_html(tmp_path / "p.html")
    assert (tmp_path / "p.html").read_text() == text
    assert 'data-total-steps="64"' in text and "<script src" not in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    assert not re.search(r"""import\s*\(?\s*["']""", text)  # the module is inline
    frag = mm_trace.to_html(fragment=True)
    assert frag.startswith('<div class="ks-viewer-host"') and "<html" not in frag
    ids = [re.search(r'id="(ks-[0-9a-f]+)"', mm_trace.to_html(fragment=True)).group(1)
           for _ in range(2)]
    assert ids[0] != ids[1]


def test_4096_step_trace_stays_under_1_mb_and_samples_above():
    x = jnp.zeros((2048, 2048), jnp.float32)
    t = kernelsim.trace(matmul, x, x)
    assert t.calls[0].steps == 4096
    page = t.to_html()
    assert len(page.encode()) < 1_000_000 and 'data-shown-steps="4096"' in page
    small = t.to_html(max_bytes=150_000)
    assert len(small.encode()) < 150_000
    shown = int(re.search(r'data-shown-steps="(\d+)"', small).group(1))
    assert 2 < shown < 4096
    data = json.loads(re.search(r'<script type="application/json" id="[^"]+">(.*?)</script>',
                                small, re.DOTALL).group(1))
    steps = _decode(data["calls"][0]["steps"])
    assert steps[0] == 0 and steps[-1] == 4095 and len(steps) == shown


def test_show_is_the_standalone_viewer_without_a_live_front_end(mm_trace):
    out = mm_trace.show()
    assert isinstance(out, v.Standalone)
    bundle = out._repr_mimebundle_()
    assert bundle["text/html"].startswith('<div class="ks-viewer-host"')
    assert "64 steps" in bundle["text/plain"]
    with pytest.raises(IndexError):
        mm_trace.show(call=3)


def test_live_widget_recomputes_model_and_chip_in_the_kernel(mm_trace):
    w = v.viewer(mm_trace)
    assert w._esm.strip().endswith("export default {render};")
    assert list(w.data["calls"][0]["models"]) == ["tpu"]
    assert list(w.data["calls"][0]["models"]["tpu"]["costs"]) == ["tpu-v5e"]
    w.chip = "tpu-v4"
    assert list(w.data["calls"][0]["models"]["tpu"]["costs"]) == ["tpu-v4"]
    w.model = "gpu"  # a tpu chip does not cost a gpu schedule: the gpu default replaces it
    assert w.chip == "h100" and list(w.data["calls"][0]["models"]) == ["gpu"]
    gpu = w.data["calls"][0]["models"]["gpu"]
    assert _decode(gpu["cumulative"])[-1] > mm_trace.calls[0].schedule.cumulative_bytes[-1]
    w.step = 5  # the step is synced state; the front end draws it
    assert w.step == 5


def test_live_front_end_is_told_apart_by_the_cell_id(monkeypatch):
    class Kernel:
        def __init__(self, metadata):
            self.metadata = metadata

        def get_parent(self, channel):
            return {"metadata": self.metadata}

    class Shell:
        kernel = None

    import IPython

    shell = Shell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert not v.live_frontend()
    shell.kernel = Kernel({})  # nbclient: no cellId
    assert not v.live_frontend()
    shell.kernel = Kernel({"cellId": "a1b2"})  # JupyterLab, Notebook 7, VS Code
    assert v.live_frontend()


def test_each_model_has_its_own_lanes_and_words(gather_trace):
    """The gpu model speaks of global and shared memory, with no SMEM lane on a
    scalar-prefetch kernel (Triton has no scalar prefetch); the tpu model of HBM, VMEM, SMEM."""
    models = v.viewer_data(gather_trace)["calls"][0]["models"]
    tpu, gpu = models["tpu"], models["gpu"]
    assert [(lane["id"], lane["kind"]) for lane in tpu["lanes"]] == [
        ("hbm", "arrays"), ("vmem", "buffers"), ("smem", "scalars")]
    assert [(lane["id"], lane["kind"]) for lane in gpu["lanes"]] == [
        ("global", "arrays"), ("shared", "buffers"), ("prefetch", "note")]
    assert tpu["words"]["labels"] == palette.ACTION_LABELS
    said = json.dumps([gpu["lanes"], gpu["words"]])
    assert "global memory" in said and "shared memory" in said
    assert not re.search(r"VMEM|SMEM|HBM", said), said
    assert gpu["words"]["scalars"] is None
    # without a scalar memory, everything held on chip counts against its capacity
    cost = v.compute(gather_trace.calls[0].schedule, gather_trace.chip)
    assert tpu["costs"]["tpu-v5e"]["onchip"] == cost.vmem_bytes
