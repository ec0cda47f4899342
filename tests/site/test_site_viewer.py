"""The viewer in chromium: a standalone page from ``Trace.to_html`` (no site build needed),
then the built site's lessons, which show it through ``Trace.show()``. Every page is watched
for console errors and requests to other hosts (the ``watched`` fixture)."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from sitetools import REPO, serve_folder

import kernelsim
from kernelsim import examples
from kernelsim.views.report import seconds

MIN_LABEL_PX = 11


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    """A standalone viewer page of a 64-step matmul, served from 127.0.0.1."""
    root = tmp_path_factory.mktemp("viewer")
    x = jnp.ones((512, 512), jnp.float32)
    kernelsim.trace(examples.matmul, x, x).to_html(root / "mm.html")

    with serve_folder(root) as url:
        yield f"{url}mm.html"


def _state(page, root=".ks-viewer"):
    v = page.locator(root).first
    return {"step": v.get_attribute("data-step"),
            "status": v.locator("[role=status]").inner_text(),
            "active": v.locator(".ks-slot.ks-active").evaluate_all(
                "els => els.map(e => e.dataset.slot)"),
            # a GPU kernel's view has no traffic lane (its copies are per warpgroup)
            "bytes": v.locator("[data-lane=traffic] .ks-act").all_inner_texts()}


def small_labels(page) -> list[str]:
    """Text in the viewer drawn smaller than MIN_LABEL_PX CSS pixels."""
    return page.evaluate("""(min) => {
        const out = [];
        for (const v of document.querySelectorAll('.ks-viewer')) {
          const walk = document.createTreeWalker(v, NodeFilter.SHOW_TEXT);
          for (let n = walk.nextNode(); n; n = walk.nextNode()) {
            const el = n.parentElement;
            if (!n.textContent.trim() || !el.getClientRects().length) continue;
            const px = parseFloat(getComputedStyle(el).fontSize);
            if (px < min) out.push(`${n.textContent.trim().slice(0, 30)}: ${px}px`);
          }
        }
        return out; }""", MIN_LABEL_PX)


def test_controls_step_the_viewer_and_describe_the_step(watched, page_url):
    page = watched.page
    page.goto(page_url)
    first = _state(page)
    assert first["step"] == "0"
    assert first["status"].startswith("step 0, grid (0, 0, 0): x_ref block (0, 0) HBM→VMEM "
                                      "slot 0, 64 KiB;"), first["status"]
    page.click(".ks-next")
    second = _state(page)
    assert second["step"] == "1" and second["status"].startswith("step 1, grid (0, 0, 1)")
    assert "x_ref:1" in second["active"] and "x_ref:0" in first["active"]
    assert "o_ref block (0, 0) kept in VMEM slot 0" in second["status"]
    page.click(".ks-prev")
    assert _state(page)["step"] == "0"
    page.locator(".ks-viewer").focus()
    page.keyboard.press("End")
    assert _state(page)["step"] == "63"
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert _state(page)["step"] == "2"
    page.locator(".ks-slider").fill("40")
    assert _state(page)["step"] == "40"
    assert small_labels(page) == []


def test_model_and_chip_switch_offline(watched, page_url):
    page = watched.page
    page.goto(page_url)
    page.click(".ks-next")
    tpu = _state(page)
    page.select_option(".ks-model", "gpu")  # the page carries both models' schedules
    gpu = _state(page)
    assert gpu["step"] == "1" and "o_ref block (0, 0) written back" in gpu["status"]
    assert gpu["bytes"] != tpu["bytes"] and gpu["active"] == ["x_ref:0", "y_ref:0", "o_ref:0"]
    assert page.locator(".ks-chip").input_value() == "h100"
    roofline = page.locator(".ks-roofline").inner_text()
    page.select_option(".ks-chip", "a100")
    assert page.locator(".ks-roofline").inner_text() != roofline
    assert "a100" in page.locator(".ks-roofline").inner_text()


def test_play_advances_and_space_pauses(watched, page_url):
    """The page's clock is the test's (playwright's fake timers drive requestAnimationFrame
    and performance.now): playback moves only when the test advances time, so a loaded machine
    cannot let it run to the last step, where space plays again from the start, before the key
    press (it failed that way in a clean clone: step 3, then 63)."""
    page = watched.page
    page.clock.install()
    page.goto(page_url)
    page.select_option(".ks-speed", "60")
    page.click(".ks-play")
    page.clock.run_for(200)  # 12 steps at 60 steps/s
    assert 5 <= int(_state(page)["step"]) < 63
    page.locator(".ks-viewer").focus()
    page.keyboard.press(" ")
    stopped = _state(page)["step"]
    page.clock.run_for(2000)  # past the last step, had it still played
    assert _state(page)["step"] == stopped
    assert page.locator(".ks-play").inner_text().endswith("play")


def test_a_key_on_a_focused_button_acts_once(watched, page_url):
    """Space on the focused play button is the viewer's key and not also the button's click
    (which would play and at once pause again), and on "next" it plays rather than stepping;
    Enter is the button's own."""
    page = watched.page
    page.clock.install()
    page.goto(page_url)
    play = page.locator(".ks-play")
    play.focus()
    page.keyboard.press(" ")
    assert play.get_attribute("aria-pressed") == "true"
    page.keyboard.press(" ")
    assert play.get_attribute("aria-pressed") == "false"
    page.keyboard.press("Enter")
    assert play.get_attribute("aria-pressed") == "true"
    page.keyboard.press("Enter")
    page.locator(".ks-next").focus()
    page.keyboard.press(" ")
    assert play.get_attribute("aria-pressed") == "true" and _state(page)["step"] == "0"


