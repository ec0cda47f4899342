"""Finding every kernel call in a program, and computing what its schedule needs around it.

``find_calls`` traces the function to a jaxpr (nothing runs) and walks it in program order.
Of the ordinary JAX code around the kernels it evaluates only the slice that produces what a
schedule needs: scalar-prefetch operands, dynamic grid bounds and the predicates and trip
counts of loops and branches that contain a pallas_call. Kernel outputs that feed such a value
are zeros, as in an analysed (not executed) call. ``run_calls`` walks the same way but runs the
whole program, each kernel through a handler (``execute``), a ``shard_map`` around kernels as
``MappedRunner`` says.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from kernelsim.adapter import (
    Captured,
    DropVar,
    Literal,
    close_jaxpr,
    consts_of,
    eval_jaxpr,
    is_kernel,
    jaxpr_as_fun,
    kernel_params,
    new_jaxpr,
    on_abstract_tpu,
    open_jaxpr,
    scan_operands,
)
from kernelsim.body.needs import body_needs, has_body_dma, is_ref
from kernelsim.errors import TraceError
from kernelsim.jaxpr import lax_numpy
from kernelsim.jaxpr.nesting import call_body, sub_jaxprs
from kernelsim.jaxpr.numpy_eval import numpy_eval
from kernelsim.model import MeshDevice


class NeedsExecution(Exception):
    """The function cannot be traced to a jaxpr (Python control flow on array values)."""


_UNKNOWN = object()  # a value the walk did not need to compute


@functools.lru_cache(maxsize=4096)
def _has_pallas_call(jaxpr: Any) -> bool:
    """``jaxpr`` reaches a kernel (a pallas_call or a pl.kernel) somewhere."""
    for eqn in open_jaxpr(jaxpr).eqns:
        # jax <= 0.10: pl.core_map is its own primitive, a pallas_call once its run_state
        # is discharged (which is how the walk sees it)
        if is_kernel(eqn) or eqn.primitive.name == "core_map":
            return True
        if any(_has_pallas_call(j) for j, _ in sub_jaxprs(eqn)):
            return True
    return False


def _schedule_operands(eqn: Any) -> range:
    """Operand positions of a kernel eqn its schedule needs: dynamic grid bounds and
    scalar-prefetch values (operands are ``*consts, *grid bounds, *prefetch, *inputs``)."""
    gm = kernel_params(eqn)["grid_mapping"]
    end = len(eqn.invars) - gm.num_inputs
    return range(end - gm.num_index_operands - gm.num_dynamic_grid_bounds, end)


def _body_value_operands(eqn: Any, bodies: bool) -> list[int]:
    """Operand positions of a pallas_call eqn whose contents its interpreted body reads for
    a DMA, an index or a branch (``BodyNeeds``): the inputs, which follow the prefetch."""
    params = kernel_params(eqn)
    kernel = params["jaxpr"]
    if not (bodies or has_body_dma(kernel)):
        return []
    gm = params["grid_mapping"]
    needs = body_needs(kernel, bodies)
    refs = open_jaxpr(kernel).invars[gm.num_index_operands:gm.num_index_operands + gm.num_inputs]
    first = len(eqn.invars) - gm.num_inputs
    return [first + k for k, v in enumerate(refs)
            if (needs.contents(v) if is_ref(v) else needs.value(v))]


@functools.lru_cache(maxsize=256)
def _everything(jaxpr: Any) -> tuple[tuple[bool, ...], frozenset, frozenset]:
    """``_needed``'s answer when the program runs: every eqn evaluated, every var known."""
    j = open_jaxpr(jaxpr)
    live = {v for e in j.eqns for v in e.outvars} | set(j.invars) | set(j.constvars)
    return (True,) * len(j.invars), frozenset(id(e) for e in j.eqns), frozenset(live)


