"""The order of a kernel body's own DMAs over its whole run (``dma_order``), and whether that
order would block forever (``would_hang``): overlap, buffers, copy sizes, in-place safety,
waits and grid semantics, followed through the body over its grid and its loops. Facts for
``grader.facts.work``, read from a ``pallas_call``'s public params alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from jax import tree_util
from jax.extend.core import Literal, jaxprs_in_params

from grader.calling import LAYOUT, TRANSPARENT, eqns, open_jaxpr


class _Buffer:
    """A kernel ref (an operand, scratch, or a ``run_scoped`` allocation) in ``dma_order``'s
    walk: a name and its memory space."""

    def __init__(self, name: str, aval: Any):
        self.name = name
        self.space = str(getattr(aval, "memory_space", "")).lower()
        self.shape = tuple(getattr(getattr(aval, "inner_aval", aval), "shape", ()) or ())

    def on_chip(self) -> bool:
        return "vmem" in self.space or "smem" in self.space


_REF_OPS = frozenset({"get", "swap", "addupdate"})
# integer scalar operations, as lax defines them (div and rem truncate toward zero)
_SCALAR_OPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "and": np.bitwise_and, "or": np.bitwise_or,
    "not": np.invert, "neg": np.negative,
    "div": lambda a, b: (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(a.dtype),
    "rem": lambda a, b: (np.sign(a) * (np.abs(a) % np.abs(b))).astype(a.dtype),
}
_UNKNOWN = object()  # a value the walk does not compute: array data
# how many body executions (grid steps times loop iterations) the walk follows at most
DMA_WALK_LIMIT = 4096


class _Copy:
    def __init__(self, number: int, src: tuple, dst: tuple, elements: int, at: tuple):
        self.number, self.src, self.dst, self.elements, self.at = number, src, dst, elements, at


def _end(end: Any) -> tuple[_Buffer | None, tuple, int]:
    """One end of a DMA: its buffer, the integer indices that select part of it (a slot, a
    slice start) and the number of elements it spans."""
    ref, transforms = (end, ()) if isinstance(end, _Buffer) else \
        (getattr(end, "ref", None), tuple(getattr(end, "transforms", ())))
    if not isinstance(ref, _Buffer):
        return None, (), 0
    where, shape = [], ref.shape
    for t in transforms:
        indices = getattr(t, "indices", None)
        if indices is None:
            continue
        shape = tuple(t.get_indexer_shape())
        for ix in indices:
            start = getattr(ix, "start", ix)
            where.append(int(start) if isinstance(start, int | np.integer) else -1)
    return ref, tuple(where), int(math.prod(shape))


def _semaphore_key(sem: Any) -> tuple:
    """A semaphore as the walk matches starts and waits: its ref's name and the slot."""
    sem_ref, sem_at, _ = _end(sem)
    return (sem_ref.name if sem_ref else "?", sem_at)


