"""kernelsim's adapter: the only module that touches JAX internals (``jax._src``).

What differs between JAX releases and the handles on JAX's internals live here, as small
functions and public names the analysis modules read (``find``, ``call_model``, ``body``, ...):
how a jaxpr and its constants are held, the internal types a jaxpr's values and a pallas_call's
block specs are made of, how every kernel call is captured and run again, the pallas_call a
``pl.kernel`` runs as, abstract TPU/GPU devices, and TPU interpret mode's copies as plain data.
Supported JAX releases: ``SUPPORTED_JAX`` (tested on both ends by ``make test``; ``make test-jax
JAX=<version>`` runs kernelsim's suite on any other). Differences between releases are handled
here by feature detection, never by comparing version strings; see kernelsim/UPGRADING.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core
from jax._src import mesh as mesh_lib
from jax._src.pallas import core as pallas_core
from jax._src.pallas import mpmd
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing
from jax._src.state import types as state_types
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernelsim.errors import TraceError
from kernelsim.model import MemorySpace, MeshDevice

# The oldest and newest JAX releases kernelsim is tested against.
SUPPORTED_JAX = ("0.10.2", "0.12.0.1")

# ---------------------------------------------------------------------------------------------
# What differs between JAX releases

# The running release, for messages only (what differs is detected, never compared by number).
RUNNING_JAX = jax.__version__

# kernelsim.gpu's model of a Mosaic GPU kernel is checked against the lowering of the Mosaic GPU
# that came with GPU interpret mode (plgpu.InterpretGPUParams; tests/kernelsim/test_gpu_model.py);
# the older one (jax 0.10.2's) pipelines plgpu.kernel differently, and nothing checks it.
@functools.cache
def models_mosaic_gpu() -> bool:
    """This JAX's Mosaic GPU is the one kernelsim.gpu models (asked once, when first needed:
    importing Mosaic GPU is slow)."""
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError:  # a jaxlib without Mosaic GPU
        return False
    return hasattr(plgpu, "InterpretGPUParams")

# jax <= 0.10 wraps a Jaxpr and its constants in ClosedJaxpr; from 0.11 a Jaxpr carries its
# constants itself (``.consts``, and ``.jaxpr`` returns the Jaxpr), and ClosedJaxpr is gone.
_CLOSED_JAXPR: type | None = getattr(jax_core, "ClosedJaxpr", None)
JAXPR_TYPES: tuple[type, ...] = (jax_core.Jaxpr,) + ((_CLOSED_JAXPR,) if _CLOSED_JAXPR else ())


def open_jaxpr(j: Any) -> Any:
    """The Jaxpr whose ``eqns`` and ``constvars`` to walk (a ClosedJaxpr's inner one)."""
    return j.jaxpr if _CLOSED_JAXPR is not None and isinstance(j, _CLOSED_JAXPR) else j


def consts_of(j: Any) -> list:
    """The constant values bound to ``open_jaxpr(j).constvars`` (none for a bare old-style
    Jaxpr)."""
    return list(getattr(j, "consts", ()))


def close_jaxpr(jaxpr: Any, consts: list) -> Any:
    """``jaxpr`` with ``consts`` attached: a ClosedJaxpr before 0.11, a Jaxpr after."""
    return (_CLOSED_JAXPR or jax_core.Jaxpr)(jaxpr, consts)


def scan_operands(params: dict[str, Any], vals: list) -> tuple[list, list, list]:
    """A scan's operands split into (consts, carry, xs).

    jax <= 0.10 records ``num_consts``/``num_carry``; from 0.11 the split is a FlatTree
    ``ft_in`` whose three children are the consts, the carry and the scanned inputs.
    """
    if "ft_in" in params:
        consts, carry, xs = params["ft_in"].update(vals).unpack()
        return list(consts), list(carry), list(xs)
    nc, ncarry = params["num_consts"], params["num_carry"]
    return vals[:nc], vals[nc:nc + ncarry], vals[nc + ncarry:]


# ---------------------------------------------------------------------------------------------
# JAX's internal types and functions the analysis reads, by public names

# jaxpr values
Literal = jax_core.Literal
DropVar = jax_core.DropVar
eval_jaxpr = jax_core.eval_jaxpr
jaxpr_as_fun = jax_core.jaxpr_as_fun
# refs and the transforms a ref view applies (``ref.at[...]``, ``.reshape``, ``.bitcast``)
AbstractRef = state_types.AbstractRef
NDIndexer = indexing.NDIndexer
IndexSlice = indexing.Slice
ReshapeTransform = state_types.ReshapeTransform
BitcastTransform = state_types.BitcastTransform
# the kinds of block dimension in a BlockSpec, and a grid bound known only when the call runs
Blocked = pallas_core.Blocked
Squeezed = pallas_core.Squeezed
Element = pallas_core.Element
DynamicGridDim = pallas_core.DynamicGridDim
# a jaxpr whose refs are threaded through as values (what runs a stateful jaxpr outside Pallas)
discharge_state = state_discharge.discharge_state


def new_jaxpr(invars: list, outvars: list, eqns: list) -> Any:
    """A Jaxpr without constants running ``eqns`` from ``invars`` to ``outvars``."""
    return jax_core.Jaxpr([], invars, outvars, eqns,
                          jax_core.join_effects(*(e.effects for e in eqns)))


MEMORY_SPACES: dict[str, MemorySpace] = {
    "default": "vmem", "vmem": "vmem", "vmem_shared": "vmem", "cmem": "vmem",
    "smem": "smem", "semaphore_mem": "semaphore", "hbm": "hbm", "any": "any",
}


def memory_space(aval: Any) -> MemorySpace:
    """Where a ref or block of type ``aval`` lives, in kernelsim's words (``MEMORY_SPACES``)."""
    space = getattr(aval, "memory_space", None)
    if space is None:
        return "semaphore" if "sem" in type(aval).__name__.lower() else "vmem"
    value = getattr(space, "value", str(space))
    if value not in MEMORY_SPACES:
        raise TraceError(f"unsupported memory space {space!r}")
    return MEMORY_SPACES[value]


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


def is_kernel(eqn: Any) -> bool:
    """A ``pallas_call``, or a ``pl.kernel``/``pl.core_map`` (the ``mpmd_map`` primitive)."""
    return eqn.primitive is pl.pallas_call_p or eqn.primitive is mpmd.mpmd_map_p


class MeshKernelParams(dict):
    """The pallas_call params that model a ``pl.kernel``; ``mpmd_params`` are its own
    ``mpmd_map`` params, which is what runs when kernelsim executes it."""

    mpmd_params: dict[str, Any]


_MESH_PARAMS: dict[int, tuple[Any, dict]] = {}


def kernel_params(eqn: Any) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------
# Abstract devices, and what lowers a GPU pallas_call


def abstract_mesh(device_kind: str, platform: str = "tpu", num_cores: int = 1) -> Any:
    """An abstract one-device mesh of ``device_kind``: what code that asks for the TPU it
    targets (``pltpu.get_tpu_info()``, ``emit_pipeline``'s tiling, a TensorCore mesh built
    without ``num_cores``: ``num_cores`` cores) reads while it is traced.
    ``platform="gpu"`` makes the device a GPU of that kind instead (``num_cores``: its SMs)."""
    device = mesh_lib.AbstractDevice(device_kind, num_cores, platform)
    # An Auto axis, so traced values carry no sharding on this mesh: the program's slices
    # then compile and run on this host's own devices.
    return jax.sharding.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                                     abstract_device=device)