def test_phone_width_has_no_horizontal_scroll(browser, page_url):
    from sitetools import watch

    context = browser.new_context(viewport={"width": 390, "height": 844})
    w = watch(context)
    try:
        w.page.goto(page_url)
        w.page.click(".ks-next")
        width = w.page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"page is {width}px wide at a 390px viewport"
        assert small_labels(w.page) == []
    finally:
        context.close()
    w.check()


def _long_named_calls(x):
    """Two calls whose names (no spaces to wrap at) are wider than a phone."""
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    for i in range(2):
        x = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                           in_specs=[spec], out_specs=spec, interpret=True,
                           name=f"a_kernel_name_longer_than_a_phone_screen_is_wide_{i}")(x)
    return x


def test_long_kernel_names_stay_inside_a_phone_width(browser, tmp_path):
    """The title and the call picker wrap or shrink an unbreakable name: the page keeps its
    width (the select's closed box shortens the name; its list shows it whole)."""
    from sitetools import watch

    kernelsim.trace(_long_named_calls, jnp.ones((16, 128))).to_html(tmp_path / "long.html")
    with serve_folder(tmp_path) as url:
        context = browser.new_context(viewport={"width": 390, "height": 844})
        w = watch(context)
        try:
            w.page.goto(f"{url}long.html")
            assert w.page.locator(".ks-call option").count() == 2
            width = w.page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"page is {width}px wide at a 390px viewport"
        finally:
            context.close()
        w.check()


