"""Property test: kernelsim's schedule equals a brute-force, step-by-step model of the rules.

The reference below walks the grid in row-major order with Python ints and applies the TPU
pipeline rules as the JAX docs state them (docs.jax.dev/en/latest/pallas/tpu/pipelining.html):
fetch an input block when its index differs from the previous step's (and at step 0), write an
output block back when its index differs from the next step's (and at the last step).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim

TABLE_LEN, TABLE_MAX = 4, 3  # scalar-prefetch table: 4 entries with values 0..3


@st.composite
def dim_sources(draw, grid):
    """How one array dimension's block index is computed, its block size and its extent."""
    kind = draw(st.sampled_from(["grid", "reversed", "const", "prefetch"]))
    axis = draw(st.integers(0, len(grid) - 1))
    if kind in ("grid", "reversed"):
        n_blocks = grid[axis]
        src = (kind, axis, grid[axis])
    elif kind == "const":
        n_blocks = draw(st.integers(1, 3))
        src = ("const", draw(st.integers(0, n_blocks - 1)))
    else:
        n_blocks = TABLE_MAX + 1
        src = ("prefetch", axis)
    squeezed = draw(st.booleans()) and draw(st.booleans())
    if squeezed:
        return src, None, n_blocks
    size = draw(st.sampled_from([1, 2, 3, 8]))
    ragged = draw(st.integers(0, size - 1))
    return src, size, n_blocks * size - ragged


@st.composite
def cases(draw):
    grid = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    use_prefetch = draw(st.booleans())
    table = draw(st.lists(st.integers(0, TABLE_MAX), min_size=TABLE_LEN, max_size=TABLE_LEN))
    operands = []
    for role in ["input"] * draw(st.integers(1, 2)) + ["output"] * draw(st.integers(1, 2)):
        dims = draw(st.lists(dim_sources(grid), min_size=1, max_size=3))
        if not use_prefetch:
            dims = [d for d in dims if d[0][0] != "prefetch"] or [(("const", 0), 4, 7)]
        dtype = draw(st.sampled_from(["float32", "bfloat16"]))
        operands.append((role, dims, dtype))
    return grid, use_prefetch, np.array(table, np.int32), operands


def _py_index(src, g, table):
    kind = src[0]
    if kind == "grid":
        return g[src[1]]
    if kind == "reversed":
        return src[2] - 1 - g[src[1]]
    if kind == "const":
        return src[1]
    return int(table[g[src[1]] % TABLE_LEN])


def _index_map(dims, ngrid):
    def index_map(*args):
        g, refs = args[:ngrid], args[ngrid:]
        out = []
        for src, _, _ in dims:
            if src[0] == "prefetch":
                out.append(refs[0][g[src[1]] % TABLE_LEN])
            else:
                out.append(_py_index(src, g, None))
        return tuple(out)

    return index_map


def _build(grid, use_prefetch, table, operands):
    ngrid = len(grid)
    specs, arrays, out_shapes = [], [], []
    for role, dims, dtype in operands:
        shape = tuple(extent for _, _, extent in dims)
        block = tuple(size for _, size, _ in dims)
        spec = pl.BlockSpec(block, _index_map(dims, ngrid))
        if role == "input":
            specs.append(spec)
            arrays.append(jnp.zeros(shape, dtype))
        else:
            out_shapes.append((spec, jax.ShapeDtypeStruct(shape, dtype)))

    def kernel(*refs):
        del refs  # kernelsim.trace never runs the body

    n_in = len(specs)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1 if use_prefetch else 0, grid=grid, in_specs=specs,
        out_specs=[s for s, _ in out_shapes])
    call = pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=[o for _, o in out_shapes])
    args = ([jnp.asarray(table)] if use_prefetch else []) + arrays
    assert len(arrays) == n_in
    return call, args


def _reference(grid, table, operands, model):
    """Per operand: (list of (block index, action, bytes) per step, totals)."""
    points = list(itertools.product(*[range(n) for n in grid]))
    results = []
    for role, dims, dtype in operands:
        itemsize = np.dtype(jnp.dtype(dtype)).itemsize
        blocks = [tuple(_py_index(src, g, table) for src, _, _ in dims) for g in points]
        events = []
        for t, b in enumerate(blocks):
            nbytes = itemsize
            for (_, size, extent), idx in zip(dims, b, strict=True):
                start, width = (idx, 1) if size is None else (idx * size, size)
                nbytes *= max(0, min(start + width, extent) - start)
            if role == "input":
                moved = model == "gpu" or t == 0 or b != blocks[t - 1]
                events.append((b, "fetch" if moved else "skip", nbytes if moved else 0))
            else:
                moved = model == "gpu" or t == len(blocks) - 1 or b != blocks[t + 1]
                events.append((b, "writeback" if moved else "keep", nbytes if moved else 0))
        results.append((role, events))
    return results


def _l2_hit_bytes(grid, events, sms):
    """Bytes of the reads that a program fewer than ``sms`` places earlier in GPU launch
    order (grid dimension 0 fastest) made of the same block."""
    points = list(itertools.product(*[range(n) for n in grid]))
    rank = [sum(g[d] * int(np.prod(grid[:d])) for d in range(len(grid))) for g in points]
    hit = 0
    for t, (block, _, nbytes) in enumerate(events):
        if any(events[u][0] == block and 0 < rank[t] - rank[u] < sms
               for u in range(len(events))):
            hit += nbytes
    return hit


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["tpu", "gpu"]))
def test_schedule_equals_brute_force(case, model):
    grid, use_prefetch, table, operands = case
    call, args = _build(grid, use_prefetch, table, operands)
    t = kernelsim.trace(call, *args, model=model)
    (ct,) = t.calls
    expected = _reference(grid, table, operands, model)
    windowed = [o for o in ct.operands if o.role in ("input", "output")]
    assert len(windowed) == len(expected)
    n_ops = len(expected)
    events = t.steps()
    assert len(events) == ct.steps * n_ops == int(np.prod(grid)) * n_ops
    for k, ((role, want), got) in enumerate(zip(expected, windowed, strict=True)):
        assert got.role == role
        mine = [(e.block_index, e.action, e.bytes) for e in events[k::n_ops]]
        assert mine == want, (got.name, mine[:6], want[:6])
        actions = [a for _, a, _ in want]
        moved = sum(b for _, _, b in want)
        if role == "input" and model == "gpu":  # re-reads by near neighbours come from L2
            moved -= _l2_hit_bytes(grid, want, t.chip.sms)
        if role == "input":
            assert (got.fetches, got.skips, got.hbm_read_bytes) == (
                actions.count("fetch"), actions.count("skip"), moved)
        else:
            assert (got.writebacks, got.keeps, got.hbm_write_bytes) == (
                actions.count("writeback"), actions.count("keep"), moved)
    prefetch_bytes = table.nbytes if use_prefetch else 0
    assert ct.hbm_read_bytes == sum(o.hbm_read_bytes for o in windowed) + prefetch_bytes
