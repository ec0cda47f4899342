"""How fast kernelsim's viewer is, measured in Chromium (Debian's, driven by playwright).

Rows:
- playback: the standalone viewer of a 4,096-step trace (a 2048^3 f32 matmul, 128^3 blocks)
  playing at its "max" speed (one step per animation frame) for 4 s; steps advanced / time.
- draw per step: the same page, 2,000 single steps driven from the page's script, each followed
  by a forced layout (``offsetHeight``); median milliseconds per step.
- standalone size: bytes of ``Trace.to_html()`` for that trace (both models, every chip).
- live step round trip: ``Trace.show()`` in a running JupyterLab (64-step matmul); a click on
  "next" sends the step to the kernel, whose observer answers with a custom message; median of
  40 clicks, from the click to the answer's arrival in the page.
- live model switch: selecting the gpu model until the kernel's recomputed data is drawn.
Usage: python bench/views.py
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax.numpy as jnp

import kernelsim
from kernelsim import examples

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "site"))
from _report import write  # noqa: E402
from sitetools import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    notebook,
    open_notebook,
    run_cell,
    start_lab,
)

LIVE_CELLS = ("""\
import jax.numpy as jnp
import kernelsim
from kernelsim import examples

x = jnp.ones((512, 512), jnp.float32)
viewer = kernelsim.trace(examples.matmul, x, x).show()
viewer""", """\
# the bench's echo: answer every step the browser sends
viewer.observe(lambda change: viewer.send({"echo": change["new"]}), names="step")""")

# Page scripts reach the first viewer through its host element, which keeps the Viewer.
ROUND_TRIPS_JS = """async (n) => {
  const host = document.querySelector('.ks-viewer').parentElement;
  const model = host.ksViewer.model, times = [];
  for (let i = 0; i < n; i++) {
    const want = (host.ksViewer.cur + 1) % 60;
    const answered = new Promise((resolve) => {
      const on = (msg) => { if (msg.echo === want) { model.off('msg:custom', on); resolve(); } };
      model.on('msg:custom', on);
    });
    const t0 = performance.now();
    host.ksViewer.go(want);
    await answered;
    times.push(performance.now() - t0);
  }
  return times; }"""

MODEL_SWITCH_JS = """async () => {
  const host = document.querySelector('.ks-viewer').parentElement;
  const model = host.ksViewer.model;
  const drawn = new Promise((resolve) => model.on('change:data', () =>
    requestAnimationFrame(() => resolve())));
  const t0 = performance.now();
  const select = host.querySelector('.ks-model');
  select.value = 'gpu';
  select.dispatchEvent(new Event('change'));
  await drawn;
  return performance.now() - t0; }"""

DRAW_JS = """(n) => {
  const v = document.querySelector('.ks-viewer').parentElement.ksViewer, times = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    v.go((v.cur + 1) % v.n);
    document.body.offsetHeight;
    times.push(performance.now() - t0);
  }
  return times; }"""


def standalone_rows(browser, tmp: Path) -> list[dict]:
    x = jnp.zeros((2048, 2048), jnp.float32)
    t = kernelsim.trace(examples.matmul, x, x)
    start = time.perf_counter()
    page_html = t.to_html(tmp / "big.html")
    built = time.perf_counter() - start
    steps = t.calls[0].steps
    page = browser.new_page(viewport={"width": 800, "height": 900})
    page.goto((tmp / "big.html").as_uri())
    page.select_option(".ks-speed", "0")
    page.click(".ks-play")
    start = time.perf_counter()
    page.wait_for_timeout(4000)
    played = int(page.locator(".ks-viewer").get_attribute("data-step"))
    seconds = time.perf_counter() - start
    page.click(".ks-play")
    draw = page.evaluate(DRAW_JS, 2000)
    page.close()
    shown = 'data-shown-steps="4096"' in page_html
    return [
        {"view": "standalone playback", "steps": steps, "value": round(played / seconds, 1),
         "unit": "steps/s", "detail": "max speed, 800 px viewport, 4 s", "goal": ">= 30"},
        {"view": "standalone draw per step", "steps": steps,
         "value": round(statistics.median(draw), 2), "unit": "ms (median)",
         "detail": f"p90 {sorted(draw)[int(len(draw) * 0.9)]:.2f} ms, 2,000 steps",
         "goal": "-"},
        {"view": "standalone size", "steps": steps, "value": len(page_html.encode()),
         "unit": "bytes", "detail": ("all steps" if shown else "steps sampled")
         + f", both models, every chip, built in {built:.2f} s", "goal": "<= 1,000,000"},
    ]


def live_rows(browser, tmp: Path) -> list[dict]:
    notebook(tmp / "bench.ipynb", *LIVE_CELLS)
    with open(tmp / "lab.log", "w") as log:
        proc, base, token = start_lab(tmp, log)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        open_notebook(page, f"{base}/lab/tree/bench.ipynb?token={token}")
        run_cell(page, 0)
        page.locator(".jp-OutputArea-output .ks-viewer").wait_for(timeout=120_000)
        run_cell(page, 1)
        page.locator(".jp-NotebookPanel .jp-CodeCell").nth(1).locator(
            ".jp-InputPrompt").filter(has_text="[2]").wait_for(timeout=30_000)
        page.evaluate(ROUND_TRIPS_JS, 5)  # warm-up
        trips = page.evaluate(ROUND_TRIPS_JS, 40)
        switch = page.evaluate(MODEL_SWITCH_JS)
        page.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return [
        {"view": "live step round trip", "steps": 64, "value": round(statistics.median(trips), 1),
         "unit": "ms (median)", "detail": f"p90 {sorted(trips)[int(len(trips) * 0.9)]:.1f} ms, "
         "40 steps, JupyterLab", "goal": "<= 100"},
        {"view": "live model switch", "steps": 64, "value": round(switch, 1), "unit": "ms",
         "detail": "tpu -> gpu, recomputed in the kernel", "goal": "-"},
    ]


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        rows = standalone_rows(browser, Path(tmp)) + live_rows(browser, Path(tmp))
        browser.close()
    write("views", rows)


if __name__ == "__main__":
    main()