class _DmaWalk:
    """Follows a kernel body over its grid (steps in order, as on one core) and its loops,
    computing only scalar integer values (program ids, loop counters, slots), and lists in
    program order each DMA start, DMA wait and compute point (an equation computing floating
    point arrays, consecutive ones counted once)."""

    def __init__(self, grid: tuple[int, ...]):
        self.grid = grid
        self.index: tuple[int, ...] = ()
        self.events: list[tuple] = []
        self.copies: list[_Copy] = []
        self.executions = 0
        self.scoped = 0

    def run(self, jaxpr: Any, args: list, consts: list | None = None) -> list:
        j = open_jaxpr(jaxpr)
        env: dict[int, Any] = {}
        for v, x in zip(j.invars, args, strict=True):
            env[id(v)] = x
        if consts is None:
            consts = getattr(jaxpr, "consts", None) or [_UNKNOWN] * len(j.constvars)
        for v, x in zip(j.constvars, consts, strict=True):
            env[id(v)] = x

        def read(v):
            return v.val if isinstance(v, Literal) else env.get(id(v), _UNKNOWN)

        for eqn in j.eqns:
            outs = self.eqn(eqn, [read(v) for v in eqn.invars])
            for v, x in zip(eqn.outvars, outs, strict=True):
                env[id(v)] = x
        return [read(v) for v in j.outvars]

    def _compute(self, eqn: Any) -> None:
        out = eqn.outvars[0].aval if eqn.outvars else None
        if out is not None and getattr(out, "shape", ()) and \
                np.issubdtype(np.dtype(out.dtype), np.floating) and \
                eqn.primitive.name not in LAYOUT | _REF_OPS:
            if not self.events or self.events[-1][0] != "compute":
                self.events.append(("compute", self.index))

    def dma(self, eqn: Any, vals: list, start: bool) -> None:
        # (src, dst, the semaphore the wait reads, the sender's semaphore, device id); a
        # wait on the sending side (``wait_send``) comes with src and dst swapped
        src, dst, sem, send_sem, *_ = tree_util.tree_unflatten(eqn.params["tree"], vals)
        key = _semaphore_key(sem)
        if start:
            (s, s_at, n), (d, d_at, _) = _end(src), _end(dst)
            copy = _Copy(len(self.copies), (s.name if s else "?", s_at, bool(s and s.on_chip())),
                         (d.name if d else "?", d_at, bool(d and d.on_chip())), n, self.index)
            self.copies.append(copy)
            self.events.append(("start", key, copy))
            if send_sem is not None:  # a remote copy: the sender waits on this one too
                self.events.append(("start_send", _semaphore_key(send_sem), copy))
        else:
            self.events.append(("wait", key, self.index))

    def eqn(self, eqn: Any, vals: list) -> list:
        name, p = eqn.primitive.name, eqn.params
        n_out = len(eqn.outvars)
        if name in ("dma_start", "dma_wait"):
            self.dma(eqn, vals, name == "dma_start")
            return []
        if name == "program_id":
            return [self.index[p["axis"]] if p["axis"] < len(self.index) else _UNKNOWN]
        if name == "num_programs":
            return [self.grid[p["axis"]] if p["axis"] < len(self.grid) else _UNKNOWN]
        if name == "cond":
            index = vals[0]
            if index is _UNKNOWN:  # a branch on data: follow none, count it as compute
                self._compute(eqn)
                return [_UNKNOWN] * n_out
            branches = p["branches"]
            return self.run(branches[int(np.clip(int(index), 0, len(branches) - 1))], vals[1:])
        if name == "scan":
            if "ft_in" in p:  # jax >= 0.11: consts, carry and xs as one tree
                consts, carry, xs = (list(t) for t in p["ft_in"].update(vals).unpack())
            else:
                nc, nca = p["num_consts"], p["num_carry"]
                consts, carry, xs = vals[:nc], vals[nc:nc + nca], vals[nc + nca:]
            ncarry = len(carry)
            for _ in range(p["length"]):
                if not self._tick():
                    break
                carry = self.run(p["jaxpr"], consts + carry + [_UNKNOWN] * len(xs))[:ncarry]
            return carry + [_UNKNOWN] * (n_out - ncarry)
        if name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cc, bc, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
            go: Any = True
            while self._tick():
                go = self.run(p["cond_jaxpr"], cc + carry)[0]
                if go is _UNKNOWN or not bool(go):
                    break
                carry = self.run(p["body_jaxpr"], bc + carry)
            return [_UNKNOWN] * n_out if go is _UNKNOWN else carry
        if name == "run_scoped":
            fresh = []  # the allocations are the body's arguments; its operands, constants
            for v in open_jaxpr(p["jaxpr"]).invars:
                fresh.append(_Buffer(f"scoped{self.scoped}", v.aval))
                self.scoped += 1
            return self.run(p["jaxpr"], fresh, consts=vals)
        subs = list(jaxprs_in_params(p))
        if name in TRANSPARENT and len(subs) == 1 and len(open_jaxpr(subs[0]).invars) == len(vals):
            return self.run(subs[0], vals)
        self._compute(eqn)
        if subs or any(v is _UNKNOWN or isinstance(v, _Buffer) for v in vals) or \
                any(getattr(v.aval, "shape", ()) for v in eqn.outvars):
            return [_UNKNOWN] * n_out
        args = [np.asarray(v) for v in vals]
        try:
            if name in _SCALAR_OPS:  # NumPy: binding each op would compile it in XLA first
                out = _SCALAR_OPS[name](*args)
            elif name == "convert_element_type":
                out = args[0].astype(p["new_dtype"])
            elif name == "select_n":
                out = args[1 + int(args[0])]
            else:
                out = eqn.primitive.bind(*args, **p)
        except Exception:  # noqa: BLE001 - a value the walk cannot compute is unknown
            return [_UNKNOWN] * n_out
        outs = out if eqn.primitive.multiple_results else [out]
        return [np.asarray(o)[()] if np.ndim(o) == 0 else _UNKNOWN for o in outs]

    def _tick(self) -> bool:
        self.executions += 1
        return self.executions <= DMA_WALK_LIMIT


def _has_dma(jaxpr: Any) -> bool:
    return any(e.primitive.name == "dma_start" for e in eqns(jaxpr))


