"""Index maps evaluated over a whole grid: the block each operand's map selects at every step,
whether a block can move at all, and which scalar-prefetch entries the maps read.

Most index maps are scalar integer arithmetic on the grid indices and prefetch reads:
``scalar_program`` evaluates those for every grid step at once in numpy; anything else is
evaluated by JAX (``evaluate_with_jax``, an eager ``vmap`` over the steps).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernelsim.access import PrefetchReads
from kernelsim.adapter import (
    IndexSlice,
    Literal,
    close_jaxpr,
    consts_of,
    discharge_state,
    jaxpr_as_fun,
    open_jaxpr,
)
from kernelsim.body.selection import select
from kernelsim.jaxpr import lax_numpy
from kernelsim.jaxpr.nesting import call_body
from kernelsim.jaxpr.numpy_eval import literal
from kernelsim.model import KernelCall


class NotScalar(Exception):
    """The index map does more than scalar integer arithmetic and prefetch reads."""


# Ops whose scalar form is the identity on a value batched over grid steps.
_SCALAR_IDENTITY = frozenset({"squeeze", "reshape", "broadcast_in_dim", "convert_element_type"})


def scalar_program(jaxpr: Any, args: list[np.ndarray],
                    grid: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Evaluate an index map over every grid step at once with numpy (no compilation).

    Each grid index is an int32 array over the steps; prefetch refs are their arrays. Only
    scalar arithmetic (``lax_numpy``'s elementwise rules, XLA's semantics), prefetch reads
    with integer indices and nested calls are understood; anything else raises ``NotScalar``
    and the caller evaluates the map with JAX instead. ``grid``: the extents
    ``pl.num_programs`` reads.
    """
    j = open_jaxpr(jaxpr)
    env: dict[Any, Any] = dict(zip(j.constvars, consts_of(jaxpr), strict=True))
    env.update(zip(j.invars, args, strict=True))

    def read(v: Any) -> Any:
        return literal(v) if isinstance(v, Literal) else env[v]

    for eqn in j.eqns:
        name, p = eqn.primitive.name, eqn.params
        vals = [read(v) for v in eqn.invars]
        body = call_body(eqn)
        if body is not None:
            outs = scalar_program(body, vals, grid)
        elif name == "num_programs" and p["axis"] < len(grid):
            outs = [np.int32(grid[p["axis"]])]
        elif name == "get":
            indexer = jax.tree_util.tree_unflatten(p["tree"], vals[1:])
            index = [ix for t in indexer for ix in t.indices]
            if len(indexer) != 1 or any(isinstance(ix, IndexSlice) for ix in index):
                raise NotScalar(name)
            ref = vals[0]  # XLA clamps a dynamic index into range; so does this
            outs = [ref[tuple(np.clip(np.asarray(ix), 0, n - 1)
                              for ix, n in zip(index, ref.shape, strict=False))]]
        elif any(getattr(v.aval, "shape", ()) != () for v in eqn.outvars):
            raise NotScalar(name)
        elif name in _SCALAR_IDENTITY and name != "convert_element_type":
            outs = vals
        else:
            # Elementwise rules broadcast, so one call covers every grid step at once.
            try:
                if name not in lax_numpy.ELEMENTWISE:
                    raise lax_numpy.Unsupported(name)
                outs = lax_numpy.apply(name, [np.asarray(x) for x in vals], p,
                                        [v.aval for v in eqn.outvars], check_shapes=False)
            except lax_numpy.Unsupported as e:
                raise NotScalar(name) from e
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in j.outvars]


def evaluate_index_map(bm: Any, grid: tuple[int, ...], grid_points: np.ndarray,
              prefetch: list[np.ndarray]) -> np.ndarray:
    """The index map of ``bm`` at every grid point: int64 [steps, ndim]."""
    ndim = len(bm.block_shape)
    nsteps = grid_points.shape[0]
    outvars = open_jaxpr(bm.index_map_jaxpr).outvars[:ndim]
    if all(isinstance(v, Literal) for v in outvars):  # constant map: no compile
        row = np.array([int(v.val) for v in outvars], dtype=np.int64)
        return np.broadcast_to(row, (nsteps, ndim)).copy()
    cols = [grid_points[:, i].astype(np.int32) for i in range(grid_points.shape[1])]
    try:
        out = scalar_program(bm.index_map_jaxpr, cols + list(prefetch), grid)[:ndim]
    except NotScalar:
        out = evaluate_with_jax(bm.index_map_jaxpr, ndim, cols, prefetch)
    return np.stack([np.broadcast_to(np.asarray(o, np.int64), (nsteps,)) for o in out], axis=1)


def evaluate_with_jax(index_map: Any, ndim: int, cols: list[np.ndarray],
                       prefetch: list[np.ndarray]) -> list[np.ndarray]:
    """The index map's first ``ndim`` outputs at every step, evaluated by JAX (eager vmap)."""
    # SMEM prefetch refs become plain array arguments once the map's state is discharged.
    fun = jaxpr_as_fun(discharge_state(index_map))

    def at(*xs):
        return fun(*xs)[:ndim]

    in_axes = (0,) * len(cols) + (None,) * len(prefetch)
    # Eager vmap: each primitive runs once over the whole grid, and JAX caches its executable
    # by shape, so repeated traces cost no compilation (jit would recompile every fresh map).
    out = jax.vmap(at, in_axes=in_axes)(*[jnp.asarray(c) for c in cols], *prefetch)
    return [np.asarray(o) for o in out]