@functools.lru_cache(maxsize=4096)
def _needed(jaxpr: Any, out_needed: tuple[bool, ...], bodies: bool = False
            ) -> tuple[tuple[bool, ...], frozenset, frozenset]:
    """Which invars of ``jaxpr`` the walk must know, which eqns (ids) it must evaluate, and
    which vars it must know (``live``).

    A value is needed when a pallas_call's schedule operand, a control-flow eqn around a
    pallas_call, or a needed output depends on it -- or an input whose contents the kernel
    body's DMAs or indices read (``_body_value_operands``; for every kernel when ``bodies``,
    else for kernels that start DMAs, the only ones whose body is interpreted by default).
    """
    j = open_jaxpr(jaxpr)
    live: set = {v for v, n in zip(j.outvars, out_needed, strict=True)
                 if n and not isinstance(v, Literal)}
    evaluate: set = set()
    for eqn in reversed(j.eqns):
        if is_kernel(eqn):
            picks = [eqn.invars[i] for i in (*_schedule_operands(eqn),
                                              *_body_value_operands(eqn, bodies))]
        else:
            outs = tuple(v in live for v in eqn.outvars)
            if not any(outs) and not any(_has_pallas_call(s) for s, _ in sub_jaxprs(eqn)):
                continue
            evaluate.add(id(eqn))
            needed = _operands_needed(eqn, outs, bodies)
            picks = [v for v, n in zip(eqn.invars, needed, strict=True) if n]
        live.update(v for v in picks if not isinstance(v, Literal))
    return tuple(v in live for v in j.invars), frozenset(evaluate), frozenset(live)


def _operands_needed(eqn: Any, outs: tuple[bool, ...], bodies: bool) -> tuple[bool, ...]:
    """Which operands of ``eqn`` are needed, given which of its outputs are."""
    p, name = eqn.params, eqn.primitive.name
    body = call_body(eqn)
    if body is not None and _has_pallas_call(body):
        return _needed(body, outs, bodies)[0]
    if name == "scan" and _has_pallas_call(p["jaxpr"]):
        return _needed(p["jaxpr"], _loop_body_needed(eqn, outs, bodies), bodies)[0]
    if name == "while" and (_has_pallas_call(p["body_jaxpr"]) or
                            _has_pallas_call(p["cond_jaxpr"])):
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cond_in = _needed(p["cond_jaxpr"], (True,), bodies)[0]
        body_in = _needed(p["body_jaxpr"], _loop_body_needed(eqn, outs, bodies), bodies)[0]
        carry_in = [a or b for a, b in zip(cond_in[cn:], body_in[bn:], strict=True)]
        return (*cond_in[:cn], *body_in[:bn], *carry_in)
    if name == "cond" and any(_has_pallas_call(b) for b in p["branches"]):
        per_branch = [_needed(b, outs, bodies)[0] for b in p["branches"]]
        return (True, *(any(col) for col in zip(*per_branch, strict=True)))
    if name == "shard_map" and _has_pallas_call(p["jaxpr"]):
        return _needed(p["jaxpr"], outs, bodies)[0]
    if any(_has_pallas_call(s) for s, _ in sub_jaxprs(eqn)):
        raise _unsupported_around_kernel(name)
    return (True,) * len(eqn.invars)


@functools.lru_cache(maxsize=4096)
def _loop_body_needed(eqn: Any, outs: tuple[bool, ...], bodies: bool) -> tuple[bool, ...]:
    """Which results of a scan's or while loop's body are needed, given which of the loop's
    are: a carry is needed in every iteration once any iteration needs it (for a while loop,
    also once its condition reads it: the predicate decides the trip count)."""
    p = eqn.params
    if eqn.primitive.name == "scan":
        consts, carry, _ = scan_operands(p, list(range(len(eqn.invars))))
        first, ncarry = len(consts), len(carry)
        body, extra = p["jaxpr"], outs[ncarry:]
        read = lambda mask: _needed(body, mask, bodies)[0][first:first + ncarry]  # noqa: E731
    else:
        first, ncarry, body, extra = p["body_nconsts"], len(outs), p["body_jaxpr"], ()
        by_cond = _needed(p["cond_jaxpr"], (True,), bodies)[0][p["cond_nconsts"]:]
        read = lambda mask: [a or b for a, b in zip(  # noqa: E731
            by_cond, _needed(body, mask, bodies)[0][first:first + ncarry], strict=True)]
    carry_out = list(outs[:ncarry])
    while True:
        more = [a or b for a, b in zip(carry_out, read((*carry_out, *extra)), strict=True)]
        if more == carry_out:
            return (*carry_out, *extra)
        carry_out = more


