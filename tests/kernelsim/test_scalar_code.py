"""The body interpreter's compiled scalar arithmetic (``kernelsim.body.scalar_code``) agrees with
XLA on every rule, at the edges where Python ints and XLA's disagree by default: wrap-around,
division and remainder by zero and of INT_MIN by -1, shift counts past the width, conversions
that narrow or change sign."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from kernelsim import adapter
from kernelsim.body import scalar_code


def _edges(dtype) -> list:
    if dtype == np.bool_:
        return [False, True]
    info = np.iinfo(dtype)
    near = [0, 1, 2, 7, 8, 9, 31, 32, 33, 63, 64, info.max - 1, info.max]
    if info.min < 0:
        near += [-1, -2, -7, -33, info.min, info.min + 1]
    return sorted({v for v in near if info.min <= v <= info.max})


BINARY = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "rem": lax.rem,
    "max": lax.max, "min": lax.min, "eq": lax.eq, "ne": lax.ne, "lt": lax.lt, "le": lax.le,
    "gt": lax.gt, "ge": lax.ge, "and": lax.bitwise_and, "or": lax.bitwise_or,
    "xor": lax.bitwise_xor, "shift_left": lax.shift_left,
    "shift_right_logical": lax.shift_right_logical,
    "shift_right_arithmetic": lax.shift_right_arithmetic,
}
UNARY = {
    "not": lax.bitwise_not, "neg": lax.neg, "abs": lax.abs, "sign": lax.sign,
    "integer_pow": lambda a: lax.integer_pow(a, 3),
    **{f"convert to {t.__name__}": (lambda a, t=t: lax.convert_element_type(a, t))
       for t in (np.int8, np.int32, np.uint8, np.uint32, np.bool_)},
}
BOOL_OPS = {"max", "min", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not"}
DTYPES = [np.int8, np.int32, np.uint8, np.uint32, np.bool_]


def _compiled(fn, *operands):
    """``fn``'s single eqn on 0-d ``operands``, compiled by scalar_code (None if it is not)."""
    jaxpr = adapter.open_jaxpr(jax.make_jaxpr(fn)(*operands))
    (eqn,) = jaxpr.eqns
    if not scalar_code.compiles(eqn):
        return None
    return scalar_code.compile_run([eqn], lambda v: True)


def _cases(dtype, arity):
    """The ops of ``arity`` that lax defines on ``dtype`` (no abs of unsigned, no arithmetic
    on bool), except a conversion to the same dtype, which is no eqn at all."""
    def defined(name, fn):
        if dtype == np.bool_ and name not in BOOL_OPS and not name.startswith("convert"):
            return False
        try:
            jax.eval_shape(fn, *[np.zeros((), dtype)] * arity)
        except TypeError:
            return False
        return name != f"convert to {dtype.__name__}"

    ops = BINARY if arity == 2 else UNARY
    return [(name, fn) for name, fn in ops.items() if defined(name, fn)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("arity", [1, 2])
def test_every_rule_equals_xla_on_edge_values(dtype, arity):
    values = _edges(dtype)
    pairs = list(itertools.product(values, repeat=arity))
    columns = [jnp.array([p[k] for p in pairs], dtype) for k in range(arity)]
    cases = _cases(dtype, arity)
    by_xla = jax.jit(lambda *cols: {name: fn(*cols) for name, fn in cases})(*columns)
    zero = np.zeros((), dtype)
    checked = 0
    for name, fn in cases:
        run = _compiled(fn, *([zero] * arity))
        if run is None and name == "shift_right_arithmetic":  # unsigned: left to XLA, as in
            continue  # lax_numpy
        assert run is not None, f"{name} on {dtype.__name__} is not compiled"
        expected = np.asarray(by_xla[name])
        for k, p in enumerate(pairs):
            (got,) = run.fn(*(np.asarray(v, dtype) for v in p))
            assert got.dtype == expected.dtype, (name, got.dtype, expected.dtype)
            assert got == expected[k], f"{name}{p} on {dtype.__name__}: {got} != {expected[k]}"
            checked += 1
    assert checked > 0


def test_select_n_and_clamp_equal_xla():
    values = _edges(np.int32)
    for which, a, b in itertools.product([False, True], values[:4], values[-4:]):
        run = _compiled(lambda w, x, y: lax.select_n(w, x, y), np.bool_(which),
                        np.int32(a), np.int32(b))
        (got,) = run.fn(np.bool_(which), np.int32(a), np.int32(b))
        assert got == lax.select_n(which, jnp.int32(a), jnp.int32(b))
    for lo, x, hi in itertools.product([-7, 0], values, [1, 33]):
        run = _compiled(lax.clamp, np.int32(lo), np.int32(x), np.int32(hi))
        assert run.fn(np.int32(lo), np.int32(x), np.int32(hi))[0] == lax.clamp(lo, x, hi)


def test_a_run_returns_only_the_values_the_rest_of_the_program_reads():
    def step(i, n):
        slot = lax.rem(i + 1, n)
        last = i == n - 1
        return lax.select_n(last, slot * 128, np.int32(0)), last

    jaxpr = adapter.open_jaxpr(jax.make_jaxpr(step)(np.int32(0), np.int32(0)))
    assert all(scalar_code.compiles(e) for e in jaxpr.eqns)
    run = scalar_code.compile_run(jaxpr.eqns, lambda v: v is jaxpr.outvars[1])
    assert run.outputs == (jaxpr.outvars[1],)  # `last`; no temporary is converted back
    whole = scalar_code.compile_run(jaxpr.eqns, lambda v: v in set(jaxpr.outvars))
    for i, n in [(0, 4), (3, 4), (5, 3), (-1, 2), (np.iinfo(np.int32).max, 7)]:
        got = dict(zip(whole.outputs, whole.fn(np.int32(i), np.int32(n)), strict=True))
        expected = jax.jit(step)(np.int32(i), np.int32(n))
        for v, e in zip(jaxpr.outvars, expected, strict=True):
            assert got[v].dtype == e.dtype and got[v] == e, (i, n, got[v], e)


def test_floats_and_arrays_are_left_to_the_general_path():
    for fn, operands in [(lax.add, (np.float32(1), np.float32(2))),
                         (lax.add, (np.zeros(3, np.int32), np.zeros(3, np.int32))),
                         (lambda a: lax.convert_element_type(a, np.float32), (np.int32(1),))]:
        assert _compiled(fn, *operands) is None
