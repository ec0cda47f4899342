"""Which values of a kernel body decide what kernelsim records about it (``BodyNeeds``), so
the body interpreter (``kernelsim.body``) computes only those."""

from __future__ import annotations

import functools
from typing import Any

import jax

from kernelsim.adapter import AbstractRef, Literal, open_jaxpr, scan_operands
from kernelsim.jaxprs import call_body, sub_jaxprs

# Effects on semaphores other than DMA waits: no data moves, nothing to record.
IGNORED = ("debug_callback", "debug_print", "semaphore_signal", "semaphore_wait")
REF_EFFECTS = ("get", "swap", "addupdate", "masked_load", "masked_swap", "dma_start",
               "dma_wait", "run_scoped")


def has_body_dma(jaxpr: Any) -> bool:
    """The kernel jaxpr starts a DMA somewhere (nested loops and branches included)."""
    return any(eqn.primitive.name == "dma_start" or
               any(has_body_dma(j) for j, _ in sub_jaxprs(eqn)) for eqn in open_jaxpr(jaxpr).eqns)


@functools.lru_cache(maxsize=4096)
def has_ref_effect(jaxpr: Any) -> bool:
    """``jaxpr`` reads, writes, allocates or copies a ref somewhere."""
    return any(eqn.primitive.name in REF_EFFECTS or
               any(has_ref_effect(j) for j, _ in sub_jaxprs(eqn)) for eqn in open_jaxpr(jaxpr).eqns)


def is_ref(v: Any) -> bool:
    return not isinstance(v, Literal) and isinstance(getattr(v, "aval", None),
                                                               AbstractRef)


class BodyNeeds:
    """Which values of a kernel body decide what kernelsim records, so only those are computed.

    Needed from the start: the indices of every ref read and write, every operand of a DMA
    other than its refs (slice starts and sizes), branch predicates and loop conditions.
    Then, transitively: the operands of any eqn whose result is needed; the contents of a ref
    a needed value is read from (which needs every value written into it, and the source of
    every DMA into it). Refs are tracked by alias class: a ref passed into a branch, loop or
    call is the same ref inside (union-find over ref vars). Everything else -- the block
    arithmetic that is the kernel's actual work -- is never evaluated.
    """

    def __init__(self, jaxpr: Any):
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
            self._seed(ins[1 + nval:])
            if nval:
                self._need(ins[0], ins[1])
            for o in outs:
                self._need(o, ins[0])
        elif name in ("masked_load", "masked_swap"):
            # (ref, transforms, mask, other) for a load, (ref, transforms, val, mask) for a swap
            ref, transforms, a, b = p["args_tree"].unflatten(ins)
            value, mask, other = (a, b, None) if name == "masked_swap" else (None, a, b)
            self._seed(jax.tree_util.tree_leaves(transforms))
            self._seed([] if mask is None else [mask])
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
            self._seed(ins[:1])
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
            self._seed(cj.outvars)
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
def body_needs(jaxpr: Any) -> BodyNeeds:
    return BodyNeeds(jaxpr)
