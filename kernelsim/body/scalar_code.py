"""Runs of scalar integer and boolean eqns, compiled once into one Python function each.

A pipeline's loop (``emit_pipeline``, or a kernel's own ``fori_loop`` over DMAs) spends most
of its eqns on scalar index arithmetic: which slot, which block, is this the last step. The
body interpreter runs such a loop thousands of times, and one numpy call per eqn costs
microseconds in dispatch and error-state handling for nanoseconds of arithmetic. So each
maximal run of consecutive scalar integer/boolean eqns becomes one function over Python ints,
generated from the eqns when the interpreter first plans their jaxpr.

Semantics are ``kernelsim.jaxpr.lax_numpy``'s (XLA's, openxla.org/xla/operation_semantics):
integers wrap at their width; ``div`` truncates toward zero, x / 0 is -1 (unsigned: all ones)
and INT_MIN / -1 is INT_MIN; ``rem`` takes the dividend's sign, x % 0 is x; a shift count
outside [0, bits) gives 0, or the sign for an arithmetic right shift; converting to bool is
``!= 0``. Anything else -- floats, arrays, other primitives -- is not compiled here and keeps
the interpreter's general path. ``tests/kernelsim/test_scalar_code.py`` holds every rule to
``lax_numpy``'s on edge values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kernelsim.adapter import Literal


@dataclasses.dataclass(frozen=True)
class _Kind:
    """How a dtype's values live in the generated code: bool, or an int of ``bits`` bits."""

    dtype: np.dtype
    signed: bool
    bits: int

    @property
    def is_bool(self) -> bool:
        return self.dtype.kind == "b"

    def wrap(self, expr: str) -> str:
        """``expr`` (a Python int) wrapped to this integer type's range, as XLA's ints wrap."""
        mask = (1 << self.bits) - 1
        if not self.signed:
            return f"(({expr}) & {mask})"
        half = 1 << (self.bits - 1)
        return f"(((({expr}) + {half}) & {mask}) - {half})"


def _kind(aval: Any) -> _Kind | None:
    """The kind of a scalar (0-d) integer or bool aval; None for anything else."""
    if getattr(aval, "shape", None) != ():
        return None
    try:
        dtype = np.dtype(aval.dtype)
    except TypeError:  # extended dtypes: semaphores, keys
        return None
    if dtype.kind not in "biu":
        return None
    return _Kind(dtype, dtype.kind == "i", 8 * dtype.itemsize)


# -- helpers the generated code calls (their names are its globals)

def _div(a: int, b: int, bits: int, signed: bool) -> int:
    if b == 0:
        return -1 if signed else (1 << bits) - 1
    if signed and a == -(1 << (bits - 1)) and b == -1:
        return a
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _rem(a: int, b: int, bits: int, signed: bool) -> int:
    if b == 0:
        return a
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _shift_left(a: int, s: int, bits: int, signed: bool) -> int:
    return a << s if 0 <= s < bits else 0


def _shift_right_logical(a: int, s: int, bits: int, signed: bool) -> int:
    return (a & ((1 << bits) - 1)) >> s if 0 <= s < bits else 0


def _shift_right_arithmetic(a: int, s: int, bits: int, signed: bool) -> int:
    return a >> s if 0 <= s < bits else (-1 if a < 0 else 0)


_HELPERS = {f.__name__: f for f in (_div, _rem, _shift_left, _shift_right_logical,
                                     _shift_right_arithmetic)}

# name -> (operand kinds, result kind, params, operand expressions) -> expression, or None when
# these operands are not compiled (the general path then runs the eqn)
_Rule = Callable[[list[_Kind], _Kind, dict, list[str]], "str | None"]


def _arith(op: str) -> _Rule:
    def rule(ins, out, params, a):
        return None if out.is_bool else out.wrap(f"{a[0]} {op} {a[1]}")
    return rule


def _compare(op: str) -> _Rule:
    return lambda ins, out, params, a: f"({a[0]} {op} {a[1]})"


def _bitwise(op: str) -> _Rule:
    # two's complement values of one width stay in its range under &, | and ^
    return lambda ins, out, params, a: f"({a[0]} {op} {a[1]})"


def _helper(name: str, kinds: str = "iu") -> _Rule:
    def rule(ins, out, params, a):
        if out.dtype.kind not in kinds:
            return None
        return out.wrap(f"{name}({a[0]}, {a[1]}, {out.bits}, {out.signed})")
    return rule


def _not(ins, out, params, a):
    if out.is_bool:
        return f"(not {a[0]})"
    return f"(~{a[0]})" if out.signed else f"({a[0]} ^ {(1 << out.bits) - 1})"


def _neg(ins, out, params, a):
    return None if out.is_bool else out.wrap(f"-{a[0]}")


def _abs(ins, out, params, a):
    return None if out.is_bool else out.wrap(f"abs({a[0]})") if out.signed else a[0]


def _sign(ins, out, params, a):
    if out.is_bool:
        return None
    return f"(({a[0]} > 0) - ({a[0]} < 0))" if out.signed else f"(1 if {a[0]} else 0)"


