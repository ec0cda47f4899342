"""The ladder from lesson 8's flash attention and lesson 7's matmul to kernels as fast as the
library's (issue 51): each rung changes one thing, timed on the chip's device time.

Flash attention (bfloat16, d = 128; ``--part flash``): ``ladder_attention`` over

- ``statistics``: ``"column"`` keeps the running max and sum as ``(bq, 1)`` scratch (lesson 8
  before this probe), ``"lanes"`` as ``(bq, 128)`` rows of one repeated value, widened by
  ``jnp.tile`` (whole vregs copied; no column is spread across the lanes);
- ``mask``: ``"every"`` builds the causal mask at every working step, ``"diagonal"`` only at
  the blocks that straddle the diagonal (the others are wholly visible);
- ``grid``: ``"rectangle"`` keeps every (query block, key block) step, the ones above the
  diagonal idle (``pl.when`` skips their work, the clamped index map their copies);
  ``"triangle"`` visits only the needed pairs, listed by scalar prefetch;

beside JAX's bundled ``flash_attention`` over its block sizes. Matmul (``--part matmul``):
``ladder_matmul`` over block shapes and ``accumulate`` (``"zeroed"``: zero the float32
scratch, add every step, cast at the last; ``"first"``: the first step stores its product,
the last adds its own and writes the output, so a one-step K writes the product straight out)
beside ``jnp.dot``; and the timing methods on one small copy kernel.

Every time is ``kernelsim.timing.time_call``'s device time (and the dispatched time beside it).
Off a TPU the kernels run in TPU interpret mode on tiny shapes, checked against plain JAX and
not timed: a check of this script (tests/bench/test_speed_probe.py).

    sh bench/tpu_packages.sh python3 bench/speed_probe.py --part flash --out "$OUT"
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import tpu_perf  # noqa: E402

from kernelsim.timing import time_call  # noqa: E402

LANES = 128
VMEM_LIMIT = 100 * 2**20  # large blocks need more than the 16 MiB default scoped VMEM


def on_chip() -> bool:
    return jax.default_backend() == "tpu"


# ----------------------------------------------------------------------------- flash attention
def widen(stat, width):
    """A ``(bq, 128)`` lane-replicated statistic as wide as ``width`` lanes."""
    if stat.shape[1] == 1 or width == stat.shape[1]:
        return stat
    if width % LANES == 0:
        return jnp.tile(stat, (1, width // LANES))
    return stat[:, :width]


def last_kv_block(i, bq, bkv):
    return (i * bq + bq - 1) // bkv


def ladder_kernel(*refs, scale, causal, statistics, mask, grid):
    if grid == "triangle":
        q_of, kv_of, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref = refs
        t = pl.program_id(1)
        i, j = q_of[t], kv_of[t]
    else:
        q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref = refs
        i, j = pl.program_id(1), pl.program_id(2)
    bq, bkv = q_ref.shape[0], k_ref.shape[0]
    last = last_kv_block(i, bq, bkv) if causal else pl.num_programs(2) - 1

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def fold_in(masked):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale
        if masked:
            q_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            k_pos = j * bkv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(k_pos <= q_pos, s, -jnp.inf)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.exp(s - widen(m_new, s.shape[1]))
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
        acc_ref[...] = widen(alpha, acc_ref.shape[1]) * acc_ref[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    if not causal:
        fold_in(False)
    elif mask == "every":
        pl.when(j <= last)(lambda: fold_in(True))
    else:
        visible = (j + 1) * bkv - 1 <= i * bq  # the block's last key <= its first query
        pl.when(visible)(lambda: fold_in(False))
        pl.when(jnp.logical_and(j <= last, jnp.logical_not(visible)))(lambda: fold_in(True))

    @pl.when(j == last)
    def _finalize():
        o_ref[...] = (acc_ref[...] / widen(l_ref[...], acc_ref.shape[1])).astype(o_ref.dtype)


def ladder_attention(q, k, v, *, bq, bkv, causal, statistics="lanes", mask="diagonal",
                     grid="rectangle", interpret=False):
    bh, n, d = q.shape
    stat = 1 if statistics == "column" else LANES
    kernel = functools.partial(ladder_kernel, scale=1 / d ** 0.5, causal=causal,
                               statistics=statistics, mask=mask, grid=grid)
    scratch = [pltpu.VMEM((bq, stat), jnp.float32), pltpu.VMEM((bq, stat), jnp.float32),
               pltpu.VMEM((bq, d), jnp.float32)]
    params = pltpu.CompilerParams(vmem_limit_bytes=VMEM_LIMIT, dimension_semantics=(
        ("parallel", "arbitrary") if grid == "triangle" else
        ("parallel", "parallel", "arbitrary")))
    out_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    if grid == "triangle":
        assert causal
        pairs = [(i, j) for i in range(n // bq) for j in range(last_kv_block(i, bq, bkv) + 1)]
        q_of = jnp.array([i for i, _ in pairs], jnp.int32)
        kv_of = jnp.array([j for _, j in pairs], jnp.int32)
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(bh, len(pairs)),
            in_specs=[pl.BlockSpec((None, bq, d), lambda h, t, qo, ko: (h, qo[t], 0)),
                      pl.BlockSpec((None, bkv, d), lambda h, t, qo, ko: (h, ko[t], 0)),
                      pl.BlockSpec((None, bkv, d), lambda h, t, qo, ko: (h, ko[t], 0))],
            out_specs=pl.BlockSpec((None, bq, d), lambda h, t, qo, ko: (h, qo[t], 0)),
            scratch_shapes=scratch)
        return pl.pallas_call(kernel, grid_spec=spec, out_shape=out_shape,
                              compiler_params=params, interpret=interpret)(q_of, kv_of, q, k, v)

    def kv_map(h, i, j):
        return h, jnp.minimum(j, last_kv_block(i, bq, bkv)) if causal else j, 0

    return pl.pallas_call(
        kernel, grid=(bh, n // bq, n // bkv),
        in_specs=[pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0)),
                  pl.BlockSpec((None, bkv, d), kv_map), pl.BlockSpec((None, bkv, d), kv_map)],
        out_specs=pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0)),
        scratch_shapes=scratch, compiler_params=params, out_shape=out_shape,
        interpret=interpret)(q, k, v)


def bundled_attention(q, k, v, *, causal, block_q, block_k_major, block_k):
    from jax.experimental.pallas.ops.tpu import flash_attention as bundled

    sizes = bundled.BlockSizes(block_q=block_q, block_k_major=block_k_major, block_k=block_k,
                               block_b=1)
    out = bundled.flash_attention(q[None], k[None], v[None], causal=causal,
                                  sm_scale=1 / q.shape[-1] ** 0.5, block_sizes=sizes)
    return out[0]


def attention_reference(q, k, v, causal):
    s = jnp.einsum("hqd,hkd->hqk", q.astype(jnp.float32), k.astype(jnp.float32),
                   precision="highest") / q.shape[-1] ** 0.5
    if causal:
        n = q.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, -1), v.astype(jnp.float32),
                      precision="highest")


# rung name -> ladder_attention's settings (blocks come from the sweep)
RUNGS = {
    "column statistics (lesson 8 before)": {"statistics": "column", "mask": "every"},
    "lane statistics": {"statistics": "lanes", "mask": "every"},
    "lane statistics, mask on the diagonal only": {"statistics": "lanes", "mask": "diagonal"},
    "lane statistics, diagonal mask, triangular grid": {"statistics": "lanes",
                                                        "mask": "diagonal",
                                                        "grid": "triangle"},
}
FLASH_SHAPES = [(32, 2048), (16, 4096), (8, 8192)]
OUR_BLOCKS = [(512, 512), (1024, 512), (512, 1024), (1024, 1024), (2048, 512)]
BUNDLED_BLOCKS = [(512, 512, 512), (1024, 512, 512), (1024, 1024, 512), (512, 1024, 1024),
                  (1024, 1024, 1024)]


def timed(fn, args, repeats, reference=None) -> dict:
    out: dict = {}
    try:
        result = jax.jit(fn)(*args)
        if reference is not None:
            out["max_abs_err"] = float(jnp.max(jnp.abs(result.astype(jnp.float32) - reference)))
        if on_chip():
            t = time_call(fn, args, repeats)
            out.update(device_s=t.device_s, dispatched_s=t.dispatched_s, loop_calls=t.loop_calls)
    except Exception as e:  # noqa: BLE001 - a refused configuration is recorded
        out["error"] = tpu_perf.first_line(e)
    return out


def flash_rows(shapes, ours, bundled_blocks, repeats) -> list[dict]:
    rows = []
    for bh, n in shapes:
        q, k, v = (jax.random.normal(jax.random.key(i), (bh, n, 128), jnp.bfloat16)
                   for i in range(3))
        for causal in (False, True):
            reference = attention_reference(q, k, v, causal)
            base = {"bh": bh, "n": n, "d": 128, "causal": causal}
            bq, bkv = ours[0]
            for rung, settings in RUNGS.items():
                if not causal and (settings["mask"] == "diagonal" or "grid" in settings):
                    continue  # the same kernel as the rung before without a mask
                fn = functools.partial(ladder_attention, bq=bq, bkv=bkv, causal=causal,
                                       interpret=not on_chip(), **settings)
                rows.append({**base, "kernel": "ladder", "rung": rung, "bq": bq, "bkv": bkv,
                             **timed(fn, (q, k, v), repeats, reference)})
                print(json.dumps(rows[-1]), flush=True)
            final = list(RUNGS.values())[-1 if causal else 1]
            for bq, bkv in ours[1:]:
                if bq > n or bkv > n:
                    continue
                fn = functools.partial(ladder_attention, bq=bq, bkv=bkv, causal=causal,
                                       interpret=not on_chip(), **final)
                rows.append({**base, "kernel": "ladder", "rung": "blocks", **final, "bq": bq,
                             "bkv": bkv, **timed(fn, (q, k, v), repeats, reference)})
                print(json.dumps(rows[-1]), flush=True)
            if not on_chip():
                continue  # JAX's bundled kernel has no interpret switch
            for bq, bkm, bk in bundled_blocks:
                if max(bq, bkm) > n:
                    continue
                fn = functools.partial(bundled_attention, causal=causal, block_q=bq,
                                       block_k_major=bkm, block_k=bk)
                rows.append({**base, "kernel": "jax bundled flash attention", "block_q": bq,
                             "block_k_major": bkm, "block_k": bk,
                             **timed(fn, (q, k, v), repeats, reference)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


# ----------------------------------------------------------------------------- matmul
def ladder_matmul_kernel(a_ref, b_ref, o_ref, acc_ref, *, accumulate, k_steps):
    kk = pl.program_id(2)
    product = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
    if accumulate == "zeroed":
        @pl.when(kk == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += product

        @pl.when(kk == k_steps - 1)
        def _finalize():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)
        return
    if k_steps == 1:
        o_ref[...] = product.astype(o_ref.dtype)
        return

    @pl.when(kk == 0)
    def _first():
        acc_ref[...] = product

    @pl.when(jnp.logical_and(kk > 0, kk < k_steps - 1))
    def _middle():
        acc_ref[...] += product

    @pl.when(kk == k_steps - 1)
    def _last():
        o_ref[...] = (acc_ref[...] + product).astype(o_ref.dtype)


def ladder_matmul(a, b, *, bm, bk, bn, accumulate, interpret=False):
    m, kdim = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        functools.partial(ladder_matmul_kernel, accumulate=accumulate, k_steps=kdim // bk),
        grid=(m // bm, n // bn, kdim // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype), interpret=interpret)(a, b)


MATMUL_SIZES = (4096, 8192)
MATMUL_BLOCKS = [(512, 1024, 1024), (1024, 1024, 1024), (512, 2048, 1024), (1024, 2048, 1024),
                 (1024, 512, 1024), (2048, 1024, 1024), (1024, 1024, 2048), (2048, 512, 2048),
                 (1024, 4096, 1024)]


def matmul_rows(sizes, blocks, repeats) -> list[dict]:
    rows = []
    for n in sizes:
        a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in range(2))
        reference = jnp.dot(a, b, preferred_element_type=jnp.float32)
        rows.append({"n": n, "kernel": "xla jnp.dot",
                     **timed(lambda x, y: jnp.dot(x, y), (a, b), repeats, reference)})
        print(json.dumps(rows[-1]), flush=True)
        for bm, bk, bn in blocks:
            if max(bm, bk, bn) > n:
                continue
            for accumulate in ("zeroed", "first"):
                fn = functools.partial(ladder_matmul, bm=bm, bk=bk, bn=bn,
                                       accumulate=accumulate, interpret=not on_chip())
                rows.append({"n": n, "kernel": "ladder matmul", "bm": bm, "bk": bk, "bn": bn,
                             "accumulate": accumulate,
                             **timed(fn, (a, b), repeats, reference)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def timing_rows(repeats) -> list[dict]:
    """One (8, 128) float32 tile copied: device time, dispatched time, one synced call."""
    x = jnp.ones((8, 128), jnp.float32)
    fn = pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        interpret=not on_chip())
    t = time_call(fn, (x,), repeats)
    jitted = jax.jit(fn)
    synced = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(jitted(x))
        synced.append(time.perf_counter() - start)
    return [{"kernel": "copy of one (8, 128) float32 tile", "device_s": t.device_s,
             "dispatched_s": t.dispatched_s, "loop_calls": t.loop_calls,
             "one_synced_call_s": float(np.median(synced))}]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--part", choices=("flash", "matmul"), required=True)
    p.add_argument("--repeats", type=int, default=5)
    opts = p.parse_args(argv)
    if opts.part == "flash":
        rows = (flash_rows(FLASH_SHAPES, OUR_BLOCKS, BUNDLED_BLOCKS, opts.repeats) if on_chip()
                else flash_rows([(1, 256)], [(128, 128), (256, 128)], [], 1))
    else:
        rows = (timing_rows(opts.repeats) if on_chip() else []) + (
            matmul_rows(MATMUL_SIZES, MATMUL_BLOCKS, opts.repeats) if on_chip()
            else matmul_rows((256,), [(128, 128, 128), (128, 256, 128)], 1))
    record = {"commit": tpu_perf.commit(), "jax": jax.__version__,
              "device": jax.devices()[0].device_kind, "part": opts.part, "rows": rows}
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / f"speed_probe-{opts.part}{'' if on_chip() else '-cpu'}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
