"""The only module of kernelsim that touches JAX internals (``jax._src``) and pallas_call params.

It turns a captured ``pallas_call`` into ``kernelsim.model`` dataclasses, evaluates index maps
over the whole grid, counts kernel FLOPs and records the DMAs TPU interpret mode performs.
Supported JAX releases: ``SUPPORTED_JAX`` (tested on both ends by ``make test``; ``make test-jax
JAX=<version>`` runs kernelsim's suite on any other). Differences between releases are handled
here by feature detection, never by comparing version strings; see kernelsim/UPGRADING.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core
from jax._src.pallas import core as pallas_core
from jax._src.pallas import mpmd
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret
from jax._src.state import indexing
from jax._src.state import types as state_types
from jax._src.state.discharge import discharge_state
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernelsim import _lax_numpy
from kernelsim.body import DmaLedger
from kernelsim.errors import TraceError
from kernelsim.model import BlockDim, BodyCopy, KernelCall, MemorySpace, MeshDevice, Operand

# The oldest and newest JAX releases kernelsim is tested against.
SUPPORTED_JAX = ("0.10.2", "0.12.0.1")

# ---------------------------------------------------------------------------------------------
# What differs between JAX releases

# jax <= 0.10 wraps a Jaxpr and its constants in ClosedJaxpr; from 0.11 a Jaxpr carries its
# constants itself (``.consts``, and ``.jaxpr`` returns the Jaxpr), and ClosedJaxpr is gone.
_CLOSED_JAXPR: type | None = getattr(jax_core, "ClosedJaxpr", None)
_JAXPR_TYPES: tuple[type, ...] = (jax_core.Jaxpr,) + ((_CLOSED_JAXPR,) if _CLOSED_JAXPR else ())


def _open(j: Any) -> Any:
    """The Jaxpr whose ``eqns`` and ``constvars`` to walk (a ClosedJaxpr's inner one)."""
    return j.jaxpr if _CLOSED_JAXPR is not None and isinstance(j, _CLOSED_JAXPR) else j


def _consts(j: Any) -> list:
    """The constant values bound to ``_open(j).constvars`` (none for a bare old-style Jaxpr)."""
    return list(getattr(j, "consts", ()))


def _closed(jaxpr: Any, consts: list) -> Any:
    """``jaxpr`` with ``consts`` attached: a ClosedJaxpr before 0.11, a Jaxpr after."""
    return (_CLOSED_JAXPR or jax_core.Jaxpr)(jaxpr, consts)


def _scan_operands(params: dict[str, Any], vals: list) -> tuple[list, list, list]:
    """A scan's operands split into (consts, carry, xs).

    jax <= 0.10 records ``num_consts``/``num_carry``; from 0.11 the split is a FlatTree
    ``ft_in`` whose three children are the consts, the carry and the scanned inputs.
    """
    if "ft_in" in params:
        consts, carry, xs = params["ft_in"].update(vals).unpack()
        return list(consts), list(carry), list(xs)
    nc, ncarry = params["num_consts"], params["num_carry"]
    return vals[:nc], vals[nc:nc + ncarry], vals[nc + ncarry:]


_MEMORY_SPACES: dict[str, MemorySpace] = {
    "default": "vmem", "vmem": "vmem", "vmem_shared": "vmem", "cmem": "vmem",
    "smem": "smem", "semaphore_mem": "semaphore", "hbm": "hbm", "any": "any",
}

# ---------------------------------------------------------------------------------------------
# Capturing every pallas_call a function reaches


@dataclass
class Captured:
    """One pallas_call as it arrived at the primitive: concrete operands and the eqn params;
    ``device``: the mesh device it runs on, for a kernel inside ``jax.shard_map``."""

    args: tuple[Any, ...]
    params: dict[str, Any]
    device: MeshDevice | None = None


_capture_lock = threading.Lock()
# pallas_call's own impl jits the primitive for the current backend; captured calls run through it.
_ORIGINAL_IMPL = pl.pallas_call_p.impl
_ORIGINAL_MESH_IMPL = mpmd.mpmd_map_p.impl


@contextlib.contextmanager
def capturing(handler: Callable[[tuple, dict], Any]) -> Iterator[None]:
    """Route every eager ``pallas_call`` to ``handler(args, params)`` while the block runs, and
    every ``pl.kernel``/``pl.core_map`` (``mpmd_map``) with the pallas_call params it runs as
    (``mesh_kernel_params``).

    Runs the block under ``jax.disable_jit()`` so calls inside ``jit``, ``scan``, ``cond`` and
    ``custom_vjp`` arrive one by one with concrete operands (``vmap`` arrives as the batched
    call with one more grid axis).
    """
    def mesh_kernel(*args, **params):
        return handler(args, mesh_kernel_params([jax.typeof(a) for a in args], params))

    with _capture_lock:
        pl.pallas_call_p.def_impl(lambda *args, **params: handler(args, params))
        mpmd.mpmd_map_p.def_impl(mesh_kernel)
        try:
            with jax.disable_jit():
                yield
        finally:
            pl.pallas_call_p.def_impl(_ORIGINAL_IMPL)
            mpmd.mpmd_map_p.def_impl(_ORIGINAL_MESH_IMPL)


# ---------------------------------------------------------------------------------------------
# Finding every pallas_call in the traced program, without running the program
#
# ``find_calls`` traces the function to a jaxpr (nothing runs) and walks it in program order.
# Of the ordinary JAX code around the kernels it evaluates only the slice that produces what a
# schedule needs: scalar-prefetch operands, dynamic grid bounds and the predicates and trip
# counts of loops and branches that contain a pallas_call. Kernel outputs that feed such a value
# are zeros, as in an analysed (not executed) call.


class NeedsExecution(Exception):
    """The function cannot be traced to a jaxpr (Python control flow on array values)."""


_UNKNOWN = object()  # a value the walk did not need to compute
_CALL_PRIMITIVES = frozenset({
    "pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_vmap_call",
    "remat_opt"})


def _call_body(eqn: Any) -> Any | None:
    """The jaxpr a call-like eqn runs on its operands one to one, if it is one.

    ``run_state`` (``pl.run_state``, the usual home of ``pl.core_map``) counts as one: its
    body with the state discharged takes the refs' initial values and returns their final
    ones, as the primitive's own impl evaluates it (jax/_src/state/discharge.py).
    """
    p = eqn.params
    if eqn.primitive.name == "run_state" and all(p["is_initialized"]):
        return _discharged(p["jaxpr"])
    if eqn.primitive.name not in _CALL_PRIMITIVES:
        return None
    body = _called_jaxpr(p)
    return body if isinstance(body, _JAXPR_TYPES) else None


def _called_jaxpr(params: dict[str, Any]) -> Any:
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
def _discharged(jaxpr: Any) -> Any:
    return discharge_state(_closed(_open(jaxpr), _consts(jaxpr)))


def _is_kernel(eqn: Any) -> bool:
    """A ``pallas_call``, or a ``pl.kernel``/``pl.core_map`` (the ``mpmd_map`` primitive)."""
    return eqn.primitive is pl.pallas_call_p or eqn.primitive is mpmd.mpmd_map_p


class MeshKernelParams(dict):
    """The pallas_call params that model a ``pl.kernel``; ``mpmd_params`` are its own
    ``mpmd_map`` params, which is what runs when kernelsim executes it."""

    mpmd_params: dict[str, Any]


_MESH_PARAMS: dict[int, tuple[Any, dict]] = {}


def _kernel_params(eqn: Any) -> dict[str, Any]:
    """The pallas_call params of a kernel eqn (``mesh_kernel_params`` for an ``mpmd_map``)."""
    if eqn.primitive is pl.pallas_call_p:
        return eqn.params
    hit = _MESH_PARAMS.get(id(eqn))
    if hit is None or hit[0] is not eqn:
        if len(_MESH_PARAMS) >= 1024:
            _MESH_PARAMS.clear()
        hit = _MESH_PARAMS[id(eqn)] = (eqn, mesh_kernel_params([v.aval for v in eqn.invars],
                                                                eqn.params))
    return hit[1]


def mesh_kernel_params(in_avals: list, params: dict[str, Any]) -> dict[str, Any]:
    """The pallas_call that a ``pl.kernel``/``pl.core_map`` (an ``mpmd_map`` of ``params``
    over operands of types ``in_avals``) runs as.

    Built as JAX builds it to run such a kernel on a CPU, i.e. in interpret mode
    (jax/_src/pallas/mpmd.py, ``_mpmd_map_fallback_lowering``, the same in jax 0.10.2 and
    0.12.0.1): the mesh's axes become the grid -- one step per TensorCore -- every operand is
    a whole array in its own memory space (the mesh's default, ANY, unless it names one), and
    the kernel's trailing refs are its scratch. Only TensorCore meshes with one body are
    modelled; the grid axis gets the mesh's dimension semantics (parallel: the cores run at
    once) and closed-over scalars are passed in SMEM, as the TPU lowering does. When kernelsim
    executes the kernel it runs the ``mpmd_map`` itself (``execute``).
    """
    jaxprs, meshes = params["jaxprs"], params["meshes"]
    label = params.get("name") or "pl.kernel"
    if len(jaxprs) != 1 or params.get("external_meshes"):
        raise TraceError(
            f"{label!r}: a pl.kernel with several bodies or meshes (MPMD, e.g. SparseCore "
            "subcores beside TensorCores) is not modelled by kernelsim; one body on a "
            "TensorCore mesh (pltpu.create_tensorcore_mesh) is.")
    (jaxpr,), (mesh,) = jaxprs, meshes
    if type(mesh).__name__ != "TensorCoreMesh":
        raise TraceError(
            f"{label!r}: pl.kernel on a {type(mesh).__name__} is not modelled by kernelsim "
            "(it models TPU TensorCores: use pltpu.create_tensorcore_mesh).")
    out_avals = list(params["out_avals"])
    nin = len(in_avals)
    nscratch = len(jaxpr.invars) - nin - len(out_avals)

    def spec(aval: Any) -> Any:
        if isinstance(aval, jax_core.ShapedArray) and not aval.shape:
            # a closed-over scalar: the TPU lowering passes it in SMEM on a TensorCore
            # (mosaic/pallas_call_registration.py, ``_rewrite_jaxpr_for_lowering``)
            return pl.BlockSpec(memory_space=pltpu.SMEM)
        space = getattr(aval, "memory_space", None)
        own = (isinstance(aval, jax_core.ShapedArray) and space is not None
               and not isinstance(space, jax_core.MemorySpace))
        return pl.BlockSpec(memory_space=space if own else mesh.default_memory_space)

    def array(aval: Any) -> Any:
        return aval.inner_aval if isinstance(aval, state_types.AbstractRef) else aval

    scratch = [v.aval for v in jaxpr.invars[len(jaxpr.invars) - nscratch:]] if nscratch else []
    grid_spec = pl.GridSpec(
        grid=tuple(mesh.shape.items()),
        in_specs=tuple(spec(array(a)) for a in in_avals),
        out_specs=tuple(spec(a) for a in out_avals),
        scratch_shapes=tuple(pallas_core.MemoryRef(a.inner_aval, a.memory_space)
                             for a in scratch))
    _, grid_mapping = pallas_core.get_grid_mapping(
        grid_spec, [array(v.aval) for v in jaxpr.invars[:nin]],
        jax.tree_util.tree_structure(tuple(range(nin))), [f"arg{i}" for i in range(nin)],
        [array(v.aval) for v in jaxpr.invars[nin:nin + len(out_avals)]],
        jax.tree_util.tree_structure(tuple(range(len(out_avals)))),
        [f"out{i}" for i in range(len(out_avals))], debug=params.get("debug", False))
    compiler_params = params.get("compiler_params") or pltpu.CompilerParams()
    modelled = MeshKernelParams({
        "jaxpr": jaxpr, "grid_mapping": grid_mapping, "mesh": mesh,
        "input_output_aliases": tuple(params["input_output_aliases"].items()),
        "debug": params.get("debug", False), "interpret": params["interpret"],
        "compiler_params": dataclasses.replace(
            compiler_params, dimension_semantics=tuple(mesh.dimension_semantics)),
        "cost_estimate": params.get("cost_estimate"), "out_avals": tuple(out_avals),
        "metadata": params.get("metadata"), "name": params.get("name")})
    modelled.mpmd_params = dict(params)
    return modelled


@functools.lru_cache(maxsize=4096)
def _has_pallas_call(jaxpr: Any) -> bool:
    """``jaxpr`` reaches a kernel (a pallas_call or a pl.kernel) somewhere."""
    for eqn in _open(jaxpr).eqns:
        # jax <= 0.10: pl.core_map is its own primitive, a pallas_call once its run_state
        # is discharged (which is how the walk sees it)
        if _is_kernel(eqn) or eqn.primitive.name == "core_map":
            return True
        if any(_has_pallas_call(j) for j, _ in _sub_jaxprs(eqn)):
            return True
    return False


def _schedule_operands(eqn: Any) -> range:
    """Operand positions of a kernel eqn its schedule needs: dynamic grid bounds and
    scalar-prefetch values (operands are ``*consts, *grid bounds, *prefetch, *inputs``)."""
    gm = _kernel_params(eqn)["grid_mapping"]
    end = len(eqn.invars) - gm.num_inputs
    return range(end - gm.num_index_operands - gm.num_dynamic_grid_bounds, end)


def _body_value_operands(eqn: Any, bodies: bool) -> list[int]:
    """Operand positions of a pallas_call eqn whose contents its interpreted body reads for
    a DMA, an index or a branch (``_BodyNeeds``): the inputs, which follow the prefetch."""
    params = _kernel_params(eqn)
    kernel = params["jaxpr"]
    if not (bodies or _has_body_dma(kernel)):
        return []
    gm = params["grid_mapping"]
    needs = _body_needs(kernel)
    refs = _open(kernel).invars[gm.num_index_operands:gm.num_index_operands + gm.num_inputs]
    first = len(eqn.invars) - gm.num_inputs
    return [first + k for k, v in enumerate(refs)
            if (needs.contents(v) if _is_ref(v) else needs.value(v))]


@functools.lru_cache(maxsize=256)
def _everything(jaxpr: Any) -> tuple[tuple[bool, ...], frozenset, frozenset]:
    """``_needed``'s answer when the program runs: every eqn evaluated, every var known."""
    j = _open(jaxpr)
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
    j = _open(jaxpr)
    live: set = {v for v, n in zip(j.outvars, out_needed, strict=True)
                 if n and not isinstance(v, jax_core.Literal)}
    evaluate: set = set()
    for eqn in reversed(j.eqns):
        if _is_kernel(eqn):
            picks = [eqn.invars[i] for i in (*_schedule_operands(eqn),
                                              *_body_value_operands(eqn, bodies))]
        else:
            outs = tuple(v in live for v in eqn.outvars)
            if not any(outs) and not any(_has_pallas_call(s) for s, _ in _sub_jaxprs(eqn)):
                continue
            evaluate.add(id(eqn))
            needed = _operands_needed(eqn, outs, bodies)
            picks = [v for v, n in zip(eqn.invars, needed, strict=True) if n]
        live.update(v for v in picks if not isinstance(v, jax_core.Literal))
    return tuple(v in live for v in j.invars), frozenset(evaluate), frozenset(live)


def _operands_needed(eqn: Any, outs: tuple[bool, ...], bodies: bool) -> tuple[bool, ...]:
    """Which operands of ``eqn`` are needed, given which of its outputs are."""
    p, name = eqn.params, eqn.primitive.name
    body = _call_body(eqn)
    if body is not None and _has_pallas_call(body):
        return _needed(body, outs, bodies)[0]
    if name == "scan" and _has_pallas_call(p["jaxpr"]):
        consts, carry, _ = _scan_operands(p, list(range(len(eqn.invars))))
        ncarry = len(carry)
        carry_out = list(outs[:ncarry])
        while True:  # a carry is needed in every iteration once any iteration needs it
            ins = _needed(p["jaxpr"], (*carry_out, *outs[ncarry:]), bodies)[0]
            more = [a or b for a, b in zip(carry_out, ins[len(consts):len(consts) + ncarry],
                                           strict=True)]
            if more == carry_out:
                return ins
            carry_out = more
    if name == "while" and (_has_pallas_call(p["body_jaxpr"]) or
                            _has_pallas_call(p["cond_jaxpr"])):
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        carry_out = list(outs)
        while True:  # the predicate decides the trip count, so it is always needed
            cond_in = _needed(p["cond_jaxpr"], (True,), bodies)[0]
            body_in = _needed(p["body_jaxpr"], tuple(carry_out), bodies)[0]
            carry_in = [a or b for a, b in zip(cond_in[cn:], body_in[bn:], strict=True)]
            more = [a or b for a, b in zip(carry_out, carry_in, strict=True)]
            if more == carry_out:
                return (*cond_in[:cn], *body_in[:bn], *carry_in)
            carry_out = more
    if name == "cond" and any(_has_pallas_call(b) for b in p["branches"]):
        per_branch = [_needed(b, outs, bodies)[0] for b in p["branches"]]
        return (True, *(any(col) for col in zip(*per_branch, strict=True)))
    if name == "shard_map" and _has_pallas_call(p["jaxpr"]):
        return _needed(p["jaxpr"], outs, bodies)[0]
    if any(_has_pallas_call(s) for s, _ in _sub_jaxprs(eqn)):
        raise _unsupported_around_kernel(name)
    return (True,) * len(eqn.invars)


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
        j = _open(jaxpr)
        _, evaluate, live = (_everything(jaxpr) if self.execute is not None
                             else _needed(jaxpr, out_needed, self.bodies))
        env: dict[Any, Any] = dict(zip(j.constvars, consts, strict=True))
        env.update(zip(j.invars, args, strict=True))

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jax_core.Literal) else env.get(v, _UNKNOWN)

        plain: list = []  # needed eqns with no pallas_call inside, run as one compiled slice

        def flush() -> None:
            if plain:
                env.update(_run_slice(plain, live, read, numpy=self.execute is None))
                plain.clear()

        for eqn in j.eqns:
            if _is_kernel(eqn):
                flush()
                captured = Captured(tuple(read(v) for v in eqn.invars), _kernel_params(eqn),
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
            elif not any(_has_pallas_call(sub) for sub, _ in _sub_jaxprs(eqn)):
                plain.append(eqn)
                continue
            else:
                flush()
                outs = self.eqn(eqn, [read(v) for v in eqn.invars])
            env.update(zip(eqn.outvars, outs, strict=True))
        flush()
        return [read(v) for v in j.outvars]

    def eqn(self, eqn: Any, vals: list) -> list:
        p, name = eqn.params, eqn.primitive.name
        body = _call_body(eqn)
        outs_needed = (True,) * len(eqn.outvars)
        if body is not None and _has_pallas_call(body):
            return self.walk(_open(body), _consts(body), vals, outs_needed)
        if name == "scan" and _has_pallas_call(p["jaxpr"]):
            consts, carry, xs = _scan_operands(p, vals)
            ys = []
            order = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
            for i in order:
                step_xs = [x if x is _UNKNOWN else x[i] for x in xs]
                out = self.walk(p["jaxpr"], _consts(p["jaxpr"]), consts + carry + step_xs,
                                outs_needed)
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
            while self._known(self.walk(cj, _consts(cj), cc + carry, (True,))[0], "while_loop "
                              "condition"):
                carry = self.walk(bj, _consts(bj), bc + carry, outs_needed)
            return carry
        if name == "cond" and any(_has_pallas_call(b) for b in p["branches"]):
            branches = p["branches"]
            index = int(self._known(vals[0], "cond predicate"))
            b = branches[min(max(index, 0), len(branches) - 1)]
            return self.walk(b, _consts(b), vals[1:], outs_needed)
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
                finder.walk(body, _consts(body), shards, (False,) * len(eqn.outvars))
            finally:
                finder.device = None
        if self.execute is None:
            return [_zeros(v.aval) for v in eqn.outvars]
        captured = finder.found[first:]
        self.found += captured
        runnable = eqn.replace(params={**p, "jaxpr": _with_kernel_params(body,
                                                                         self.mapped.prepare)})
        ins = list(dict.fromkeys(v for v in eqn.invars if not isinstance(v, jax_core.Literal)))
        env = dict(zip(eqn.invars, vals, strict=True))
        alone = _open(body).replace(constvars=[], invars=ins, outvars=list(eqn.outvars),
                                    eqns=[runnable], effects=runnable.effects)
        # under jit, as jax.shard_map itself runs: every device's kernel runs at once
        run_all = jax.jit(lambda *xs: jax_core.eval_jaxpr(alone, [], *xs))
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
    j = _open(jaxpr)
    eqns = []
    for eqn in j.eqns:
        if eqn.primitive is pl.pallas_call_p:
            eqn = eqn.replace(params=dict(prepare(eqn.params)))
        elif _is_kernel(eqn):
            raise TraceError("kernelsim cannot run a pl.kernel inside a shard_map")
        eqns.append(eqn)
    opened = j.replace(eqns=eqns)
    return opened if jaxpr is j else _closed(opened, _consts(jaxpr))


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

    First in numpy (``_numpy_eval``: no compilation, which is most of what a cold trace would
    otherwise pay) when ``numpy``; a slice numpy cannot evaluate (or any slice of a program
    that is really run, whose values must be XLA's) runs as one compiled program (cached by
    the slice's text and input types), not one compilation per primitive.
    """
    defined = {v for e in eqns for v in e.outvars}
    inputs = list(dict.fromkeys(v for e in eqns for v in e.invars
                                if not isinstance(v, jax_core.Literal) and v not in defined))
    outputs = [v for e in eqns for v in e.outvars
               if v in live and not isinstance(v, jax_core.DropVar)]
    values = [read(v) for v in inputs]
    if any(v is _UNKNOWN for v in values):  # _needed marks every input of a needed eqn
        raise AssertionError("kernelsim: a needed value was not computed")
    results = None
    try:
        if numpy:
            slice_ = types.SimpleNamespace(constvars=[], invars=inputs, eqns=eqns,
                                           outvars=outputs)
            results = _numpy_eval(slice_, [], values)
    except _lax_numpy.Unsupported:
        pass
    if results is None:
        program = jax_core.Jaxpr([], inputs, outputs, eqns,
                                 jax_core.join_effects(*(e.effects for e in eqns)))
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


# How many primitive applications one numpy evaluation may make before it gives the slice to
# XLA (a long while_loop runs faster compiled than op by op in Python).
_NUMPY_BUDGET = 20_000


def _numpy_eval(jaxpr: Any, consts: list, args: list, budget: list | None = None) -> list:
    """Evaluate ``jaxpr`` on concrete values with numpy (``kernelsim._lax_numpy``'s rules).

    Understands nested calls (jit, custom_jvp/vjp, checkpoint), ``cond``, ``while``, ``scan``
    and hijax primitives (through their ``expand``). Raises ``_lax_numpy.Unsupported`` for
    anything else, for operands of a dtype it does not model, or past ``_NUMPY_BUDGET``
    primitive applications; the caller then asks XLA.
    """
    budget = [_NUMPY_BUDGET] if budget is None else budget
    j = _open(jaxpr)
    env: dict[Any, Any] = dict(zip(j.constvars, (np.asarray(c) for c in consts), strict=True))
    env.update(zip(j.invars, (np.asarray(a) for a in args), strict=True))

    def read(v: Any) -> Any:
        return _literal(v) if isinstance(v, jax_core.Literal) else env[v]

    for eqn in j.eqns:
        budget[0] -= 1
        if budget[0] < 0:
            raise _lax_numpy.Unsupported("too long for op-by-op evaluation")
        vals = [read(v) for v in eqn.invars]
        outs = _numpy_eqn(eqn, vals, budget)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in j.outvars]


def _numpy_eqn(eqn: Any, vals: list, budget: list) -> list:
    """One eqn of ``_numpy_eval``: its outputs, as a list."""
    name, p = eqn.primitive.name, eqn.params
    body = _call_body(eqn)
    if body is not None:
        return _numpy_eval(body, _consts(body), vals, budget)
    if name == "cond":
        branches = p["branches"]
        b = branches[int(np.clip(int(vals[0]), 0, len(branches) - 1))]
        return _numpy_eval(b, _consts(b), vals[1:], budget)
    if name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cc, bc, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        while bool(_numpy_eval(cj, _consts(cj), cc + carry, budget)[0]):
            carry = _numpy_eval(bj, _consts(bj), bc + carry, budget)
        return carry
    if name == "scan":
        consts, carry, xs = _scan_operands(p, vals)
        ys = []
        order = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
        for i in order:
            out = _numpy_eval(p["jaxpr"], _consts(p["jaxpr"]), consts + carry + [x[i] for x in xs],
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
        return _numpy_eval(expanded, _consts(expanded), vals, budget)
    return _lax_numpy.apply(name, vals, p, [v.aval for v in eqn.outvars])


@functools.lru_cache(maxsize=256)
def _hi_expansion(prim: Any, in_avals: tuple, out_avals: tuple) -> Any:
    """The jaxpr of a hijax primitive's ``expand`` (jax >= 0.12: e.g. ``jnp.searchsorted``)
    for operands of types ``in_avals``."""
    try:
        closed = jax.make_jaxpr(prim.expand)(*prim.in_avals)
    except Exception as e:  # noqa: BLE001 - not expandable here: XLA evaluates it
        raise _lax_numpy.Unsupported(f"hijax primitive {type(prim).__name__}") from e
    return closed


_SLICE_CACHE: dict[str, Callable] = {}


def _compiled(key: str, program: Any) -> Callable:
    """A jitted function of ``program``, one per distinct program text (bounded cache)."""
    if key not in _SLICE_CACHE:
        if len(_SLICE_CACHE) >= 256:
            _SLICE_CACHE.clear()
        _SLICE_CACHE[key] = jax.jit(jax_core.jaxpr_as_fun(_closed(program, [])))
    return _SLICE_CACHE[key]


def _tpu_mesh(device_kind: str, platform: str = "tpu", num_cores: int = 1) -> Any:
    """An abstract one-device mesh of ``device_kind``: what code that asks for the TPU it
    targets (``pltpu.get_tpu_info()``, ``emit_pipeline``'s tiling, a TensorCore mesh built
    without ``num_cores``: ``num_cores`` cores) reads while it is traced.
    ``platform="gpu"`` makes the device a GPU of that kind instead (``num_cores``: its SMs)."""
    from jax._src import mesh as mesh_lib

    device = mesh_lib.AbstractDevice(device_kind, num_cores, platform)
    # An Auto axis, so traced values carry no sharding on this mesh: the program's slices
    # then compile and run on this host's own devices.
    return jax.sharding.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                                     abstract_device=device)


def on_abstract_tpu(device_kind: str) -> Any:
    """A context in which code that asks for its TPU (``pltpu.get_tpu_info()``, a TensorCore
    mesh without ``num_cores``) is told ``device_kind``, on any host."""
    return jax.sharding.use_abstract_mesh(_tpu_mesh(device_kind))


def typed_ndarray_type() -> type | None:
    """The ndarray subclass JAX keeps a literal's JAX type in (``jax._src.literals.TypedNdArray``,
    new in jax 0.12); None in a release without it. A pickle of one as a plain ndarray loses
    that type, so code that sends a jaxpr across processes must reduce it itself."""
    try:
        from jax._src.literals import TypedNdArray
    except ImportError:
        return None
    return TypedNdArray


def on_abstract_gpu(device_kind: str, num_cores: int) -> Any:
    """A context in which code that asks for its GPU (JAX's bundled Mosaic GPU ops read the SM
    count, ``num_cores``) is told ``device_kind``, on any host: to lower them from a CPU."""
    return jax.sharding.use_abstract_mesh(_tpu_mesh(device_kind, "gpu", num_cores))


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
    finder.walk(_open(closed), _consts(closed), flat, (False,) * len(_open(closed).outvars))
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
    outs = finder.walk(_open(closed), _consts(closed), flat, (True,) * len(_open(closed).outvars))
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


def execute(args: tuple, params: dict[str, Any], interpret: Any) -> list[jax.Array]:
    """Run the captured call, with ``interpret`` replacing its interpret setting when not None.

    A ``pl.kernel`` runs as itself (its ``mpmd_map``), not as the pallas_call that models it.
    """
    if isinstance(params, MeshKernelParams):
        own = params.mpmd_params
        return _ORIGINAL_MESH_IMPL(*args, **(own if interpret is None
                                             else {**own, "interpret": interpret}))
    if interpret is not None:
        params = {**params, "interpret": interpret}
    return _ORIGINAL_IMPL(*args, **params)


def in_row_major_order(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every grid axis "arbitrary".

    TPU interpret mode visits the coordinates of "parallel" axes in a random permutation (to
    expose order-dependent kernels); a single TensorCore runs them in row-major order, which is
    the order kernelsim models. Marking them arbitrary makes the interpreter use that order.
    (A ``pl.kernel`` takes no dimension semantics: it runs as it is.)
    """
    cp = params.get("compiler_params")
    if isinstance(params, MeshKernelParams):
        return params
    if getattr(cp, "dimension_semantics", None) is None:
        return params
    return {**params, "compiler_params": dataclasses.replace(cp, dimension_semantics=None)}


def uses_manual_dma(params: dict[str, Any]) -> bool:
    """The kernel keeps operands in HBM/ANY or has semaphores: it needs the TPU interpreter."""
    gm = params["grid_mapping"]
    spaces = [_memory_space(bm.transformed_block_aval) for bm in gm.block_mappings]
    spaces += [_memory_space(a) for a in gm.scratch_avals]
    return any(s in ("any", "hbm", "semaphore") for s in spaces)


def requested_interpret(params: dict[str, Any]) -> Any:
    """What the kernel author passed as ``interpret=`` (False when compiling)."""
    return params["interpret"]


# ---------------------------------------------------------------------------------------------
# From params to the model


def _memory_space(aval: Any) -> MemorySpace:
    space = getattr(aval, "memory_space", None)
    if space is None:
        return "semaphore" if "sem" in type(aval).__name__.lower() else "vmem"
    value = getattr(space, "value", str(space))
    if value not in _MEMORY_SPACES:
        raise TraceError(f"unsupported memory space {space!r}")
    return _MEMORY_SPACES[value]


def _block_dims(call_name: str, origin: str, block_shape: tuple) -> tuple[BlockDim, ...]:
    dims = []
    for b in block_shape:
        if isinstance(b, pallas_core.Blocked):
            dims.append(BlockDim("blocked", int(b.block_size)))
        elif isinstance(b, pallas_core.Squeezed):
            dims.append(BlockDim("squeezed", 1))
        elif isinstance(b, pallas_core.Element):
            dims.append(BlockDim("element", int(b.block_size), tuple(map(int, b.padding))))
        else:
            raise TraceError(
                f"pallas_call {call_name!r}, operand {origin}: block dimension kind "
                f"{type(b).__name__} is not supported by kernelsim (supported: Blocked, "
                "Element, Squeezed/None)."
            )
    return tuple(dims)


def _dimension_semantics(params: dict[str, Any], ndim: int) -> tuple[str, ...]:
    """One semantics per grid axis, as the TPU lowering sets them (mosaic/lowering.py,
    ``MosaicGridMapping``): the user's (default "arbitrary") for the kernel's own axes, in
    order, and "parallel" for every axis ``vmap`` added (``GridMapping.vmapped_dims``)."""
    semantics = getattr(params.get("compiler_params"), "dimension_semantics", None)
    vmapped = set(params["grid_mapping"].vmapped_dims)
    own = (("arbitrary",) * (ndim - len(vmapped)) if semantics is None
           else tuple(getattr(s, "value", str(s)).lower() for s in semantics))
    it = iter(own)
    return tuple("parallel" if i in vmapped else next(it, "arbitrary") for i in range(ndim))


def _call_name(params: dict[str, Any]) -> str:
    if params.get("name"):
        return str(params["name"])
    info = params["jaxpr"].debug_info
    src = getattr(info, "func_src_info", None) or "kernel"
    return src.split(" at ")[0]


class _NotScalar(Exception):
    """The index map does more than scalar integer arithmetic and prefetch reads."""


# Ops whose scalar form is the identity on a value batched over grid steps.
_SCALAR_IDENTITY = frozenset({"squeeze", "reshape", "broadcast_in_dim", "convert_element_type"})


def _scalar_program(jaxpr: Any, args: list[np.ndarray],
                    grid: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Evaluate an index map over every grid step at once with numpy (no compilation).

    Each grid index is an int32 array over the steps; prefetch refs are their arrays. Only
    scalar arithmetic (``_lax_numpy``'s elementwise rules, XLA's semantics), prefetch reads
    with integer indices and nested calls are understood; anything else raises ``_NotScalar``
    and the caller evaluates the map with JAX instead. ``grid``: the extents
    ``pl.num_programs`` reads.
    """
    j = _open(jaxpr)
    env: dict[Any, Any] = dict(zip(j.constvars, _consts(jaxpr), strict=True))
    env.update(zip(j.invars, args, strict=True))

    def read(v: Any) -> Any:
        return _literal(v) if isinstance(v, jax_core.Literal) else env[v]

    for eqn in j.eqns:
        name, p = eqn.primitive.name, eqn.params
        vals = [read(v) for v in eqn.invars]
        body = _call_body(eqn)
        if body is not None:
            outs = _scalar_program(body, vals, grid)
        elif name == "num_programs" and p["axis"] < len(grid):
            outs = [np.int32(grid[p["axis"]])]
        elif name == "get":
            indexer = jax.tree_util.tree_unflatten(p["tree"], vals[1:])
            index = [ix for t in indexer for ix in t.indices]
            if len(indexer) != 1 or any(isinstance(ix, indexing.Slice) for ix in index):
                raise _NotScalar(name)
            ref = vals[0]  # XLA clamps a dynamic index into range; so does this
            outs = [ref[tuple(np.clip(np.asarray(ix), 0, n - 1)
                              for ix, n in zip(index, ref.shape, strict=False))]]
        elif any(getattr(v.aval, "shape", ()) != () for v in eqn.outvars):
            raise _NotScalar(name)
        elif name in _SCALAR_IDENTITY and name != "convert_element_type":
            outs = vals
        else:
            # Elementwise rules broadcast, so one call covers every grid step at once.
            try:
                if name not in _lax_numpy.ELEMENTWISE:
                    raise _lax_numpy.Unsupported(name)
                outs = _lax_numpy.apply(name, [np.asarray(x) for x in vals], p,
                                        [v.aval for v in eqn.outvars], check_shapes=False)
            except _lax_numpy.Unsupported as e:
                raise _NotScalar(name) from e
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in j.outvars]


def _literal(v: Any) -> np.ndarray:
    """A jaxpr literal as a numpy value of its own dtype (a Python int literal stays int32)."""
    try:
        return np.asarray(v.val, dtype=np.dtype(v.aval.dtype))
    except TypeError:  # an extended dtype: keep the value as JAX made it
        return v.val


def _evaluate(bm: Any, grid: tuple[int, ...], grid_points: np.ndarray,
              prefetch: list[np.ndarray]) -> np.ndarray:
    """The index map of ``bm`` at every grid point: int64 [steps, ndim]."""
    ndim = len(bm.block_shape)
    nsteps = grid_points.shape[0]
    outvars = _open(bm.index_map_jaxpr).outvars[:ndim]
    if all(isinstance(v, jax_core.Literal) for v in outvars):  # constant map: no compile
        row = np.array([int(v.val) for v in outvars], dtype=np.int64)
        return np.broadcast_to(row, (nsteps, ndim)).copy()
    cols = [grid_points[:, i].astype(np.int32) for i in range(grid_points.shape[1])]
    try:
        out = _scalar_program(bm.index_map_jaxpr, cols + list(prefetch), grid)[:ndim]
    except _NotScalar:
        out = _evaluate_with_jax(bm.index_map_jaxpr, ndim, cols, prefetch)
    return np.stack([np.broadcast_to(np.asarray(o, np.int64), (nsteps,)) for o in out], axis=1)


def _evaluate_with_jax(index_map: Any, ndim: int, cols: list[np.ndarray],
                       prefetch: list[np.ndarray]) -> list[np.ndarray]:
    """The index map's first ``ndim`` outputs at every step, evaluated by JAX (eager vmap)."""
    # SMEM prefetch refs become plain array arguments once the map's state is discharged.
    fun = jax_core.jaxpr_as_fun(discharge_state(index_map))

    def at(*xs):
        return fun(*xs)[:ndim]

    in_axes = (0,) * len(cols) + (None,) * len(prefetch)
    # Eager vmap: each primitive runs once over the whole grid, and JAX caches its executable
    # by shape, so repeated traces cost no compilation (jit would recompile every fresh map).
    out = jax.vmap(at, in_axes=in_axes)(*[jnp.asarray(c) for c in cols], *prefetch)
    return [np.asarray(o) for o in out]


def _itemsize(dtype: Any) -> int:
    """Bytes per element; 0 for semaphores and other dtypes that hold no data."""
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 0


def _operand_names(params: dict[str, Any]) -> list[str]:
    """The kernel's parameter names (prefetch, inputs, outputs, scratch), or positional names
    (``in0``, ``out0``, ...) when JAX did not record them (e.g. a call made by ``jax.jvp``)."""
    gm = params["grid_mapping"]
    nprefetch, nin, nout = gm.num_index_operands, gm.num_inputs, gm.num_outputs
    nscratch = len(gm.scratch_avals)
    arg_names = params["jaxpr"].debug_info.arg_names
    if arg_names and len(arg_names) == nprefetch + nin + nout + nscratch:
        return list(arg_names)
    return ([f"prefetch{i}" for i in range(nprefetch)] + [f"in{i}" for i in range(nin)]
            + [f"out{i}" for i in range(nout)] + [f"scratch{i}" for i in range(nscratch)])


def with_operand_names(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` whose kernel jaxpr carries the operand names kernelsim uses, so the TPU
    interpreter reports its copies under the same names (it says "unknown" otherwise)."""
    if isinstance(params, MeshKernelParams):  # runs as its mpmd_map, whose jaxpr is the same
        return params
    jaxpr = params["jaxpr"]
    names = tuple(_operand_names(params))
    if tuple(jaxpr.debug_info.arg_names or ()) == names:
        return params
    info = jaxpr.debug_info._replace(arg_names=names)
    return {**params, "jaxpr": jaxpr.replace(debug_info=info)}


def _scoped_peak(jaxpr: Any) -> dict[str, int]:
    """Per on-chip memory space, the most bytes ``pl.run_scoped`` allocations in ``jaxpr``
    hold at once: nested scopes add up, sequential ones and branches take the larger."""
    peak: dict[str, int] = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "run_scoped":
            inner = _open(eqn.params["jaxpr"])
            here = dict(_scoped_peak(inner))
            for v in inner.invars:
                space = _memory_space(v.aval)
                if space in ("vmem", "smem"):
                    here[space] = here.get(space, 0) + _ref_array(v.aval).nbytes
        else:
            here = {}
            for sub, _ in _sub_jaxprs(eqn):
                for space, n in _scoped_peak(sub).items():
                    here[space] = max(here.get(space, 0), n)
        for space, n in here.items():
            peak[space] = max(peak.get(space, 0), n)
    return peak


def _temporaries_peak(jaxpr: Any) -> int:
    """The most bytes of array values (not refs, not scalars) the kernel body holds at once:
    each value lives from the eqn that makes it to its last use; a loop or branch adds its
    own body's peak while it runs. What Mosaic cannot keep in vector registers it places in
    VMEM beside the pipeline's buffers, so this bounds that extra VMEM from above."""
    eqns = jaxpr.eqns
    last: dict[Any, int] = {}
    for k, eqn in enumerate(eqns):
        for v in eqn.invars:
            if not isinstance(v, jax_core.Literal):
                last[v] = k
    for v in jaxpr.outvars:
        if not isinstance(v, jax_core.Literal):
            last[v] = len(eqns)

    def nbytes(v: Any) -> int:
        aval = v.aval
        if isinstance(aval, state_types.AbstractRef) or not getattr(aval, "shape", ()):
            return 0
        return int(np.prod(aval.shape, dtype=np.int64)) * _itemsize(aval.dtype)

    live: dict[Any, int] = {v: nbytes(v) for v in jaxpr.invars if v in last}
    peak = sum(live.values())
    for k, eqn in enumerate(eqns):
        inner = max((_temporaries_peak(j) for j, _ in _sub_jaxprs(eqn)), default=0)
        for v in eqn.outvars:
            if v in last:
                live[v] = nbytes(v)
        peak = max(peak, sum(live.values()) + inner)
        for v in [v for v in live if last[v] <= k]:
            del live[v]
    return peak


def _used_vars(jaxpr: Any) -> set:
    """The vars some eqn of ``jaxpr`` takes as an operand, or that it returns."""
    used = {v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal)}
    for eqn in jaxpr.eqns:
        used.update(v for v in eqn.invars if not isinstance(v, jax_core.Literal))
    return used


def _window_moves(bm: Any, grid: tuple[int, ...]) -> bool:
    """The index map of ``bm`` may return different blocks over ``grid``: one of its outputs
    depends on a grid index of extent > 1, or on a scalar-prefetch ref (whose entries may
    differ), as far as the jaxpr's data flow shows."""
    j = _open(bm.index_map_jaxpr)
    deps: dict[Any, set[int]] = {v: {i} for i, v in enumerate(j.invars)}
    for eqn in j.eqns:
        used = set().union(*(deps.get(v, set()) for v in eqn.invars
                             if not isinstance(v, jax_core.Literal)))
        if eqn.primitive.name == "num_programs":  # reads an extent, not an index
            used = set()
        for v in eqn.outvars:
            deps[v] = used
    reached = set().union(*(deps.get(v, set()) for v in j.outvars[:len(bm.block_shape)]
                            if not isinstance(v, jax_core.Literal)))
    return any(i >= len(grid) or grid[i] > 1 for i in reached)


def _concrete_grid(name: str, gm: Any, leading: tuple) -> tuple[int, ...]:
    """The grid with each dynamic bound read from its operand (the last ``leading`` ones)."""
    bounds = iter(leading[len(leading) - gm.num_dynamic_grid_bounds:])
    grid = []
    for g in gm.grid:
        if isinstance(g, pallas_core.DynamicGridDim):
            value = np.asarray(next(bounds)).reshape(-1)
            grid.append(int(value[0]))
        elif isinstance(g, (int, np.integer)):
            grid.append(int(g))
        else:
            raise TraceError(f"pallas_call {name!r}: grid dimension {g!r} is neither an int "
                             "nor a dynamic bound kernelsim can read")
    return tuple(grid)


def to_model(args: tuple, params: dict[str, Any]) -> KernelCall:
    """The model of one captured call (index maps evaluated over the whole grid)."""
    gm = params["grid_mapping"]
    name = _call_name(params)
    nprefetch, nin, nout = gm.num_index_operands, gm.num_inputs, gm.num_outputs
    grid = _concrete_grid(name, gm, args[:len(args) - nprefetch - nin])
    names = _operand_names(params)
    operand_args = args[len(args) - nprefetch - nin:]
    prefetch_vals = [np.asarray(a) for a in operand_args[:nprefetch]]
    call = KernelCall(name, grid, _dimension_semantics(params, len(grid)), [])
    call.flops_per_step, call.matmul_dtypes = count_flops(params["jaxpr"])
    scoped = _scoped_peak(_open(params["jaxpr"]))
    call.scoped_vmem_bytes, call.scoped_smem_bytes = scoped.get("vmem", 0), scoped.get("smem", 0)
    kernel = _open(params["jaxpr"])
    call.referenced = frozenset(n for n, v in zip(names, kernel.invars, strict=False)
                                if v in _used_vars(kernel))
    call.temporaries_vmem_bytes = _temporaries_peak(kernel)
    limit = getattr(params.get("compiler_params"), "vmem_limit_bytes", None)
    call.vmem_limit_bytes = None if limit is None else int(limit)
    # input_output_aliases index the inputs after the scalar prefetch operands
    # (jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py, ``oi_alias_map``)
    call.aliases = {names[nprefetch + nin + o]: names[i]
                    for i, o in params.get("input_output_aliases", ())}
    ce = params.get("cost_estimate")
    if ce is not None:
        call.cost_estimate_flops = int(ce.flops)
        call.cost_estimate_bytes = int(ce.bytes_accessed)
    for i, val in enumerate(prefetch_vals):
        call.operands.append(Operand(names[i], "scalar_prefetch", tuple(val.shape),
                                     str(val.dtype), val.dtype.itemsize, "smem", value=val))
    points = call.grid_indices()
    for k, bm in enumerate(gm.block_mappings):
        role = "input" if k < nin else "output"
        aval = bm.array_aval
        dims = _block_dims(name, bm.origin, bm.block_shape)
        space = _memory_space(bm.transformed_block_aval)
        buffers = bm.pipeline_mode.buffer_count if bm.pipeline_mode is not None else 2
        if not isinstance(buffers, int):  # jax >= 0.12: (in, out) pairs, emit_pipeline only
            raise TraceError(
                f"pallas_call {name!r}, operand {bm.origin}: pl.Buffered({buffers!r}) is an "
                "(input, output) pair, which only emit_pipeline accepts; a pallas_call "
                "BlockSpec takes one int buffer count.")
        revisit = getattr(getattr(bm.pipeline_mode, "revisit", None), "value", None)
        if revisit == "any" and buffers > 1:
            # jax/_src/pallas/mosaic/lowering.py raises this LoweringException for such a block
            call.notes.append(
                f"operand {bm.origin}: RevisitMode.ANY is not supported with double buffering "
                f"(pl.Buffered({buffers}, revisit=...)); Mosaic's lowering rejects it: use "
                "pl.Buffered(1, revisit=pl.RevisitMode.ANY).")
        trivial = bool(bm.has_trivial_window())
        # Mosaic forces single buffering for a trivial window in VMEM, whatever the BlockSpec
        # asked (jax/_src/pallas/mosaic/lowering.py, "Force single-buffering pipelining for
        # trivial windowing in VMEM"). A block with no pipeline mode whose index map reads no
        # grid index of extent > 1 loads one window, and Mosaic's compiler single-buffers it
        # too: JAX's test_automatic_single_buffering (tests/pallas/tpu_pallas_test.py) compiles
        # such 10 MiB blocks where two 10 MiB buffers exceed the scoped VMEM limit. Any other
        # block keeps its buffer count.
        if space == "vmem" and (trivial or (bm.pipeline_mode is None
                                            and not _window_moves(bm, grid))):
            buffers = 1
        call.operands.append(Operand(
            names[nprefetch + k], role, tuple(aval.shape), str(aval.dtype),
            _itemsize(aval.dtype), space, dims, int(buffers),
            _evaluate(bm, grid, points, prefetch_vals), trivial_window=trivial,
            revisit_any=revisit == "any" and role == "output"))
    for j, aval in enumerate(gm.scratch_avals):
        space = _memory_space(aval)
        inner = getattr(aval, "inner_aval", aval)
        shape = tuple(getattr(inner, "shape", ()))
        dtype = getattr(inner, "dtype", None)
        itemsize = _itemsize(dtype) if space != "semaphore" else 0
        call.operands.append(Operand(names[nprefetch + nin + nout + j], "scratch", shape,
                                     str(dtype) if itemsize else "semaphore", itemsize, space))
    return call


# ---------------------------------------------------------------------------------------------
# FLOPs from the kernel jaxpr

_DATA_MOVEMENT = frozenset({
    "get", "swap", "program_id", "num_programs", "broadcast_in_dim", "reshape", "squeeze",
    "expand_dims", "transpose", "convert_element_type", "iota", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p", "select_n", "rev",
    "bitcast_convert_type", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
    "semaphore_read", "gather", "scatter", "device_id", "load", "store", "masked_load",
    "masked_swap", "multiple_of", "pjit_dce", "optimization_barrier", "stop_gradient",
})


def _sub_jaxprs(eqn: Any) -> list[tuple[Any, int]]:
    """(jaxpr, repetitions) pairs nested in ``eqn``'s params."""
    p = eqn.params
    name = eqn.primitive.name
    if name == "scan":
        return [(_open(p["jaxpr"]), int(p["length"]))]
    if name == "cond":
        return [(_open(b), 1) for b in p["branches"]]
    if name == "while":
        return [(_open(p["body_jaxpr"]), 1)]
    found = []
    for v in p.values():
        for item in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(item, _JAXPR_TYPES):
                found.append((_open(item), 1))
    return found


def count_flops(jaxpr: Any) -> tuple[int, tuple[str, ...]]:
    """FLOPs of one kernel invocation and the input dtypes of its matmuls.

    dot_general: 2 x output elements x contracted size; other arithmetic: one FLOP per output
    element (reductions: per input element); data movement is free. ``cond`` counts its most
    expensive branch, ``scan`` its body times its length, ``while`` one iteration.
    """
    flops = 0
    dtypes: list[str] = []
    for eqn in _open(jaxpr).eqns:
        name = eqn.primitive.name
        subs = _sub_jaxprs(eqn)
        if name == "cond":
            counted = [count_flops(j) for j, _ in subs]
            flops += max((c[0] for c in counted), default=0)
            dtypes += [d for c in counted for d in c[1]]
            continue
        if subs:
            for j, reps in subs:
                f, d = count_flops(j)
                flops += f * reps
                dtypes += d
            continue
        if name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            k = int(np.prod([lhs.shape[a] for a in lhs_contract], dtype=np.int64))
            out = eqn.outvars[0].aval
            flops += 2 * int(np.prod(out.shape, dtype=np.int64)) * k
            dtypes.append(str(lhs.dtype))
        elif name in _DATA_MOVEMENT:
            continue
        elif name.startswith("reduce_") or name in ("argmax", "argmin", "cumsum", "cumprod",
                                                    "cummax", "cumlogsumexp"):
            flops += int(np.prod(getattr(eqn.invars[0].aval, "shape", ()), dtype=np.int64))
        else:
            for v in eqn.outvars:
                shape = getattr(v.aval, "shape", None)
                if shape is not None and hasattr(v.aval, "dtype"):
                    flops += int(np.prod(shape, dtype=np.int64))
    return flops, tuple(dtypes)


# ---------------------------------------------------------------------------------------------
# What the real TPU lowering says, on any machine


def tpu_lowering_error(fn: Callable, args: tuple, device_kind: str) -> str | None:
    """The error JAX's Mosaic TPU lowering raises for ``fn(*args)``, or None if it lowers.

    Runs JAX's own lowering for platform "tpu" (``jax.export``) under an abstract mesh whose
    device is ``device_kind`` (e.g. "TPU v5e"), so rules that depend on the chip apply; no TPU
    is needed and nothing executes. Compiling (Mosaic's own passes) is not part of this.
    """
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    try:
        with jax.sharding.use_abstract_mesh(_tpu_mesh(device_kind)):
            jax.export.export(jax.jit(fn), platforms=["tpu"])(*shapes)
    except Exception as err:  # noqa: BLE001 - every lowering failure is the answer
        return f"{type(err).__name__}: {err}"
    return None


def gpu_lowering_error(fn: Callable, args: tuple, device_kind: str) -> str | None:
    """The error JAX's GPU lowering of ``pallas_call`` (Triton) raises for ``fn(*args)``, or
    None if it lowers.

    Lowers for platform "cuda" under an abstract mesh whose device is the GPU ``device_kind``
    (e.g. "NVIDIA H100 80GB HBM3"); no GPU is needed and nothing executes. Triton's own
    compilation to PTX happens later, on a GPU, and is not part of this.
    """
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    # jax <= 0.10 lowers a pallas_call without compiler params to Mosaic GPU unless this flag
    # is off (and Mosaic GPU needs a GPU jaxlib); from 0.11 pallas_call on GPU is Triton only.
    use_mosaic_gpu = getattr(jax_config, "jax_pallas_use_mosaic_gpu", None)
    try:
        with (jax.sharding.use_abstract_mesh(_tpu_mesh(device_kind, "gpu")),
              use_mosaic_gpu(False) if use_mosaic_gpu is not None else contextlib.nullcontext()):
            jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    except Exception as err:  # noqa: BLE001 - every lowering failure is the answer
        return f"{type(err).__name__}: {err}"
    return None


# ---------------------------------------------------------------------------------------------
# The DMAs TPU interpret mode performs


@dataclass(frozen=True)
class InterpretCopy:
    """One pipeline copy the TPU interpreter made: ``kind`` is "fetch" or "writeback"."""

    call: int
    operand: str
    kind: str
    block_index: tuple[int, ...]
    grid_index: tuple[int, ...]
    bytes: int
    device: int = 0


@dataclass(frozen=True)
class InterpretDma:
    """One DMA the kernel body started, as the TPU interpreter executed it: from the memory
    of device ``src_device`` into that of ``dst_device`` (the interpreter's device ids)."""

    call: int
    src_space: MemorySpace
    dst_space: MemorySpace
    bytes: int
    src_device: int = 0
    dst_device: int = 0


def _interpret_space(index: int) -> MemorySpace:
    return _MEMORY_SPACES[tpu_interpret.TPU_MEMORY_SPACE_NAMES[int(index)]]


@contextlib.contextmanager
def recording_interpret_copies(sink: list[InterpretCopy], call_index: Callable[[], int],
                               dmas: list[InterpretDma] | None = None):
    """Record every pipeline copy of TPU interpret mode into ``sink`` while the block runs,
    and every DMA a kernel body starts into ``dmas``.

    The interpreter's ``get``/``store`` callbacks carry ``input_name``/``output_name`` only for
    the pipeline's own HBM<->VMEM copies, so kernel-body accesses are not counted there; body
    DMAs are seen where the interpreter writes their data (``DMA.execute_write``).
    """
    orig_get, orig_store = tpu_interpret.get, tpu_interpret.store
    orig_write = tpu_interpret.DMA.execute_write

    @functools.wraps(orig_write)
    def execute_write(dma):
        if dmas is not None and dma.data is not None:
            dmas.append(InterpretDma(call_index(), _interpret_space(dma.src_memory_space),
                                     _interpret_space(dma.dst_memory_space), dma.data_size,
                                     int(dma.src_device_id), int(dma.dst_device_id)))
        return orig_write(dma)

    @functools.wraps(orig_get)
    def get(*args, input_name=None, **kw):
        token, val = orig_get(*args, input_name=input_name, **kw)
        if input_name is not None:
            sink.append(InterpretCopy(call_index(), input_name, "fetch",
                                      tuple(int(x) for x in args[6]),
                                      tuple(int(x) for x in args[7]), np.asarray(val).nbytes,
                                      int(args[1])))
        return token, val

    @functools.wraps(orig_store)
    def store(*args, output_name=None, **kw):
        out = orig_store(*args, output_name=output_name, **kw)
        if output_name is not None:
            sink.append(InterpretCopy(call_index(), output_name, "writeback",
                                      tuple(int(x) for x in args[7]),
                                      tuple(int(x) for x in args[8]), np.asarray(args[6]).nbytes,
                                      int(args[1])))
        return out

    tpu_interpret.get, tpu_interpret.store = get, store
    tpu_interpret.DMA.execute_write = execute_write
    try:
        yield
    finally:
        tpu_interpret.get, tpu_interpret.store = orig_get, orig_store
        tpu_interpret.DMA.execute_write = orig_write
        pltpu.reset_tpu_interpret_mode_state()


# ---------------------------------------------------------------------------------------------
# Which scalar-prefetch entries the index maps read, and what the kernel body reads and writes


class Selection(NamedTuple):
    """What a chain of ref transforms selects of a ref.

    ids: flat indices of the ref's elements, shaped as the view (plus a trailing axis of the
    ref elements one view element packs, after a bitcast to a wider dtype; a narrower one
    repeats each ref element once per view element it holds); box: per dimension ``(start,
    size, stride)`` when the selection is one strided box of the ref, else None; nbytes: the
    bytes the view holds; exact: the view's elements are the ref's own (no bitcast between).
    """

    ids: np.ndarray
    box: tuple | None
    nbytes: int
    exact: bool


def _select(shape: tuple[int, ...], transforms: tuple, itemsize: int = 1) -> Selection:
    """What a chain of ``ref.at[...]`` indexers, ``ref.reshape`` and ``ref.bitcast`` views
    selects of a ref of ``shape`` whose elements are ``itemsize`` bytes.

    The box is only given for a single indexer of slices and integers (or no transform). The
    work is proportional to the selection, not to the ref: slices and integers narrow one
    coordinate vector per dimension of the ref; a gather, reshape or bitcast makes the indices
    of the region selected so far explicit.
    """
    shape = tuple(int(n) for n in shape)
    if not transforms:  # ref[...]: the whole ref
        ids = _flat_ids(shape, [np.arange(n, dtype=np.int64) for n in shape])
        return Selection(ids, tuple((0, n, 1) for n in shape), ids.size * itemsize, True)
    box: list | None = [] if len(transforms) == 1 else None
    coords: list[Any] = [np.arange(n, dtype=np.int64) for n in shape]  # int: a dropped dim
    ids: np.ndarray | None = None  # explicit indices, once a view made them necessary
    pack, view_itemsize = 1, itemsize  # ref elements per view element; bytes per one
    for t in transforms:
        if isinstance(t, (state_types.ReshapeTransform, state_types.BitcastTransform)):
            ids = _flat_ids(shape, coords) if ids is None else ids
            box = None
            if isinstance(t, state_types.ReshapeTransform):
                ids = ids.reshape(tuple(t.shape) + ((pack,) if pack > 1 else ()))
                continue
            ids, pack, view_itemsize = _bitcast_view(ids, pack, view_itemsize,
                                                     np.dtype(t.dtype).itemsize)
            continue
        if not isinstance(t, indexing.NDIndexer):
            raise TraceError(f"kernelsim follows ref indexing, reshape and bitcast, not "
                             f"{type(t).__name__}")
        index = []
        for ix in t.indices:
            if isinstance(ix, indexing.Slice):
                start, size, stride = int(ix.start), int(ix.size), int(ix.stride)
                index.append(slice(start, start + size * stride, stride))
                if box is not None:
                    box.append((start, size, stride))
            else:
                value = np.asarray(ix, dtype=np.int64)
                index.append(value)
                if box is not None and value.ndim == 0:
                    box.append((int(value), 1, 1))
                elif box is not None:
                    box = None
        if ids is None and all(not isinstance(i, np.ndarray) or i.ndim == 0 for i in index):
            view = [d for d, c in enumerate(coords) if not isinstance(c, int)]
            for d, i in zip(view, index, strict=False):
                coords[d] = coords[d][i] if isinstance(i, slice) else int(coords[d][int(i)])
            continue
        if ids is None:
            ids = _flat_ids(shape, coords)
        ids = ids[tuple(index)]
    if box is not None and len(box) != len(shape):
        box = None
    ids = _flat_ids(shape, coords) if ids is None else ids
    return Selection(ids, None if box is None else tuple(box),
                     ids.size // pack * view_itemsize, view_itemsize == itemsize)


def _bitcast_view(ids: np.ndarray, pack: int, itemsize: int, new_itemsize: int
                  ) -> tuple[np.ndarray, int, int]:
    """``ids`` (a view packing ``pack`` ref elements each, of ``itemsize`` bytes) seen as
    ``new_itemsize``-byte elements, as a TPU ref bitcast does: the second-minor dimension
    shrinks or grows by the ratio (jax/_src/state/utils.py, ``bitcast``)."""
    view = ids.shape[:-1] if pack > 1 else ids.shape
    if len(view) < 2 and new_itemsize != itemsize:
        raise TraceError("a bitcast that changes the element size of a 1-D ref")
    if new_itemsize > itemsize:  # r rows of the old view make one row of the new one
        r = new_itemsize // itemsize
        n, m = view[-2], view[-1]
        lead = view[:-2]
        tail = (pack,) if pack > 1 else ()
        grouped = ids.reshape(lead + (n // r, r, m) + tail)
        grouped = np.moveaxis(grouped, len(lead) + 1, -1 if not tail else -2)
        return grouped.reshape(lead + (n // r, m, r * pack)), r * pack, new_itemsize
    if new_itemsize < itemsize:  # each old row makes k rows of the new view
        k = itemsize // new_itemsize
        if pack > 1 and pack % k == 0:
            lead, n, m = view[:-2], view[-2], view[-1]
            split = ids.reshape(lead + (n, m, k, pack // k))
            split = np.moveaxis(split, -2, len(lead) + 1)
            new_pack = pack // k
            out = split.reshape(lead + (n * k, m) + ((new_pack,) if new_pack > 1 else ()))
            return out, new_pack, new_itemsize
        if pack > 1:
            raise TraceError("a bitcast kernelsim cannot follow (it splits packed elements)")
        return np.repeat(ids, k, axis=-2), 1, new_itemsize
    return ids, pack, itemsize


def _flat_ids(shape: tuple[int, ...], coords: list[Any]) -> np.ndarray:
    """Row-major flat indices of the open grid ``coords`` (per dimension of ``shape``: an
    int for a dropped dimension, else a vector of coordinates), shaped as the grid."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    view = [k for k, c in enumerate(coords) if not isinstance(c, int)]
    offset = sum(c * strides[k] for k, c in enumerate(coords) if isinstance(c, int))
    ids = np.full(tuple(len(coords[k]) for k in view), offset, np.int64)
    for j, k in enumerate(view):
        axis = [1] * len(view)
        axis[j] = -1
        ids += (coords[k] * strides[k]).reshape(axis)
    return ids


def prefetch_reads(params: dict[str, Any], call: KernelCall) -> dict[str, Any]:
    """Per scalar-prefetch operand, the entries the index maps read at every grid step.

    Only ``ref[...]`` reads at the top level of an index map are seen (nested ``cond``/loops
    inside an index map are not); returns ``{name: access.PrefetchReads}``.
    """
    from kernelsim.access import PrefetchReads

    gm = params["grid_mapping"]
    prefetch = [o for o in call.operands if o.role == "scalar_prefetch"]
    if not prefetch:
        return {}
    points = call.grid_indices()
    ngrid = points.shape[1]
    values = [np.asarray(o.value) for o in prefetch]
    rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {i: [] for i in range(len(prefetch))}
    for bm in gm.block_mappings:
        closed = bm.index_map_jaxpr
        jaxpr = _open(closed)
        refs = {v: i for i, v in enumerate(jaxpr.invars[ngrid:])}
        gets = [e for e in jaxpr.eqns if e.primitive.name == "get" and e.invars[0] in refs]
        if not gets:
            continue
        leaves = [v for e in gets for v in e.invars[1:]]
        info = jaxpr.debug_info
        probe = jaxpr.replace(outvars=leaves, debug_info=info._replace(result_paths=None)
                              if info is not None else None) if leaves else None
        if probe is not None:
            probe = _closed(probe, _consts(closed))
            cols = [points[:, i].astype(np.int32) for i in range(ngrid)]
            try:
                leaf_vals = [np.broadcast_to(np.asarray(v), (points.shape[0],))
                             for v in _scalar_program(probe, cols + values, call.grid)]
            except _NotScalar:
                leaf_vals = _evaluate_with_jax(probe, len(leaves), cols, values)
        at = 0
        for e in gets:
            which = refs[e.invars[0]]
            n = len(e.invars) - 1
            mine, at = leaf_vals[at:at + n] if n else [], at + n
            shape = tuple(prefetch[which].shape)
            for step in range(points.shape[0]):
                transforms = jax.tree_util.tree_unflatten(e.params["tree"],
                                                          [v[step] for v in mine])
                ids = _select(shape, transforms).ids
                flat = np.unique(ids.reshape(-1))
                rows[which].append((np.full(flat.shape, step, np.int64), flat))
    out = {}
    for i, op in enumerate(prefetch):
        steps = np.concatenate([r[0] for r in rows[i]]) if rows[i] else np.zeros(0, np.int64)
        flat = np.concatenate([r[1] for r in rows[i]]) if rows[i] else np.zeros(0, np.int64)
        out[op.name] = PrefetchReads(op.name, tuple(op.shape), steps, flat)
    return out


class _Ref:
    """A ref while the body is interpreted: its name, memory space and contents (numpy)."""

    __slots__ = ("name", "space", "data")

    def __init__(self, name: str, space: MemorySpace, data: np.ndarray):
        self.name, self.space, self.data = name, space, data


def _ref_array(aval: Any) -> np.ndarray:
    inner = getattr(aval, "inner_aval", aval)
    shape = tuple(getattr(inner, "shape", ()))
    dtype = getattr(inner, "dtype", None)
    try:
        return np.zeros(shape, np.dtype(dtype))
    except TypeError:  # semaphores and other non-numeric refs
        return np.zeros(shape, np.int32)


_IDENTITY = ("multiple_of", "pjit_dce", "optimization_barrier")
# Effects on semaphores other than DMA waits: no data moves, nothing to record.
_IGNORED = ("debug_callback", "debug_print", "semaphore_signal", "semaphore_wait")
_REF_EFFECTS = ("get", "swap", "addupdate", "masked_load", "masked_swap", "dma_start",
                "dma_wait", "run_scoped")


def _has_body_dma(jaxpr: Any) -> bool:
    """The kernel jaxpr starts a DMA somewhere (nested loops and branches included)."""
    return any(eqn.primitive.name == "dma_start" or
               any(_has_body_dma(j) for j, _ in _sub_jaxprs(eqn)) for eqn in _open(jaxpr).eqns)


@functools.lru_cache(maxsize=4096)
def _has_ref_effect(jaxpr: Any) -> bool:
    """``jaxpr`` reads, writes, allocates or copies a ref somewhere."""
    return any(eqn.primitive.name in _REF_EFFECTS or
               any(_has_ref_effect(j) for j, _ in _sub_jaxprs(eqn)) for eqn in _open(jaxpr).eqns)


def _is_ref(v: Any) -> bool:
    return not isinstance(v, jax_core.Literal) and isinstance(getattr(v, "aval", None),
                                                               state_types.AbstractRef)


class _BodyNeeds:
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
        self._scan(_open(jaxpr))
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
        return not isinstance(v, jax_core.Literal) and v in self._needed

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
        if isinstance(b, jax_core.Literal) or isinstance(a, jax_core.Literal):
            return
        self._edges.append((("ref", a) if _is_ref(a) else a, ("ref", b) if _is_ref(b) else b))

    def _bind(self, inner: list, outer: list) -> None:
        """Sub-jaxpr inputs ``inner`` receive ``outer``: one ref, or a value needing its source."""
        for a, b in zip(inner, outer, strict=True):
            if isinstance(b, jax_core.Literal):
                continue
            if _is_ref(a) or _is_ref(b):
                ra, rb = self._find(a), self._find(b)
                if ra is not rb:
                    self._parent[ra] = rb
            else:
                self._need(a, b)

    def _results(self, outer: list, inner: list) -> None:
        for a, b in zip(outer, inner, strict=True):
            self._need(a, b)

    def _seed(self, vs: Any) -> None:
        self._seeds.extend(("ref", v) if _is_ref(v) else v for v in vs
                           if not isinstance(v, jax_core.Literal))

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
            self._seed(v for v in ins if not _is_ref(v))
        elif name == "dma_start":
            refs = [v for v in ins if _is_ref(v)]  # flattened as src, dst, dst_sem, src_sem
            self._seed(v for v in ins if not _is_ref(v))
            if len(refs) >= 2:
                self._need(refs[1], refs[0])
        elif name == "cond":
            self._seed(ins[:1])
            for b in p["branches"]:
                bj = _open(b)
                self._bind(bj.invars, ins[1:])
                self._results(outs, bj.outvars)
                self._scan(bj)
        elif name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cj, bj = _open(p["cond_jaxpr"]), _open(p["body_jaxpr"])
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
            body = _open(p["jaxpr"])
            consts, carry, xs = _scan_operands(p, list(ins))
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
            inner = _open(p["jaxpr"])
            self._bind(inner.constvars, ins)
            self._results(outs, inner.outvars)
            self._scan(inner)
        elif (body := _call_body(eqn)) is not None:
            bj = _open(body)
            self._bind(bj.invars, ins)
            self._results(outs, bj.outvars)
            self._scan(bj)
        elif name in _IGNORED or name == "semaphore_read":
            return
        elif _sub_jaxprs(eqn):  # a construct kernelsim does not look into: everything it uses
            self._seed(ins)
        else:
            for o in outs:
                for i in ins:
                    self._need(o, i)


@functools.lru_cache(maxsize=256)
def _body_needs(jaxpr: Any) -> _BodyNeeds:
    return _BodyNeeds(jaxpr)


_SKIP = object()  # a value no recorded fact depends on: never computed


class _Interpreter:
    """Runs a kernel jaxpr on concrete values, recording ref reads and writes (if ``record``)
    and every DMA the body starts. Only what ``_BodyNeeds`` marks is computed, in numpy where
    ``_lax_numpy`` can (JAX otherwise)."""

    def __init__(self, grid: tuple[int, ...], sink: list, needs: _BodyNeeds, record: bool,
                 grid_names: tuple | None = None, device: MeshDevice | None = None):
        self.grid, self.sink, self.needs, self.recording = grid, sink, needs, record
        self.grid_names = tuple(grid_names or ())
        self.device = device
        self.dmas = DmaLedger()
        self.step, self.grid_index, self.order, self.scoped, self.dma_pos = 0, (), 0, 0, 0

    @property
    def copies(self) -> list[BodyCopy]:
        return self.dmas.copies

    def _dma_end(self, end: Any, what: str) -> tuple[_Ref, Selection]:
        """The ref of one end of a DMA (a ref or a view of one) and what it selects."""
        ref, transforms = (end, ()) if isinstance(end, _Ref) else (end.ref, end.transforms)
        if not isinstance(ref, _Ref):
            raise TraceError(f"a DMA {what} kernelsim cannot follow ({type(ref).__name__})")
        return ref, _select(ref.data.shape, tuple(transforms), ref.data.itemsize)

    def _semaphore(self, sem: Any) -> str:
        """A DMA semaphore's name: ``name``, or ``name[i, ...]`` for one of an array."""
        ref, (ids, *_) = self._dma_end(sem, "semaphore")
        if ids.size != 1 or ref.data.ndim == 0:
            return ref.name
        index = np.unravel_index(int(ids.reshape(-1)[0]), ref.data.shape)
        return f"{ref.name}[{', '.join(str(int(i)) for i in index)}]"

    def dma_wait(self, eqn: Any, vals: list) -> None:
        """A wait for a DMA's write (``.wait()``/``wait_recv``); a wait for its read is not
        the copy's completion and is not recorded."""
        if eqn.params.get("is_wait_send"):
            return
        _, _, sem, *_ = jax.tree_util.tree_unflatten(eqn.params["tree"], vals)
        self.dmas.wait(self.step, self.dma_pos, self._semaphore(sem))
        self.dma_pos += 1

    def _target(self, eqn: Any, device_id: Any) -> int | None:
        """The device a DMA writes: its ``device_id`` (a remote copy) or this one."""
        if device_id is None:
            return None if self.device is None else self.device.id
        if self.device is None:
            raise TraceError("a remote copy (make_async_remote_copy) outside jax.shard_map: "
                             "kernelsim knows the devices only from the shard_map's mesh")
        target = jax.tree_util.tree_map(lambda v: int(np.asarray(v)), device_id)
        if getattr(eqn.params.get("device_id_type"), "value", None) == "logical":
            return int(target)
        try:
            return self.device.target(target)
        except (KeyError, ValueError) as e:
            raise TraceError(f"a remote copy's device_id {target!r}: {e}") from None

    def dma(self, eqn: Any, vals: list) -> None:
        src, dst, dst_sem, _, device_id = jax.tree_util.tree_unflatten(eqn.params["tree"], vals)
        src_ref, src_sel = self._dma_end(src, "source")
        dst_ref, dst_sel = self._dma_end(dst, "destination")
        self.dmas.start(self.step, self.dma_pos, src_ref.name, dst_ref.name, src_ref.space,
                        dst_ref.space, src_sel.nbytes, src_sel.box, dst_sel.box,
                        self._semaphore(dst_sem), None if self.device is None
                        else self.device.id, self._target(eqn, device_id))
        self.dma_pos += 1
        src_ids, dst_ids = src_sel.ids, dst_sel.ids
        dst_var = [v for v in eqn.invars if _is_ref(v)][1]
        if self.needs.contents(dst_var) and not (src_sel.exact and dst_sel.exact):
            raise TraceError("a value kernelsim needs is copied by a DMA through a ref bitcast "
                             "(kernelsim follows such DMAs' sizes, not their data)")
        if self.needs.contents(dst_var) and src_ids.size == dst_ids.size:
            flat = dst_ref.data.reshape(-1)
            data = src_ref.data.reshape(-1)[src_ids.reshape(-1)].astype(flat.dtype)
            if eqn.params.get("add"):
                data = data + flat[dst_ids.reshape(-1)]
            flat[dst_ids.reshape(-1)] = data

    def masked(self, eqn: Any, vals: list) -> Any:
        """``pl.load``/``pl.store``/``pltpu.store`` with a mask (``masked_load``,
        ``masked_swap``): only the elements the mask keeps are read or written."""
        swap = eqn.primitive.name == "masked_swap"
        ref, transforms, a, b = eqn.params["args_tree"].unflatten(vals)
        value, mask, other = (a, b, None) if swap else (None, a, b)
        reads = self.needs.value(eqn.outvars[0])
        writes = swap and self.needs.contents(eqn.invars[0])
        if not (self.recording or reads or writes):
            return _SKIP
        ids, box, _, exact = _select(ref.data.shape, self._computed(eqn, list(transforms)),
                                     ref.data.itemsize)
        if (reads or writes) and not exact:
            raise TraceError("a value kernelsim needs is read or written through a ref "
                             "bitcast (kernelsim follows such accesses' places, not data)")
        keep = None if mask is None else np.broadcast_to(
            np.asarray(self._computed(eqn, [mask])[0], bool), ids.shape)
        touched, box = (ids, box) if keep is None else (ids[keep], None)
        if not swap:
            self.record(ref, "read", touched, box)
        out = _SKIP
        if reads:
            out = ref.data.reshape(-1)[ids].reshape(eqn.outvars[0].aval.shape)
            if not swap and keep is not None and other is not None:
                out = np.where(keep, out, np.asarray(self._computed(eqn, [other])[0]))
        if swap:
            if writes:
                new = np.broadcast_to(np.asarray(self._computed(eqn, [value])[0],
                                                 ref.data.dtype), ids.shape)
                ref.data.reshape(-1)[touched] = new if keep is None else new[keep]
            self.record(ref, "write", touched, box)
        return out

    def record(self, ref: _Ref, kind: str, ids: np.ndarray, box: tuple | None) -> None:
        if not self.recording:
            return
        from kernelsim.access import Access

        points = None
        if box is None:
            points = np.stack(np.unravel_index(np.unique(ids.reshape(-1)), ref.data.shape),
                              axis=1).astype(np.int64) if ref.data.ndim else np.zeros((1, 0),
                                                                                       np.int64)
        self.sink.append(Access(self.step, self.order, ref.name, kind, ref.data.shape, box,
                                points))
        self.order += 1

    def run(self, jaxpr: Any, consts: list, args: list) -> list:
        env: dict[Any, Any] = {}

        def read(v):
            return _literal(v) if isinstance(v, jax_core.Literal) else env.get(v, _SKIP)

        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for v, x in zip(jaxpr.invars, args, strict=True):
            env[v] = x
        for eqn in jaxpr.eqns:
            if not self._wanted(eqn):
                continue
            outs = self.eqn(eqn, [read(v) for v in eqn.invars])
            if not eqn.primitive.multiple_results:
                outs = [outs]
            for v, x in zip(eqn.outvars, outs, strict=True):
                env[v] = x
        return [read(v) for v in jaxpr.outvars]

    def _wanted(self, eqn: Any) -> bool:
        """The eqn has a needed result, touches a ref, or contains something that does."""
        return (any(self.needs.value(v) for v in eqn.outvars)
                or any(_is_ref(v) for v in eqn.invars)
                or eqn.primitive.name in _REF_EFFECTS
                or any(_has_ref_effect(j) for j, _ in _sub_jaxprs(eqn)))

    def _computed(self, eqn: Any, vals: list) -> list:
        """``vals`` of a needed eqn (each one was marked needed, so each was computed)."""
        if any(v is _SKIP for v in vals):
            raise AssertionError(f"kernelsim: an operand of {eqn.primitive.name!r} that a "
                                 "recorded fact depends on was not computed")
        return vals

    def eqn(self, eqn: Any, vals: list) -> Any:
        name, p = eqn.primitive.name, eqn.params
        if name == "dma_start":
            self.dma(eqn, self._computed(eqn, vals))
            return []
        if name == "dma_wait":
            self.dma_wait(eqn, self._computed(eqn, vals))
            return []
        if name == "semaphore_read":
            return np.int32(0)
        if name in ("get", "swap", "addupdate"):
            ref = vals[0]
            nval = 0 if name == "get" else 1
            reads = name != "addupdate" and self.needs.value(eqn.outvars[0])
            writes = name != "get" and self.needs.contents(eqn.invars[0])
            if not (self.recording or reads or writes):
                return [] if name == "addupdate" else _SKIP
            transforms = jax.tree_util.tree_unflatten(
                p["tree"], self._computed(eqn, vals[1 + nval:]))
            ids, box, _, exact = _select(ref.data.shape, transforms, ref.data.itemsize)
            if (reads or writes) and not exact:
                raise TraceError("a value kernelsim needs is read or written through a ref "
                                 "bitcast (kernelsim follows such accesses' places, not data)")
            if name in ("get", "addupdate"):
                self.record(ref, "read", ids, box)
            out = _SKIP
            if reads:
                out = ref.data.reshape(-1)[ids].reshape(eqn.outvars[0].aval.shape)
            if name != "get":
                if writes:
                    flat = ref.data.reshape(-1)
                    new = np.broadcast_to(np.asarray(self._computed(eqn, vals[1:2])[0],
                                                     ref.data.dtype), ids.shape)
                    flat[ids] = flat[ids] + new if name == "addupdate" else new
                self.record(ref, "write", ids, box)
            return [] if name == "addupdate" else out
        if name in ("masked_load", "masked_swap"):
            return self.masked(eqn, vals)
        if name == "program_id":
            return np.int32(self.grid_index[p["axis"]])
        if name == "num_programs":
            return np.int32(self.grid[p["axis"]])
        if name == "axis_index" and p["axis_name"] in self.grid_names:  # a named grid / mesh
            return np.int32(self.grid_index[self.grid_names.index(p["axis_name"])])
        if name == "axis_index" and self.device and p["axis_name"] in self.device.axes:
            return np.int32(self.device.coords[self.device.axes.index(p["axis_name"])])
        if name == "cond":
            branches = p["branches"]
            index = int(self._computed(eqn, vals[:1])[0])
            b = branches[int(np.clip(index, 0, len(branches) - 1))]
            return self.run(_open(b), _consts(b), vals[1:])
        if name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cc, bc, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
            cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
            while bool(self._computed(eqn, self.run(_open(cj), _consts(cj), cc + carry))[0]):
                carry = self.run(_open(bj), _consts(bj), bc + carry)
            return carry
        if name == "scan":
            length, body = p["length"], p["jaxpr"]
            consts, carry, xs = _scan_operands(p, vals)
            ncarry = len(carry)
            ys = []
            order = range(length - 1, -1, -1) if p["reverse"] else range(length)
            for i in order:
                step_xs = [x if x is _SKIP else x[i] for x in xs]
                out = self.run(_open(body), _consts(body), consts + carry + step_xs)
                carry, y = out[:ncarry], out[ncarry:]
                ys.append(y)
            if p["reverse"]:
                ys.reverse()
            stacked = []
            for k, v in enumerate(eqn.outvars[ncarry:]):
                if not self.needs.value(v):
                    stacked.append(_SKIP)
                elif ys:
                    stacked.append(np.stack([np.asarray(y[k]) for y in ys]))
                else:
                    stacked.append(np.zeros(v.aval.shape, v.aval.dtype))
            return carry + stacked
        if name == "run_scoped":
            inner = p["jaxpr"]
            refs = []
            for v in inner.invars:
                refs.append(_Ref(f"scoped{self.scoped}", _memory_space(v.aval),
                                 _ref_array(v.aval)))
                self.scoped += 1
            return self.run(inner, vals, refs)
        if name in _IDENTITY:
            return vals if eqn.primitive.multiple_results else vals[0]
        if name in _IGNORED:
            return []
        if name in _CALL_PRIMITIVES:
            sub = _called_jaxpr(p)
            if sub is not None:
                return self.run(_open(sub), _consts(sub), vals)
        if any(isinstance(v, _Ref) for v in vals):
            raise TraceError(
                f"access recording does not support {name!r} on refs (supported: ref reads "
                "and writes, pl.when/cond, fori_loop/while, scan, run_scoped)")
        vals = self._computed(eqn, vals)
        try:
            outs = _numpy_eqn(eqn, [np.asarray(v) for v in vals], [_NUMPY_BUDGET])
        except _lax_numpy.Unsupported:
            outs = eqn.primitive.bind(*vals, **p)
            outs = [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else [outs])]
        return outs if eqn.primitive.multiple_results else outs[0]


def _block_of(value: np.ndarray, op: Operand, step: int, shape: tuple[int, ...]) -> np.ndarray:
    """The block of input ``value`` that ``op``'s index map selects at ``step``, shaped as the
    kernel's ref (``shape``); the part outside the array is zeros."""
    block = np.zeros(tuple(d.size for d in op.block_dims), value.dtype)
    src, dst = [], []
    for dim, index, extent in zip(op.block_dims, op.block_indices[step], op.shape, strict=True):
        start = int(dim.start(np.int64(index)))
        lo, hi = max(start, 0), min(start + dim.size, extent)
        src.append(slice(lo, max(hi, lo)))
        dst.append(slice(lo - start, lo - start + max(hi - lo, 0)))
    block[tuple(dst)] = value[tuple(src)]
    return block.reshape(shape)


def needs_body_interpretation(params: dict[str, Any]) -> bool:
    """The call's traffic includes DMAs its body starts, so ``interpret_body`` must run."""
    return _has_body_dma(params["jaxpr"])


def interpret_body(params: dict[str, Any], call: KernelCall, args: tuple | None = None,
                   record: bool = True) -> tuple[Any, list[BodyCopy]]:
    """Run the kernel body at every grid step: its ``AccessLog`` (empty unless ``record``) and
    the DMAs it starts.

    Only the values that decide indices, DMAs and control flow are computed (``_BodyNeeds``).
    Scalar-prefetch refs hold their real values and scratch refs keep their contents from
    step to step. An input whose contents such a value reads (e.g. a DMA size in an SMEM
    block) holds its real block at each step when ``args`` (the call's operands) has it, and
    an HBM/ANY input the whole array; other input and output blocks are zeros.
    """
    from kernelsim.access import AccessLog

    jaxpr = params["jaxpr"]
    if _open(jaxpr).constvars:
        raise TraceError(f"pallas_call {call.name!r}: kernel jaxpr with constants is not "
                         "supported by kernel-body interpretation")
    if len(jaxpr.invars) != len(call.operands):
        raise TraceError(f"pallas_call {call.name!r}: {len(jaxpr.invars)} kernel refs but "
                         f"{len(call.operands)} operands")
    needs = _body_needs(jaxpr)
    gm = params["grid_mapping"]
    inputs = (list(args[len(args) - gm.num_inputs:]) if args is not None
              else [_UNKNOWN] * gm.num_inputs)
    refs, blocks, fresh = [], [], []  # blocks: (ref, input value, operand) refilled per step
    for i, (v, op) in enumerate(zip(jaxpr.invars, call.operands, strict=True)):
        if not _is_ref(v):  # a scalar a pl.kernel closes over: the kernel gets its value
            value = inputs[i - gm.num_index_operands]
            refs.append(_SKIP if value is _UNKNOWN else np.asarray(value))
            continue
        ref = _Ref(op.name, op.memory_space, _ref_array(v.aval))
        refs.append(ref)
        if op.role == "scalar_prefetch":
            ref.data = np.array(op.value, copy=True).reshape(ref.data.shape)
            continue
        value = _UNKNOWN
        if op.role == "input" and needs.contents(v):
            value = inputs[i - gm.num_index_operands]
        if value is not _UNKNOWN and not op.pipelined:  # HBM/ANY: the whole array, kept
            ref.data = np.array(value, copy=True).reshape(ref.data.shape)
        elif value is not _UNKNOWN:
            blocks.append((ref, np.asarray(value), op))
        elif op.role in ("input", "output") and op.pipelined:
            fresh.append(ref)
    sink: list = []
    interp = _Interpreter(call.grid, sink, needs, record, gm.grid_names, call.device)
    for step, point in enumerate(call.grid_indices()):
        for r in fresh:
            r.data.fill(0)
        for r, value, op in blocks:
            r.data = _block_of(value, op, step, r.data.shape)
        interp.step, interp.grid_index, interp.order, interp.scoped, interp.dma_pos = (
            step, tuple(int(g) for g in point), 0, 0, 0)
        with jax.disable_jit():
            interp.run(_open(jaxpr), [], refs)
    shapes = {r.name: r.data.shape for r in refs if isinstance(r, _Ref)}
    for a in sink:
        shapes.setdefault(a.operand, a.shape)
    return AccessLog(call.steps, shapes, sink), interp.copies