def on_abstract_tpu(device_kind: str) -> Any:
    """A context in which code that asks for its TPU (``pltpu.get_tpu_info()``, a TensorCore
    mesh without ``num_cores``) is told ``device_kind``, on any host."""
    return jax.sharding.use_abstract_mesh(abstract_mesh(device_kind))


def typed_ndarray_type() -> type | None:
    """The ndarray subclass JAX keeps a literal's JAX type in (``jax._src.literals.TypedNdArray``,
    new in jax 0.12); None in a release without it. A pickle of one as a plain ndarray loses
    that type, so code that sends a jaxpr across processes must reduce it itself."""
    try:
        from jax._src.literals import TypedNdArray  # optional: new in jax 0.12
    except ImportError:
        return None
    return TypedNdArray


def prng_impl_functions() -> frozenset[tuple[str, str]]:
    """(module, qualified name) of every function a registered JAX PRNG implementation holds
    (``jax._src.random.prng.prngs``: threefry, rbg, philox, ...): what a pickled jaxpr names
    when a kernel draws ``jax.random`` bits from a key, whose type carries its
    implementation."""
    from jax._src.random import prng

    return frozenset((f.__module__, f.__qualname__) for impl in prng.prngs.values()
                     for f in impl if callable(f))


def on_abstract_gpu(device_kind: str, num_cores: int) -> Any:
    """A context in which code that asks for its GPU (JAX's bundled Mosaic GPU ops read the SM
    count, ``num_cores``) is told ``device_kind``, on any host: to lower them from a CPU."""
    return jax.sharding.use_abstract_mesh(abstract_mesh(device_kind, "gpu", num_cores))


