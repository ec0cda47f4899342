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

Each row has the chip's time (``kernelsim.timing.time_call``: medians after a warm-up) and
kernelsim's estimate for tpu-v5e. Off a TPU every kernel runs in TPU interpret mode on a tiny
shape and nothing is timed: a check of this script, not of the chip.

    sh bench/tpu_packages.sh python3 bench/fa_probe.py --out "$OUT/fa_probe-v5e.json"
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "lessons")]

import tpu_perf  # noqa: E402

from kernelsim.timing import time_call  # noqa: E402

LANES = 128  # a row of lane-replicated statistics, as the bundled kernel keeps them
VARIANTS = ("lesson", "nt_dot", "nt_dot_lane_dense", "nt_dot_tiled_stats", "bundled")


def variant_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref, *, scale, lane_dense,
                   tiled):
    """Lesson 8's non-causal body with the scores as an NT ``dot_general``; with
    ``lane_dense`` the running max and sum are ``(bq, LANES)`` rows of one repeated value, and
    with ``tiled`` too those rows are widened by ``jnp.tile``, not by a broadcast of a column."""
    kv_step = pl.program_id(2)

    @pl.when(kv_step == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        denom_ref[...] = jnp.zeros_like(denom_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
    m_prev = m_ref[...]
    if tiled:  # whole rows of LANES repeated: no value crosses lanes
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - jnp.tile(m_new, (1, s.shape[1] // LANES)))
        alpha = jnp.exp(m_prev - m_new)
        denom_ref[...] = alpha * denom_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = jnp.tile(alpha, (1, acc_ref.shape[1] // LANES)) * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
    elif lane_dense:  # one column of the repeated rows broadcasts over the scores
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_new[:, :1])
        alpha = jnp.exp(m_prev - m_new)
        denom_ref[...] = alpha * denom_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = alpha[:, :1] * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
    else:
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        denom_ref[...] = alpha * denom_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kv_step == pl.num_programs(2) - 1)
    def _finalize():
        denom = denom_ref[...][:, :1] if lane_dense or tiled else denom_ref[...]
        o_ref[...] = (acc_ref[...] / denom).astype(o_ref.dtype)


def variant_attention(q, k, v, *, bq, bkv, lane_dense, tiled, interpret):
    """``variant_kernel`` over lesson 8's grid (heads, query blocks, key blocks)."""
    heads, n, d = q.shape
    stat = LANES if lane_dense or tiled else 1
    return pl.pallas_call(
        functools.partial(variant_kernel, scale=1 / d ** 0.5, lane_dense=lane_dense,
                          tiled=tiled),
        grid=(heads, n // bq, n // bkv),
        in_specs=[pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0)),
                  pl.BlockSpec((None, bkv, d), lambda h, i, j: (h, j, 0)),
                  pl.BlockSpec((None, bkv, d), lambda h, i, j: (h, j, 0))],
        out_specs=pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0)),
        scratch_shapes=[pltpu.VMEM((bq, stat), jnp.float32), pltpu.VMEM((bq, stat), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
    )(q, k, v)


def call(variant: str, lesson_flash, bh: int, n: int, block: int):
    """(fn, args) of one row: random bfloat16 q, k, v of (bh, n, 128)."""
    config = {"bh": bh, "n": n, "d": 128, "causal": False}
    if variant == "bundled":
        return tpu_perf.flash_call(lesson_flash, {**config, "block": block})
    if variant == "lesson":
        return tpu_perf.flash_call(lesson_flash, {**config, "bq": block, "bkv": block})
    fn, args = tpu_perf.flash_call(lesson_flash, {**config, "bq": block, "bkv": block})
    return functools.partial(variant_attention, bq=block, bkv=block,
                             lane_dense=variant == "nt_dot_lane_dense",
                             tiled=variant == "nt_dot_tiled_stats",
                             interpret=tpu_perf.interpreting()), args


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
                        row["measured_s"], row["synced_s"] = time_call(jax.jit(fn), args, 12, 5)
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
