"""kernelsim evaluates small programs in numpy with XLA's semantics; XLA is the judge.

Each program is traced to a jaxpr, evaluated by kernelsim's numpy evaluator (which must not
hand it back to XLA) and by ``jax.jit``; the results must be equal bit for bit, dtype included.
The programs aim at the edges where numpy and XLA disagree by default: integer wrap-around,
division and remainder by zero, shift counts past the width, saturating float->int casts,
out-of-bounds gathers and scatters, the order of sums and sorts.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from kernelsim import adapter
from kernelsim.jaxpr import lax_numpy, numpy_eval

I32 = np.iinfo(np.int32)
INTS = jnp.array([7, -7, 0, 1, -1, I32.min, I32.max, 13], jnp.int32)
DIVISORS = jnp.array([2, 2, 0, 0, -1, -1, -1, -5], jnp.int32)
FLOATS = jnp.array([0.5, -2.5, np.nan, np.inf, -np.inf, 3e9, -3e9, -0.0], jnp.float32)


def _by_numpy(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree_util.tree_leaves(args)
    out = numpy_eval.numpy_eval(adapter.open_jaxpr(closed), adapter.consts_of(closed), flat)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(jax.eval_shape(fn, *args)),
                                        out)


def _same(fn, *args):
    expected = jax.jit(fn)(*args)
    got = _by_numpy(fn, *args)
    for g, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected),
                    strict=True):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        np.testing.assert_array_equal(g, np.asarray(e))


_gather_scatter_index = jnp.array([[0], [3], [-1], [9], [5]], jnp.int32)

PROGRAMS = {
    "int32_wraps": (lambda x: x * 1_000_003 + x, INTS),
    "div_truncates_and_by_zero": (lambda x, d: (lax.div(x, d), x // d), INTS, DIVISORS),
    "rem_sign_and_by_zero": (lambda x, d: (lax.rem(x, d), x % d), INTS, DIVISORS),
    "unsigned_div_by_zero": (lambda x, d: lax.div(x, d),
                             jnp.array([7, 0, 5], jnp.uint32), jnp.array([2, 0, 0], jnp.uint32)),
    "shifts_past_the_width": (lambda x, s: (lax.shift_left(x, s),
                                            lax.shift_right_arithmetic(x, s),
                                            lax.shift_right_logical(x, s)),
                              INTS, jnp.array([1, 3, 31, 32, 40, -1, 0, 5], jnp.int32)),
    "float_to_int_saturates": (lambda f: (f.astype(jnp.int32), f.astype(jnp.uint8),
                                          f.astype(jnp.bool_)), FLOATS),
    "float_arithmetic": (lambda f, g: (f + g, f - g, f * g, f / g, jnp.maximum(f, g),
                                       jnp.floor(f), jnp.ceil(g), jnp.sign(f), f ** 3),
                         FLOATS, FLOATS[::-1] * 0.3),
    "comparisons_and_select": (lambda x, d: jnp.where(x > d, x, jnp.where(x == d, 0, -d)),
                               INTS, DIVISORS),
    "select_n_three_way": (lambda w, x: lax.select_n(w, x, -x, x * 2),
                           jnp.array([0, 1, 2, 1, 0, 2, 2, 1], jnp.int32), INTS),
    "clamp_and_abs": (lambda x: (jnp.clip(x, -5, 9), jnp.abs(x), -x), INTS),
    "bitwise": (lambda x, d: (x & d, x | d, x ^ d, ~x, (x > 0) & (d < 0)), INTS, DIVISORS),
    "iota_broadcast_reshape_transpose": (
        lambda x: (jnp.arange(12).reshape(3, 4).T + x[:4, None], jnp.broadcast_to(x, (2, 8))),
        INTS),
    "slices_concat_pad_rev": (
        lambda x: (x[1:7:2], jnp.concatenate([x, x[::-1]]),
                   lax.pad(x, np.int32(-9), [(2, -3, 1)]), lax.pad(x, np.int32(0), [(-1, 2, 0)])),
        INTS),
    "dynamic_slice_clamps": (lambda x, i: (lax.dynamic_slice(x, (i,), (3,)),
                                           lax.dynamic_update_slice(x, x[:3] * 0, (i,))),
                             INTS, jnp.int32(6)),
    "integer_reductions_wrap": (lambda x: (x.sum(), x.prod(), x.max(), x.min(),
                                           jnp.cumsum(x), lax.cumsum(x, reverse=True),
                                           lax.cummax(x), jnp.argmax(x), jnp.argmin(x)), INTS),
    "argmax_ties_and_nan": (lambda f: (jnp.argmax(f), jnp.argmin(f), jnp.max(f)),
                            jnp.array([1.0, 3.0, 3.0, np.nan, 0.0], jnp.float32)),
    "whole_number_float_sums": (lambda f: (f.sum(), jnp.cumsum(f)),
                                jnp.array([1.0, 2.0, 3.0, -4.0], jnp.float32)),
    "sort_keys_with_values": (lambda k, v: lax.sort((k, v), num_keys=1),
                              jnp.array([3, 1, 3, 0, 1], jnp.int32), jnp.arange(5)),
    "sort_floats_total_order": (lambda f: jnp.sort(f), FLOATS),
    "gather_clip_and_fill": (
        lambda x, i: (x.at[i[:, 0]].get(mode="clip"), x.at[i[:, 0]].get(mode="fill"),
                      x.at[i[:, 0]].get(mode="fill", fill_value=-3), jnp.take(x, i[:, 0])),
        INTS, _gather_scatter_index),
    "gather_2d_windows": (lambda m, i: m[i[:, 0] % 3, 1:3], jnp.arange(12).reshape(3, 4),
                          _gather_scatter_index),
    "scatter_drop_and_clip": (
        lambda x, i: (x.at[i[:, 0]].set(99), x.at[i[:, 0]].add(5), x.at[i[:, 0]].max(50),
                      x.at[i[:, 0]].min(-50), x.at[i[:, 0]].mul(3),
                      x.at[i[:, 0]].set(99, mode="clip")),
        INTS, _gather_scatter_index),
    "repeat_histogram_searchsorted": (
        lambda g: (jnp.repeat(jnp.arange(4), g, total_repeat_length=9),
                   jnp.histogram(g, bins=4, range=(0, 4))[0],
                   jnp.searchsorted(jnp.cumsum(g), jnp.arange(8), side="right")),
        jnp.array([2, 0, 3, 1], jnp.int32)),
    "control_flow": (
        lambda x: (lax.fori_loop(0, 5, lambda i, c: c * 3 + i, x),
                   lax.cond(x[0] > 0, lambda v: v + 1, lambda v: v - 1, x),
                   lax.scan(lambda c, v: (c + v, c * v), 0, x)),
        INTS),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_numpy_evaluation_equals_xla(name):
    fn, *args = PROGRAMS[name]
    _same(fn, *args)


def test_megablox_group_metadata_equals_xla():
    """The slice that decides megablox gmm's grid and prefetch tables, on ragged groups."""
    gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
    for sizes in ([128, 64, 192, 128], [0, 512, 0, 0], [1, 255, 0, 256], [100, 100, 100, 212]):
        fn = functools.partial(gmm.make_group_metadata, m=512, tm=128, num_nonzero_groups=4,
                               start_group=jnp.int32(0))
        _same(lambda g, fn=fn: fn(group_sizes=g), jnp.array(sizes, jnp.int32))


@pytest.mark.parametrize("fn, arg", [
    (jnp.exp, FLOATS),                       # transcendental: XLA's own approximation
    (jnp.sum, FLOATS * 0.1),                 # a float sum: XLA's order decides the rounding
    (lambda b: b + 1, jnp.ones(3, jnp.bfloat16)),  # a dtype numpy does not compute like XLA
])
def test_what_numpy_cannot_match_is_left_to_xla(fn, arg):
    with pytest.raises(lax_numpy.Unsupported):
        _by_numpy(fn, arg)
