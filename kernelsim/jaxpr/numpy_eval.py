"""Concrete values of ordinary JAX code, evaluated in numpy (no compilation).

``numpy_eval`` runs a jaxpr op by op with ``kernelsim.jaxpr.lax_numpy``'s rules (XLA's semantics);
the call finder uses it for the code around kernels and the body interpreter for the values a
kernel body's indices and DMAs depend on. What it cannot evaluate raises
``lax_numpy.Unsupported`` and the caller asks XLA instead.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from kernelsim.adapter import Literal, consts_of, open_jaxpr, scan_operands
from kernelsim.jaxpr import lax_numpy
from kernelsim.jaxpr.nesting import call_body

# How many primitive applications one numpy evaluation may make before it gives the slice to
# XLA (a long while_loop runs faster compiled than op by op in Python).
NUMPY_BUDGET = 20_000


def numpy_eval(jaxpr: Any, consts: list, args: list, budget: list | None = None) -> list:
    """Evaluate ``jaxpr`` on concrete values with numpy (``kernelsim.jaxpr.lax_numpy``'s rules).

    Understands nested calls (jit, custom_jvp/vjp, checkpoint), ``cond``, ``while``, ``scan``
    and hijax primitives (through their ``expand``). Raises ``lax_numpy.Unsupported`` for
    anything else, for operands of a dtype it does not model, or past ``NUMPY_BUDGET``
    primitive applications; the caller then asks XLA.
    """
    budget = [NUMPY_BUDGET] if budget is None else budget
    j = open_jaxpr(jaxpr)
    env: dict[Any, Any] = dict(zip(j.constvars, (np.asarray(c) for c in consts), strict=True))
    env.update(zip(j.invars, (np.asarray(a) for a in args), strict=True))

    def read(v: Any) -> Any:
        return literal(v) if isinstance(v, Literal) else env[v]

    for eqn in j.eqns:
        budget[0] -= 1
        if budget[0] < 0:
            raise lax_numpy.Unsupported("too long for op-by-op evaluation")
        vals = [read(v) for v in eqn.invars]
        outs = numpy_eqn(eqn, vals, budget)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in j.outvars]


def numpy_eqn(eqn: Any, vals: list, budget: list) -> list:
    """One eqn of ``numpy_eval``: its outputs, as a list."""
    name, p = eqn.primitive.name, eqn.params
    body = call_body(eqn)
    if body is not None:
        return numpy_eval(body, consts_of(body), vals, budget)
    if name == "cond":
        branches = p["branches"]
        b = branches[min(max(int(vals[0]), 0), len(branches) - 1)]  # HLO clamps the index
        return numpy_eval(b, consts_of(b), vals[1:], budget)
    if name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cc, bc, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        while bool(numpy_eval(cj, consts_of(cj), cc + carry, budget)[0]):
            carry = numpy_eval(bj, consts_of(bj), bc + carry, budget)
        return carry
    if name == "scan":
        consts, carry, xs = scan_operands(p, vals)
        ys = []
        order = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
        for i in order:
            out = numpy_eval(p["jaxpr"], consts_of(p["jaxpr"]), consts + carry + [x[i] for x in xs],
                              budget)
            carry, y = out[:len(carry)], out[len(carry):]
            ys.append(y)
        if p["reverse"]:
            ys.reverse()
        nys = len(eqn.outvars) - len(carry)
        if not ys:
            return carry + [np.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars[len(carry):]]
        return carry + [np.stack([y[k] for y in ys]) for k in range(nys)]
    if name == "call_hi_primitive":
        prim = p["_prim"]  # primitives hash by their params alone: the types complete the key
        expanded = _hi_expansion(prim, tuple(prim.in_avals_flat), tuple(prim.out_avals_flat))
        return numpy_eval(expanded, consts_of(expanded), vals, budget)
    return lax_numpy.apply(name, vals, p, [v.aval for v in eqn.outvars])


@functools.lru_cache(maxsize=256)
def _hi_expansion(prim: Any, in_avals: tuple, out_avals: tuple) -> Any:
    """The jaxpr of a hijax primitive's ``expand`` (jax >= 0.12: e.g. ``jnp.searchsorted``)
    for operands of types ``in_avals``."""
    try:
        closed = jax.make_jaxpr(prim.expand)(*prim.in_avals)
    except Exception as e:  # noqa: BLE001 - not expandable here: XLA evaluates it
        raise lax_numpy.Unsupported(f"hijax primitive {type(prim).__name__}") from e
    return closed


def literal(v: Any) -> np.ndarray:
    """A jaxpr literal as a numpy value of its own dtype (a Python int literal stays int32)."""
    try:
        return np.asarray(v.val, dtype=np.dtype(v.aval.dtype))
    except TypeError:  # an extended dtype: keep the value as JAX made it
        return v.val
