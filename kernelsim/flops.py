"""FLOPs of one kernel invocation, counted from the kernel jaxpr."""

from __future__ import annotations

from typing import Any

import numpy as np

from kernelsim.adapter import open_jaxpr
from kernelsim.jaxprs import sub_jaxprs

_DATA_MOVEMENT = frozenset({
    "get", "swap", "program_id", "num_programs", "broadcast_in_dim", "reshape", "squeeze",
    "expand_dims", "transpose", "convert_element_type", "iota", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p", "select_n", "rev",
    "bitcast_convert_type", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
    "semaphore_read", "gather", "scatter", "device_id", "load", "store", "masked_load",
    "masked_swap", "multiple_of", "pjit_dce", "optimization_barrier", "stop_gradient",
})


def count_flops(jaxpr: Any) -> tuple[int, tuple[str, ...]]:
    """FLOPs of one kernel invocation and the input dtypes of its matmuls.

    dot_general: 2 x output elements x contracted size; other arithmetic: one FLOP per output
    element (reductions: per input element); data movement is free. ``cond`` counts its most
    expensive branch, ``scan`` its body times its length, ``while`` one iteration.
    """
    flops = 0
    dtypes: list[str] = []
    for eqn in open_jaxpr(jaxpr).eqns:
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn)
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
