"""lax primitives evaluated in numpy with XLA's semantics, so small integer programs need no
compilation.

kernelsim evaluates two kinds of ordinary JAX code concretely: the slice of a wrapper that
produces scalar-prefetch operands and grid bounds (e.g. megablox's group metadata), and the
index arithmetic of a kernel body that decides its DMAs. Compiling such a slice with XLA costs
0.5-1.5 s on a CPU, far more than evaluating its few dozen small ops here. ``apply`` runs one
primitive; ``Unsupported`` means "let XLA do it" and the caller falls back to JAX.

What is exact here (the rule follows the HLO op's definition, openxla.org/xla/operation_semantics):
integers wrap; ``div`` truncates, x / 0 is -1 (unsigned: all ones) and INT_MIN / -1 is INT_MIN;
``rem`` takes the dividend's sign, x % 0 is x; shifts by the bit width or more give 0 (or the
sign for arithmetic right shifts); float -> int conversion saturates and NaN becomes 0; gathers
clamp (or fill) and scatters clamp (or drop) whole windows as ``GatherScatterMode`` says;
``lt_to``/``eq_to`` compare floats in IEEE total order. Float arithmetic is limited to the ops
IEEE rounds exactly (+, -, *, /, comparisons, min/max, floor/ceil) in float32/float64;
transcendentals and float reductions or sums (whose result depends on XLA's summation order)
are left to XLA. One known difference: XLA's CPU runtime flushes float denormals to zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax import lax


class Unsupported(Exception):
    """This primitive (or these operands) is left to XLA."""


_EXACT_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _check_dtypes(vals: list, floats_ok: bool) -> None:
    for v in vals:
        kind = v.dtype.kind
        if kind in "biu" or (floats_ok and v.dtype in _EXACT_FLOATS):
            continue
        raise Unsupported(f"dtype {v.dtype}")


def _check_sum_dtypes(vals: list) -> None:
    """Sums in any order agree only on integers -- or on floats that are whole numbers whose
    total magnitude the mantissa holds exactly (then no addition ever rounds: e.g. the counts
    ``jnp.histogram`` adds up in float32)."""
    _check_dtypes(vals, floats_ok=True)
    for v in vals:
        if v.dtype.kind == "f":
            mantissa = np.finfo(v.dtype).nmant + 1
            # a broadcast (a gradient's cotangent of ones) is checked on its distinct values
            distinct = v[tuple(0 if stride == 0 else slice(None) for stride in v.strides)]
            repeats = v.size // max(distinct.size, 1)
            head = distinct.reshape(-1)[:256]  # most float operands fail here, at once
            if not (np.all(np.trunc(head) == head) and np.all(np.isfinite(distinct))
                    and np.all(np.trunc(distinct) == distinct)
                    and float(np.sum(np.abs(distinct), dtype=np.float64)) * repeats
                    < 2.0 ** mantissa):
                raise Unsupported("a float sum whose result depends on XLA's order")


def _int_info(dtype: np.dtype) -> np.iinfo:
    return np.iinfo(dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """HLO divide: integers truncate toward zero; x / 0 = -1 (all ones); INT_MIN / -1 = INT_MIN."""
    dtype = np.result_type(a, b)
    if dtype.kind == "f":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.true_divide(a, b).astype(dtype)
    a, b = np.asarray(a, dtype), np.asarray(b, dtype)
    zero = b == 0
    safe = np.where(zero, 1, b)
    if dtype.kind == "i":
        overflow = (a == _int_info(dtype).min) & (safe == -1)
        safe = np.where(overflow, 1, safe)
        q = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))
        q = np.where((a < 0) != (safe < 0), -q, q).astype(dtype)
        q = np.where(overflow, a, q)
        return np.where(zero, dtype.type(-1), q).astype(dtype)
    return np.where(zero, _int_info(dtype).max, a // safe).astype(dtype)


def _rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """HLO remainder: the dividend's sign (C fmod); x % 0 = x; INT_MIN % -1 = 0."""
    dtype = np.result_type(a, b)
    if dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.fmod(a, b).astype(dtype)
    a, b = np.asarray(a, dtype), np.asarray(b, dtype)
    zero = b == 0
    safe = np.where(zero | (b == -1) if dtype.kind == "i" else zero, 1, b)
    r = np.fmod(a, safe).astype(dtype)
    if dtype.kind == "i":
        r = np.where(b == -1, dtype.type(0), r)
    return np.where(zero, a, r).astype(dtype)


