"""The model of one pallas_call, built from its params: ``to_model`` -> ``KernelCall``.

Grid, dimension semantics, operands with their block dimensions, memory spaces and buffer
counts, block indices at every grid step (``index_maps``), FLOPs (``flops``), the VMEM that
``pl.run_scoped`` scopes and the values Mosaic keeps in VMEM hold at their peak, aliases and the
author's cost estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernelsim.adapter import (
    AbstractRef,
    Blocked,
    DynamicGridDim,
    Element,
    Literal,
    MeshKernelParams,
    Squeezed,
    memory_space,
    open_jaxpr,
)
from kernelsim.body.needs import ref_array
from kernelsim.errors import TraceError
from kernelsim.find.flops import body_work, most_expensive, precision_name, step_work
from kernelsim.find.index_maps import (
    evaluate_index_map,
    prefetch_read,
    reads_prefetch_at_prefetched_index,
    window_moves,
)
from kernelsim.jaxpr.nesting import sub_jaxprs
from kernelsim.model import BlockDim, KernelCall, Operand, tile_padded_bytes


def uses_manual_dma(params: dict[str, Any]) -> bool:
    """The kernel keeps operands in HBM/ANY or has semaphores: it needs the TPU interpreter."""
    gm = params["grid_mapping"]
    spaces = [memory_space(bm.transformed_block_aval) for bm in gm.block_mappings]
    spaces += [memory_space(a) for a in gm.scratch_avals]
    return any(s in ("any", "hbm", "semaphore") for s in spaces)


def requested_interpret(params: dict[str, Any]) -> Any:
    """What the kernel author passed as ``interpret=`` (False when compiling)."""
    return params["interpret"]


def _block_dims(call_name: str, origin: str, block_shape: tuple) -> tuple[BlockDim, ...]:
    dims = []
    for b in block_shape:
        if isinstance(b, Blocked):
            dims.append(BlockDim("blocked", int(b.block_size)))
        elif isinstance(b, Squeezed):
            dims.append(BlockDim("squeezed", 1))
        elif isinstance(b, Element):
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
            inner = open_jaxpr(eqn.params["jaxpr"])
            here = dict(_scoped_peak(inner))
            for v in inner.invars:
                space = memory_space(v.aval)
                if space in ("vmem", "smem"):
                    here[space] = here.get(space, 0) + ref_array(v.aval).nbytes
        else:
            here = {}
            for sub, _ in sub_jaxprs(eqn):
                for space, n in _scoped_peak(sub).items():
                    here[space] = max(here.get(space, 0), n)
        for space, n in here.items():
            peak[space] = max(peak.get(space, 0), n)
    return peak


# Reductions: Mosaic streams an operand into a reduction over its minor (lane) dimension
# through vector registers, but a value the body reads again after such a reduction has
# consumed it must wait in VMEM (``_body_values_peak``).
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
                         "reduce_or", "argmax", "argmin", "cumsum", "cumprod", "cummax",
                         "cummin"})
# The most VMEM a matmul's result takes beside the buffers, bytes: Mosaic computes a large dot
# in pieces. Fitted on a TPU v5e (jax 0.10.2, libtpu 0.0.42.1; bench/recorded/tpu_perf-v5e.json
# ``vmem``, recorded at f1c4f1f, and tests/kernelsim/chip_verdicts_v5e.py): for lesson 7's
# matmul Mosaic allocated 2.08-2.36 MiB beside its buffers whether the float32 result was
# 512 x 1024 (2 MiB) or 1024 x 1024 (4 MiB), and (1024, 768, 1024), 14 MiB of buffers,
# compiled under the 16 MiB limit; counting at most 2 MiB gives all 12 recorded verdicts.
MATMUL_RESULT_VMEM_BYTES = 2 << 20
# Reads of a ref: Mosaic reads the VMEM buffer in place, no copy of the block is made.
_REF_READS = frozenset({"get", "load", "masked_load"})
# A float32 dot at HIGH / HIGHEST precision: Mosaic splits each operand into bf16 parts (2 /
# 3) and a float32 remainder, kept beside the buffers. On the v5e a (512, 512, 512) float32
# matmul at HIGHEST allocated at least 4.21 MiB beside its 7 MiB of buffers
# (bench/recorded/tpu_perf_vmem-v5e.json), a 1 MiB result and 3 MiB more.
_SPLIT_PARTS = {"HIGH": 2, "HIGHEST": 3}


def _reduces_lanes_only(eqn: Any) -> bool:
    """``eqn`` reduces its operand over its minor (lane) dimension alone."""
    rank = len(getattr(eqn.invars[0].aval, "shape", ()))
    axes = eqn.params.get("axes", (eqn.params.get("axis"),))
    return tuple(axes) == (rank - 1,)


def _split_bytes(eqn: Any) -> int:
    """VMEM a float32 ``dot_general`` at HIGH or HIGHEST keeps for its operands' parts."""
    parts = _SPLIT_PARTS.get(precision_name(eqn.params.get("precision")), 0)
    if not parts or str(eqn.invars[0].aval.dtype) != "float32":
        return 0
    return sum(tile_padded_bytes(tuple(v.aval.shape), "bfloat16", 2) * parts
               + tile_padded_bytes(tuple(v.aval.shape), "float32", 4) for v in eqn.invars)


