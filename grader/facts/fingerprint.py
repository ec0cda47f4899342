"""Whose kernel body is it? A body's identity up to renaming, for "kernels are your own".

``fingerprint`` is the sha256 of ``canonical``: a kernel body's jaxpr as text that two bodies
share exactly when they are the same program up to the names of their variables, dead code and
the numbers in it (shapes, sizes, literal values, which differ with the case a body runs on) but
the axes it contracts, reduces, transposes or broadcasts along.
``grader.facts.work`` records each kernel's fingerprint among its facts;
``grader.tasks.shipped`` stores those of the bodies a learner did not write, at any size.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from jax.extend.core import Literal, jaxprs_in_params

from grader.calling import open_jaxpr

# what a body's fingerprint leaves out: numbers (shapes, sizes, literal values, which differ with
# the case a body runs on) and object addresses
_ERASED = re.compile(r"0x[0-9a-fA-F]+|\d+")


# parameters left out of a fingerprint: a dot's precision, so that a shipped body with
# precision="highest" added (or left out) is still the same body
_UNFINGERPRINTED = frozenset({"precision"})


# parameters whose numbers are axes, not sizes: kept, so that ``a @ b.T`` is not ``a @ b`` and a
# sum over rows is not one over columns (a body's ranks are in its fingerprint already)
_AXES = frozenset({"dimension_numbers", "axes", "permutation", "dimensions",
                   "broadcast_dimensions", "axis", "dimension"})


def _param_text(name: str, value: Any) -> str:
    return repr(value) if name in _AXES else _ERASED.sub("#", repr(value))


def _live(j: Any) -> list:
    """The equations of ``j`` that an output or an effect depends on (dead code removed, so a
    copied body padded with unused arithmetic keeps its fingerprint)."""
    needed = {id(v) for v in j.outvars if not isinstance(v, Literal)}
    kept = []
    for eqn in reversed(j.eqns):
        if eqn.effects or any(id(v) in needed for v in eqn.outvars) or \
                eqn.primitive.name in ("dma_start", "dma_wait", "swap", "addupdate"):
            kept.append(eqn)
            needed |= {id(v) for v in eqn.invars if not isinstance(v, Literal)}
    return kept[::-1]


def canonical(jaxpr: Any) -> str:
    """A kernel body's jaxpr as text that two bodies share exactly when they are the same
    program up to the names of their variables, dead code and the numbers in it: variables
    numbered in order of first use, each equation its primitive, its non-jaxpr parameters
    (numbers erased but axes), its operands and its results' dtypes and ranks, nested jaxprs
    in place."""
    j = open_jaxpr(jaxpr)
    names: dict[int, str] = {}

    def ref(v) -> str:
        aval = getattr(v, "aval", None)
        kind = f"{getattr(aval, 'dtype', '')}/{len(getattr(aval, 'shape', ()) or ())}"
        if isinstance(v, Literal):
            return f"lit:{kind}"
        if id(v) not in names:
            names[id(v)] = f"v{len(names)}:{kind}"
        return names[id(v)]

    lines = [" ".join(ref(v) for v in (*getattr(j, "constvars", ()), *j.invars))]
    for eqn in _live(j):
        nested = set()
        subs = []
        for k, p in sorted(eqn.params.items()):
            found = list(jaxprs_in_params({k: p}))
            if found:
                nested.add(k)
                subs.extend(canonical(s) for s in found)
        params = ",".join(f"{k}={_param_text(k, p)}" for k, p in sorted(eqn.params.items())
                          if k not in nested and k not in _UNFINGERPRINTED)
        ins = " ".join(ref(v) for v in eqn.invars)
        outs = " ".join(ref(v) for v in eqn.outvars)
        lines.append(f"{outs} = {eqn.primitive.name}[{params}]({ins})" +
                     "".join(f"{{{s}}}" for s in subs))
    lines.append("-> " + " ".join(ref(v) for v in j.outvars))
    return "\n".join(lines)


def fingerprint(jaxpr: Any) -> str:
    """sha256 of ``canonical(jaxpr)``: a kernel body's identity up to renaming."""
    return hashlib.sha256(canonical(jaxpr).encode()).hexdigest()

