"""How a jaxpr nests: the jaxprs inside an eqn, and the body a call-like eqn runs.

The call primitives' names and the params their bodies sit in differ between JAX releases
(``pjit`` before ``jit``, ``call_jaxpr``/``fun_jaxpr``/``call``/``fwd_jaxpr``); the names here
cover every supported release. Read by the call finder, the evaluators and the body interpreter.
"""

from __future__ import annotations

import functools
from typing import Any

from kernelsim.adapter import JAXPR_TYPES, close_jaxpr, consts_of, discharge_state, open_jaxpr

CALL_PRIMITIVES = frozenset({
    "pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_vmap_call",
    "remat_opt"})


def call_body(eqn: Any) -> Any | None:
    """The jaxpr a call-like eqn runs on its operands one to one, if it is one.

    ``run_state`` (``pl.run_state``, the usual home of ``pl.core_map``) counts as one: its
    body with the state discharged takes the refs' initial values and returns their final
    ones, as the primitive's own impl evaluates it (jax/_src/state/discharge.py).
    """
    p = eqn.params
    if eqn.primitive.name == "run_state" and all(p["is_initialized"]):
        return discharged(p["jaxpr"])
    if eqn.primitive.name not in CALL_PRIMITIVES:
        return None
    body = called_jaxpr(p)
    return body if isinstance(body, JAXPR_TYPES) else None


def called_jaxpr(params: dict[str, Any]) -> Any:
    """The jaxpr a call-like primitive runs: ``jaxpr`` (jit, checkpoint), ``call_jaxpr``
    (custom_jvp/custom_vjp: the primal, which is what runs unless a transformation already
    applied the custom rule while tracing), ``fun_jaxpr``, or ``call`` (``jax.custom_vmap``
    unbatched: its impl runs ``call``; under ``vmap`` the rule was applied while tracing, so
    the program holds the rule's own kernels instead), or ``fwd_jaxpr`` (``remat_opt``, the
    forward pass of a ``custom_vjp`` under ``jax.grad``: its impl runs ``fwd_jaxpr``)."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr", "call", "fwd_jaxpr"):
        if key in params:
            return params[key]
    return None


@functools.lru_cache(maxsize=256)
def discharged(jaxpr: Any) -> Any:
    return discharge_state(close_jaxpr(open_jaxpr(jaxpr), consts_of(jaxpr)))


def sub_jaxprs(eqn: Any) -> list[tuple[Any, int]]:
    """(jaxpr, repetitions) pairs nested in ``eqn``'s params."""
    p = eqn.params
    name = eqn.primitive.name
    if name == "scan":
        return [(open_jaxpr(p["jaxpr"]), int(p["length"]))]
    if name == "cond":
        return [(open_jaxpr(b), 1) for b in p["branches"]]
    if name == "while":
        return [(open_jaxpr(p["body_jaxpr"]), 1)]
    found = []
    for v in p.values():
        for item in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(item, JAXPR_TYPES):
                found.append((open_jaxpr(item), 1))
    return found