def _unsupported_around_kernel(name: str) -> TraceError:
    return TraceError(f"a pallas_call inside {name!r} is not supported by kernelsim's "
                      "tracer (supported around kernels: jit, custom_jvp/custom_vjp, "
                      "custom_vmap, checkpoint, scan, fori_loop/while_loop, cond, vmap, "
                      "shard_map)")


class _CallFinder:
    """Walks a jaxpr in program order, collecting pallas_calls and computing needed values.

    With ``execute`` (``handler(args, params) -> outputs``) the walk runs the whole program
    instead: every eqn is evaluated (the code between kernels as compiled XLA slices) and each
    kernel's outputs are what ``execute`` returns, so nothing is traced twice and the kernel
    bodies are traced exactly as the program traced them (no ``disable_jit``).

    A ``jax.shard_map`` around kernels is walked once per device of its mesh, on that
    device's shards, and each kernel found is captured with its ``MeshDevice``. When the
    program runs, the devices cannot run one at a time (a remote copy needs its receiver
    running), so the shard_map runs whole, each kernel's params first passed through
    ``mapped.prepare`` (e.g. to run it in TPU interpret mode), by ``mapped.run(thunk,
    captured)``.
    """

    def __init__(self, bodies: bool, execute: Callable[[tuple, dict], Any] | None = None,
                 mapped: MappedRunner | None = None):
        self.found: list[Captured] = []
        self.bodies = bodies
        self.execute = execute
        self.mapped = mapped or MappedRunner()
        self.device: MeshDevice | None = None

    def walk(self, jaxpr: Any, consts: list, args: list, out_needed: tuple[bool, ...]) -> list:
        j = open_jaxpr(jaxpr)
        _, evaluate, live = (_everything(jaxpr) if self.execute is not None
                             else _needed(jaxpr, out_needed, self.bodies))
        env: dict[Any, Any] = dict(zip(j.constvars, consts, strict=True))
        env.update(zip(j.invars, args, strict=True))

        def read(v: Any) -> Any:
            return v.val if isinstance(v, Literal) else env.get(v, _UNKNOWN)

        plain: list = []  # needed eqns with no pallas_call inside, run as one compiled slice

        def flush() -> None:
            if plain:
                env.update(_run_slice(plain, live, read, numpy=self.execute is None))
                plain.clear()

        for eqn in j.eqns:
            if is_kernel(eqn):
                flush()
                captured = Captured(tuple(read(v) for v in eqn.invars), kernel_params(eqn),
                                    self.device)
                self.found.append(captured)
                if self.execute is not None:
                    outs = list(self.execute(captured.args, captured.params))
                else:
                    outs = [_zeros(v.aval) if v in live else _UNKNOWN for v in eqn.outvars]
            elif id(eqn) not in evaluate:
                continue
            elif (eqn.primitive.name == "axis_index" and self.device is not None
                  and eqn.params["axis_name"] in self.device.axes):
                flush()  # this device's coordinate, as shard_map gives it to its body
                axis = self.device.axes.index(eqn.params["axis_name"])
                outs = [np.int32(self.device.coords[axis])]
            elif not any(_has_pallas_call(sub) for sub, _ in sub_jaxprs(eqn)):
                plain.append(eqn)
                continue
            else:
                flush()
                outs = self.eqn(eqn, [read(v) for v in eqn.invars],
                                tuple(v in live for v in eqn.outvars))
            env.update(zip(eqn.outvars, outs, strict=True))
        flush()
        return [read(v) for v in j.outvars]

    def eqn(self, eqn: Any, vals: list, live: tuple[bool, ...]) -> list:
        """A control-flow or call eqn with kernels inside, walked; ``live``: which of its
        results the program needs (a call or branch computes only those, as ``_needed``
        planned; a loop's carries, all of them)."""
        p, name = eqn.params, eqn.primitive.name
        body = call_body(eqn)
        if body is not None and _has_pallas_call(body):
            return self.walk(open_jaxpr(body), consts_of(body), vals, live)
        if name == "scan" and _has_pallas_call(p["jaxpr"]):
            body_needed = _loop_body_needed(eqn, live, self.bodies)
            consts, carry, xs = scan_operands(p, vals)
            ys = []
            order = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
            for i in order:
                step_xs = [x if x is _UNKNOWN else x[i] for x in xs]
                out = self.walk(p["jaxpr"], consts_of(p["jaxpr"]), consts + carry + step_xs,
                                body_needed)
                carry, y = out[:len(carry)], out[len(carry):]
                ys.append(y)
            if p["reverse"]:
                ys.reverse()
            stacked = [_UNKNOWN if not ys or any(y[k] is _UNKNOWN for y in ys)
                       else np.stack([np.asarray(y[k]) for y in ys])
                       for k in range(len(eqn.outvars) - len(carry))]
            return carry + stacked
        if name == "while" and (_has_pallas_call(p["body_jaxpr"]) or
                                _has_pallas_call(p["cond_jaxpr"])):
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cc, bc, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
            cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
            body_needed = _loop_body_needed(eqn, live, self.bodies)
            while self._known(self.walk(cj, consts_of(cj), cc + carry, (True,))[0], "while_loop "
                              "condition"):
                carry = self.walk(bj, consts_of(bj), bc + carry, body_needed)
            return carry
        if name == "cond" and any(_has_pallas_call(b) for b in p["branches"]):
            branches = p["branches"]
            index = int(self._known(vals[0], "cond predicate"))
            b = branches[min(max(index, 0), len(branches) - 1)]
            return self.walk(b, consts_of(b), vals[1:], live)
        if name == "shard_map" and _has_pallas_call(p["jaxpr"]):
            return self.shard_map(eqn, vals)
        raise _unsupported_around_kernel(name)

    def shard_map(self, eqn: Any, vals: list) -> list:
        """Walk the body once per mesh device on its shards; run the whole map if executing."""
        p = eqn.params
        if self.device is not None:
            raise TraceError("a shard_map inside a shard_map around a kernel is not "
                             "supported by kernelsim's tracer")
        mesh = p["mesh"]
        axes, sizes = tuple(mesh.axis_names), tuple(int(n) for n in mesh.axis_sizes)
        if set(p["newly_manual_axes"]) != set(axes):
            raise TraceError("a shard_map around a kernel that leaves mesh axes "
                             f"{sorted(set(axes) - set(p['newly_manual_axes']))} automatic is "
                             "not supported by kernelsim's tracer (make every axis manual)")
        body = p["jaxpr"]
        finder = self if self.execute is None else _CallFinder(self.bodies)
        first = len(finder.found)
        needed = _needed(body, (False,) * len(eqn.outvars), self.bodies)[0]
        for coords in np.ndindex(*sizes):
            device = MeshDevice(axes, sizes, tuple(int(c) for c in coords))
            shards = [_shard(v, spec, device) if need and v is not _UNKNOWN else _UNKNOWN
                      for v, spec, need in zip(vals, p["in_specs"], needed, strict=True)]
            finder.device = device
            try:
                finder.walk(body, consts_of(body), shards, (False,) * len(eqn.outvars))
            finally:
                finder.device = None
        if self.execute is None:
            return [_zeros(v.aval) for v in eqn.outvars]
        captured = finder.found[first:]
        self.found += captured
        runnable = eqn.replace(params={**p, "jaxpr": _with_kernel_params(body,
                                                                         self.mapped.prepare)})
        ins = list(dict.fromkeys(v for v in eqn.invars if not isinstance(v, Literal)))
        env = dict(zip(eqn.invars, vals, strict=True))
        alone = open_jaxpr(body).replace(constvars=[], invars=ins, outvars=list(eqn.outvars),
                                    eqns=[runnable], effects=runnable.effects)
        # under jit, as jax.shard_map itself runs: every device's kernel runs at once
        run_all = jax.jit(lambda *xs: eval_jaxpr(alone, [], *xs))
        return list(self.mapped.run(lambda: run_all(*[env[v] for v in ins]), captured))

    @staticmethod
    def _known(value: Any, what: str) -> Any:
        if value is _UNKNOWN:  # _needed marks every value an evaluated eqn reads
            raise AssertionError(f"kernelsim: the {what} was not computed")
        return value