def test_measured_time_shows_beside_the_estimate_at_phone_and_desktop_width(browser, tmp_path):
    """``run(..., measure=True)`` on a chip: the header says both times and their ratio, and
    at 390 px each part stays inside the viewer, on its own box (wrapped, not cut or over
    the title)."""
    from sitetools import watch

    x = jnp.ones((256, 256), jnp.float32)
    _, t = kernelsim.run(examples.matmul, x, x)
    t.calls[0].measured = kernelsim.timing.Measurement(1.5e-3, 1.6e-3, "TPU v5 lite", 10, 5)
    ratio = t.calls[0].measured_over_estimated
    estimate = seconds(t.calls[0].estimated_seconds).replace("us", "µs")
    t.to_html(tmp_path / "measured.html")
    with serve_folder(tmp_path) as url:
        for width in (1280, 390):
            context = browser.new_context(viewport={"width": width, "height": 844})
            w = watch(context)
            try:
                w.page.goto(f"{url}measured.html")
                header = w.page.locator(".ks-measured")
                assert header.inner_text() == (f"measured 1.5 ms on TPU v5 lite · estimated "
                                               f"{estimate} on tpu-v5e ({ratio:.2f}× the "
                                               "estimate)")
                assert w.page.evaluate("document.documentElement.scrollWidth") <= width
                boxes = w.page.evaluate("""() => {
                    const r = (e) => { const b = e.getBoundingClientRect();
                      return [b.left, b.top, b.right, b.bottom]; };
                    const v = document.querySelector('.ks-viewer');
                    return {viewer: r(v), title: r(v.querySelector('.ks-title')),
                            parts: [...v.querySelectorAll('.ks-measured>span')].map(r)}; }""")
                left, _, right, _ = boxes["viewer"]
                title_bottom = boxes["title"][3]
                parts = boxes["parts"]
                assert len(parts) == 3
                for a in parts:
                    assert left <= a[0] and a[2] <= right, f"{a} leaves the viewer {boxes}"
                    assert a[1] >= title_bottom, f"{a} overlaps the title {boxes}"
                for a, b in itertools.pairwise(parts):
                    assert a[2] <= b[0] or a[3] <= b[1], f"{a} and {b} overlap"
                assert small_labels(w.page) == []
            finally:
                context.close()
            w.check()


# --- the built site --------------------------------------------------------------------------

VIEWER_LESSONS = sorted(p.stem for p in (REPO / "lessons").glob("[0-9][0-9]-*.py")
                        if ".show(" in p.read_text())


def test_lessons_show_the_viewer():
    assert {"03-tiling", "06-scalar-prefetch"} <= set(VIEWER_LESSONS), VIEWER_LESSONS


@pytest.mark.parametrize("stem", VIEWER_LESSONS)
def test_lesson_viewer_advances(watched, base_url, stem):
    page = watched.page
    page.goto(f"{base_url}lessons/{stem}/")
    viewer = page.locator(".ks-viewer").first
    viewer.scroll_into_view_if_needed()
    before = _state(page)
    viewer.locator(".ks-next").click()
    after = _state(page)
    assert (before["step"], after["step"]) == ("0", "1")
    assert before["status"] != after["status"]
    column, box = page.locator("article").first.bounding_box(), viewer.bounding_box()
    assert box["width"] >= 0.9 * column["width"], "the viewer does not fill the column"
    assert box["x"] + box["width"] <= column["x"] + column["width"] + 1, "wider than the column"
    assert small_labels(page) == []


def test_scalar_prefetch_lesson_shows_vmem_and_smem_lanes(watched, base_url):
    page = watched.page
    page.goto(f"{base_url}lessons/06-scalar-prefetch/")
    viewer = page.locator(".ks-viewer").filter(has=page.locator("[data-lane=smem]")).first
    viewer.scroll_into_view_if_needed()
    assert viewer.locator("[data-lane=vmem] .ks-slot").count() >= 2
    read = viewer.locator("[data-lane=smem] .ks-cell.ks-read")
    assert read.count() >= 1
    status = viewer.locator("[role=status]").inner_text()
    assert re.search(r"SMEM read \w+\[\d+\]", status), status


@pytest.mark.parametrize("stem", VIEWER_LESSONS)
def test_lesson_page_at_phone_width_has_no_horizontal_scroll(lessons_at_390, stem):
    """Every lesson with a viewer: its controls (a call picker naming a long kernel, say)
    wrap or shrink inside a phone's width (measured scrolled to the first viewer)."""
    seen = lessons_at_390[stem]
    assert seen.measured["viewers"] > 0 and seen.problems == [], seen
    width = seen.measured["width"]
    assert width <= 390, f"the lesson page is {width}px wide at a 390px viewport"