def triton_for_gpu_pallas_call() -> contextlib.AbstractContextManager:
    """A context in which a GPU ``pallas_call`` without compiler params lowers with Triton.

    jax <= 0.10 lowers it to Mosaic GPU unless this flag is off (and Mosaic GPU needs a GPU
    jaxlib); from 0.11 pallas_call on GPU is Triton only and the flag is gone."""
    use_mosaic_gpu = getattr(jax_config, "jax_pallas_use_mosaic_gpu", None)
    return use_mosaic_gpu(False) if use_mosaic_gpu is not None else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# What TPU interpret mode copies, as plain data


def _interpret_space(index: int) -> MemorySpace:
    return MEMORY_SPACES[tpu_interpret.TPU_MEMORY_SPACE_NAMES[int(index)]]


@contextlib.contextmanager
def observing_interpret_mode(on_copy: Callable[..., None],
                             on_dma: Callable[..., None] | None = None) -> Iterator[None]:
    """Tell ``on_copy`` every pipeline copy TPU interpret mode makes while the block runs, and
    ``on_dma`` every DMA a kernel body starts; the interpreter's state is reset afterwards.

    ``on_copy(operand, kind, block_index, grid_index, nbytes, device)``: ``kind`` is "fetch"
    or "writeback". The interpreter's ``get``/``store`` callbacks carry ``input_name``/
    ``output_name`` only for the pipeline's own HBM<->VMEM copies, so kernel-body accesses are
    not seen there; body DMAs are seen where the interpreter writes their data
    (``DMA.execute_write``): ``on_dma(src_space, dst_space, nbytes, src_device, dst_device)``.
    """
    orig_get, orig_store = tpu_interpret.get, tpu_interpret.store
    orig_write = tpu_interpret.DMA.execute_write

    @functools.wraps(orig_write)
    def execute_write(dma):
        if on_dma is not None and dma.data is not None:
            on_dma(_interpret_space(dma.src_memory_space), _interpret_space(dma.dst_memory_space),
                   dma.data_size, int(dma.src_device_id), int(dma.dst_device_id))
        return orig_write(dma)

    @functools.wraps(orig_get)
    def get(*args, input_name=None, **kw):
        token, val = orig_get(*args, input_name=input_name, **kw)
        if input_name is not None:
            on_copy(input_name, "fetch", tuple(int(x) for x in args[6]),
                    tuple(int(x) for x in args[7]), np.asarray(val).nbytes, int(args[1]))
        return token, val

    @functools.wraps(orig_store)
    def store(*args, output_name=None, **kw):
        out = orig_store(*args, output_name=output_name, **kw)
        if output_name is not None:
            on_copy(output_name, "writeback", tuple(int(x) for x in args[7]),
                    tuple(int(x) for x in args[8]), np.asarray(args[6]).nbytes, int(args[1]))
        return out

    tpu_interpret.get, tpu_interpret.store = get, store
    tpu_interpret.DMA.execute_write = execute_write
    try:
        yield
    finally:
        tpu_interpret.get, tpu_interpret.store = orig_get, orig_store
        tpu_interpret.DMA.execute_write = orig_write
        pltpu.reset_tpu_interpret_mode_state()
