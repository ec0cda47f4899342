"""kernelsim's estimate beside the chip's time, and the compiler's verdicts, on a TPU.

Runs on the TPU machine (Python 3.11, jax 0.10.2 + libtpu, only jax and numpy beside this
repository; lessons/_course.py also wants matplotlib) and writes ``tpu_perf-<chip>.json`` to
``--out`` (``$OUT`` on the device machine):

- ``rows``: one per timed kernel -- lesson 7's matmul over block shapes and sizes, lesson 8's
  flash attention over block sizes, causal and not, JAX's bundled
  ``jax.experimental.pallas.ops.tpu.flash_attention`` (held out of any fit), elementwise and
  reduction kernels. Each has ``kernel``, ``family`` (matmul, flash_attention, elementwise,
  reduction, other), ``config``, ``measured_s`` (the device time per call,
  ``kernelsim.timing.device_time``: calls inside one jitted loop, median of ``--repeats``),
  ``dispatched_s`` (per call when dispatched one by one from Python: device time plus the
  host's dispatch, shown beside it and never fitted), ``loop_calls``, ``estimated_s``
  (kernelsim's, for tpu-v5e), ``fitted`` (whether a time-model fit may use it) and kernelsim's
  terms (``kernelsim``). A config the compiler refuses is a
  row with ``error`` and no time.
- ``vmem``: lesson 7's matmul at 4096 over block shapes at the default scoped VMEM limit:
  compiled or Mosaic's message, beside kernelsim's footprint and whether it warned.
- ``lint``: copy kernels over packed and unpacked block shapes: compiled and exact, or the
  error, beside kernelsim's block-shape warning.

``--re-estimate FILE`` runs nothing on a chip: it re-estimates every row of a recorded
``FILE`` with the current kernelsim (the configs are in the rows; kernelsim needs no chip),
rewrites its ``estimated_s`` and ``kernelsim`` terms and the vmem and lint sweeps' kernelsim
verdicts (the chip's measurements and verdicts untouched), and prints the ratio table with
each family's range, fitted rows apart from held-out ones.

``--fit FILE`` runs nothing on a chip either: it refits the TPU time model's constants on
``FILE``'s fitted rows (``fit_constants``: the worst |log(measured / estimated)| minimised
with numpy only) and prints them beside chips.py's; it changes no file.

The timing is ``kernelsim.timing.time_call`` (device time; the dispatched time beside it),
which ``kernelsim.run(..., measure=True)`` uses too.

``--smoke`` runs a tiny sweep (on a CPU in interpret mode; JAX's bundled kernel is traced but
not timed there) to check the script and its JSON. Prints the ratio table at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lessons")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import kernelsim  # noqa: E402
from kernelsim.cost.estimate import TimeConstants, TimeTerms, fitted_seconds  # noqa: E402
from kernelsim.cost.lint import BLOCK_SHAPE_REJECTED, SCOPED_VMEM, rule_of  # noqa: E402
from kernelsim.timing import time_call  # noqa: E402

CHIP = "tpu-v5e"
from bench.model_kernels import HELD_OUT, VMEM_PROBES  # noqa: E402

FAMILIES = ("matmul", "flash_attention", "elementwise", "reduction", "other", *HELD_OUT)
MATMUL_BLOCKS = [(128, 128, 128), (256, 256, 256), (512, 512, 512), (512, 1024, 1024),
                 (256, 512, 512), (512, 256, 512), (1024, 512, 512), (256, 1024, 256)]
MATMUL_SIZES = {4096: True, 8192: True, 2048: False}  # n -> fitted (2048 held out)
FLASH_BLOCKS = [(128, 128), (256, 256), (512, 256), (512, 512), (1024, 512)]
FLASH_SHAPES = [(32, 2048), (16, 4096), (8, 8192)]  # (batch x heads, sequence), d = 128
VMEM_BLOCKS = [(512, 1024, 1024), (1024, 512, 1024), (1024, 768, 1024), (1024, 896, 1024),
               (1024, 1024, 1024), (512, 2048, 1024), (1024, 1280, 1024), (1024, 1536, 1024),
               (2048, 512, 1024), (768, 1024, 1024), (1024, 640, 1024), (512, 1536, 1024)]
LINT_CASES = [((rows_total, 256), (rows, 256), dtype)
              for dtype in ("int8", "uint8", "float16", "bfloat16", "int16", "float32")
              for rows_total, rows in ((32, 8), (32, 16), (64, 32), (32, 32), (8, 8),
                                       (16, 16), (64, 48))]


def interpreting() -> bool:
    return jax.default_backend() != "tpu"


def estimate(fn, args) -> dict:
    """kernelsim's figures for the call(s) ``fn(*args)`` makes, summed over calls."""
    calls = kernelsim.trace(fn, *args, chip=CHIP).to_dict()["calls"]
    keys = ("estimated_seconds", "compute_seconds", "memory_seconds", "overhead_seconds",
            "flops", "hbm_read_bytes", "hbm_write_bytes", "steps")
    out = {k: sum(c[k] for c in calls) for k in keys}
    out["mosaic_vmem_bytes"] = max(c["mosaic_vmem_bytes"] for c in calls)
    out["warnings"] = [w for c in calls for w in c["warnings"]]
    return out


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' / '.join(str(e).splitlines()[:3])}"[:400]


