"""How fast the kernelsim views are: widget redraw per step and HTML player size.

Rows: the widget's per-step redraw (artist update + blit + PNG encode, median over 60 slider
moves after a warm-up) for a three-operand trace (a 512^3 f32 matmul with 128^3 blocks, 64
steps), and the HTML player's size for a 4,096-step trace (a 2048^3 matmul) and for a
32,768-step one (4096^3, which samples steps to stay under 1 MB).
Usage: python bench/views.py
"""

from __future__ import annotations

import statistics
import sys
import time

import jax.numpy as jnp

import kernelsim
from kernelsim import examples as ex

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _report import write  # noqa: E402


def main() -> None:
    from kernelsim.views.widget import Stepper

    rows = []
    x = jnp.zeros((512, 512), jnp.float32)
    t = kernelsim.trace(ex.matmul, x, x)
    stepper = Stepper(t)
    for step in range(1, 5):  # warm-up
        stepper.slider.value = step
    stepper.redraw_seconds.clear()
    for step in range(60):
        stepper.slider.value = (step * 7 + 5) % t.calls[0].steps
    ms = [s * 1e3 for s in stepper.redraw_seconds]
    rows.append({"view": "widget redraw per step", "steps": t.calls[0].steps,
                 "operands": len(t.calls[0].schedule.operands),
                 "value": statistics.median(ms), "unit": "ms (median)",
                 "detail": f"p90 {sorted(ms)[int(len(ms) * 0.9)]:.1f} ms", "goal": "<= 50 ms"})
    for n in (2048, 4096):
        x = jnp.zeros((n, n), jnp.float32)
        t = kernelsim.trace(ex.matmul, x, x)
        t0 = time.perf_counter()
        page = t.to_html()
        took = time.perf_counter() - t0
        shown = page.count("showing") and page.split("showing ", 1)[1].split(" steps")[0]
        rows.append({"view": "HTML player size", "steps": t.calls[0].steps,
                     "operands": len(t.calls[0].schedule.operands),
                     "value": len(page.encode()), "unit": "bytes",
                     "detail": (f"showing {shown} steps" if shown else "all steps")
                     + f", built in {took:.2f} s", "goal": "< 1,000,000 bytes"})
    write("views", rows)


if __name__ == "__main__":
    main()