def _body_values_peak(jaxpr: Any) -> int:
    """The most bytes of array values Mosaic keeps in VMEM beside the buffers at once, each
    with its tile padding (``model.tile_padded_bytes``). Mosaic streams element-wise work
    through vector registers, however many operations read a value, and so a reduction over
    the lanes of such a value. A value is kept when:

    - it is a matmul's result (at most ``MATMUL_RESULT_VMEM_BYTES``: Mosaic makes it in
      pieces) or a matmul reads it; a float32 matmul at HIGH or HIGHEST also keeps its
      operands' parts (``_split_bytes``);
    - a reduction over other dimensions than the lanes reads it;
    - the body reads it again after a reduction or matmul that depends on it (a softmax's
      exp, read by its sum and then its division; a layer norm's centred rows);
    - a reduction reads it and it is computed from a kept value.

    A ref read is not a copy. Each kept value lives from the eqn that makes it to its last
    use; a loop or branch adds its own body's peak while it runs. Measured on a TPU v5e
    (bench/recorded/tpu_perf_vmem-v5e.json): each probe compiled at its buffers plus 64 KiB
    where this counts nothing kept, and was refused where it counts some."""
    eqns = jaxpr.eqns
    last: dict[Any, int] = {}
    readers: dict[Any, list[int]] = {}
    for k, eqn in enumerate(eqns):
        for v in {v for v in eqn.invars if not isinstance(v, Literal)}:
            last[v] = k
            readers.setdefault(v, []).append(k)
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            last[v] = len(eqns)
    # the vars each eqn depends on, transitively
    ancestors: dict[Any, frozenset] = {}
    depends: list[frozenset] = []
    for eqn in eqns:
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        seen = frozenset(ins).union(*(ancestors.get(v, frozenset()) for v in ins))
        depends.append(seen)
        for v in eqn.outvars:
            ancestors[v] = seen
    waits = [k for k, eqn in enumerate(eqns)
             if eqn.primitive.name in _REDUCTIONS or eqn.primitive.name == "dot_general"]
    kept: set = set()

    def kept_bytes(v: Any, i: int) -> int:
        eqn, aval = eqns[i], v.aval
        producer = eqn.primitive.name
        if (isinstance(aval, AbstractRef) or not getattr(aval, "shape", ())
                or producer in _REF_READS or v not in last):
            return 0
        n = tile_padded_bytes(tuple(aval.shape), str(aval.dtype), _itemsize(aval.dtype))
        if producer == "dot_general":
            return min(n, MATMUL_RESULT_VMEM_BYTES)
        read_by = [eqns[k] for k in readers.get(v, ())]
        if any(r.primitive.name == "dot_general" for r in read_by):
            return n
        reduced = [r for r in read_by if r.primitive.name in _REDUCTIONS]
        if any(not _reduces_lanes_only(r) for r in reduced):
            return n
        if any(i < k < last[v] and v in depends[k] for k in waits):  # read after it
            return n
        if reduced and any(u in kept for u in eqn.invars if not isinstance(u, Literal)):
            return n
        return 0

    live: dict[Any, int] = {}
    peak = 0
    for k, eqn in enumerate(eqns):
        inner = max((_body_values_peak(j) for j, _ in sub_jaxprs(eqn)), default=0)
        split = _split_bytes(eqn) if eqn.primitive.name == "dot_general" else 0
        for v in eqn.outvars:
            if n := kept_bytes(v, k):
                live[v] = n
                kept.add(v)
        peak = max(peak, sum(live.values()) + inner + split)
        for v in [v for v in live if last[v] <= k]:
            del live[v]
    return peak


