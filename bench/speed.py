"""The course's kernels against the library's on the chip's device time (issue 51, item 6).

Lesson 8's flash attention (``flash_attention``; causal: ``causal_flash_attention``, the grid
of needed pairs) against JAX's bundled ``jax.experimental.pallas.ops.tpu.flash_attention``,
and lesson 7's matmul against XLA's ``jnp.dot``, each over a few block shapes; a row per
(kernel, n, causal) keeps each side at its own fastest blocks. Beside them, assignment 7's
backward (tasks 4-5, the instructor's solution, through ``jax.vjp``) against ``jax.vjp`` of
the bundled kernel. Every time is ``kernelsim.timing.time_call``'s device time.

Writes ``speed-<chip>.json``: ``commit``, ``chip``, ``rows`` (``kernel``, ``baseline``
("jax bundled flash attention" or "xla jnp.dot"), ``n``, ``causal``, ``kernel_blocks``,
``baseline_blocks``, ``kernel_device_s``, ``baseline_device_s``), ``backward``,
``timing_methods`` (a tiny copy and a small matmul as device time, dispatched time and one
synced call) and ``sweep`` (every candidate timed). Off a TPU every lesson kernel runs in TPU
interpret mode on a tiny shape, checked against plain JAX and not timed
(``tests/bench/test_speed.py``).

    TPU_PERF_COMMIT=$(git rev-parse HEAD) sh bench/tpu_packages.sh \\
        python3 bench/speed.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "lessons")]

import tpu_perf  # noqa: E402

from kernelsim.timing import time_call  # noqa: E402

CHIP = "tpu-v5e"
FLASH = "jax bundled flash attention"
XLA = "xla jnp.dot"
VMEM_LIMIT = 100 * 2**20  # the largest blocks need more than the 16 MiB default
FLASH_SHAPES = [(32, 2048), (16, 4096), (8, 8192)]  # (batch x heads, N), d = 128, bfloat16
# (bq, bkv, chunk) of lesson 8's kernels; (block_q, block_k_major, block_k) of the bundled one
FLASH_BLOCKS = {False: [(1024, 512, None), (2048, 512, None), (1024, 1024, 512)],
                True: [(512, 512, None), (1024, 512, None), (1024, 1024, 512)]}
BUNDLED_BLOCKS = [(512, 512, 512), (1024, 1024, 512), (1024, 1024, 1024)]
MATMUL_BLOCKS = {4096: [(1024, 4096, 1024), (512, 4096, 1024), (1024, 2048, 1024)],
                 8192: [(1024, 2048, 1024), (512, 2048, 1024), (1024, 4096, 1024)]}
BACKWARD = {"bh": 8, "n": 2048, "block": 512}
ASSIGNMENT_7 = ROOT / "exercises" / "source" / "07_flash_attention" / "flash_attention.py"


def on_chip() -> bool:
    return jax.default_backend() == "tpu"


def lesson_kernels():
    import _course

    eight = _course.definitions("08-flash-attention", "last_kv_block", "widen", "flash_step",
                                "flash_kernel", "statistics_scratch", "flash_attention",
                                "causal_flash_kernel", "causal_flash_attention",
                                SCALE=1 / 128 ** 0.5, LANES=128)
    seven = _course.definitions("07-performance", "matmul_kernel", "matmul")
    return eight, seven.matmul


def assignment_backward():
    """Assignment 7's instructor solution of task 5, ``attention_with_grad``, compiled (its
    imports, functions and ``defvjp``; none of its checks)."""
    tree = ast.parse(ASSIGNMENT_7.read_text())
    keep = [node for node in tree.body
            if isinstance(node, ast.FunctionDef)
            or (isinstance(node, ast.Import | ast.ImportFrom)
                and not (getattr(node, "module", "") or "").startswith(("grader", "kernelsim")))
            or (isinstance(node, ast.Expr) and "defvjp" in ast.unparse(node))]
    namespace = {"INTERPRET": not on_chip(), "TPU_INTERPRET": not on_chip()}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(ASSIGNMENT_7), "exec"),  # noqa: S102
         namespace)
    return namespace["attention_with_grad"]


def bundled_attention(q, k, v, *, causal, blocks):
    from jax.experimental.pallas.ops.tpu import flash_attention as bundled

    bq, bkm, bk = blocks
    sizes = bundled.BlockSizes(block_q=bq, block_k_major=bkm, block_k=bk, block_b=1,
                               block_q_major_dkv=bq, block_k_major_dkv=bkm, block_k_dkv=bk,
                               block_q_dkv=bq, block_k_major_dq=bkm, block_k_dq=bk,
                               block_q_dq=bq)
    return bundled.flash_attention(q[None], k[None], v[None], causal=causal,
                                   sm_scale=1 / q.shape[-1] ** 0.5, block_sizes=sizes)[0]


def attention_reference(q, k, v, causal):
    s = jnp.einsum("hqd,hkd->hqk", q.astype(jnp.float32), k.astype(jnp.float32),
                   precision="highest") / q.shape[-1] ** 0.5
    if causal:
        s = jnp.where(jnp.tril(jnp.ones(s.shape[1:], bool)), s, -jnp.inf)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, -1), v.astype(jnp.float32),
                      precision="highest")


def timed(fn, args, repeats, reference=None, tolerance=None) -> dict:
    """The device time of ``fn(*args)`` on a chip (and its output's largest error against
    ``reference``); off a chip only the error, which must be within ``tolerance``."""
    out: dict = {}
    try:
        result = jax.jit(fn)(*args)
        result = result[0] if isinstance(result, tuple) else result  # a pullback's dq
        if reference is not None:
            error = float(jnp.max(jnp.abs(result.astype(jnp.float32) - reference)))
            out["max_abs_err"] = error
            assert tolerance is None or error <= tolerance, (error, tolerance)
        if on_chip():
            t = time_call(fn, args, repeats)
            out.update(device_s=t.device_s, dispatched_s=t.dispatched_s,
                       loop_calls=t.loop_calls)
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - a refused configuration is recorded, not fatal
        out["error"] = tpu_perf.first_line(e)
    return out


def best(rows: list[dict]) -> dict:
    timed_rows = [r for r in rows if r.get("device_s")]
    return min(timed_rows, key=lambda r: r["device_s"]) if timed_rows else {}


def flash_rows(eight, shapes, ours, bundled_blocks, repeats, sweep) -> list[dict]:
    rows = []
    for bh, n in shapes:
        q, k, v = (jax.random.normal(jax.random.key(i), (bh, n, 128), jnp.bfloat16)
                   for i in range(3))
        for causal in (False, True):
            reference = attention_reference(q, k, v, causal)
            kernel = eight.causal_flash_attention if causal else eight.flash_attention
            name = "lesson 8 " + ("causal_flash_attention" if causal else "flash_attention")
            mine, theirs = [], []
            for bq, bkv, chunk in ours[causal]:
                if max(bq, bkv) > n:
                    continue
                fn = functools.partial(kernel, bq=bq, bkv=bkv, chunk=chunk,
                                       vmem_limit=VMEM_LIMIT, interpret=not on_chip())
                mine.append({"kernel": name, "n": n, "bh": bh, "causal": causal,
                             "blocks": {"bq": bq, "bkv": bkv, "chunk": chunk},
                             **timed(fn, (q, k, v), repeats, reference, 0.02)})
                print(json.dumps(mine[-1]), flush=True)
            for blocks in bundled_blocks if on_chip() else ():  # no interpret switch
                if max(blocks) > n:
                    continue
                fn = functools.partial(bundled_attention, causal=causal, blocks=blocks)
                theirs.append({"kernel": FLASH, "n": n, "bh": bh, "causal": causal,
                               "blocks": dict(zip(("block_q", "block_k_major", "block_k"),
                                                  blocks, strict=True)),
                               **timed(fn, (q, k, v), repeats, reference)})
                print(json.dumps(theirs[-1]), flush=True)
            sweep += mine + theirs
            rows.append(summary(name, FLASH, n, causal, best(mine), best(theirs), bh=bh, d=128))
    return rows


def summary(kernel, baseline, n, causal, mine, theirs, **shape) -> dict:
    return {"kernel": kernel, "baseline": baseline, "n": n, "causal": causal, **shape,
            "kernel_blocks": mine.get("blocks"), "baseline_blocks": theirs.get("blocks"),
            "kernel_device_s": mine.get("device_s"),
            "baseline_device_s": theirs.get("device_s")}


def matmul_rows(matmul, blocks_by_n, repeats, sweep) -> list[dict]:
    rows = []
    for n, candidates in blocks_by_n.items():
        a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in range(2))
        reference = jnp.dot(a, b, preferred_element_type=jnp.float32)
        xla = {"kernel": XLA, "n": n, "blocks": None,
               **timed(lambda x, y: jnp.dot(x, y), (a, b), repeats, reference)}
        mine = []
        for bm, bk, bn in candidates:
            fn = functools.partial(matmul, bm=bm, bk=bk, bn=bn, vmem_limit=VMEM_LIMIT,
                                   interpret=not on_chip())
            mine.append({"kernel": "lesson 7 matmul", "n": n,
                         "blocks": {"bm": bm, "bk": bk, "bn": bn},
                         **timed(fn, (a, b), repeats, reference, 0.05 * n ** 0.5)})
            print(json.dumps(mine[-1]), flush=True)
        sweep += [xla, *mine]
        rows.append(summary("lesson 7 matmul", XLA, n, False, best(mine), xla, dtype="bfloat16"))
    return rows


def backward_row(attention_with_grad, bh, n, block, repeats) -> dict:
    """Assignment 7's forward and backward (vmapped over bh heads) against the bundled
    kernel's, each through ``jax.vjp`` with one cotangent, at ``block`` blocks: the time of
    (dq, dk, dv); the error is dq's against plain JAX's."""
    q, k, v, do = (jax.random.normal(jax.random.key(i), (bh, n, 128), jnp.bfloat16)
                   for i in range(4))
    learner = jax.vmap(lambda q, k, v: attention_with_grad(q, k, v, block, block))
    theirs = functools.partial(bundled_attention, causal=False, blocks=(block,) * 3)

    def grads(f):
        return lambda q, k, v, do: jax.vjp(f, q, k, v)[1](do)

    reference = grads(lambda q, k, v: attention_reference(q, k, v, False).astype(q.dtype))(
        q, k, v, do)[0].astype(jnp.float32)
    out = {"kernel": "assignment 7 attention_with_grad (instructor's solution), jax.vjp",
           "baseline": f"jax.vjp of {FLASH}", "bh": bh, "n": n, "block": block,
           "learner": timed(grads(learner), (q, k, v, do), repeats, reference, 0.05)}
    if on_chip():
        out["bundled"] = timed(grads(theirs), (q, k, v, do), repeats, reference)
    return out


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def timing_rows(matmul, repeats) -> list[dict]:
    """What a time is: one (8, 128) float32 tile copied and lesson 7's matmul at n = 1024,
    each as device time, dispatched time (calls one by one from Python) and one synced call."""
    x = jnp.ones((8, 128), jnp.float32)
    a = jax.random.normal(jax.random.key(0), (1024, 1024), jnp.bfloat16)
    cases = [("copy of one (8, 128) float32 tile",
              pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                             interpret=not on_chip()), (x,)),
             ("lesson 7 matmul, n = 1024, blocks (512, 1024, 1024)",
              functools.partial(matmul, bm=512, bk=1024, bn=1024, interpret=not on_chip()),
              (a, a))]
    rows = []
    for name, fn, args in cases:
        t = time_call(fn, args, repeats)
        jitted = jax.jit(fn)
        synced = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(jitted(*args))
            synced.append(time.perf_counter() - start)
        rows.append({"kernel": name, "device_s": t.device_s, "dispatched_s": t.dispatched_s,
                     "loop_calls": t.loop_calls, "one_synced_call_s": statistics.median(synced)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=5)
    opts = p.parse_args(argv)
    eight, matmul = lesson_kernels()
    sweep: list[dict] = []
    if on_chip():
        rows = flash_rows(eight, FLASH_SHAPES, FLASH_BLOCKS, BUNDLED_BLOCKS, opts.repeats, sweep)
        rows += matmul_rows(matmul, MATMUL_BLOCKS, opts.repeats, sweep)
        backward = backward_row(assignment_backward(), **BACKWARD, repeats=opts.repeats)
        timing = timing_rows(matmul, opts.repeats)
    else:
        rows = flash_rows(eight, [(1, 256)], {False: [(128, 128, None), (128, 256, 128)],
                                              True: [(128, 128, None), (64, 128, 64)]},
                          [], 1, sweep)
        rows += matmul_rows(matmul, {256: [(128, 256, 128), (128, 128, 256)]}, 1, sweep)
        backward = backward_row(assignment_backward(), 1, 256, 128, 1)
        timing = timing_rows(matmul, 1)
    record = {"commit": tpu_perf.commit(), "chip": CHIP, "jax": jax.__version__,
              "device": jax.devices()[0].device_kind,
              "timing": "kernelsim.timing.time_call: device time per call (calls inside one "
                        f"jitted loop), median of {opts.repeats}",
              "rows": rows, "backward": backward, "timing_methods": timing, "sweep": sweep}
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / f"speed-{CHIP.removeprefix('tpu-')}{'' if on_chip() else '-cpu'}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        if r["kernel_device_s"] and r["baseline_device_s"]:
            print(f"{r['kernel']:36} n={r['n']:5} causal={r['causal']!s:5} "
                  f"{r['baseline_device_s'] / r['kernel_device_s']:.3f}x the {r['baseline']}")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
