"""FLOPs of one kernel invocation, counted from the kernel jaxpr."""

from __future__ import annotations

from typing import Any

import numpy as np

from kernelsim.adapter import open_jaxpr
from kernelsim.jaxpr.nesting import sub_jaxprs
from kernelsim.model import Matmul, tile_padded_bytes

_VREG_BYTES = 8 * 128 * 4  # one TPU vector register: 8 sublanes x 128 lanes of 32-bit words


def _vregs(aval: Any) -> int:
    """Vector registers a value of ``aval`` fills as Mosaic lays it out (tile-padded: a
    (512, 1) float32 value fills 64, as (512, 128) would); 0 for a non-array."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
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


def count_flops(jaxpr: Any) -> tuple[int, tuple[Matmul, ...], int]:
    """FLOPs of one kernel invocation, its matmuls, and its vector work: the vector registers
    its arithmetic other than matmuls produces (a reduction: that it reads), tile-padded
    (``_vregs``), the unit of the TPU time model's VPU term.

    dot_general: 2 x output elements x contracted size; other arithmetic: one FLOP per output
    element (reductions: per input element); data movement is free. ``cond`` counts its most
    expensive branch, ``scan`` its body times its length, ``while`` one iteration.
    """
    flops = vregs = 0
    matmuls: list[Matmul] = []
    layouts: dict = {}  # var -> its dimensions' places in the layout it was loaded with
    for eqn in open_jaxpr(jaxpr).eqns:
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn)
        if name == "cond":
            counted = [count_flops(j) for j, _ in subs]
            flops += max((c[0] for c in counted), default=0)
            vregs += max((c[2] for c in counted), default=0)
            matmuls += [m for c in counted for m in c[1]]
            continue
        if subs:
            for j, reps in subs:
                f, ms, v = count_flops(j)
                flops += f * reps
                vregs += v * reps
                matmuls += [Matmul(m.dtype, m.flops * reps, m.k_major, m.tf32) for m in ms]
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
            continue
        elif name.startswith("reduce_") or name in ("argmax", "argmin", "cumsum", "cumprod",
                                                    "cummax", "cumlogsumexp"):
            flops += int(np.prod(getattr(eqn.invars[0].aval, "shape", ()), dtype=np.int64))
            vregs += _vregs(eqn.invars[0].aval)
        else:
            for v in eqn.outvars:
                shape = getattr(v.aval, "shape", None)
                if shape is not None and hasattr(v.aval, "dtype"):
                    flops += int(np.prod(shape, dtype=np.int64))
                    vregs += _vregs(v.aval)
    return flops, tuple(matmuls), vregs
