"""The viewer on kernels in a ``shard_map`` in chromium: a ring all-gather on four
interpret-mode devices (traced in a fresh Python, see tests/kernelsim/views/ici_ring.py),
shown by ``Trace.to_html``, at a desktop's and a phone's width. Its ICI lane lists the remote
copies in flight at each grid step with their devices and bytes, the call picker names each
call's device, and no label is cut, overlapped or too small. Screenshots land in
build/screenshots/ for a person to look at."""

from __future__ import annotations

import sys

import pytest
from sitetools import REPO, serve_folder, watch
from test_site_viewer import small_labels
from test_site_viewer_gpu import CUT_OR_OVERLAPPED

sys.path.insert(0, str(REPO / "tests" / "kernelsim" / "views"))
from ici_ring import DEVICES, run  # noqa: E402

pytestmark = pytest.mark.interpret

SHOTS = REPO / "build" / "screenshots"


@pytest.fixture(scope="module")
def ring_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("ici-viewer")
    run(root)
    with serve_folder(root) as url:
        yield f"{url}ring.html"


def _in_flight(viewer) -> list[str]:
    return [" ".join(t.split()) for t in viewer.locator("[data-lane=ici] .ks-slot.ks-active")
            .all_inner_texts()]


@pytest.mark.parametrize("width", [1280, 390])
def test_ici_lane_lists_the_remote_copies_in_flight_per_step(browser, ring_url, width):
    context = browser.new_context(viewport={"width": width, "height": 900})
    w = watch(context)
    try:
        page = w.page
        page.goto(ring_url)
        viewer = page.locator(".ks-viewer")
        assert viewer.locator(".ks-title").inner_text().startswith(
            "call 1: ring_kernel · device 1 · grid (4) = 4 steps")
        assert viewer.locator(".ks-call option").all_inner_texts() == [
            f"call {d}: ring_kernel · device {d}" for d in range(DEVICES)]
        lanes = viewer.locator("[data-lane]").evaluate_all("els => els.map(e => e.dataset.lane)")
        assert lanes == ["hbm", "vmem", "ici", "grid", "traffic"], lanes
        # step s: the copy started at s - 1 (waited on now) and the one started at s
        copy = "device 1 → device 2 8 KiB, semaphore recv_sems[{}] started at step {}, " \
               "waited on at step {}"
        assert _in_flight(viewer) == [copy.format(0, 0, 1)]
        assert "1 remote copy in flight over ICI" in viewer.locator("[role=status]").inner_text()
        viewer.locator(".ks-next").click()
        assert _in_flight(viewer) == [copy.format(0, 0, 1), copy.format(1, 1, 2)]
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert small_labels(page) == []
        assert page.evaluate(CUT_OR_OVERLAPPED) == []
        SHOTS.mkdir(parents=True, exist_ok=True)
        viewer.screenshot(path=SHOTS / f"viewer-ici-{width}.png")
        viewer.locator(".ks-next").click()
        viewer.locator(".ks-next").click()
        assert _in_flight(viewer) == [copy.format(2, 2, 3)]
        # another device's call: its own copies; the GPU model has no ICI lane
        page.select_option(".ks-call", "2")
        assert _in_flight(page.locator(".ks-viewer"))[0].startswith("device 2 → device 3")
        page.select_option(".ks-model", "gpu")
        assert page.locator("[data-lane=ici]").count() == 0
        assert "TPU primitive" in page.locator("[data-lane=remote]").inner_text()
    finally:
        context.close()
    w.check()
