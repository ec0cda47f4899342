"""``Trace.show()`` in a running JupyterLab: the anywidget viewer renders, steps in the
browser, and a model switch is recomputed in the kernel; a Mosaic GPU kernel's
``GpuKernel.show()`` renders the same module's GPU view, its step synced with the kernel."""

from __future__ import annotations

import os
import signal

import pytest
from sitetools import REPO, notebook, open_notebook, run_cell, start_lab, watch

CELL = """\
import jax.numpy as jnp
import kernelsim
from kernelsim import examples

x = jnp.ones((512, 512), jnp.float32)
viewer = kernelsim.trace(examples.matmul, x, x).show()
viewer"""
KERNEL_SIDE = "print(viewer.step, viewer.model, viewer.chip)"
GPU_CELL = f"""\
import functools, sys
import jax
sys.path.insert(0, {str(REPO / "bench")!r})
import gpu_kernels
from kernelsim import gpu

mm = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
matmul = functools.partial(gpu_kernels.matmul_mgpu, tm=64, tn=64, tk=64, stages=2)
(kernel,) = gpu.analyse(matmul, mm, mm, chip="h200")
gpu_viewer = kernel.show()
gpu_viewer"""
GPU_KERNEL_SIDE = "print(type(gpu_viewer).__name__, gpu_viewer.step)"


def viewer_state(v) -> dict:
    return {"step": v.get_attribute("data-step"),
            "status": v.locator("[role=status]").inner_text(),
            "active": v.locator(".ks-slot.ks-active").evaluate_all(
                "els => els.map(e => e.dataset.slot)"),
            "bytes": v.locator("[data-lane=traffic] .ks-act").inner_text()}


@pytest.mark.slow
def test_show_in_jupyterlab_steps_and_recomputes_the_model(browser, tmp_path):
    notebook(tmp_path / "viewer.ipynb", CELL, KERNEL_SIDE, GPU_CELL, GPU_KERNEL_SIDE)
    with open(tmp_path / "lab.log", "w") as log:
        proc, base, token = start_lab(tmp_path, log)
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    w = watch(context)
    try:
        page = w.page
        open_notebook(page, f"{base}/lab/tree/viewer.ipynb?token={token}")
        run_cell(page, 0)
        viewer = page.locator(".jp-OutputArea-output .ks-viewer")
        viewer.wait_for(timeout=120_000)
        first = viewer_state(viewer)
        assert first["step"] == "0" and first["status"].startswith("step 0, grid (0, 0, 0)")
        viewer.locator(".ks-next").click()
        second = viewer_state(viewer)
        assert second["step"] == "1" and second["status"] != first["status"]
        assert "x_ref:0" in first["active"] and "x_ref:1" in second["active"]
        viewer.locator(".ks-model").select_option("gpu")  # recomputed in the kernel
        page.wait_for_function(
            "() => document.querySelector('.ks-viewer .ks-chip')?.value === 'h100'",
            timeout=30_000)
        gpu = viewer_state(viewer)
        assert gpu["bytes"] != second["bytes"], gpu
        assert "o_ref block (0, 0) written back" in gpu["status"], gpu["status"]
        run_cell(page, 1)  # the kernel holds the step and model the browser set
        printed = page.locator(".jp-CodeCell").nth(1).locator(".jp-OutputArea-output")
        printed.wait_for(timeout=30_000)
        assert printed.inner_text().strip() == "1 gpu h100"
        run_cell(page, 2)
        mgpu = page.locator(".jp-CodeCell").nth(2).locator(".ks-viewer")
        mgpu.wait_for(timeout=120_000)
        assert mgpu.locator("[role=status]").inner_text().startswith(
            "event 0: warpgroup 0: loop 0 step 0: TMA copy in0")
        mgpu.locator(".ks-next").click()
        assert mgpu.get_attribute("data-step") == "1"
        run_cell(page, 3)
        printed = page.locator(".jp-CodeCell").nth(3).locator(".jp-OutputArea-output")
        printed.wait_for(timeout=30_000)
        assert printed.inner_text().strip() == "GpuViewer 1"
    finally:
        context.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert not [e for e in w.errors if "ks-" in e or "viewer" in e], w.errors
