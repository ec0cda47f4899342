"""The viewer on a Mosaic GPU kernel in chromium: the course's pipelined matmul as
``kernelsim.gpu`` models it, shown by ``GpuKernel.to_html`` (the page ``GpuKernel.show()``
gives outside a live notebook), at a desktop's and a phone's width. It speaks the GPU's
memories (global, shared, registers) and events (TMA copies, barrier waits), never the TPU's
lanes or words, and no label is cut, overlapped or too small. Screenshots land in
build/screenshots/ for a person to look at."""

from __future__ import annotations

import functools
import re
import sys

import jax
import jax.numpy as jnp
import pytest
from sitetools import REPO, serve_folder, watch
from test_site_viewer import small_labels

from kernelsim import gpu

sys.path.insert(0, str(REPO / "bench"))
import gpu_kernels as gk  # noqa: E402

SHOTS = REPO / "build" / "screenshots"

# Text in the viewer whose box is wider than its parent's (cut), or that covers another
# label's box (overlapped): [what, why]
CUT_OR_OVERLAPPED = """() => {
  const out = [], boxes = [];
  const v = document.querySelector('.ks-viewer');
  const walk = document.createTreeWalker(v, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    if (!n.textContent.trim()) continue;
    const el = n.parentElement, range = document.createRange();
    range.selectNodeContents(n);
    const r = range.getBoundingClientRect(), box = el.getBoundingClientRect();
    if (!r.width) continue;
    if (r.right > box.right + 1 || r.left < box.left - 1 || el.scrollWidth > el.clientWidth + 1)
      out.push([n.textContent.trim().slice(0, 40), 'cut']);
    for (const [t, o] of boxes)
      if (r.left < o.right - 1 && o.left < r.right - 1 && r.top < o.bottom - 1 &&
          o.top < r.bottom - 1 && !el.contains(o.el) && !o.el.contains(el))
        out.push([n.textContent.trim().slice(0, 40), 'overlaps ' + t]);
    boxes.push([n.textContent.trim().slice(0, 40),
                {left: r.left, right: r.right, top: r.top, bottom: r.bottom, el}]);
  }
  return out; }"""


@pytest.fixture(scope="module")
def kernel_url(tmp_path_factory):
    """The standalone viewer of the course's two-stage Mosaic GPU matmul, from 127.0.0.1."""
    root = tmp_path_factory.mktemp("gpu-viewer")
    mm = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    fn = functools.partial(gk.matmul_mgpu, tm=64, tn=64, tk=64, stages=2)
    (kernel,) = gpu.analyse(fn, mm, mm, chip="h200")
    kernel.to_html(root / "mgpu.html")

    with serve_folder(root) as url:
        yield f"{url}mgpu.html", kernel


@pytest.mark.parametrize("width", [1280, 390])
def test_gpu_kernel_shows_gpu_memories_and_events(browser, kernel_url, width):
    url, kernel = kernel_url
    context = browser.new_context(viewport={"width": width, "height": 900})
    w = watch(context)
    try:
        page = w.page
        page.goto(url)
        viewer = page.locator(".ks-viewer")
        lanes = viewer.locator("[data-lane]").evaluate_all("els => els.map(e => e.dataset.lane)")
        assert lanes == ["global", "shared", "registers", "warpgroups", "cost"], lanes
        # event 0 is the prologue's TMA copy of A's first tile; two copies later, the wait
        status = viewer.locator("[role=status]")
        first = kernel.events[0]
        assert status.inner_text().startswith(
            f"event 0: warpgroup 0: loop 0 step 0: TMA copy {first.src} → {first.dst} "
            "(global → shared memory), 8 KiB, lands on"), status.inner_text()
        assert set(viewer.locator(".ks-slot.ks-active").evaluate_all(
            "els => els.map(e => e.dataset.buffer)")) == {first.src, first.dst, first.barrier}
        wait = next(i for i, e in enumerate(kernel.events) if e.kind == "barrier_wait")
        for _ in range(wait):
            viewer.locator(".ks-next").click()
        assert viewer.get_attribute("data-step") == str(wait)
        assert f"waits on {first.barrier}" in status.inner_text()
        text = viewer.inner_text()
        for words in ("global memory", "shared memory", "registers", "TMA copy global → shared",
                      "barrier wait", f"{kernel.smem_bytes / 1024:.3g} KiB per CTA"):
            assert words in text, words
        assert not re.search(r"VMEM|SMEM|HBM|scalar", text), re.findall(
            r".{30}(?:VMEM|SMEM|HBM|scalar).{30}", text)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert small_labels(page) == []
        assert page.evaluate(CUT_OR_OVERLAPPED) == []
        SHOTS.mkdir(parents=True, exist_ok=True)
        viewer.screenshot(path=SHOTS / f"viewer-mosaic-gpu-{width}.png")
    finally:
        context.close()
    w.check()
