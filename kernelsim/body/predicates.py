"""A kernel body's ``pl.when`` predicates at every grid step at once.

A ``pl.when`` (a ``cond``) decides which of its branches runs; which one runs at a grid step
decides the work that step does (``kernelsim.find.flops.step_work``). A predicate that is a
function of the program ids, the grid's extents, literals and scalar-prefetch entries has one
value per grid step, known before the kernel runs: ``StepValues`` evaluates such scalar code
over all the steps at once, a numpy array of shape ``(steps,)`` standing for each scalar. Any
other operand -- a value read from an input block or from scratch, a loop's carry -- makes it
``NotEvaluable``, with the reason.

Semantics are ``kernelsim.jaxpr.lax_numpy``'s (XLA's); a scalar-prefetch read out of the
table's bounds is clamped (the step it happens at may be one whose branch never runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from kernelsim.adapter import IndexSlice, Literal, NDIndexer, open_jaxpr
from kernelsim.jaxpr import lax_numpy
from kernelsim.jaxpr.nesting import call_body

# On 0-d operands these restate the value (a scalar as 0-d); with a (steps,) array
# standing for the scalar they must not reshape it.
_RESTATES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "copy",
                       "copy_p", "multiple_of", "optimization_barrier", "pjit_dce"})


class NotEvaluable(Exception):
    """A value that is not a function of the grid step alone (the message says what)."""


class PrefetchRef:
    """A scalar-prefetch ref: its contents, the same at every step."""

    def __init__(self, data: np.ndarray):
        self.data = data


class StepValues:
    """The scalar values of one jaxpr (a kernel body, or a branch or call inside it) at every
    grid step: ``value(var)`` evaluates what ``var`` depends on, once.

    grid_indices: (steps, rank) int array, each step's grid point; grid: the extents.
    bound: the jaxpr's invars and what each one is (a ``PrefetchRef``, or a function giving
    the value of the operand it stands for); an invar not bound is ``NotEvaluable``.
    """

    def __init__(self, jaxpr: Any, grid_indices: np.ndarray, grid: tuple[int, ...],
                 bound: dict[Any, PrefetchRef | Callable[[], Any]]):
        self.jaxpr, self.grid_indices, self.grid = open_jaxpr(jaxpr), grid_indices, grid
        self._bound = bound
        self._memo: dict[Any, Any] = {}
        self._producer = {v: eqn for eqn in self.jaxpr.eqns for v in eqn.outvars}

    def inner(self, jaxpr: Any, operands: list) -> StepValues:
        """The values of ``jaxpr`` (a branch or a call's body) whose invars receive
        ``operands``, vars of this jaxpr: each is evaluated here when it is needed there."""
        invars = open_jaxpr(jaxpr).invars
        return StepValues(jaxpr, self.grid_indices, self.grid, {
            inner: (lambda v=outer: self.value(v)) for inner, outer in
            zip(invars, operands, strict=True)})

    def branch_index(self, cond_eqn: Any) -> np.ndarray:
        """Which branch of ``cond_eqn`` (an eqn of this jaxpr) runs at each step, clamped to
        the branches as HLO clamps it."""
        index = np.broadcast_to(np.asarray(self.value(cond_eqn.invars[0])),
                                (len(self.grid_indices),))
        return np.clip(index.astype(np.int64), 0, len(cond_eqn.params["branches"]) - 1)

    def value(self, v: Any) -> Any:
        """``v`` at every step: a (steps,) array, a 0-d one when it is the same at every
        step, or a ``PrefetchRef``."""
        if isinstance(v, Literal):
            return np.asarray(v.val)
        if v in self._memo:
            return self._memo[v]
        if v in self._bound:
            b = self._bound[v]
            out = b if isinstance(b, PrefetchRef) else b()
        elif v in self._producer:
            eqn = self._producer[v]
            self._memo.update(zip(eqn.outvars, self._eqn(eqn), strict=True))
            return self._memo[v]
        else:
            raise NotEvaluable("it reads an operand other than scalar prefetch: a block, "
                                "scratch or a value from outside")
        self._memo[v] = out
        return out

    def _eqn(self, eqn: Any) -> list:
        name, p = eqn.primitive.name, eqn.params
        if name == "program_id":
            return [self.grid_indices[:, p["axis"]].astype(np.int32)]
        if name == "num_programs":
            return [np.asarray(self.grid[p["axis"]], np.int32)]
        if name == "get":
            return [self._prefetch_read(eqn)]
        body = call_body(eqn)
        if body is not None:
            inner = self.inner(body, list(eqn.invars))
            return [inner.value(o) for o in open_jaxpr(body).outvars]
        if any(getattr(o.aval, "shape", None) != () for o in eqn.outvars):
            raise NotEvaluable(f"it depends on {name!r} of an array")
        vals = [self.value(v) for v in eqn.invars]
        if any(isinstance(x, PrefetchRef) for x in vals):
            raise NotEvaluable(f"it passes a ref to {name!r}")
        if name in _RESTATES and len(vals) == 1:
            return vals
        try:
            return lax_numpy.apply(name, [np.asarray(x) for x in vals], p,
                                   [o.aval for o in eqn.outvars], check_shapes=False)
        except lax_numpy.Unsupported as e:
            raise NotEvaluable(f"kernelsim does not evaluate {name!r} here ({e})") from None

    def _prefetch_read(self, eqn: Any) -> np.ndarray:
        """A scalar read from a scalar-prefetch ref, at indices known at every step."""
        ref = self.value(eqn.invars[0])
        if not isinstance(ref, PrefetchRef):
            raise NotEvaluable("it reads a ref other than scalar prefetch")
        transforms = jax.tree_util.tree_unflatten(
            eqn.params["tree"], [self.value(v) for v in eqn.invars[1:]])
        if (len(transforms) != 1 or not isinstance(transforms[0], NDIndexer)
                or eqn.outvars[0].aval.shape != ()):
            raise NotEvaluable("it reads scalar prefetch through a view")
        index = []
        for ix, extent in zip(transforms[0].indices, ref.data.shape, strict=True):
            if isinstance(ix, IndexSlice):
                if ix.size != 1:
                    raise NotEvaluable("it reads a slice of scalar prefetch")
                ix = ix.start
            index.append(np.clip(np.asarray(ix).astype(np.int64), 0, extent - 1))
        return ref.data[tuple(index)]