def dma_order(params: dict) -> dict | None:
    """The DMAs a kernel body starts by hand, in the order it issues them over its whole run
    (grid steps in order, loops unrolled; None when it starts none). JSON-ready:

    - ``copies``: the copies into on-chip memory (``in``) and out of it (``out``): how many,
      the distinct element counts they move, and the distinct on-chip buffers (ref and slot)
      they use;
    - ``computes`` and ``overlapped``: how many compute points the run has, and at how many
      of them a copy into on-chip memory is in flight (started, not yet waited): the next
      chunk's copy started before this chunk's compute;
    - ``unsafe``: copies started into an on-chip buffer while a copy out of that same buffer
      is still in flight (the write-back is still reading it);
    - ``crosses_steps``: a copy started at one grid step is waited at another;
    - ``never_waited`` / ``waits_unmatched``: starts no wait consumes, waits no start signals
      (a kernel that waits for a copy nobody started never returns);
    - ``semantics``: the grid's dimension semantics, as the call states them.
    """
    kernel = params["jaxpr"]
    if not _has_dma(kernel):
        return None
    gm = params["grid_mapping"]
    grid = tuple(int(g) for g in gm.grid)
    j = open_jaxpr(kernel)
    walk = _DmaWalk(grid)
    refs = [_Buffer(f"ref{i}", v.aval) for i, v in enumerate(j.invars)]
    for index in np.ndindex(*grid) if grid else [()]:
        if not walk._tick():
            break
        walk.index = tuple(int(i) for i in index)
        walk.run(kernel, list(refs))
    exact = all(-1 not in e[1][1] for e in walk.events if e[0] != "compute")
    pending: dict[tuple, list[_Copy]] = {}
    in_flight: list[_Copy] = []
    computes = overlapped = unsafe = unmatched = 0
    crosses = False
    for event in walk.events:
        kind = event[0]
        if kind == "start":
            _, key, copy = event
            if copy.dst[2] and any(c.src[:2] == copy.dst[:2] and c.src[2] for c in in_flight):
                unsafe += 1
            pending.setdefault(key, []).append(copy)
            in_flight.append(copy)
        elif kind == "start_send":  # a remote copy's sending side, waited on by wait_send
            _, key, copy = event
            pending.setdefault(key, []).append(copy)
        elif kind == "wait":
            _, key, at = event
            if pending.get(key):
                copy = pending[key].pop(0)
                if copy in in_flight:
                    in_flight.remove(copy)
                crosses |= copy.at != at
            else:
                unmatched += 1
        else:
            computes += 1
            overlapped += any(c.dst[2] and not c.src[2] for c in in_flight)
    cp = params.get("compiler_params")
    semantics = getattr(cp, "dimension_semantics", None)
    if isinstance(cp, dict):
        semantics = next((getattr(v, "dimension_semantics", None) for v in cp.values()), None)
    copies_in = [c for c in walk.copies if c.dst[2] and not c.src[2]]
    copies_out = [c for c in walk.copies if c.src[2] and not c.dst[2]]
    return {
        "copies": {
            d: {"count": len(cs), "elements": sorted({c.elements for c in cs}),
                "buffers": len({(c.dst if d == "in" else c.src)[:2] for c in cs})}
            for d, cs in (("in", copies_in), ("out", copies_out))},
        "computes": computes, "overlapped": overlapped, "unsafe": unsafe,
        "crosses_steps": crosses, "never_waited": sum(len(v) for v in pending.values()),
        "waits_unmatched": unmatched,
        "semantics": [str(s).rsplit(".", 1)[-1].lower() for s in semantics or ()],
        "followed": walk.executions <= DMA_WALK_LIMIT, "exact": exact}


def would_hang(work: dict) -> str | None:
    """Why executing the program would block forever, from its DMA order, as the case's error
    ("DmaWouldHang: ..."; None: it would not, as far as the order shows): a wait no copy
    signals, where every semaphore slot was known, or copies that cross grid steps on a grid
    whose steps may run in any order."""
    for c in work["calls"]:
        d = c["dma"]
        if d is None:
            continue
        if d["exact"] and d["waits_unmatched"]:
            return (f"DmaWouldHang: pallas_call #{c['number']} waits {d['waits_unmatched']} "
                    "time(s) for a DMA that no copy started, so it would never return: pair "
                    "every .wait() with the .start() of the same copy (same semaphore, same size)")
        if d["crosses_steps"] and any(s != "arbitrary" for s in d["semantics"]):
            return (f"DmaWouldHang: pallas_call #{c['number']} waits at one grid step for a "
                    f"copy started at another, on a {'/'.join(d['semantics'])} grid whose steps "
                    "may run in any order or on two cores, where that wait never returns: mark "
                    "the grid dimension_semantics=(\"arbitrary\",)")
    return None