def _select_n(ins, out, params, a):
    which, cases = a[0], a[1:]
    if len(cases) == 2:
        return f"({cases[1]} if {which} else {cases[0]})"
    return f"({', '.join(cases)},)[{which}]"


def _convert(ins, out, params, a):
    if out.is_bool:
        return f"({a[0]} != 0)"
    return out.wrap(f"int({a[0]})")


def _integer_pow(ins, out, params, a):
    y = int(params["y"])
    return None if out.is_bool or y < 0 else out.wrap(f"{a[0]} ** {y}")


def _clamp(ins, out, params, a):
    low, x, high = a
    return f"min(max({x}, {low}), {high})"


def _identity(ins, out, params, a):
    return a[0]


RULES: dict[str, _Rule] = {
    "add": _arith("+"), "sub": _arith("-"), "mul": _arith("*"),
    "div": _helper("_div"), "rem": _helper("_rem"),
    "shift_left": _helper("_shift_left"),
    "shift_right_logical": _helper("_shift_right_logical"),
    "shift_right_arithmetic": _helper("_shift_right_arithmetic", kinds="i"),
    "max": lambda ins, out, params, a: f"max({a[0]}, {a[1]})",
    "min": lambda ins, out, params, a: f"min({a[0]}, {a[1]})",
    "eq": _compare("=="), "ne": _compare("!="), "lt": _compare("<"), "le": _compare("<="),
    "gt": _compare(">"), "ge": _compare(">="),
    "eq_to": _compare("=="), "lt_to": _compare("<"), "le_to": _compare("<="),
    "and": _bitwise("&"), "or": _bitwise("|"), "xor": _bitwise("^"), "not": _not,
    "neg": _neg, "abs": _abs, "sign": _sign, "select_n": _select_n,
    "convert_element_type": _convert, "integer_pow": _integer_pow, "clamp": _clamp,
    # on a 0-d operand with a 0-d result these only restate it
    "squeeze": _identity, "reshape": _identity, "broadcast_in_dim": _identity,
    "copy": _identity, "copy_p": _identity, "multiple_of": _identity,
}


def _expression(eqn: Any, operands: list[str]) -> str | None:
    """The Python expression for ``eqn`` over ``operands``, or None if it is not compiled."""
    rule = RULES.get(eqn.primitive.name)
    if rule is None or len(eqn.outvars) != 1:
        return None
    ins = [_kind(v.aval) for v in eqn.invars]
    out = _kind(eqn.outvars[0].aval)
    if out is None or not ins or any(k is None for k in ins):
        return None
    return rule(ins, out, eqn.params, operands)


def compiles(eqn: Any) -> bool:
    """``eqn`` is a scalar integer/boolean eqn that ``ScalarRun`` compiles."""
    return _expression(eqn, [f"a{i}" for i in range(len(eqn.invars))]) is not None


@dataclasses.dataclass(frozen=True)
class ScalarRun:
    """Consecutive eqns of a jaxpr compiled into ``fn``: it takes the values of ``inputs``
    (numpy scalars or 0-d arrays) and returns those of ``outputs`` as numpy scalars of their
    dtypes."""

    inputs: tuple
    outputs: tuple
    fn: Callable[..., tuple]
    source: str  # the generated code, for a reader chasing a wrong value


def compile_run(eqns: Sequence[Any], live: Callable[[Any], bool]) -> ScalarRun:
    """One function for ``eqns`` (each one ``compiles``), returning the values the rest of the
    jaxpr reads: those vars for which ``live(var)`` holds."""
    names: dict[Any, str] = {}
    inputs: list = []
    lines: list[str] = []
    namespace: dict[str, Any] = dict(_HELPERS)

    def operand(v: Any) -> str:
        if isinstance(v, Literal):
            value = np.asarray(v.val).item()
            return repr(bool(value) if isinstance(value, bool) else int(value))
        if v not in names:
            names[v] = f"x{len(inputs)}"
            kind = _kind(v.aval)
            lines.append(f"    {names[v]} = {'bool' if kind.is_bool else 'int'}"
                         f"(v{len(inputs)})")
            inputs.append(v)
        return names[v]

    produced = []
    for eqn in eqns:
        expr = _expression(eqn, [operand(v) for v in eqn.invars])
        (out,) = eqn.outvars
        names[out] = f"t{len(produced)}"
        lines.append(f"    {names[out]} = {expr}")
        produced.append(out)
    outputs = tuple(v for v in produced if live(v))
    for v in outputs:
        namespace[f"as_{v.aval.dtype}"] = np.dtype(v.aval.dtype).type
    returned = ", ".join(f"as_{v.aval.dtype}({names[v]})" for v in outputs)
    source = (f"def run({', '.join(f'v{i}' for i in range(len(inputs)))}):\n"
              + "\n".join(lines) + f"\n    return ({returned}{',' if outputs else ''})\n")
    exec(compile(source, "<kernelsim scalar run>", "exec"), namespace)  # noqa: S102
    return ScalarRun(tuple(inputs), outputs, namespace["run"], source)
