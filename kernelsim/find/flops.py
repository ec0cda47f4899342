"""FLOPs of one kernel invocation, counted from the kernel jaxpr."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from kernelsim.adapter import open_jaxpr
from kernelsim.jaxpr.nesting import sub_jaxprs
from kernelsim.model import Matmul, tile_padded_bytes

_VREG_BYTES = 8 * 128 * 4  # one TPU vector register: 8 sublanes x 128 lanes of 32-bit words


def _vregs(aval: Any) -> int:
    """Vector registers a value of ``aval`` fills as Mosaic lays it out (tile-padded: a
    (512, 1) float32 value fills 64, as (512, 128) would); 0 for a non-array."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    # a PRNG key (jax.random.key in a kernel body) is an extended dtype, no NumPy one: its
    # words are scalars until random_bits draws from it
    if shape is None or dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return 0
    size = tile_padded_bytes(tuple(shape), str(dtype), np.dtype(dtype).itemsize)
    return -(-size // _VREG_BYTES)

# Copies and relabellings, no arithmetic. ``tile`` (jnp.tile, pltpu.repeat) lowers to a
# tpu.concatenate of the same value (jax/_src/pallas/mosaic/lowering.py, _tile_lowering_rule),
# like ``concatenate``: JAX's bundled flash attention repeats its lane-replicated statistics
# this way and does no vector work for it.
_DATA_MOVEMENT = frozenset({
    "get", "swap", "program_id", "num_programs", "broadcast_in_dim", "reshape", "squeeze",
    "expand_dims", "transpose", "convert_element_type", "iota", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p", "select_n", "rev",
    "bitcast_convert_type", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
    "semaphore_read", "gather", "scatter", "device_id", "load", "store", "masked_load",
    "masked_swap", "multiple_of", "pjit_dce", "optimization_barrier", "stop_gradient", "tile",
})


def _is_column(var: Any) -> bool:
    """``var`` is a column: a value of rank 2 or more whose last axis is 1, not a scalar."""
    shape = tuple(getattr(getattr(var, "aval", None), "shape", ()))
    return len(shape) >= 2 and shape[-1] == 1 and int(np.prod(shape, dtype=np.int64)) > 1


def lane_broadcast_vregs(eqn: Any, replicated: set) -> int:
    """The vector registers of the columns ``eqn`` spreads across the lanes, or 0: an operand
    whose last axis is 1 made as wide as a last axis of more than one lane, by
    ``broadcast_in_dim`` or by an elementwise operation's own broadcasting (``s - m`` with
    scores (bq, bkv) and a running max (bq, 1) read from scratch, as an online softmax has),
    unless the column is ``replicated``: a reduction along the lanes leaves its result in
    every lane, and arithmetic on such columns keeps it so. Measured on the TPU v5e, lesson
    8's flash attention took 1.58x the time with (bq, 1) statistics in scratch that it took
    with the same statistics kept as (bq, 128) rows and widened by ``jnp.tile``, a copy of
    whole vregs (bench/recorded/fa_probe-v5e.json). Tile-padded, as ``_vregs``: a (512, 1)
    float32 column is 64."""
    if not eqn.outvars:  # an effect (a debug print): no value
        return 0
    shape = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
    if len(shape) < 2 or shape[-1] == 1:
        return 0
    return sum(_vregs(v.aval) for v in eqn.invars
               if _is_column(v) and len(v.aval.shape) == len(shape) and v not in replicated)


def _keeps_replicated(eqn: Any, replicated: set) -> bool:
    """``eqn``'s column result is in every lane: a reduction along the last axis, a
    relabelling of such a result, or arithmetic whose column operands all are (scalars
    aside)."""
    name = eqn.primitive.name
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        rank = len(getattr(eqn.invars[0].aval, "shape", ()))
        return rank - 1 in tuple(eqn.params.get("axes", ()))
    if name in _RELABELLINGS:  # (bq,) -> (bq, 1): the same values in the same lanes
        return not hasattr(eqn.invars[0], "val") and eqn.invars[0] in replicated
    columns = [v for v in eqn.invars if _is_column(v)]
    return bool(columns) and all(v in replicated for v in columns) and name not in (
        "get", "load", "masked_load", "slice", "dynamic_slice")


_RELABELLINGS = frozenset({"reshape", "broadcast_in_dim", "expand_dims", "squeeze",
                           "convert_element_type", "copy"})


class BodyWork(NamedTuple):
    """What one kernel invocation computes (``count_flops``)."""

    flops: int
    matmuls: tuple[Matmul, ...]
    vector_vregs: int
    lane_broadcast_vregs: int


def _is_k_major(var: Any, contract: tuple[int, ...], layouts: dict) -> bool:
    """``var``'s minor dimension where it was loaded is one of ``contract``."""
    rank = len(getattr(var.aval, "shape", ()))
    if rank == 0:
        return True
    loaded = tuple(range(rank))  # a Literal, or a value no transpose relabelled
    source = loaded if hasattr(var, "val") else layouts.get(var, loaded)  # value -> loaded dim
    return any(source[d] == rank - 1 for d in contract)


# Precisions (lax.Precision or DotAlgorithmPreset names) at which the Triton lowering gives a
# float32 dot TF32 inputs: jax/_src/pallas/triton/lowering.py, _TF32_PRECISIONS (DEFAULT, HIGH)
# and the TF32_TF32_F32 preset; no precision at all is DEFAULT.
_TF32_NAMES = frozenset({"DEFAULT", "HIGH", "TF32_TF32_F32"})


def _is_tf32(dtype: str, precision: Any) -> bool:
    if dtype != "float32":
        return False
    if precision is None:
        return True
    names = [getattr(p, "name", str(p)) for p in
             (precision if isinstance(precision, tuple | list) else (precision,))]
    return any(n in _TF32_NAMES for n in names)


def count_flops(jaxpr: Any) -> BodyWork:
    """FLOPs of one kernel invocation, its matmuls, its vector work: the vector registers
    its arithmetic other than matmuls produces (a reduction: that it reads), tile-padded
    (``_vregs``), the unit of the TPU time model's VPU term; and its lane broadcasts
    (``lane_broadcast_vregs``), a term of their own.

    dot_general: 2 x output elements x contracted size; other arithmetic: one FLOP per output
    element (reductions: per input element); data movement is free. ``cond`` counts its most
    expensive branch, ``scan`` its body times its length, ``while`` one iteration.
    """
    flops = vregs = broadcasts = 0
    matmuls: list[Matmul] = []
    layouts: dict = {}  # var -> its dimensions' places in the layout it was loaded with
    replicated: set = set()  # columns in every lane (``lane_broadcast_vregs``)
    for eqn in open_jaxpr(jaxpr).eqns:
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn)
        if _keeps_replicated(eqn, replicated):
            replicated.update(eqn.outvars)
        if name == "cond":
            counted = [count_flops(j) for j, _ in subs]
            flops += max((c.flops for c in counted), default=0)
            vregs += max((c.vector_vregs for c in counted), default=0)
            broadcasts += max((c.lane_broadcast_vregs for c in counted), default=0)
            matmuls += [m for c in counted for m in c.matmuls]
            continue
        if subs:
            for j, reps in subs:
                work = count_flops(j)
                flops += work.flops * reps
                vregs += work.vector_vregs * reps
                broadcasts += work.lane_broadcast_vregs * reps
                matmuls += [Matmul(m.dtype, m.flops * reps, m.k_major, m.tf32)
                            for m in work.matmuls]
            continue
        if name == "transpose" and not hasattr(eqn.invars[0], "val"):  # (not a Literal)
            (x,) = eqn.invars
            source = layouts.get(x, tuple(range(len(x.aval.shape))))
            layouts[eqn.outvars[0]] = tuple(source[p] for p in eqn.params["permutation"])
        elif (name == "convert_element_type" and not hasattr(eqn.invars[0], "val")
              and eqn.invars[0] in layouts):
            layouts[eqn.outvars[0]] = layouts[eqn.invars[0]]
        if name == "dot_general":
            (lhs_contract, rhs_contract), _ = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars
            k = int(np.prod([lhs.aval.shape[a] for a in lhs_contract], dtype=np.int64))
            out = eqn.outvars[0].aval
            dot = 2 * int(np.prod(out.shape, dtype=np.int64)) * k
            flops += dot
            matmuls.append(Matmul(str(lhs.aval.dtype), dot,
                                  _is_k_major(lhs, tuple(lhs_contract), layouts)
                                  and _is_k_major(rhs, tuple(rhs_contract), layouts),
                                  _is_tf32(str(lhs.aval.dtype), eqn.params.get("precision"))))
        elif name in _DATA_MOVEMENT:
            broadcasts += lane_broadcast_vregs(eqn, replicated) if name == "broadcast_in_dim" \
                else 0
        elif name.startswith("reduce_") or name in ("argmax", "argmin", "cumsum", "cumprod",
                                                    "cummax", "cumlogsumexp"):
            flops += int(np.prod(getattr(eqn.invars[0].aval, "shape", ()), dtype=np.int64))
            vregs += _vregs(eqn.invars[0].aval)
        else:
            broadcasts += lane_broadcast_vregs(eqn, replicated)
            for v in eqn.outvars:
                shape = getattr(v.aval, "shape", None)
                if shape is not None and hasattr(v.aval, "dtype"):
                    flops += int(np.prod(shape, dtype=np.int64))
                    vregs += _vregs(v.aval)
    return BodyWork(flops, tuple(matmuls), vregs, broadcasts)