def _shift(a: np.ndarray, s: np.ndarray, kind: str) -> np.ndarray:
    """HLO shifts: a shift count outside [0, bits) gives 0, or the sign for arithmetic right."""
    dtype = a.dtype
    if kind == "arithmetic" and dtype.kind != "i":
        raise Unsupported("arithmetic shift of an unsigned or bool value")
    unsigned = np.dtype(f"u{dtype.itemsize}")
    count = np.asarray(s).astype(unsigned)  # negative counts become huge, as in HLO
    big = count >= 8 * dtype.itemsize
    count = np.where(big, 0, count).astype(unsigned)
    if kind == "arithmetic":
        fill = np.where(a < 0, dtype.type(-1), dtype.type(0))
        return np.where(big, fill, np.right_shift(a, count.astype(dtype))).astype(dtype)
    bits = np.ascontiguousarray(a).view(unsigned)
    out = (np.left_shift if kind == "left" else np.right_shift)(bits, count).astype(unsigned)
    return np.where(big, dtype.type(0), out.view(dtype)).astype(dtype)


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """An integer key that orders floats as IEEE totalOrder does (-NaN < -inf < -0 < 0 < NaN)."""
    if x.dtype.kind != "f":
        return x
    signed = np.dtype(f"i{x.dtype.itemsize}")
    bits = np.ascontiguousarray(x).view(signed)
    return np.where(bits < 0, bits ^ np.iinfo(signed).max, bits)


def _convert(x: np.ndarray, new_dtype: Any) -> np.ndarray:
    """convert_element_type: float -> int saturates and NaN becomes 0; to bool is ``!= 0``."""
    dtype = np.dtype(new_dtype)
    if dtype.kind == "b":
        return x != 0
    if x.dtype.kind == "f" and dtype.kind in "iu":
        info = _int_info(dtype)
        t = np.trunc(np.where(np.isnan(x), 0, x).astype(np.float64))
        inside = np.clip(t, info.min, info.max)  # float64 bounds; the masks fix int64's ends
        out = np.where(t >= float(info.max), info.max,
                       np.where(t <= float(info.min), info.min, 0)).astype(dtype)
        middle = (t < float(info.max)) & (t > float(info.min))
        return np.where(middle, inside.astype(dtype), out)
    if dtype.kind == "f" and dtype not in _EXACT_FLOATS:
        raise Unsupported(f"conversion to {dtype}")
    return x.astype(dtype)


def _elementwise(fn: Callable, floats_ok: bool = True) -> Callable:
    def rule(vals: list, params: dict) -> list:
        _check_dtypes(vals, floats_ok)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return [fn(*vals)]
    return rule