def row(kernel, family, config, fn, args, fitted, opts) -> dict:
    """Time ``fn(*args)`` compiled and estimate it; a refusal becomes the row's error."""
    assert family in FAMILIES
    est = estimate(fn, args)
    out = {"kernel": kernel, "family": family, "config": config, "fitted": fitted,
           "estimated_s": est.pop("estimated_seconds"), "kernelsim": est,
           "measured_s": None, "dispatched_s": None}
    if opts.get("untimed"):
        out["error"] = "not timed here: " + opts["untimed"]
        return out
    if time.perf_counter() > opts["deadline"]:
        out["error"] = "not timed: the sweep's --budget-s was spent"
        return out
    try:
        timed = time_call(fn, args, opts["repeats"])
        out["measured_s"], out["dispatched_s"] = timed.device_s, timed.dispatched_s
        out["loop_calls"] = timed.loop_calls
    except Exception as e:  # a refused config is recorded, not fatal
        out["error"] = first_line(e)
    return out


def lesson_kernels():
    import _course

    seven = _course.definitions("07-performance", "matmul_kernel", "matmul")
    eight = _course.definitions("08-flash-attention", "last_kv_block", "widen", "flash_step",
                                "flash_kernel", "statistics_scratch", "flash_attention",
                                SCALE=1 / 128 ** 0.5, LANES=128)
    return seven.matmul, eight.flash_attention


def matmul_call(matmul, config):
    """(fn, args) of lesson 7's matmul row ``config`` (random bfloat16 operands)."""
    n = config["n"]
    a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in range(2))
    return functools.partial(matmul, bm=config["bm"], bk=config["bk"], bn=config["bn"],
                             interpret=interpreting()), (a, b)


def matmul_rows(matmul, sizes, blocks, opts) -> list[dict]:
    rows = []
    for n, fitted in sizes.items():
        for bm, bk, bn in blocks:
            if max(bm, bk, bn) > n:
                continue
            config = {"n": n, "bm": bm, "bk": bk, "bn": bn, "dtype": "bfloat16"}
            rows.append(row("lesson7 matmul", "matmul", config, *matmul_call(matmul, config),
                            fitted, opts))
    return rows


LANES = 128  # a row of lane-replicated statistics, as JAX's bundled kernel keeps them


STATISTICS = ("column", "rows", "tiled")  # how variant_kernel keeps its running max and sum


