"""The HTML player: self-contained, steps in headless Chromium, stays under 1 MB."""

import functools
import http.server
import re
import threading
from pathlib import Path

import jax.numpy as jnp
import pytest
from views_kernels import matmul

import kernelsim

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def test_page_is_self_contained_and_states_the_step_count(mm_trace, tmp_path):
    text = mm_trace.to_html(tmp_path / "p.html")
    assert (tmp_path / "p.html").read_text() == text
    assert "64 steps" in text and "<script src" not in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    frag = mm_trace.to_html(fragment=True)
    assert frag.startswith('<div class="ks-player"') and "<html" not in frag
    assert re.search(r'id="(ks-[0-9a-f]+)"', frag).group(1) != \
        re.search(r'id="(ks-[0-9a-f]+)"', mm_trace.to_html(fragment=True)).group(1)


def test_4096_step_trace_stays_under_1_mb_and_samples_above():
    x = jnp.zeros((2048, 2048), jnp.float32)
    t = kernelsim.trace(matmul, x, x)
    assert t.calls[0].steps == 4096
    page = t.to_html()
    assert len(page.encode()) < 1_000_000 and "all 4,096 steps" in page
    small = t.to_html(max_bytes=200_000)
    assert len(small.encode()) < 200_000
    m = re.search(r"showing ([\d,]+) of 4,096 steps", small)
    assert m and 2 < int(m.group(1).replace(",", "")) < 4096


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian chromium")
def test_next_advances_the_step_in_headless_chromium(mm_trace, tmp_path):
    from playwright.sync_api import sync_playwright

    mm_trace.to_html(tmp_path / "player.html")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/player.html"
    requests, errors = [], []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            assert page.inner_text(".ks-step") == "step 1 of 64"
            page.click(".ks-next")
            page.click(".ks-next")
            page.click(".ks-next")
            assert page.inner_text(".ks-step") == "step 4 of 64"
            assert "grid index (0, 0, 3)" in page.inner_text(".ks-grid")
            actions = page.eval_on_selector_all(
                "tbody tr", "rows => rows.map(r => r.dataset.operand + ':' + r.dataset.action)")
            assert actions == ["x_ref:fetch", "y_ref:fetch", "o_ref:writeback"]
            cum = int(mm_trace.calls[0].schedule.cumulative_bytes[3])
            assert f"{cum:,}" in page.inner_text(".ks-bytes")
            page.click(".ks-prev")
            assert page.inner_text(".ks-step") == "step 3 of 64"
            page.fill(".ks-slider", "63")
            page.dispatch_event(".ks-slider", "input")
            assert page.inner_text(".ks-step") == "step 64 of 64"
            browser.close()
    finally:
        server.shutdown()
    assert errors == []
    assert requests and all(u.startswith("http://127.0.0.1:") for u in requests), requests