def _sign(x: np.ndarray) -> np.ndarray:
    return np.where(x == 0, x, np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


def _select_n(which: np.ndarray, *cases: np.ndarray) -> np.ndarray:
    """lax.select_n: ``cases[which]`` elementwise (a bool ``which`` picks case 1 when True)."""
    which = np.asarray(which)
    if not which.shape:
        return cases[int(which)]
    out = cases[0]
    for k, case in enumerate(cases[1:], start=1):
        out = np.where(which == k, case, out)
    return out


def _integer_pow(vals: list, params: dict) -> list:
    _check_dtypes(vals, True)
    x, y = vals[0], int(params["y"])
    if x.dtype.kind in "iu" and y < 0:
        raise Unsupported("negative integer power of an integer")
    with np.errstate(over="ignore"):
        if x.dtype.kind == "f":  # XLA multiplies by repeated squaring; so does this
            out = np.ones_like(x)
            base, n = x.copy(), abs(y)
            while n:
                if n & 1:
                    out = out * base
                base, n = base * base, n >> 1
            return [out if y >= 0 else (np.ones_like(x) / out).astype(x.dtype)]
        return [np.power(x, y, dtype=x.dtype)]


def _broadcast_in_dim(vals: list, params: dict) -> list:
    if len(vals) != 1:
        raise Unsupported("dynamic shapes")
    x, shape, dims = vals[0], tuple(params["shape"]), params["broadcast_dimensions"]
    expanded = [1] * len(shape)
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    return [np.broadcast_to(x.reshape(expanded), shape)]


def _reshape(vals: list, params: dict) -> list:
    if len(vals) != 1:
        raise Unsupported("dynamic shapes")
    x = vals[0]
    if params.get("dimensions") is not None:
        x = np.transpose(x, params["dimensions"])
    return [x.reshape(tuple(params["new_sizes"]))]


def _pad(vals: list, params: dict) -> list:
    """lax.pad: interior padding, then edge padding; negative edges crop."""
    x, value = vals
    for axis, (lo, hi, interior) in enumerate(params["padding_config"]):
        n = x.shape[axis]
        shape = list(x.shape)
        shape[axis] = n + max(n - 1, 0) * interior
        spread = np.full(shape, value, x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(0, shape[axis], interior + 1)
        spread[tuple(index)] = x
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        spread = np.pad(spread, widths, constant_values=value)
        index[axis] = slice(max(-lo, 0), spread.shape[axis] - max(-hi, 0))
        x = spread[tuple(index)]
    return [x]


def _dynamic_slice(vals: list, params: dict) -> list:
    x, *starts = vals
    sizes = params["slice_sizes"]
    if len(starts) != x.ndim:
        raise Unsupported("dynamic_slice with dynamic sizes")
    index = []
    for s, size, n in zip(starts, sizes, x.shape, strict=True):
        start = int(np.clip(int(s), 0, n - size))  # HLO clamps the window into the operand
        index.append(slice(start, start + size))
    return [x[tuple(index)]]


def _dynamic_update_slice(vals: list, params: dict) -> list:
    x, update, *starts = vals
    out = x.copy()
    index = []
    for s, size, n in zip(starts, update.shape, x.shape, strict=True):
        start = int(np.clip(int(s), 0, n - size))
        index.append(slice(start, start + size))
    out[tuple(index)] = update
    return [out]


def _reduce(fn: Callable, floats_ok: bool, is_sum: bool = False) -> Callable:
    def rule(vals: list, params: dict) -> list:
        _check_sum_dtypes(vals) if is_sum else _check_dtypes(vals, floats_ok)
        x = vals[0]
        return [fn(x, axis=tuple(params["axes"])).astype(x.dtype)]
    return rule


def _argminmax(fn: Callable) -> Callable:
    def rule(vals: list, params: dict) -> list:
        _check_dtypes(vals, True)
        (axis,) = params["axes"]
        return [fn(vals[0], axis=axis).astype(np.dtype(params["index_dtype"]))]
    return rule


def _cumulative(fn: Callable, floats_ok: bool, is_sum: bool = False) -> Callable:
    def rule(vals: list, params: dict) -> list:
        _check_sum_dtypes(vals) if is_sum else _check_dtypes(vals, floats_ok)
        x, axis = vals[0], params["axis"]
        if params.get("reverse"):
            return [np.flip(fn(np.flip(x, axis), axis=axis).astype(x.dtype), axis)]
        return [fn(x, axis=axis).astype(x.dtype)]
    return rule


def _sort(vals: list, params: dict) -> list:
    keys = vals[:params["num_keys"]]
    _check_dtypes(keys, True)
    if not params["is_stable"] and len(vals) > len(keys):
        raise Unsupported("unstable sort carrying values: XLA may order ties differently")
    axis = params["dimension"]
    # lexsort is stable and sorts by its last key first; floats in total order, as lax does
    moved = [np.moveaxis(_total_order_key(k), axis, -1) for k in reversed(keys)]
    order = np.lexsort(moved, axis=-1)
    return [np.moveaxis(np.take_along_axis(np.moveaxis(v, axis, -1), order, axis=-1), -1, axis)
            for v in vals]


def _mode(params: dict) -> Any:
    return lax.GatherScatterMode.from_any(params.get("mode"))


def _gather(vals: list, params: dict) -> list:
    operand, indices = vals
    dn, sizes = params["dimension_numbers"], tuple(params["slice_sizes"])
    if getattr(dn, "operand_batching_dims", ()):
        raise Unsupported("gather with batching dims")
    mode = _mode(params)
    if mode not in (lax.GatherScatterMode.CLIP, lax.GatherScatterMode.FILL_OR_DROP,
                    lax.GatherScatterMode.PROMISE_IN_BOUNDS):
        raise Unsupported(f"gather mode {mode}")
    batch_shape = indices.shape[:-1]
    idx = indices.reshape(-1, indices.shape[-1]).astype(np.int64)
    starts = np.zeros((idx.shape[0], operand.ndim), np.int64)
    starts[:, list(dn.start_index_map)] = idx
    upper = np.array(operand.shape, np.int64) - np.array(sizes, np.int64)
    valid = np.all((starts >= 0) & (starts <= upper), axis=1)
    starts = np.clip(starts, 0, upper)  # HLO gather clamps; FILL masks afterwards
    window = np.indices(sizes, dtype=np.int64).reshape(operand.ndim, -1).T
    pos = starts[:, None, :] + window[None]
    out = operand[tuple(pos[..., d] for d in range(operand.ndim))]
    if mode == lax.GatherScatterMode.FILL_OR_DROP:
        fill = params.get("fill_value")
        out = np.where(valid[:, None], out,
                       _gather_fill_value(operand.dtype) if fill is None else fill)
    out = out.reshape(batch_shape + tuple(s for d, s in enumerate(sizes)
                                          if d not in dn.collapsed_slice_dims))
    # batch dims go where offset_dims are not, in order; offset dims keep their order
    rank = len(batch_shape) + len(dn.offset_dims)
    batch_pos = [d for d in range(rank) if d not in dn.offset_dims]
    source = [0] * rank
    for k, d in enumerate(batch_pos):
        source[d] = k
    for k, d in enumerate(dn.offset_dims):
        source[d] = len(batch_shape) + k
    return [np.transpose(out, source)]


def _gather_fill_value(dtype: np.dtype) -> Any:
    """What a FILL_OR_DROP gather returns out of bounds (jax/_src/lax/slicing.py ``gather``)."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "i":
        return np.iinfo(dtype).min
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return True


_SCATTER_COMBINE = {
    "scatter": None, "scatter-add": np.add, "scatter_add": np.add, "scatter-mul": np.multiply,
    "scatter_mul": np.multiply, "scatter-min": np.minimum, "scatter_min": np.minimum,
    "scatter-max": np.maximum, "scatter_max": np.maximum,
}


def _scatter(name: str) -> Callable:
    combine = _SCATTER_COMBINE[name]

    def rule(vals: list, params: dict) -> list:
        operand, indices, updates = vals
        if combine is np.add:
            _check_sum_dtypes([operand, updates])
        elif combine is np.multiply:
            _check_dtypes([operand, updates], floats_ok=False)  # float products round
        dn = params["dimension_numbers"]
        if getattr(dn, "operand_batching_dims", ()):
            raise Unsupported("scatter with batching dims")
        mode = _mode(params)
        uwd = tuple(dn.update_window_dims)
        scatter_dims = [d for d in range(updates.ndim) if d not in uwd]
        u = np.transpose(updates, scatter_dims + list(uwd))
        nbatch = int(np.prod(indices.shape[:-1], dtype=np.int64))
        window_shape = tuple(updates.shape[d] for d in uwd)
        u = u.reshape((nbatch, -1))
        sizes, k = [], 0
        for d in range(operand.ndim):
            if d in dn.inserted_window_dims:
                sizes.append(1)
            else:
                sizes.append(window_shape[k])
                k += 1
        starts = np.zeros((nbatch, operand.ndim), np.int64)
        starts[:, list(dn.scatter_dims_to_operand_dims)] = indices.reshape(
            nbatch, -1).astype(np.int64)
        upper = np.array(operand.shape, np.int64) - np.array(sizes, np.int64)
        if mode == lax.GatherScatterMode.CLIP:
            starts = np.clip(starts, 0, upper)
        elif mode not in (lax.GatherScatterMode.FILL_OR_DROP,
                          lax.GatherScatterMode.PROMISE_IN_BOUNDS):
            raise Unsupported(f"scatter mode {mode}")
        keep = np.all((starts >= 0) & (starts <= upper), axis=1)  # out-of-bounds windows drop
        window = np.indices(sizes, dtype=np.int64).reshape(operand.ndim, -1).T
        pos = (starts[keep][:, None, :] + window[None]).reshape(-1, operand.ndim)
        where = tuple(pos[:, d] for d in range(operand.ndim))
        out = operand.copy()
        values = u[keep].reshape(-1).astype(operand.dtype)
        with np.errstate(over="ignore"):
            if combine is None:
                out[where] = values  # duplicates: the last update wins
            else:
                combine.at(out, where, values)
        return [out]
    return rule


def _iota(vals: list, params: dict) -> list:
    if vals:
        raise Unsupported("dynamic shapes")
    shape, dim = tuple(params["shape"]), params["dimension"]
    line = np.arange(shape[dim], dtype=np.dtype(params["dtype"]))
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return [np.broadcast_to(line.reshape(view), shape)]


def _split(vals: list, params: dict) -> list:
    cuts = np.cumsum(params["sizes"])[:-1]
    return list(np.split(vals[0], cuts, axis=params["axis"]))


def _unstack(vals: list, params: dict) -> list:
    x, axis = vals[0], params["axis"]
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


def _bitcast(vals: list, params: dict) -> list:
    x, dtype = vals[0], np.dtype(params["new_dtype"])
    if dtype.itemsize != x.dtype.itemsize:
        raise Unsupported("bitcast between sizes")
    return [np.ascontiguousarray(x).view(dtype)]


def _clamp(lo: np.ndarray, x: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, lo), hi)


_ELEMENTWISE: dict[str, tuple[Callable, bool]] = {
    "add": (np.add, True), "sub": (np.subtract, True), "mul": (np.multiply, True),
    "div": (_div, True), "rem": (_rem, True), "max": (np.maximum, True),
    "min": (np.minimum, True), "neg": (np.negative, True), "abs": (np.abs, True),
    "sign": (_sign, True), "floor": (np.floor, True), "ceil": (np.ceil, True),
    "eq": (np.equal, True), "ne": (np.not_equal, True), "lt": (np.less, True),
    "le": (np.less_equal, True), "gt": (np.greater, True), "ge": (np.greater_equal, True),
    "and": (np.bitwise_and, False), "or": (np.bitwise_or, False),
    "xor": (np.bitwise_xor, False), "not": (np.invert, False),
    "shift_left": (lambda a, s: _shift(a, s, "left"), False),
    "shift_right_logical": (lambda a, s: _shift(a, s, "logical"), False),
    "shift_right_arithmetic": (lambda a, s: _shift(a, s, "arithmetic"), False),
    "clamp": (_clamp, True),
    "is_finite": (np.isfinite, True), "square": (np.square, True),
    "eq_to": (lambda a, b: np.equal(_total_order_key(a), _total_order_key(b)), True),
    "lt_to": (lambda a, b: np.less(_total_order_key(a), _total_order_key(b)), True),
    "le_to": (lambda a, b: np.less_equal(_total_order_key(a), _total_order_key(b)), True),
}

RULES: dict[str, Callable[[list, dict], list]] = {
    **{name: _elementwise(fn, floats) for name, (fn, floats) in _ELEMENTWISE.items()},
    "select_n": lambda vals, params: [_select_n(*vals)],  # any dtype: it only picks
    "integer_pow": _integer_pow,
    "convert_element_type": lambda vals, p: [_convert(vals[0], p["new_dtype"])],
    "broadcast_in_dim": _broadcast_in_dim, "reshape": _reshape,
    "squeeze": lambda vals, p: [np.squeeze(vals[0], axis=tuple(p["dimensions"]))],
    "expand_dims": lambda vals, p: [np.expand_dims(vals[0], tuple(p["dimensions"]))],
    "transpose": lambda vals, p: [np.transpose(vals[0], p["permutation"])],
    "rev": lambda vals, p: [np.flip(vals[0], tuple(p["dimensions"]))],
    "concatenate": lambda vals, p: [np.concatenate(vals, axis=p["dimension"])],
    "slice": lambda vals, p: [vals[0][tuple(
        slice(s, e, st) for s, e, st in zip(p["start_indices"], p["limit_indices"],
                                             p["strides"] or (1,) * vals[0].ndim,
                                             strict=True))]],
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice,
    "pad": _pad, "iota": _iota, "split": _split, "unstack": _unstack,
    "empty": lambda vals, p: [np.zeros(tuple(p["shape"]), np.dtype(p["dtype"]))],
    "copy": lambda vals, p: [np.array(vals[0])], "copy_p": lambda vals, p: [np.array(vals[0])],
    # where values live, never what they are: on one host these are the identity
    "reshard": lambda vals, p: list(vals), "sharding_constraint": lambda vals, p: list(vals),
    "bitcast_convert_type": _bitcast,
    "reduce_sum": _reduce(np.sum, floats_ok=False, is_sum=True),
    "reduce_prod": _reduce(np.prod, floats_ok=False),
    "reduce_max": _reduce(np.max, floats_ok=True),
    "reduce_min": _reduce(np.min, floats_ok=True),
    "reduce_and": _reduce(np.bitwise_and.reduce, floats_ok=False),
    "reduce_or": _reduce(np.bitwise_or.reduce, floats_ok=False),
    "reduce_xor": _reduce(np.bitwise_xor.reduce, floats_ok=False),
    "argmax": _argminmax(np.argmax), "argmin": _argminmax(np.argmin),
    "cumsum": _cumulative(np.cumsum, floats_ok=False, is_sum=True),
    "cumprod": _cumulative(np.cumprod, floats_ok=False),
    "cummax": _cumulative(np.maximum.accumulate, floats_ok=True),
    "cummin": _cumulative(np.minimum.accumulate, floats_ok=True),
    "sort": _sort, "gather": _gather,
    **{name: _scatter(name) for name in _SCATTER_COMBINE},
}


# Rules that act element by element (and so broadcast over a leading batch of grid steps).
ELEMENTWISE = frozenset(_ELEMENTWISE) | {"select_n", "integer_pow", "convert_element_type"}


def apply(name: str, vals: list[np.ndarray], params: dict, out_avals: list,
          check_shapes: bool = True) -> list[np.ndarray]:
    """``name`` applied to ``vals`` with ``params``: one array per entry of ``out_avals``,
    cast to its dtype (and checked against its shape unless ``check_shapes`` is False)."""
    rule = RULES.get(name)
    if rule is None:
        raise Unsupported(name)
    outs = rule(vals, params)
    if len(outs) != len(out_avals):
        raise Unsupported(f"{name}: {len(outs)} results for {len(out_avals)} outputs")
    cast = []
    for out, aval in zip(outs, out_avals, strict=True):
        out = np.asarray(out)
        if check_shapes and out.shape != tuple(aval.shape):
            raise Unsupported(f"{name}: shape {out.shape}, expected {tuple(aval.shape)}")
        try:
            dtype = np.dtype(aval.dtype)
        except TypeError as e:  # extended dtypes (keys, semaphores): XLA's business
            raise Unsupported(f"{name}: dtype {aval.dtype}") from e
        cast.append(out if out.dtype == dtype else out.astype(dtype))
    return cast