def _used_vars(jaxpr: Any) -> set:
    """The vars some eqn of ``jaxpr`` takes as an operand, or that it returns."""
    used = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for eqn in jaxpr.eqns:
        used.update(v for v in eqn.invars if not isinstance(v, Literal))
    return used


def _concrete_grid(name: str, gm: Any, leading: tuple) -> tuple[int, ...]:
    """The grid with each dynamic bound read from its operand (the last ``leading`` ones)."""
    bounds = iter(leading[len(leading) - gm.num_dynamic_grid_bounds:])
    grid = []
    for g in gm.grid:
        if isinstance(g, DynamicGridDim):
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
    tree = body_work(params["jaxpr"])
    work = most_expensive(tree)
    call.flops_per_step, call.matmuls = work.flops, work.matmuls
    call.vector_vregs_per_step = work.vector_vregs
    call.lane_broadcast_vregs_per_step = work.lane_broadcast_vregs
    scoped = _scoped_peak(open_jaxpr(params["jaxpr"]))
    call.scoped_vmem_bytes, call.scoped_smem_bytes = scoped.get("vmem", 0), scoped.get("smem", 0)
    kernel = open_jaxpr(params["jaxpr"])
    call.referenced = frozenset(n for n, v in zip(names, kernel.invars, strict=False)
                                if v in _used_vars(kernel))
    call.body_values_vmem_bytes = _body_values_peak(kernel)
    call.read_by_index_maps = frozenset(
        names[i] for bm in gm.block_mappings for i in prefetch_read(bm, len(gm.grid)))
    call.dependent_prefetch_reads = frozenset(
        names[nprefetch + k] for k, bm in enumerate(gm.block_mappings)
        if reads_prefetch_at_prefetched_index(bm, len(gm.grid)))
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
        call.cost_estimate_transcendentals = int(ce.transcendentals)
        call.cost_estimate_remote_bytes = int(ce.remote_bytes_transferred)
    for i, val in enumerate(prefetch_vals):
        call.operands.append(Operand(names[i], "scalar_prefetch", tuple(val.shape),
                                     str(val.dtype), val.dtype.itemsize, "smem", value=val))
    points = call.grid_indices()
    for k, bm in enumerate(gm.block_mappings):
        role = "input" if k < nin else "output"
        aval = bm.array_aval
        dims = _block_dims(name, bm.origin, bm.block_shape)
        space = memory_space(bm.transformed_block_aval)
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
                                            and not window_moves(bm, grid))):
            buffers = 1
        call.operands.append(Operand(
            names[nprefetch + k], role, tuple(aval.shape), str(aval.dtype),
            _itemsize(aval.dtype), space, dims, int(buffers),
            evaluate_index_map(bm, grid, points, prefetch_vals), trivial_window=trivial,
            revisit_any=revisit == "any" and role == "output"))
    for j, aval in enumerate(gm.scratch_avals):
        space = memory_space(aval)
        inner = getattr(aval, "inner_aval", aval)
        shape = tuple(getattr(inner, "shape", ()))
        dtype = getattr(inner, "dtype", None)
        itemsize = _itemsize(dtype) if space != "semaphore" else 0
        call.operands.append(Operand(names[nprefetch + nin + nout + j], "scratch", shape,
                                     str(dtype) if itemsize else "semaphore", itemsize, space))
    call.step_work = step_work(tree, params["jaxpr"], grid, points,
                               dict(zip(kernel.invars[:nprefetch], prefetch_vals, strict=True)))
    return call
