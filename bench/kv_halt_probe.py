"""Which index map of assignment 14's kv_cache_append halts a TPU core: each variant of the
page's index map (it places the cache's input block and the aliased output block) in a process
of its own, since a halt (E0200 RuntimeUnexpectedCoreHalt) leaves the process unusable.

Variants: control (table[s * slots + positions[s] // page_size], the table flattened),
const_page, no_new_rows, rows_whole_vmem, no_alias, rows_padded8 (the body and operands
changed around the control's index map), shift and lax_div (the index computed another way),
table_only (table[s * slots]) and pos_only (positions[s] // page_size). On a CPU everything runs
in TPU interpret mode. Writes ``$OUT/kv_probe.json`` (ran, and whether values match).

Usage: python3 bench/kv_halt_probe.py [VARIANT ...]
"""
import json
import os
import subprocess
import sys

VARIANTS = sys.argv[1:] or ["control"]
CHILD = r'''
import sys, functools, json
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
v = sys.argv[1]
interp = jax.default_backend() != "tpu"
cache = jnp.asarray(np.random.default_rng(0).standard_normal((12, 16, 128)), jnp.float32)
new_rows = jnp.asarray(np.random.default_rng(1).standard_normal((3, 1, 128)), jnp.float32)
table = jnp.asarray([[10, 9, 0, 6], [1, 8, 4, 5], [2, 3, 7, 11]], jnp.int32)
pos = jnp.asarray([15, 16, 44], jnp.int32)
page_size, slots, d = 16, 4, 128
pages = table[jnp.arange(3), pos // page_size]
want = cache.at[pages, pos % page_size].set(new_rows[:, 0])
def page_of(s, t, p):
    if v == "const_page":
        return (0, 0, 0)
    if v == "shift":
        return (t[s * slots + jax.lax.shift_right_logical(p[s], 4)], 0, 0)
    if v == "lax_div":
        return (t[s * slots + jax.lax.div(p[s], page_size)], 0, 0)
    if v == "table_only":
        return (t[s * slots], 0, 0)
    if v == "pos_only":
        return (p[s] // page_size, 0, 0)
    return (t[s * slots + p[s] // page_size], 0, 0)
page = pl.BlockSpec((None, page_size, d), page_of)
if v == "no_new_rows":
    def kernel(t, p, page_ref, out_ref):
        rows = jax.lax.broadcasted_iota(jnp.int32, (page_size, d), 0)
        out_ref[...] = jnp.where(rows == p[pl.program_id(0)] % page_size, 1.0, page_ref[...])
    specs, args, alias = [page], (table.reshape(-1), pos, cache), {2: 0}
elif v == "rows_whole_vmem":
    def kernel(t, p, page_ref, new_ref, out_ref):
        s = pl.program_id(0)
        rows = jax.lax.broadcasted_iota(jnp.int32, (page_size, d), 0)
        out_ref[...] = jnp.where(rows == p[s] % page_size, new_ref[pl.ds(s, 1), :], page_ref[...])
    specs = [page, pl.BlockSpec((3, d), lambda s, *_: (0, 0))]
    args, alias = (table.reshape(-1), pos, cache, new_rows[:, 0]), {2: 0}
elif v == "rows_padded8":
    def kernel(t, p, page_ref, new_ref, out_ref):
        rows = jax.lax.broadcasted_iota(jnp.int32, (page_size, d), 0)
        row = p[pl.program_id(0)] % page_size
        out_ref[...] = jnp.where(rows == row, new_ref[0:1, :], page_ref[...])
    padded = jnp.pad(new_rows, ((0, 0), (0, 7), (0, 0)))
    specs = [page, pl.BlockSpec((None, 8, d), lambda s, *_: (s, 0, 0))]
    args, alias = (table.reshape(-1), pos, cache, padded), {2: 0}
else:
    def kernel(t, p, page_ref, new_ref, out_ref):
        rows = jax.lax.broadcasted_iota(jnp.int32, (page_size, d), 0)
        row = p[pl.program_id(0)] % page_size
        out_ref[...] = jnp.where(rows == row, new_ref[...], page_ref[...])
    specs = [page, pl.BlockSpec((None, 1, d), lambda s, *_: (s, 0, 0))]
    args, alias = (table.reshape(-1), pos, cache, new_rows), ({} if v == "no_alias" else {2: 0})
f = pl.pallas_call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(3,), in_specs=specs, out_specs=page),
    out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype), input_output_aliases=alias,
    interpret=pltpu.InterpretParams() if interp else False)
out = jax.block_until_ready(jax.jit(f)(*args))
ok = None if v in ("const_page", "no_new_rows") else bool(np.allclose(out, want))
print(json.dumps({"variant": v, "ran": True, "matches": ok}))
'''


def probe(variant: str) -> dict:
    """Run one variant in a fresh process: whether it ran, and if so whether it matched."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, variant], capture_output=True,
                              text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "ran": False, "error": "timeout"}
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    return {"variant": variant, "ran": False, "rc": done.returncode,
            "error": (done.stderr.strip().splitlines() or [""])[-1][:300]}


results = []
for v in VARIANTS:
    results.append(probe(v))
    print(json.dumps(results[-1]), flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "kv_probe.json"), "w") as f:
    json.dump(results, f, indent=1)