class MappedRunner:
    """How ``run_calls`` runs a ``shard_map`` around kernels: ``prepare(params)`` gives each
    kernel's params to run with, ``run(thunk, captured)`` runs the whole map (``thunk()``)
    knowing the per-device calls it makes (``captured``)."""

    def prepare(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def run(self, thunk: Callable[[], Any], captured: list[Captured]) -> Any:
        return thunk()


def _with_kernel_params(jaxpr: Any, prepare: Callable[[dict], dict]) -> Any:
    """``jaxpr`` with every pallas_call eqn's params replaced by ``prepare(params)``."""
    j = open_jaxpr(jaxpr)
    eqns = []
    for eqn in j.eqns:
        if eqn.primitive is pl.pallas_call_p:
            eqn = eqn.replace(params=dict(prepare(eqn.params)))
        elif is_kernel(eqn):
            raise TraceError("kernelsim cannot run a pl.kernel inside a shard_map")
        eqns.append(eqn)
    opened = j.replace(eqns=eqns)
    return opened if jaxpr is j else close_jaxpr(opened, consts_of(jaxpr))


def _shard(value: Any, spec: Any, device: MeshDevice) -> np.ndarray:
    """The shard of ``value`` that ``device`` holds under partition ``spec``: along each
    dimension the spec names mesh axes for, the block numbered row-major over those axes."""
    value = np.asarray(value)
    index: list[slice] = []
    for dim, names in enumerate(tuple(spec) + (None,) * (value.ndim - len(tuple(spec)))):
        names = () if names is None else (names if isinstance(names, tuple) else (names,))
        count, k = 1, 0
        for name in names:
            axis = device.axes.index(name)
            count, k = count * device.sizes[axis], k * device.sizes[axis] + device.coords[axis]
        size = value.shape[dim] // count
        index.append(slice(k * size, (k + 1) * size))
    return value[tuple(index)]


def _zeros(aval: Any) -> Any:
    """Zeros standing in for a kernel output: numpy (no dispatch) unless the dtype is JAX's own."""
    try:
        return np.zeros(aval.shape, np.dtype(aval.dtype))
    except TypeError:
        return jnp.zeros(aval.shape, aval.dtype)


def _run_slice(eqns: list, live: frozenset, read: Callable[[Any], Any],
               numpy: bool = True) -> dict:
    """Run consecutive eqns as one program; the values of their outputs in ``live``.

    First in numpy (``numpy_eval``: no compilation, which is most of what a cold trace would
    otherwise pay) when ``numpy``; a slice numpy cannot evaluate (or any slice of a program
    that is really run, whose values must be XLA's) runs as one compiled program (cached by
    the slice's text and input types), not one compilation per primitive.
    """
    defined = {v for e in eqns for v in e.outvars}
    inputs = list(dict.fromkeys(v for e in eqns for v in e.invars
                                if not isinstance(v, Literal) and v not in defined))
    outputs = [v for e in eqns for v in e.outvars
               if v in live and not isinstance(v, DropVar)]
    values = [read(v) for v in inputs]
    if any(v is _UNKNOWN for v in values):  # _needed marks every input of a needed eqn
        raise AssertionError("kernelsim: a needed value was not computed")
    results = None
    try:
        if numpy:
            slice_ = types.SimpleNamespace(constvars=[], invars=inputs, eqns=eqns,
                                           outvars=outputs)
            results = numpy_eval(slice_, [], values)
    except lax_numpy.Unsupported:
        pass
    if results is None:
        program = new_jaxpr(inputs, outputs, eqns)
        try:
            results = _compiled(str(program), program)(*values)
        except Exception as err:  # noqa: BLE001 - any failure here is kernelsim's to explain
            names = ", ".join(sorted({e.primitive.name for e in eqns}))
            raise TraceError(
                f"kernelsim needs values computed by {names} (they feed a scalar-prefetch "
                "operand, a grid bound or the control flow around a pallas_call) but could not "
                f"compute them: {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}") from err
    return dict(zip(outputs, results, strict=True))


_SLICE_CACHE: dict[str, Callable] = {}


def _compiled(key: str, program: Any) -> Callable:
    """A jitted function of ``program``, one per distinct program text (bounded cache)."""
    if key not in _SLICE_CACHE:
        if len(_SLICE_CACHE) >= 256:
            _SLICE_CACHE.clear()
        _SLICE_CACHE[key] = jax.jit(jaxpr_as_fun(close_jaxpr(program, [])))
    return _SLICE_CACHE[key]


def _asks_for_a_tpu(error: Exception) -> bool:
    """``error`` is what tracing raises on a host without a TPU when the code asks for the TPU
    it targets: ``get_tpu_info()``'s "Unsupported TPU device kind: cpu" (every release so far)
    or ``pltpu.create_tensorcore_mesh`` reading ``jax.devices()[0].num_cores`` (a CPU device
    has none). Under an abstract TPU mesh both read the abstract device instead."""
    if isinstance(error, ValueError):
        return "TPU device kind" in str(error)
    return isinstance(error, AttributeError) and getattr(error, "name", None) == "num_cores"


def _is_python_data(value: Any) -> bool:
    """Hashable Python scalars and tuples of them: no array anywhere in it."""
    leaves = jax.tree_util.tree_leaves(value)
    if not leaves or not all(type(leaf) in (int, float, bool, complex, str) for leaf in leaves):
        return False
    try:
        hash(value)
    except TypeError:
        return False
    return True


def find_calls(fn: Callable, args: tuple, device_kind: str,
               bodies: bool = False) -> list[Captured]:
    """Every pallas_call ``fn(*args)`` makes, in program order, found in its jaxpr.

    device_kind: the TPU to present to code that asks which one it runs on (e.g. "TPU v5e");
    only used if tracing on this machine's own device fails for that reason.
    bodies: every kernel body will be interpreted (``record_access``), so compute the inputs
    each one reads values from; otherwise only for kernels that start DMAs.
    Raises ``NeedsExecution`` when ``fn`` cannot be traced to a jaxpr (it branches in Python on
    array values); the caller then runs it eagerly instead.
    """
    closed, flat, _ = _program(fn, args, device_kind)
    finder = _CallFinder(bodies)
    finder.walk(open_jaxpr(closed), consts_of(closed), flat,
                (False,) * len(open_jaxpr(closed).outvars))
    return finder.found


def run_calls(fn: Callable, args: tuple, device_kind: str,
              execute: Callable[[tuple, dict], Any], mapped: MappedRunner | None = None
              ) -> tuple[Any, list[Captured]]:
    """Run ``fn(*args)`` from its jaxpr: ``(outputs, every kernel call in program order)``.

    Each kernel's outputs are ``execute(args, params)``; the code around the kernels runs as
    compiled XLA slices between them; a ``shard_map`` around kernels runs whole, as
    ``mapped`` says (``MappedRunner``). Raises ``NeedsExecution`` as ``find_calls`` does.
    """
    closed, flat, out_tree = _program(fn, args, device_kind)
    finder = _CallFinder(False, execute, mapped)
    outs = finder.walk(open_jaxpr(closed), consts_of(closed), flat,
                       (True,) * len(open_jaxpr(closed).outvars))
    return jax.tree_util.tree_unflatten(out_tree, outs), finder.found


def _program(fn: Callable, args: tuple, device_kind: str) -> tuple[Any, list, Any]:
    """``fn``'s jaxpr, its flat array arguments and the tree of its outputs."""
    # Plain Python data (ints, tuples of ints, ...) stays Python while tracing, as when the
    # caller runs fn: a jitted fn may take it as a static argument (block sizes, shapes).
    static = tuple(i for i, a in enumerate(args) if _is_python_data(a))
    trace_to_jaxpr = jax.make_jaxpr(fn, static_argnums=static, return_shape=True)
    try:
        try:
            closed, shapes = trace_to_jaxpr(*args)
        except (ValueError, AttributeError) as e:
            if not _asks_for_a_tpu(e):
                raise
            with on_abstract_tpu(device_kind):
                closed, shapes = trace_to_jaxpr(*args)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError) as e:
        raise NeedsExecution(str(e)) from e
    flat = jax.tree_util.tree_leaves([a for i, a in enumerate(args) if i not in static])
    return closed, list(flat), jax.tree_util.tree_structure(shapes)


def zeros_for(params: dict[str, Any]) -> list[jax.Array]:
    """Stand-in outputs for a call that is analysed, not executed."""
    return [jnp.zeros(a.shape, a.dtype) for a in params["out_avals"]]