def variant_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, denom_ref, acc_ref, *, scale, statistics):
    """Lesson 8's non-causal body with the scores as an NT ``dot_general``. ``statistics``:
    ``"column"``, the running max and sum as ``(bq, 1)`` (the lesson's); ``"rows"``,
    ``(bq, LANES)`` rows of one repeated value, one column of which broadcasts over the scores
    and the accumulator; ``"tiled"``, those rows widened by ``jnp.tile``, so no value crosses
    lanes. The last step divides by one column of the rows either way."""
    kv_step = pl.program_id(2)

    def widen(stat, width):
        """``stat`` as wide as ``width`` lanes, as ``statistics`` says."""
        if statistics == "tiled":
            return jnp.tile(stat, (1, width // LANES))
        return stat[:, :1] if statistics == "rows" else stat

    @pl.when(kv_step == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        denom_ref[...] = jnp.zeros_like(denom_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    p = jnp.exp(s - widen(m_new, s.shape[1]))
    alpha = jnp.exp(m_prev - m_new)
    denom_ref[...] = alpha * denom_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = widen(alpha, acc_ref.shape[1]) * acc_ref[...] + jnp.dot(
        p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kv_step == pl.num_programs(2) - 1)
    def _finalize():
        denom = denom_ref[...] if statistics == "column" else denom_ref[...][:, :1]
        o_ref[...] = (acc_ref[...] / denom).astype(o_ref.dtype)


def variant_attention(q, k, v, *, bq, bkv, statistics, interpret):
    """``variant_kernel`` over lesson 8's grid (heads, query blocks, key blocks)."""
    heads, n, d = q.shape
    stat = 1 if statistics == "column" else LANES
    return pl.pallas_call(
        functools.partial(variant_kernel, scale=1 / d ** 0.5, statistics=statistics),
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


def flash_call(flash, config):
    """(fn, args) of a flash-attention row ``config``: lesson 8's kernel (``bq``/``bkv``),
    with ``statistics`` its variant (``variant_attention``; the recorded rows: ``"tiled"``,
    lane-replicated rows widened by ``jnp.tile``), or JAX's bundled one (``block``);
    random bfloat16 q, k, v of (bh, n, d)."""
    bh, n, d = config["bh"], config["n"], config["d"]
    q, k, v = (jax.random.normal(jax.random.key(i), (bh, n, d), jnp.bfloat16) for i in range(3))
    if "statistics" in config:  # bench/fa_probe.py's variant, non-causal
        return functools.partial(variant_attention, bq=config["bq"], bkv=config["bkv"],
                                 statistics=config["statistics"],
                                 interpret=interpreting()), (q, k, v)
    if "block" not in config:
        # lanes: the width of the running max and sum; rows recorded without it (2026-12-05)
        # timed lesson 8's kernel as it was then, with (bq, 1) columns
        return functools.partial(flash, bq=config["bq"], bkv=config["bkv"],
                                 causal=config["causal"], lanes=config.get("lanes", 1),
                                 interpret=interpreting()), (q, k, v)
    from jax.experimental.pallas.ops.tpu import flash_attention as bundled

    blk = config["block"]
    sizes = bundled.BlockSizes(block_q=blk, block_k_major=blk, block_k=blk, block_b=1)
    fn = functools.partial(bundled.flash_attention, causal=config["causal"],
                           sm_scale=1 / d ** 0.5, block_sizes=sizes)
    return fn, tuple(x.reshape(1, bh, n, d) for x in (q, k, v))


def flash_rows(flash, shapes, blocks, opts, bundled_sizes) -> list[dict]:
    rows = []
    untimed = "JAX's bundled kernel has no interpret switch" if interpreting() else None
    for bh, n in shapes:
        for causal in (False, True):
            for bq, bkv in blocks:
                config = {"bh": bh, "n": n, "d": 128, "bq": bq, "bkv": bkv, "causal": causal}
                rows.append(row("lesson8 flash_attention", "flash_attention", config,
                                *flash_call(flash, config), True, opts))
            for blk in bundled_sizes:
                config = {"bh": bh, "n": n, "d": 128, "block": blk, "causal": causal}
                rows.append(row("jax bundled flash_attention", "flash_attention", config,
                                *flash_call(flash, config), False, {**opts, "untimed": untimed}))
    return rows


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _row_sum_kernel(x_ref, o_ref):
    o_ref[...] = jnp.sum(x_ref[...], axis=1, keepdims=True)


def elementwise_call(kernel, config):
    """(fn, args) of an ``add`` or ``row sum`` row ``config``: float32 (rows, cols) in
    row blocks of ``block``."""
    (rows_n, cols), br = config["shape"], config["block"]
    x = jax.random.normal(jax.random.key(2), (rows_n, cols), jnp.float32)
    spec = pl.BlockSpec((br, cols), lambda i: (i, 0))
    if kernel == "add":
        return pl.pallas_call(_add_kernel, grid=(rows_n // br,), in_specs=[spec, spec],
                              out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=interpreting()), (x, x)
    return pl.pallas_call(
        _row_sum_kernel, grid=(rows_n // br,), in_specs=[spec],
        out_specs=pl.BlockSpec((br, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows_n, 1), x.dtype), interpret=interpreting()), (x,)


def elementwise_and_reduction_rows(sizes, blocks, opts, fitted: bool = False) -> list[dict]:
    rows = []
    for rows_n, cols in sizes:
        for br in blocks:
            if br > rows_n:
                continue
            config = {"shape": [rows_n, cols], "block": br}
            for kernel, family in (("add", "elementwise"), ("row sum", "reduction")):
                rows.append(row(kernel, family, config, *elementwise_call(kernel, config),
                                fitted, opts))
    return rows


# The model sweep (--model): kernelsim's time model on device time. The families it is fitted
# on (lesson 7's matmul at n = 4096 and 8192, lesson 8's flash attention and its variant with
# tiled statistics, elementwise add and row sum), rows of them held out (lesson 7's matmul at
# n = 2048, JAX's bundled flash attention), and seven families the fit never sees
# (bench/model_kernels.py HELD_OUT): (family, config) below.
MODEL_MATMUL_BLOCKS = [(256, 256, 256), (512, 512, 512), (512, 1024, 1024), (1024, 512, 512),
                       (256, 512, 512)]
MODEL_FLASH_BLOCKS = [(256, 256), (512, 512), (1024, 512)]
ROWS_SHAPES = [([4096, 4096], 64), ([4096, 4096], 256), ([16384, 1024], 512)]
HELD_OUT_CONFIGS = [
    *((f, {"shape": shape, "block": b}) for f in ("softmax", "layer_norm", "fused_elementwise")
      for shape, b in ROWS_SHAPES),
    *(("transpose", {"n": n, "block": b}) for n, b in ((4096, 256), (4096, 512), (8192, 512))),
    *(("matmul_dtype", {"n": n, "bm": bm, "bk": bk, "bn": bn, "dtype": dtype,
                        "precision": precision})
      for dtype, precision, n, (bm, bk, bn) in (
          ("float32", "DEFAULT", 2048, (512, 512, 512)),
          ("float32", "DEFAULT", 4096, (512, 512, 512)),
          ("float32", "DEFAULT", 4096, (256, 512, 512)),
          ("float32", "HIGH", 2048, (512, 512, 512)),
          ("float32", "HIGHEST", 2048, (512, 512, 512)),
          ("float32", "HIGHEST", 4096, (512, 512, 512)),
          ("float32", "HIGHEST", 4096, (256, 512, 512)),
          ("int8", "DEFAULT", 2048, (256, 256, 256)),
          ("int8", "DEFAULT", 4096, (512, 512, 512)),
          ("int8", "DEFAULT", 4096, (512, 1024, 1024)),
          ("int8", "DEFAULT", 8192, (512, 1024, 1024)))),
    *(("batched_matmul", {"batch": g, "n": n, "k": k, "bm": b, "bn": b})
      for g, n, k, b in ((16, 1024, 1024, 256), (16, 1024, 1024, 512), (64, 512, 128, 512))),
    *(("gather", {"vocab": v, "dim": d, "tokens": t})
      for v, d, t in ((32768, 1024, 2048), (8192, 4096, 1024))),
]
# kernel -> the configs whose VMEM the compiler is asked for (vmem_figures): the VMEM sweep's
# matmuls, the held-out kernels, and the computations of PallasBench's three kernels that
# kernelsim warned about on tpu-v6e (issue 51): rms_norm_residual with (128, 8192) float32
# blocks (33.56 MB counted), sigmoid_bce at PallasBench's (2048, 1024), one block (41.9 MB),
# pairwise_distance at its (256, 32) (34.2 MB)
VMEM_FIGURE_CONFIGS = [
    *(("matmul_dtype", {"n": 4096, "bm": bm, "bk": bk, "bn": bn, "dtype": "bfloat16"})
      for bm, bk, bn in ((512, 1024, 1024), (1024, 896, 1024), (1024, 1024, 1024),
                         (2048, 512, 1024))),
    ("matmul_dtype", {"n": 4096, "bm": 512, "bk": 512, "bn": 512, "dtype": "float32",
                      "precision": "HIGHEST"}),
    ("matmul_dtype", {"n": 4096, "bm": 512, "bk": 1024, "bn": 1024, "dtype": "int8"}),
    *((f, {"shape": [4096, 4096], "block": b}) for f in ("softmax", "layer_norm",
                                                          "fused_elementwise")
      for b in (256, 1024)),
    ("transpose", {"n": 4096, "block": 1024}),
    ("batched_matmul", {"batch": 16, "n": 1024, "k": 1024, "bm": 512, "bn": 512}),
    ("rms_norm_residual", {"shape": [2048, 8192], "block": 128}),
    ("rms_norm_residual", {"shape": [2048, 1024], "block": 128}),
    ("sigmoid_bce", {"shape": [2048, 1024], "block": 2048}),
    ("sigmoid_bce", {"shape": [1024, 1024], "block": 1024}),
    ("pairwise_distance", {"shape": [256, 32]}),
]
PROBE_LIMIT_BYTES = 1 << 20  # the vmem_limit_bytes the probes compile under: every one passes it


def model_rows(matmul, flash, opts, smoke: bool = False) -> list[dict]:
    """The model sweep's rows (``MODEL_*``, ``HELD_OUT_CONFIGS``); ``smoke``: one small row of
    each family."""
    if smoke:
        rows = matmul_rows(matmul, {256: True}, [(128, 128, 128)], opts)
        rows += flash_rows(flash, [(1, 256)], [(128, 128)], opts, [])
        rows += elementwise_and_reduction_rows([(64, 256)], [32], opts)
        held = [(f, c) for f, c in HELD_OUT_SMOKE]
    else:
        rows = matmul_rows(matmul, MATMUL_SIZES, MODEL_MATMUL_BLOCKS, opts)
        rows += flash_rows(flash, FLASH_SHAPES, MODEL_FLASH_BLOCKS, opts, [512])
        rows += [row("lesson8 flash_attention tiled statistics", "flash_attention",
                     config, *flash_call(flash, config), True, opts)
                 for bh, n in FLASH_SHAPES
                 for config in [{"bh": bh, "n": n, "d": 128, "bq": 512, "bkv": 512,
                                 "causal": False, "statistics": "tiled"}]]
        rows += elementwise_and_reduction_rows([(4096, 4096), (16384, 1024)], [64, 256, 1024],
                                               opts, fitted=True)
        held = HELD_OUT_CONFIGS
    rows += [row(family, family, config, *HELD_OUT[family](config, interpreting()), False, opts)
             for family, config in held]
    return rows


HELD_OUT_SMOKE = [
    ("softmax", {"shape": [64, 256], "block": 32}),
    ("layer_norm", {"shape": [64, 256], "block": 32}),
    ("fused_elementwise", {"shape": [64, 256], "block": 32}),
    ("transpose", {"n": 256, "block": 128}),
    ("matmul_dtype", {"n": 256, "bm": 128, "bk": 128, "bn": 128, "dtype": "float32",
                      "precision": "HIGHEST"}),
    ("matmul_dtype", {"n": 256, "bm": 128, "bk": 128, "bn": 128, "dtype": "int8"}),
    ("batched_matmul", {"batch": 2, "n": 256, "k": 128, "bm": 128, "bn": 128}),
    ("gather", {"vocab": 64, "dim": 128, "tokens": 16})]


def vmem_figures(configs, limit: int = PROBE_LIMIT_BYTES, compile_: bool = True,
                 over_buffers: int | None = None) -> list[dict]:
    """Compile (never run) each probe with ``vmem_limit_bytes=limit`` (``over_buffers``: at
    kernelsim's buffers plus that many bytes instead) beside kernelsim's footprint on tpu-v5e
    (``compile_`` False: kernelsim's side only). Mosaic allocates a kernel's VMEM in pieces
    and a refusal names the total at the piece that crossed the limit
    (``compiler_vmem_bytes``): under a small limit, the first pieces (the scratch, the
    pipeline's buffers); at the buffers plus a margin, a kernel that compiles keeps no more
    than the margin beside its buffers, and one refused says what it kept."""
    out = []
    for kernel, config in configs:
        build = VMEM_PROBES[kernel]
        fn, args = build(config, interpreting())
        call = kernelsim.trace(fn, *args, chip=CHIP).calls[0]
        at = limit if over_buffers is None else call.cost.vmem_bytes + over_buffers
        figure = {"kernel": kernel, "config": config, "limit_bytes": at,
                  "kernelsim_mosaic_vmem_bytes": call.cost.mosaic_vmem_bytes,
                  "kernelsim_buffers_bytes": call.cost.vmem_bytes,
                  "kernelsim_body_values_bytes": call.cost.body_values_vmem_bytes}
        if compile_:
            limited, args = build(config, interpreting(), pltpu.CompilerParams(
                vmem_limit_bytes=at,
                **({"dimension_semantics": ("parallel", "parallel", "arbitrary")}
                   if kernel == "matmul_dtype" else {})))
            try:
                jax.jit(limited).lower(*args).compile()
                figure["compiled"], figure["compiler_message"] = True, None
            except Exception as e:  # the refusal is the figure
                figure["compiled"] = False
                figure["compiler_message"] = f"{type(e).__name__}: {e}"[:6000]
            figure["compiler_vmem_bytes"] = compiler_vmem_bytes(figure["compiler_message"])
        out.append(figure)
    return out


def compiler_vmem_bytes(message: str | None) -> int | None:
    """The VMEM Mosaic had allocated when it refused, read from its CompileTimeScopedVmemOom
    message ("Scoped allocation with size 2.00M and limit 1.00M exceeded ..."); None when
    there is no such figure in it."""
    import re

    m = re.search(r"allocation with size ([\d.]+)([KMG]?)", message or "")
    if not m:
        return None
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])


def row_call(r, matmul, flash):
    """(fn, args) that a recorded row ``r`` timed, rebuilt from its kernel and config."""
    if r["family"] in HELD_OUT:
        return HELD_OUT[r["family"]](r["config"], interpreting())
    if r["family"] == "matmul":
        return matmul_call(matmul, r["config"])
    if r["family"] == "flash_attention":
        return flash_call(flash, r["config"])
    return elementwise_call(r["kernel"], r["config"])


def vmem_sweep(matmul, n, blocks, compile_: bool = True) -> list[dict]:
    """Compile (never run) each config at the default scoped VMEM limit (``compile_``
    False: kernelsim's side only)."""
    a = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
    zeros = jnp.zeros((n, n), jnp.bfloat16)
    out = []
    for bm, bk, bn in blocks:
        fn = functools.partial(matmul, bm=bm, bk=bk, bn=bn, interpret=interpreting())
        call = kernelsim.trace(fn, zeros, zeros, chip=CHIP).calls[0]
        verdict = {"blocks": [bm, bk, bn], "n": n,
                   "kernelsim_mosaic_vmem_bytes": call.cost.mosaic_vmem_bytes,
                   "kernelsim_warned": any(rule_of(w) == SCOPED_VMEM for w in call.warnings)}
        if not compile_:
            out.append(verdict)
            continue
        try:
            jax.jit(fn).lower(a, a).compile()
            verdict["compiled"], verdict["error"] = True, None
        except Exception as e:
            verdict["compiled"], verdict["error"] = False, first_line(e)
        out.append(verdict)
    return out


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _copy_call(shape, block, dtype):
    spec = pl.BlockSpec(block, lambda i: (i, 0))
    return pl.pallas_call(_copy_kernel, grid=(shape[0] // block[0],), in_specs=[spec],
                          out_specs=spec, out_shape=jax.ShapeDtypeStruct(shape, dtype),
                          interpret=interpreting())


def lint_rejects(shape, block, dtype) -> bool:
    """kernelsim's lint rejects the copy kernel's block (``BLOCK_SHAPE_REJECTED``)."""
    x = jnp.zeros(shape, dtype)
    warnings = kernelsim.trace(_copy_call(shape, block, dtype), x, chip=CHIP).calls[0].warnings
    return any(BLOCK_SHAPE_REJECTED in w for w in warnings)


def lint_sweep(cases) -> list[dict]:
    """Run a copy kernel over each (array, block, dtype): compiled and exact, or the error."""
    out = []
    for shape, block, dtype in cases:
        fn = _copy_call(shape, block, dtype)
        x = (jnp.arange(np.prod(shape)) % 100).reshape(shape).astype(dtype)
        verdict = {"shape": list(shape), "block": list(block), "dtype": dtype,
                   "kernelsim_rejects": lint_rejects(shape, block, dtype)}
        try:
            y = jax.block_until_ready(jax.jit(fn)(x))
            verdict["compiled"] = True
            verdict["exact"] = bool(np.array_equal(np.asarray(y), np.asarray(x)))
            verdict["error"] = None
        except Exception as e:
            verdict["compiled"], verdict["exact"], verdict["error"] = False, False, first_line(e)
        out.append(verdict)
    return out


def ratio_table(rows: list[dict]) -> str:
    lines = [f"{'kernel':28} {'config':58} {'measured ms':>11} {'est ms':>8} {'ratio':>6} fit"]
    for r in rows:
        cfg = json.dumps(r["config"], separators=(",", ":"))[:58]
        if r["measured_s"] is None:
            lines.append(f"{r['kernel']:28} {cfg:58} {'-':>11} {r['estimated_s'] * 1e3:8.3f} "
                         f"{'-':>6} {r.get('error', '')[:60]}")
            continue
        ratio = r["measured_s"] / r["estimated_s"] if r["estimated_s"] else float("nan")
        lines.append(f"{r['kernel']:28} {cfg:58} {r['measured_s'] * 1e3:11.3f} "
                     f"{r['estimated_s'] * 1e3:8.3f} {ratio:6.2f} {'yes' if r['fitted'] else 'no'}")
    return "\n".join(lines)


def ratio_ranges(rows: list[dict]) -> str:
    """measured / estimated, min-max per kernel and n (matmuls), fitted apart from held out."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r["measured_s"] is None:
            continue
        size = f" n={r['config']['n']}" if r["family"] == "matmul" else ""
        key = (r["kernel"] + size, "fitted" if r["fitted"] else "held out")
        groups.setdefault(key, []).append(r["measured_s"] / r["estimated_s"])
    return "\n".join(f"{k:36} {fit:8} {min(v):5.2f}-{max(v):5.2f} ({len(v)} rows)"
                     for (k, fit), v in groups.items())


def re_estimate(path: Path) -> dict:
    """Rewrite the kernelsim side of the recorded ``path`` with the current model."""
    recorded = json.loads(path.read_text())
    matmul, flash = lesson_kernels()
    for r in recorded["rows"]:
        est = estimate(*row_call(r, matmul, flash))
        r["estimated_s"], r["kernelsim"] = est.pop("estimated_seconds"), est
    fresh = {tuple(v["blocks"]): v for v in vmem_sweep(matmul, 4096, [
        tuple(v["blocks"]) for v in recorded.get("vmem", [])], compile_=False)}
    for v in recorded.get("vmem", []):
        for key in ("kernelsim_mosaic_vmem_bytes", "kernelsim_warned"):
            v[key] = fresh[tuple(v["blocks"])][key]
    for case in recorded.get("lint", []):
        case["kernelsim_rejects"] = lint_rejects(tuple(case["shape"]), tuple(case["block"]),
                                                 case["dtype"])
    for f in recorded.get("vmem_figures", []):
        (ours,) = vmem_figures([(f["kernel"], f["config"])], f["limit_bytes"], compile_=False)
        f.update(ours, compiler_vmem_bytes=compiler_vmem_bytes(f["compiler_message"]))
    recorded["estimated_at"] = commit()
    path.write_text(json.dumps(recorded, indent=1) + "\n")
    print(ratio_table(recorded["rows"]))
    print(ratio_ranges(recorded["rows"]))
    return recorded


FIT_START = {  # the coarse grid the fit starts from: datasheet-neutral guesses, not chips.py's
    "call_seconds": (10e-6, 50e-6, 200e-6), "per_step_seconds": (0.1e-6, 0.35e-6, 1e-6),
    "idle_step_seconds": (0.01e-6, 0.1e-6, 0.35e-6), "mxu_efficiency": (0.6, 0.8, 1.0),
    "vector_vregs_per_second": (0.5e9, 2e9, 8e9), "lane_broadcast_seconds": (0.5e-9, 3e-9, 10e-9),
    "dma_efficiency": (0.6, 0.8, 1.0)}
AT_MOST_ONE = ("mxu_efficiency", "dma_efficiency")  # shares of a peak


def fit_terms(rows: list[dict]) -> tuple[TimeTerms, np.ndarray]:
    """Every call of ``rows`` (kernelsim's ``TimeTerms`` on tpu-v5e, as numpy arrays) and the
    row each belongs to."""
    matmul, flash = lesson_kernels()
    terms, owner = [], []
    for i, r in enumerate(rows):
        fn, args = row_call(r, matmul, flash)
        for call in kernelsim.trace(fn, *args, chip=CHIP).calls:
            terms.append(call.cost.time_terms)
            owner.append(i)
    return TimeTerms(*(np.array([getattr(t, f.name) for t in terms], float)
                       for f in dataclasses.fields(TimeTerms))), np.array(owner)


def log_ratios(k: TimeConstants, terms: TimeTerms, owner: np.ndarray,
               measured: np.ndarray) -> np.ndarray:
    """log(measured / estimated) per row under the constants ``k``."""
    compute, memory, overhead = fitted_seconds(terms, k)
    estimated = np.bincount(owner, np.maximum(compute, memory) + overhead, len(measured))
    return np.log(measured / estimated)


def worst_log_ratio(k: TimeConstants, terms: TimeTerms, owner: np.ndarray,
                    measured: np.ndarray) -> float:
    """max over rows of |log(measured / estimated)| under the constants ``k``."""
    return float(np.max(np.abs(log_ratios(k, terms, owner, measured))))


def pattern_search(score, x: list[float], capped: list[bool]) -> list[float]:
    """A local minimum of ``score`` from ``x``: scale one constant, or two at once (a worst
    case that two rows share moves only so), up or down by a factor shrinking from 2 to
    1.0005 while the score improves; a ``capped`` constant stays at most 1."""
    n = len(x)
    moves = [((i, s),) for i in range(n) for s in (1, -1)]
    moves += [((i, s), (j, t)) for i, j in itertools.combinations(range(n), 2)
              for s in (1, -1) for t in (1, -1)]
    fx = score(x)
    for factor in (2.0, 1.4, 1.1, 1.02, 1.005, 1.0005):
        improved = True
        while improved:
            improved = False
            for move in moves:
                y = x.copy()
                for i, sign in move:
                    y[i] *= factor ** sign
                    y[i] = min(y[i], 1.0) if capped[i] else y[i]
                fy = score(y)
                if fy < fx - 1e-12:
                    x, fx, improved = y, fy, True
    return x


def fit_constants(terms: TimeTerms, owner: np.ndarray, measured: np.ndarray) -> TimeConstants:
    """The constants that minimise the worst |log(measured / estimated)| over the rows: a
    coarse grid (``FIT_START``), then ``pattern_search`` in log space from its 8 best points,
    on the p-norm of the |log ratio|s for p = 2, 8, 32 and then on their maximum; numpy
    only."""
    names = list(FIT_START)
    capped = [name in AT_MOST_ONE for name in names]

    def norm(p: float):
        """The p-norm of the rows' |log ratio| (p = inf: the worst), of the constants."""
        def score(values) -> float:
            r = np.abs(log_ratios(TimeConstants(**dict(zip(names, values, strict=True))),
                                  terms, owner, measured))
            return float(r.max() if p == np.inf else np.mean(r ** p) ** (1 / p))
        return score

    def search(start) -> list[float]:
        # the worst case alone has corners a search along the axes stops at; smoother norms
        # first, each from where the last stopped
        x = list(start)
        for p in (2, 8, 32, np.inf):
            x = pattern_search(norm(p), x, capped)
        return x

    worst = norm(np.inf)
    grid = sorted(itertools.product(*FIT_START.values()), key=worst)
    best = min((search(start) for start in grid[:8]), key=worst)
    return TimeConstants(**dict(zip(names, best, strict=True)))


def fit(path: Path) -> TimeConstants:
    """Refit the TPU time model on the rows of ``path`` marked fitted (``fit_constants``, on
    kernelsim's terms of each row today) and print the constants beside chips.py's."""
    rows = [r for r in json.loads(path.read_text())["rows"]
            if r["fitted"] and r["measured_s"] is not None]
    terms, owner = fit_terms(rows)
    measured = np.array([r["measured_s"] for r in rows])
    found = fit_constants(terms, owner, measured)
    current = TimeConstants.of(kernelsim.chips.get_chip(CHIP))
    print(f"fitted on {len(rows)} rows of {path} (worst |log(measured / estimated)|)")
    print(f"{'constant':24} {'found':>12} {'chips.py':>12}")
    for name in FIT_START:
        print(f"{name:24} {getattr(found, name):12.4g} {getattr(current, name):12.4g}")
    for label, k in (("found", found), ("chips.py", current)):
        w = worst_log_ratio(k, terms, owner, measured)
        print(f"{label:24} worst {w:.4f}: measured / estimated within "
              f"{np.exp(-w):.3f}-{np.exp(w):.3f}")
    return found


def model_sweep(matmul, flash, opts, smoke: bool, out: Path, started: float) -> dict:
    """Run the model sweep and write ``tpu_perf_model-<chip>[-smoke].json``: ``rows`` as the
    main sweep's (``model_rows``) and ``vmem_figures`` (``vmem_figures``)."""
    figures = VMEM_FIGURE_CONFIGS[-3:] if smoke else VMEM_FIGURE_CONFIGS
    result = {"commit": commit(), "jax": jax.__version__, "chip": CHIP,
              "device_kind": jax.devices()[0].device_kind, "backend": jax.default_backend(),
              "timing": f"measured_s: device time per call (kernelsim.timing.device_time: "
                        f"loops of 2k and k calls in one jitted function, the difference / k, "
                        f"median of {opts['repeats']}); dispatched_s: per call dispatched one "
                        "by one from Python (device time plus host dispatch)",
              "vmem_figures": vmem_figures(figures, compile_=not interpreting()),
              "rows": model_rows(matmul, flash, opts, smoke)}
    result["wall_s"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tpu_perf_model-{CHIP.removeprefix('tpu-')}{'-smoke' if smoke else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(ratio_table(result["rows"]))
    print(ratio_ranges(result["rows"]))
    for f in result["vmem_figures"]:
        print(f"{f['kernel']:18} {json.dumps(f['config'])[:60]:60} kernelsim "
              f"{f['kernelsim_mosaic_vmem_bytes'] / 2**20:7.2f} MiB compiler "
              f"{(f.get('compiler_vmem_bytes') or 0) / 2**20:7.2f} MiB")
    print(f"wrote {path} in {result['wall_s']:.0f} s")
    return result


def vmem_over_buffers_sweep(margin: int, out: Path) -> dict:
    """Compile every VMEM probe at kernelsim's buffers plus ``margin`` bytes and write
    ``tpu_perf_vmem-<chip>.json``."""
    result = {"commit": commit(), "jax": jax.__version__, "chip": CHIP,
              "device_kind": jax.devices()[0].device_kind, "margin_bytes": margin,
              "vmem_figures": vmem_figures(VMEM_FIGURE_CONFIGS, over_buffers=margin,
                                           compile_=not interpreting())}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tpu_perf_vmem-{CHIP.removeprefix('tpu-')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for f in result["vmem_figures"]:
        print(f"{f['kernel']:18} {json.dumps(f['config'])[:60]:60} buffers "
              f"{f['kernelsim_buffers_bytes'] / 2**20:7.2f} body "
              f"{f['kernelsim_body_values_bytes'] / 2**20:6.2f} MiB; compiled "
              f"{f.get('compiled')} {(f.get('compiler_vmem_bytes') or 0) / 2**20:7.2f} MiB")
    return result


def commit() -> str:
    """The commit measured: TPU_PERF_COMMIT when set (a device's copy of the tree may carry
    an older .git than the files it runs), else the checkout's HEAD."""
    if os.environ.get("TPU_PERF_COMMIT"):
        return os.environ["TPU_PERF_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench" / "recorded")))
    p.add_argument("--smoke", action="store_true", help="a tiny sweep to test the script")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="time no new kernel after this many seconds (still estimated)")
    p.add_argument("--re-estimate", metavar="FILE", type=Path,
                   help="re-estimate a recorded FILE with the current kernelsim (no chip)")
    p.add_argument("--model", action="store_true",
                   help="the model sweep: fitted and held-out families on device time, and "
                        "the compiler's VMEM figures (tpu_perf_model-<chip>.json)")
    p.add_argument("--vmem-over-buffers", metavar="BYTES", type=int,
                   help="only the VMEM probes, each compiled at kernelsim's buffers plus BYTES "
                        "(tpu_perf_vmem-<chip>.json)")
    p.add_argument("--fit", metavar="FILE", type=Path,
                   help="refit the TPU time model on a recorded FILE's fitted rows (no chip)")
    a = p.parse_args(argv)
    if a.fit:
        return fit(a.fit)
    if a.re_estimate:
        return re_estimate(a.re_estimate)
    started = time.perf_counter()
    opts = {"repeats": 2 if a.smoke else a.repeats,
            "deadline": started + a.budget_s}
    matmul, flash = lesson_kernels()
    if a.model:
        return model_sweep(matmul, flash, opts, a.smoke, Path(a.out), started)
    if a.vmem_over_buffers is not None:
        return vmem_over_buffers_sweep(a.vmem_over_buffers, Path(a.out))
    if a.smoke:
        plan = [
            lambda: matmul_rows(matmul, {256: True}, [(128, 128, 128)], opts),
            lambda: flash_rows(flash, [(1, 256)], [(128, 128)], opts, [128]),
            lambda: elementwise_and_reduction_rows([(64, 256)], [32], opts),
        ]
        vmem = lambda: vmem_sweep(matmul, 2048, [(512, 1024, 1024), (1024, 1024, 1024)])  # noqa: E731
        lint = lambda: lint_sweep(LINT_CASES[:3])  # noqa: E731
    else:
        plan = [
            lambda: matmul_rows(matmul, MATMUL_SIZES, MATMUL_BLOCKS, opts),
            lambda: flash_rows(flash, FLASH_SHAPES, FLASH_BLOCKS, opts, [128, 512]),
            lambda: elementwise_and_reduction_rows([(4096, 4096), (16384, 1024)],
                                                   [64, 256, 1024], opts),
        ]
        vmem = lambda: vmem_sweep(matmul, 4096, VMEM_BLOCKS)  # noqa: E731
        lint = lambda: lint_sweep(LINT_CASES)  # noqa: E731
    result = {"commit": commit(), "jax": jax.__version__, "chip": CHIP,
              "device_kind": jax.devices()[0].device_kind, "backend": jax.default_backend(),
              "timing": f"measured_s: device time per call (kernelsim.timing.device_time: "
                        f"loops of 2k and k calls in one jitted function, the difference / k, "
                        f"median of {opts['repeats']}); dispatched_s: per call dispatched one "
                        "by one from Python (device time plus host dispatch)",
              "rows": [], "vmem": vmem(), "lint": lint()}
    for step in plan:
        result["rows"] += step()
    result["wall_s"] = time.perf_counter() - started
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tpu_perf-{CHIP.removeprefix('tpu-')}{'-smoke' if a.smoke else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(ratio_table(result["rows"]))
    print(ratio_ranges(result["rows"]))
    print(f"vmem: {sum(v['compiled'] for v in result['vmem'])} of {len(result['vmem'])} "
          f"compiled; kernelsim warned {sum(v['kernelsim_warned'] for v in result['vmem'])}")
    disagree = [v for v in result["lint"] if v["kernelsim_rejects"] == v["compiled"]]
    print(f"lint: {len(disagree)} of {len(result['lint'])} disagree with the compiler")
    print(f"wrote {path} in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
