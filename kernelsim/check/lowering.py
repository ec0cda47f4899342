"""What the real TPU and GPU lowerings say about a program, on any machine."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from kernelsim.adapter import abstract_mesh, triton_for_gpu_pallas_call


def tpu_lowering_error(fn: Callable, args: tuple, device_kind: str) -> str | None:
    """The error JAX's Mosaic TPU lowering raises for ``fn(*args)``, or None if it lowers.

    Runs JAX's own lowering for platform "tpu" (``jax.export``) under an abstract mesh whose
    device is ``device_kind`` (e.g. "TPU v5e"), so rules that depend on the chip apply; no TPU
    is needed and nothing executes. Compiling (Mosaic's own passes) is not part of this.
    """
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    try:
        with jax.sharding.use_abstract_mesh(abstract_mesh(device_kind)):
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
    try:
        with (jax.sharding.use_abstract_mesh(abstract_mesh(device_kind, "gpu")),
              triton_for_gpu_pallas_call()):
            jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    except Exception as err:  # noqa: BLE001 - every lowering failure is the answer
        return f"{type(err).__name__}: {err}"
    return None
