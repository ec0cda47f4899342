"""Which values of a kernel body decide what kernelsim records about it (``BodyNeeds``), so
the body interpreter (``kernelsim.body.steps``) computes only those."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from kernelsim.adapter import AbstractRef, Literal, open_jaxpr, scan_operands
from kernelsim.jaxpr.nesting import CALL_PRIMITIVES, call_body, sub_jaxprs

# Effects on semaphores other than DMA waits: no data moves, nothing to record.
IGNORED = ("debug_callback", "debug_print", "semaphore_signal", "semaphore_wait")
REF_EFFECTS = ("get", "swap", "addupdate", "masked_load", "masked_swap", "dma_start",
               "dma_wait", "run_scoped")


REF_WRITES = ("swap", "addupdate", "masked_swap")
DMA_EFFECTS = ("dma_start", "dma_wait")


@functools.lru_cache(maxsize=4096)
def _holds(jaxpr: Any, names: tuple[str, ...]) -> bool:
    """``jaxpr`` has an eqn of one of the primitives ``names`` somewhere (nested loops,
    branches and calls included)."""
    return any(eqn.primitive.name in names or any(_holds(j, names) for j, _ in sub_jaxprs(eqn))
               for eqn in open_jaxpr(jaxpr).eqns)


def has_body_dma(jaxpr: Any) -> bool:
    """The kernel jaxpr starts a DMA somewhere (nested loops and branches included)."""
    return _holds(jaxpr, ("dma_start",))


def has_dma_effect(jaxpr: Any) -> bool:
    """``jaxpr`` starts or waits for a DMA somewhere."""
    return _holds(jaxpr, DMA_EFFECTS)


def has_ref_effect(jaxpr: Any) -> bool:
    """``jaxpr`` reads, writes, allocates or copies a ref somewhere."""
    return _holds(jaxpr, REF_EFFECTS)


def written_refs(jaxpr: Any) -> list:
    """The ref vars ``jaxpr`` stores into, nested jaxprs included (their own vars, which
    ``BodyNeeds`` binds to the refs passed in)."""
    found = []
    for eqn in open_jaxpr(jaxpr).eqns:
        if eqn.primitive.name in REF_WRITES:
            found.append(eqn.invars[0])
        for j, _ in sub_jaxprs(eqn):
            found.extend(written_refs(j))
    return found


def is_ref(v: Any) -> bool:
    return not isinstance(v, Literal) and isinstance(getattr(v, "aval", None),
                                                               AbstractRef)


def ref_array(aval: Any) -> np.ndarray:
    """Zeros shaped like the ref ``aval`` (a semaphore's as int32): a ref's value before the
    body writes it."""
    inner = getattr(aval, "inner_aval", aval)
    shape = tuple(getattr(inner, "shape", ()))
    dtype = getattr(inner, "dtype", None)
    try:
        return np.zeros(shape, np.dtype(dtype))
    except TypeError:  # semaphores and other non-numeric refs
        return np.zeros(shape, np.int32)


class BodyNeeds:
    """Which values of a kernel body decide what kernelsim records, so only those are computed.

    Needed from the start: every operand of a DMA other than its refs (slice starts and sizes,
    semaphore indices) and the predicates of the branches and loops that start or wait for
    DMAs; when ref accesses are recorded (``record``), also the indices of every ref read and
    write and every branch predicate and loop condition. (Without ``record``, a predicate is
    needed only through what it decides: a needed result of its branch or loop, or a ref whose
    contents are needed that the branch or loop writes.) Then, transitively: the operands of
    any eqn whose result is needed; the contents of a ref a needed value is read from (which
    needs every value written into it, and the source of every DMA into it). Refs are tracked
    by alias class: a ref passed into a branch, loop or call is the same ref inside
    (union-find over ref vars). A pure call (``pure_call_body``) ties each result to its own
    site's operands (``pure_dependencies``): JAX shares one jaxpr between calls of a function
    on the same types. Everything else -- the block arithmetic that is the kernel's actual
    work -- is never evaluated.
    """

    def __init__(self, jaxpr: Any, record: bool = True):
        self.record = record
        self._parent: dict[Any, Any] = {}
        self._edges: list[tuple[Any, Any]] = []  # (a, b): if a is needed, b is needed
        self._seeds: list[Any] = []
        self._scanned: set[int] = set()
        self._keep: list[Any] = []  # scanned jaxprs stay alive, so their ids stay unique
        self._scan(open_jaxpr(jaxpr))
        graph: dict[Any, list[Any]] = {}
        for a, b in self._edges:
            graph.setdefault(self._node(a), []).append(self._node(b))
        needed: set[Any] = set()
        todo = [self._node(x) for x in self._seeds]
        while todo:
            n = todo.pop()
            if n not in needed:
                needed.add(n)
                todo.extend(graph.get(n, ()))
        self._needed = needed

    def value(self, v: Any) -> bool:
        """The value of var ``v`` must be computed."""
        return not isinstance(v, Literal) and v in self._needed

    def contents(self, ref: Any) -> bool:
        """The data held by ref var ``ref`` (and every alias of it) must be tracked."""
        return ("ref", self._find(ref)) in self._needed

    # -- union-find over ref vars
    def _find(self, v: Any) -> Any:
        root = v
        while self._parent.get(root, root) is not root:
            root = self._parent[root]
        while v is not root:
            self._parent[v], v = root, self._parent.get(v, v)
        return root

    def _node(self, x: Any) -> Any:
        return ("ref", self._find(x[1])) if isinstance(x, tuple) else x

    def _need(self, a: Any, b: Any) -> None:
        if isinstance(b, Literal) or isinstance(a, Literal):
            return
        self._edges.append((("ref", a) if is_ref(a) else a, ("ref", b) if is_ref(b) else b))

    def _bind(self, inner: list, outer: list) -> None:
        """Sub-jaxpr inputs ``inner`` receive ``outer``: one ref, or a value needing its source."""
        for a, b in zip(inner, outer, strict=True):
            if isinstance(b, Literal):
                continue
            if is_ref(a) or is_ref(b):
                ra, rb = self._find(a), self._find(b)
                if ra is not rb:
                    self._parent[ra] = rb
            else:
                self._need(a, b)

    def _results(self, outer: list, inner: list) -> None:
        for a, b in zip(outer, inner, strict=True):
            self._need(a, b)

    def _seed(self, vs: Any) -> None:
        self._seeds.extend(("ref", v) if is_ref(v) else v for v in vs
                           if not isinstance(v, Literal))

    def _where(self, indices: list, outs: list, written: Any) -> None:
        """``indices`` say where a ref access reads (its results ``outs``) or writes (the ref
        ``written``, or None): needed to record it, else only for what it reads or writes."""
        if self.record:
            self._seed(indices)
            return
        for i in indices:
            for o in outs:
                self._need(o, i)
            if written is not None:
                self._need(written, i)

    def _decides(self, predicate: list, bodies: list, outs: list) -> None:
        """``predicate`` decides whether (or how often) ``bodies`` run, with results ``outs``."""
        if self.record or any(has_dma_effect(b) for b in bodies):
            self._seed(predicate)
            return
        for p in predicate:
            for o in outs:
                self._need(o, p)
            for b in bodies:
                for ref in written_refs(b):
                    self._need(ref, p)

    def _scan(self, j: Any) -> None:
        if id(j) in self._scanned:  # a shared sub-jaxpr: its own edges are recorded once
            return
        self._scanned.add(id(j))
        self._keep.append(j)
        for eqn in j.eqns:
            self._eqn(eqn)

    def _eqn(self, eqn: Any) -> None:
        name, p, ins, outs = eqn.primitive.name, eqn.params, eqn.invars, eqn.outvars
        if name in ("get", "swap", "addupdate"):
            nval = 0 if name == "get" else 1
            self._where(ins[1 + nval:], outs, ins[0] if nval else None)
            if nval:
                self._need(ins[0], ins[1])
            for o in outs:
                self._need(o, ins[0])
        elif name in ("masked_load", "masked_swap"):
            # (ref, transforms, mask, other) for a load, (ref, transforms, val, mask) for a swap
            ref, transforms, a, b = p["args_tree"].unflatten(ins)
            value, mask, other = (a, b, None) if name == "masked_swap" else (None, a, b)
            self._where(jax.tree_util.tree_leaves(transforms) + ([] if mask is None else [mask]),
                        outs, ref if value is not None else None)
            if value is not None:
                self._need(ref, value)
            for o in outs:
                self._need(o, ref)
                if other is not None:
                    self._need(o, other)
        elif name == "dma_wait":  # which semaphore it waits on: indices only
            self._seed(v for v in ins if not is_ref(v))
        elif name == "dma_start":
            refs = [v for v in ins if is_ref(v)]  # flattened as src, dst, dst_sem, src_sem
            self._seed(v for v in ins if not is_ref(v))
            if len(refs) >= 2:
                self._need(refs[1], refs[0])
        elif name == "cond":
            self._decides(ins[:1], [open_jaxpr(b) for b in p["branches"]], outs)
            for b in p["branches"]:
                bj = open_jaxpr(b)
                self._bind(bj.invars, ins[1:])
                self._results(outs, bj.outvars)
                self._scan(bj)
        elif name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cj, bj = open_jaxpr(p["cond_jaxpr"]), open_jaxpr(p["body_jaxpr"])
            carry = ins[cn + bn:]
            self._bind(cj.invars[:cn], ins[:cn])
            self._bind(bj.invars[:bn], ins[cn:cn + bn])
            self._decides(cj.outvars, [cj, bj], outs)
            for k, c in enumerate(carry):
                for inner in (cj.invars[cn + k], bj.invars[bn + k]):
                    self._bind([inner], [c])
                    self._bind([inner], [bj.outvars[k]])
                self._results([outs[k]], [bj.outvars[k]])
                self._need(outs[k], c)
            self._scan(cj)
            self._scan(bj)
        elif name == "scan":
            body = open_jaxpr(p["jaxpr"])
            consts, carry, xs = scan_operands(p, list(ins))
            nc, ncarry = len(consts), len(carry)
            self._bind(body.invars[:nc], consts)
            for k, c in enumerate(carry):
                self._bind([body.invars[nc + k]], [c])
                self._bind([body.invars[nc + k]], [body.outvars[k]])
                self._results([outs[k]], [body.outvars[k]])
                self._need(outs[k], c)
            self._bind(body.invars[nc + ncarry:], xs)
            self._results(outs[ncarry:], body.outvars[ncarry:])
            self._scan(body)
        elif name == "run_scoped":
            inner = open_jaxpr(p["jaxpr"])
            self._bind(inner.constvars, ins)
            self._results(outs, inner.outvars)
            self._scan(inner)
        elif (body := pure_call_body(eqn)) is not None:
            # A pure call's jaxpr is often shared (jit caches it: every ``jnp.where`` on the
            # same types is one jaxpr), so its vars would tie all its call sites together;
            # its dependencies tie each site's results to that site's operands only.
            for o, deps in zip(outs, pure_dependencies(body), strict=True):
                for k in deps:
                    self._need(o, ins[k])
        elif (body := call_body(eqn)) is not None:
            bj = open_jaxpr(body)
            self._bind(bj.invars, ins)
            self._results(outs, bj.outvars)
            self._scan(bj)
        elif name in IGNORED or name == "semaphore_read":
            return
        elif sub_jaxprs(eqn):  # a construct kernelsim does not look into: everything it uses
            self._seed(ins)
        else:
            for o in outs:
                for i in ins:
                    self._need(o, i)


@functools.lru_cache(maxsize=256)
def body_needs(jaxpr: Any, record: bool = True) -> BodyNeeds:
    return BodyNeeds(jaxpr, record)


def pure_call_body(eqn: Any) -> Any | None:
    """The jaxpr a jit-like call runs, if it is a function of its operands in straight-line
    code: it touches no ref, and holds no branch or loop (calls of such jaxprs are fine)."""
    if eqn.primitive.name not in CALL_PRIMITIVES or any(is_ref(v) for v in eqn.invars):
        return None
    body = call_body(eqn)
    return body if body is not None and _straight_line(body) else None


@functools.lru_cache(maxsize=4096)
def _straight_line(jaxpr: Any) -> bool:
    return all(eqn.primitive.name not in REF_EFFECTS and
               (not sub_jaxprs(eqn) or pure_call_body(eqn) is not None)
               for eqn in open_jaxpr(jaxpr).eqns)


@functools.lru_cache(maxsize=4096)
def pure_slice(jaxpr: Any, out_needed: tuple[bool, ...]) -> tuple[frozenset, tuple[bool, ...]]:
    """The eqns (ids) of pure ``jaxpr`` its needed outputs depend on, and which of its invars
    they read. An eqn with nested jaxprs counts as reading all its operands."""
    j = open_jaxpr(jaxpr)
    live = {v for v, n in zip(j.outvars, out_needed, strict=True)
            if n and not isinstance(v, Literal)}
    evaluated = set()
    for eqn in reversed(j.eqns):
        if any(v in live for v in eqn.outvars):
            evaluated.add(id(eqn))
            live.update(v for v in eqn.invars if not isinstance(v, Literal))
    return frozenset(evaluated), tuple(v in live for v in j.invars)


@functools.lru_cache(maxsize=4096)
def pure_dependencies(jaxpr: Any) -> tuple[tuple[int, ...], ...]:
    """For each output of pure ``jaxpr``, the positions of the invars ``pure_slice`` reads."""
    n = len(open_jaxpr(jaxpr).outvars)
    return tuple(tuple(k for k, read in enumerate(
        pure_slice(jaxpr, tuple(i == out for i in range(n)))[1]) if read) for out in range(n))
