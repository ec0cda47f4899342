"""How long kernelsim.trace takes, against one TPU-interpret-mode run of the same kernel.

Table 1: a 1024^3 f32 matmul with 128^3 blocks (512 steps) and a 4096^3 one (32,768 steps).
Trace times are the median of 5 runs in this process after one warm-up; the interpret-mode
run is one call (its first, including compilation, which is what a learner waits for).
Table 2 ("real code"): JAX's bundled TPU Pallas ops as tests/kernelsim/test_bundled_ops.py
builds them: the *cold* trace (the first in this process for that op) against one run of the
op with every pallas_call in TPU interpret mode (``kernelsim.run(..., interpret=
InterpretParams())``, whose own analysis is a few ms of it).
Usage: python bench/trace_speed.py [--no-interpret]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim import examples as ex

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402


def _time(fn, repeat: int) -> tuple[float, float]:
    """(first call seconds, median of the next ``repeat`` calls)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-interpret", action="store_true", help="skip the interpreter run")
    args = parser.parse_args()
    rows = []
    for n in (1024, 4096):
        x = jnp.zeros((n, n), jnp.float32)
        fn = functools.partial(ex.matmul, bm=128, bk=128, bn=128)
        first, median = _time(lambda fn=fn, x=x: kernelsim.trace(fn, x, x), repeat=5)
        steps = kernelsim.trace(fn, x, x).calls[0].steps
        row = {"matmul": f"{n}^3 / 128^3", "steps": steps, "trace_first_s": first,
               "trace_median_s": median, "interpret_s": None, "speedup": None}
        if n == 1024 and not args.no_interpret:
            xr = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
            run = functools.partial(ex.matmul, bm=128, bk=128, bn=128,
                                    interpret=pltpu.InterpretParams())
            t0 = time.perf_counter()
            jax.block_until_ready(run(xr, xr))
            row["interpret_s"] = time.perf_counter() - t0
            row["speedup"] = row["interpret_s"] / median
        rows.append(row)
    write("trace_speed", rows, {"goals": {"speedup_1024": ">= 100", "trace_4096_s": "<= 2"}})
    if not args.no_interpret:
        real_code()


def real_code() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernelsim"))
    from test_bundled_ops import TPU_OPS

    rows = []
    for name, build in TPU_OPS.items():
        fn, args = build()
        t0 = time.perf_counter()
        kernelsim.trace(fn, *args)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        jax.block_until_ready(kernelsim.run(fn, *args, interpret=pltpu.InterpretParams())[0])
        interpret = time.perf_counter() - t0
        rows.append({"op": name, "trace_cold_s": cold, "interpret_s": interpret,
                     "speedup": interpret / cold})
    speedups = sorted(r["speedup"] for r in rows)
    median = statistics.median(speedups)
    rows.append({"op": "median", "trace_cold_s": None, "interpret_s": None, "speedup": median})
    write("trace_speed_real_code", rows,
          {"goals": {"median_speedup": ">= 20", "slowest_speedup": "> 1"},
           "slowest_speedup": speedups[0]})


if __name__ == "__main__":
    main()