def window_moves(bm: Any, grid: tuple[int, ...]) -> bool:
    """The index map of ``bm`` may return different blocks over ``grid``: one of its outputs
    depends on a grid index of extent > 1, or on a scalar-prefetch ref (whose entries may
    differ), as far as the jaxpr's data flow shows."""
    j = open_jaxpr(bm.index_map_jaxpr)
    deps: dict[Any, set[int]] = {v: {i} for i, v in enumerate(j.invars)}
    for eqn in j.eqns:
        used = set().union(*(deps.get(v, set()) for v in eqn.invars
                             if not isinstance(v, Literal)))
        if eqn.primitive.name == "num_programs":  # reads an extent, not an index
            used = set()
        for v in eqn.outvars:
            deps[v] = used
    reached = set().union(*(deps.get(v, set()) for v in j.outvars[:len(bm.block_shape)]
                            if not isinstance(v, Literal)))
    return any(i >= len(grid) or grid[i] > 1 for i in reached)


def prefetch_read(bm: Any, ngrid: int) -> set[int]:
    """The scalar-prefetch refs (by position) the index map of ``bm`` reads or passes on to a
    nested call: its inputs after the ``ngrid`` grid indices that some eqn takes."""
    j = open_jaxpr(bm.index_map_jaxpr)
    refs = {v: i for i, v in enumerate(j.invars[ngrid:])}
    return {refs[v] for eqn in j.eqns for v in eqn.invars
            if not isinstance(v, Literal) and v in refs}


def reads_prefetch_at_prefetched_index(bm: Any, ngrid: int) -> bool:
    """Whether the index map of ``bm`` reads a scalar-prefetch ref at an index computed from
    another read of scalar prefetch (``table[s * slots + positions[s] // page_size]``)."""
    j = open_jaxpr(bm.index_map_jaxpr)
    refs = set(j.invars[ngrid:])
    read: set[Any] = set()  # values that depend on a read of scalar prefetch
    for eqn in j.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        if eqn.primitive.name == "get" and ins and ins[0] in refs:
            if any(v in read for v in ins[1:]):
                return True
        elif not any(v in read for v in ins):
            continue
        read |= set(eqn.outvars)
    return False


def prefetch_reads(params: dict[str, Any], call: KernelCall) -> dict[str, Any]:
    """Per scalar-prefetch operand, the entries the index maps read at every grid step.

    Only ``ref[...]`` reads at the top level of an index map are seen (nested ``cond``/loops
    inside an index map are not); returns ``{name: access.PrefetchReads}``.
    """
    gm = params["grid_mapping"]
    prefetch = [o for o in call.operands if o.role == "scalar_prefetch"]
    if not prefetch:
        return {}
    points = call.grid_indices()
    ngrid = points.shape[1]
    values = [np.asarray(o.value) for o in prefetch]
    rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {i: [] for i in range(len(prefetch))}
    for bm in gm.block_mappings:
        closed = bm.index_map_jaxpr
        jaxpr = open_jaxpr(closed)
        refs = {v: i for i, v in enumerate(jaxpr.invars[ngrid:])}
        gets = [e for e in jaxpr.eqns if e.primitive.name == "get" and e.invars[0] in refs]
        if not gets:
            continue
        leaves = [v for e in gets for v in e.invars[1:]]
        info = jaxpr.debug_info
        probe = jaxpr.replace(outvars=leaves, debug_info=info._replace(result_paths=None)
                              if info is not None else None) if leaves else None
        if probe is not None:
            probe = close_jaxpr(probe, consts_of(closed))
            cols = [points[:, i].astype(np.int32) for i in range(ngrid)]
            try:
                leaf_vals = [np.broadcast_to(np.asarray(v), (points.shape[0],))
                             for v in scalar_program(probe, cols + values, call.grid)]
            except NotScalar:
                leaf_vals = evaluate_with_jax(probe, len(leaves), cols, values)
        at = 0
        for e in gets:
            which = refs[e.invars[0]]
            n = len(e.invars) - 1
            mine, at = leaf_vals[at:at + n] if n else [], at + n
            shape = tuple(prefetch[which].shape)
            for step in range(points.shape[0]):
                transforms = jax.tree_util.tree_unflatten(e.params["tree"],
                                                          [v[step] for v in mine])
                ids = select(shape, transforms).ids
                flat = np.unique(ids.reshape(-1))
                rows[which].append((np.full(flat.shape, step, np.int64), flat))
    out = {}
    for i, op in enumerate(prefetch):
        steps = np.concatenate([r[0] for r in rows[i]]) if rows[i] else np.zeros(0, np.int64)
        flat = np.concatenate([r[1] for r in rows[i]]) if rows[i] else np.zeros(0, np.int64)
        out[op.name] = PrefetchReads(op.name, tuple(op.shape), steps, flat)
    return out
