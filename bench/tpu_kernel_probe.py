"""Run the kernels issue 33 found failing on a TPU v5e, on the present chip, and say what each
did: compiled or not, its largest difference from plain JAX, the error when it failed.

The kernels are the instructor solutions themselves, read from ``exercises/source/`` (the
nbgrader cells, parsed here without jupytext, which the chip's machine lacks), run with only
jax and numpy. Every part runs in a child process with a time limit, one after another (one
program holds the chip at a time; this process never opens it): a core halt (kv_cache_append
reading a 2-D page table in its index map did that) kills only its child.

    python bench/tpu_kernel_probe.py --out "$OUT/tpu_kernel_probe.json"

Off a TPU (JAX_PLATFORMS=cpu) every kernel runs in TPU interpret mode: a check of this script,
not of the chip. Measurement, never assertion: the JSON records, the exit status is 0.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "exercises" / "source"
CHILD_SECONDS = 150


@functools.cache
def course_backend():
    """``kernelsim/backend.py`` (jax only), loaded without the kernelsim package, whose other
    modules need more than the chip's machine is sure to have."""
    spec = importlib.util.spec_from_file_location("course_backend",
                                                  ROOT / "kernelsim" / "backend.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def on_tpu() -> bool:
    return jax.default_backend() == "tpu"


def interpret():
    """Compiled on a TPU, TPU interpret mode elsewhere."""
    return False if on_tpu() else pltpu.InterpretParams()


def solution(assignment: str, task: str, *edits: tuple[str, str]):
    """The function ``task`` of the instructor notebook's ``<task>_solution`` cell, with
    ``edits`` (old, new) made to its source, defined in a namespace of jax and numpy only."""
    path = SOURCE / assignment / f"{assignment[3:]}.py"
    cells = re.split(r"^# %%.*$", path.read_text(), flags=re.M)
    (source,) = [c for c in cells if c.lstrip("\n").startswith(f"def {task}(")]
    for old, new in edits:
        assert old in source, (task, old)
        source = source.replace(old, new)
    scope = {"jax": jax, "jnp": jnp, "np": np, "pl": pl, "pltpu": pltpu, "math": math,
             "functools": functools, "INTERPRET": interpret(), "TPU_INTERPRET": interpret(),
             "RACES": interpret(), "tensorcores": course_backend().tensorcores}
    exec(compile(source, f"{path.name}:{task}_solution", "exec"), scope)  # noqa: S102
    return scope[task]


def measure(name: str, fn, args: tuple, expected, note: str = "") -> dict:
    """Run ``fn(*args)`` once (compile included) and compare with ``expected``."""
    start = time.perf_counter()
    try:
        out = np.asarray(jax.block_until_ready(fn(*args)), np.float64)
    except Exception as e:  # noqa: BLE001 - the failure is the measurement
        return {"name": name, "ran": False, "error": f"{type(e).__name__}: {e}"[:1500],
                "note": note}
    diff = float(np.max(np.abs(out - np.asarray(expected, np.float64))))
    return {"name": name, "ran": True, "compiled": on_tpu(), "max_abs_diff": diff,
            "seconds_first_call": round(time.perf_counter() - start, 3), "note": note}


# --------------------------------------------------------------------------- kv_cache_append
KV_FORMS = {
    "flat": (),  # the fixed solution: the page table flattened to 1-D
    "2d": (("table_ref[s * slots + pos_ref[s] // page_size]",
            "table_ref[s, pos_ref[s] // page_size]"),
           ("(page_indices.reshape(-1), positions, cache, new_rows)",
            "(page_indices, positions, cache, new_rows)")),
    # the 2-D table with its last dimension padded to 128 entries: does the halt follow the
    # table's row length (a layout that pads SMEM rows) or the 2-D read itself?
    "2d_padded_to_128": (("table_ref[s * slots + pos_ref[s] // page_size]",
                          "table_ref[s, pos_ref[s] // page_size]"),
                         ("(page_indices.reshape(-1), positions, cache, new_rows)",
                          "(jnp.pad(page_indices, ((0, 0), (0, 128 - slots))), positions, "
                          "cache, new_rows)")),
}


def kv_case(dtype):
    """Case v0 of kv_cache_append (float32 cache (12, 16, 128), 3 sequences, 4 slots)."""
    rng = np.random.default_rng(141)
    cache = rng.standard_normal((12, 16, 128)).astype(dtype)
    rows = rng.standard_normal((3, 1, 128)).astype(dtype)
    table = np.array([[3, 7, 1, 0], [9, 2, 5, 6], [4, 8, 10, 11]], np.int32)
    positions = np.array([20, 3, 63], np.int32)
    expected = cache.copy()
    for s, p in enumerate(positions):
        expected[table[s, p // 16], p % 16] = rows[s, 0]
    return (jnp.asarray(cache), jnp.asarray(rows), jnp.asarray(table),
            jnp.asarray(positions)), expected


def kv_append(form: str) -> dict:
    fn = solution("14_production_kernels", "kv_cache_append", *KV_FORMS[form])
    args, expected = kv_case(np.float32)
    return measure(f"kv_cache_append[{form}]", fn, args, expected)


# --------------------------------------------------------------------------- the others
# pool_rows's cases (visible v0 and hidden h0-h2 of grader/tasks/a09_debugging.py)
POOL_CASES = (((64, 256), np.float32), ((40, 128), np.float32), ((128, 384), jnp.bfloat16),
              ((16, 200), np.float32), ((64, 256), jnp.bfloat16))
# the solution as it was, one strided read per row of a group: Mosaic lowers a strided read
# only of 32-bit data in a ref exactly 128 lanes wide (the grader's rule strided_load)
STRIDED_POOL = ((
    """        x = x_ref[...].astype(jnp.float32)
        rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
        out_row = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        pooled = jnp.zeros(o_ref.shape, jnp.float32)
        for j in range(out_rows):
            group = (rows >= 4 * j) & (rows < 4 * j + 4)
            total = jnp.sum(jnp.where(group, x, 0.0), axis=0, keepdims=True)
            pooled = jnp.where(out_row == j, total, pooled)
        o_ref[...] = (pooled / 4).astype(o_ref.dtype)""",
    """        total = sum(x_ref[pl.ds(r, out_rows, stride=4), :].astype(jnp.float32)
                    for r in range(4))
        o_ref[...] = (total / 4).astype(o_ref.dtype)"""),)


def pool_rows(shape, dtype, edits=(), label="") -> dict:
    fn = solution("09_debugging", "pool_rows", *edits)
    x = np.random.default_rng(9).standard_normal(shape).astype(dtype)
    m, n = shape
    want = x.astype(np.float32).reshape(m // 4, 4, n).mean(axis=1).astype(dtype)
    return measure(f"pool_rows[{np.dtype(dtype).name} {shape}{label}]", fn,
                   (jnp.asarray(x),), want)


def for_a_tpu(fn):
    """``fn`` on a TPU; elsewhere ``fn`` told that it targets a TPU v5e (emit_pipeline asks
    which TPU it tiles for), as grader.calling.traced_as_tpu does."""
    if on_tpu():
        return fn
    mesh = jax.sharding.AbstractMesh(
        (1,), ("core",), abstract_device=jax.sharding.AbstractDevice("TPU v5 lite", 1, "tpu"))

    def call(*args):
        args = [jax.device_put(a, jax.devices()[0]) for a in args]
        with jax.sharding.use_abstract_mesh(mesh):
            return fn(*args)
    return call


def matmul_bias_relu_cores(dtype) -> dict:
    """A12's solution, its core-parallel axis as large as the chip has TensorCores."""
    fn = solution("12_kernel_api", "matmul_bias_relu_cores")
    rng = np.random.default_rng(12)
    a, b = (rng.standard_normal(s).astype(dtype) for s in ((256, 256), (256, 256)))
    bias = rng.standard_normal((1, 256)).astype(dtype)
    f64 = [v.astype(np.float64) for v in (a, b, bias)]
    want = np.maximum(f64[0] @ f64[1] + f64[2], 0).astype(dtype)
    kind, cores = jax.devices()[0].device_kind, course_backend().tensorcores()
    return measure(f"matmul_bias_relu_cores[{np.dtype(dtype).name}]",
                   for_a_tpu(functools.partial(fn, bm=128, bk=128, bn=128)),
                   (jnp.asarray(a), jnp.asarray(b), jnp.asarray(bias)), want,
                   note=f"device kind {kind!r}; grid ({cores},) core-parallel "
                   "(kernelsim.backend.tensorcores())")


def matmul(dtype, precision_edit: tuple[str, str] | None = None, label: str = "") -> dict:
    """Assignment 4's matmul under the precision policy (or with ``precision_edit``), K = 2048,
    against float64."""
    edits = (precision_edit,) if precision_edit else ()
    fn = solution("04_memory_spaces", "matmul", *edits)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((256, 2048)).astype(dtype)
    b = rng.standard_normal((2048, 256)).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    if dtype != np.float32:  # rounded once to bfloat16 at the end
        want = want.astype(jnp.bfloat16)
    return measure(f"matmul[{np.dtype(dtype).name}{label}]",
                   functools.partial(fn, bm=128, bk=512, bn=128),
                   (jnp.asarray(a), jnp.asarray(b)), want)


def xla_float32_dot(precision) -> dict:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 2048)), rng.standard_normal((2048, 256))
    f = jax.jit(functools.partial(jnp.dot, precision=precision))
    return measure(f"xla jnp.dot float32 precision={precision}", f,
                   (jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)), a @ b)


def safe_part() -> list[dict]:
    bf16 = jnp.bfloat16
    return [kv_append("flat"), *(pool_rows(shape, dtype) for shape, dtype in POOL_CASES),
            pool_rows((64, 128), np.float32, STRIDED_POOL, " strided, 128 lanes"),
            matmul_bias_relu_cores(np.float32), matmul_bias_relu_cores(bf16),
            matmul(np.float32), matmul(bf16),
            matmul(np.float32, ("precision = jax.lax.Precision.HIGHEST if a.dtype == "
                                "jnp.float32 else None", "precision = None"),
                   " at the default precision (Mosaic's own)"),
            xla_float32_dot(None), xla_float32_dot("highest")]


PARTS = {"safe": safe_part, **{f"kv_{form}": functools.partial(lambda f: [kv_append(f)], form)
                               for form in KV_FORMS if form != "flat"}}


def in_child(part: str) -> dict:
    """``PARTS[part]`` in a fresh process: its results, or how the process ended."""
    cmd = [sys.executable, __file__, "--part", part]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_SECONDS)
    except subprocess.TimeoutExpired:
        return {"part": part, "child": f"no answer in {CHILD_SECONDS} s", "results": []}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    found = json.loads(lines[-1]) if lines else {"results": []}
    return {"part": part, "child": f"exited {done.returncode}",
            "seconds": round(time.perf_counter() - start, 1), **found,
            **({} if done.returncode == 0 else {"stderr_tail": done.stderr[-2000:]})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the JSON goes")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:  # a child: the only process that opens the chip
        print(json.dumps({"backend": jax.default_backend(),
                          "device_kind": jax.devices()[0].device_kind,
                          "results": PARTS[args.part]()}))
        return
    parts = [in_child(part) for part in PARTS]  # "safe" first: a halt cannot cost it
    record = {"jax": jax.__version__, "python": sys.version.split()[0], "parts": parts}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
