"""Where lesson 8's flash attention spends the time JAX's bundled kernel does not (issue 34).

On the TPU v5e, JAX's bundled flash attention with 512 blocks ran in 0.36-0.57 of kernelsim's
estimate while lesson 8's kernel, with the same grid, bytes and FLOPs, matched it
(``bench/recorded/tpu_perf-v5e.json``). This times lesson 8's kernel beside variants that each
change one thing the bundled kernel does differently, and the bundled kernel itself:

- ``lesson``: lesson 8's ``flash_kernel`` as the lesson writes it (``q @ k.T`` with the
  transpose written out, the running max and sum as ``(bq, 1)`` scratch);
- ``nt_dot``: the scores as one ``lax.dot_general`` contracting both operands' last axis (the
  bundled kernel's form: no transpose written in the body);
- ``nt_dot_lane_dense``: that, and the running max and sum kept as ``(bq, 128)`` rows whose
  lanes all hold the same value (the bundled kernel's ``MIN_BLOCK_SIZE`` layout);
- ``nt_dot_tiled_stats``: that, with the rows widened to the scores' and the accumulator's
  width by ``jnp.tile`` (a copy of whole vregs, as the bundled kernel does) where the others
  broadcast one column across the lanes;
- ``bundled``: ``jax.experimental.pallas.ops.tpu.flash_attention``.

Each row has the chip's device time (``kernelsim.timing.time_call``: calls inside one jitted
loop; the time of calls dispatched one by one beside it) and
kernelsim's estimate for tpu-v5e. Off a TPU every kernel runs in TPU interpret mode on a tiny
shape and nothing is timed: a check of this script, not of the chip.

    sh bench/tpu_packages.sh python3 bench/fa_probe.py --out "$OUT/fa_probe-v5e.json"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "lessons")]

import tpu_perf  # noqa: E402

from kernelsim.timing import time_call  # noqa: E402

VARIANTS = ("lesson", "nt_dot", "nt_dot_lane_dense", "nt_dot_tiled_stats", "bundled")
# the variants of tpu_perf.variant_attention, by the names the record keeps
STATISTICS = {"nt_dot": "column", "nt_dot_lane_dense": "rows", "nt_dot_tiled_stats": "tiled"}


def call(variant: str, lesson_flash, bh: int, n: int, block: int):
    """(fn, args) of one row: random bfloat16 q, k, v of (bh, n, 128)."""
    config = {"bh": bh, "n": n, "d": 128, "causal": False}
    if variant == "bundled":
        return tpu_perf.flash_call(lesson_flash, {**config, "block": block})
    config.update(bq=block, bkv=block)
    if variant != "lesson":
        config["statistics"] = STATISTICS[variant]
    return tpu_perf.flash_call(lesson_flash, config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    on_chip = not tpu_perf.interpreting()
    shapes = [(32, 2048), (8, 8192)] if on_chip else [(1, 256)]
    blocks = (128, 256, 512) if on_chip else (128,)
    _, lesson_flash = tpu_perf.lesson_kernels()
    rows = []
    for bh, n in shapes:
        for block in blocks:
            reference = None
            for variant in VARIANTS:
                if variant == "bundled" and not on_chip:
                    continue  # JAX's bundled kernel has no interpret switch
                fn, args = call(variant, lesson_flash, bh, n, block)
                row = {"variant": variant, "bh": bh, "n": n, "block": block,
                       "estimated_s": tpu_perf.estimate(fn, args)["estimated_seconds"]}
                try:
                    out = np.asarray(jax.jit(fn)(*args), np.float32).reshape(bh, n, 128)
                    reference = out if reference is None else reference
                    row["max_abs_diff_from_lesson"] = float(np.max(np.abs(out - reference)))
                    if on_chip:
                        timed = time_call(fn, args)
                        row["measured_s"], row["dispatched_s"] = timed.device_s, timed.dispatched_s
                except Exception as e:  # a refused variant is recorded, not fatal
                    row["error"] = tpu_perf.first_line(e)
                rows.append(row)
                print(json.dumps(row), flush=True)
    record = {"commit": tpu_perf.commit(), "jax": jax.__version__,
              "device": jax.devices()[0].device_kind, "rows": rows}
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
