"""Decide, per kernel, whether a pallas_call compiles for the present backend or runs interpreted.

Pallas compiles for TPU (Mosaic) and GPU; on a CPU-only machine every kernel runs in interpret
mode. Two interpreters exist (https://docs.jax.dev/en/latest/pallas/tpu/details.html and the
``interpret`` argument of ``pl.pallas_call``):

* ``interpret=True`` -- a jitted loop over the grid; no memory spaces, no DMA model. Fast.
* ``interpret=pltpu.InterpretParams()`` -- the TPU interpreter: simulates HBM, VMEM, SMEM,
  semaphores and the pipeline's DMAs (skipping unchanged input blocks). Needed on the CPU for
  kernels that use TPU-only features (manual async copies, semaphores, SMEM refs), and slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
from jax.experimental.pallas import tpu as pltpu

from kernelsim.adapter import RUNNING_JAX, SUPPORTED_JAX


class NeedsNewerJax(NotImplementedError):
    """An API the running JAX release lacks; the message names a release that has it. Not the
    caller's mistake: a lesson's cell or a learner's check that raises it needs another JAX."""


def newer_api(module: Any, name: str) -> Any:
    """``module.name``, or, where the running JAX lacks it, ``NeedsNewerJax`` saying which
    release has it (what does not use it still runs)."""
    if hasattr(module, name):
        return getattr(module, name)
    raise NeedsNewerJax(
        f"{module.__name__}.{name} is not in JAX {RUNNING_JAX}: this needs a newer "
        f"release, such as JAX {SUPPORTED_JAX[-1]}, which the course is checked against "
        "(jax 0.10.2 is the last release for Python 3.11: a newer one needs Python 3.12 or "
        "newer)")


@dataclass(frozen=True)
class Execution:
    """How one kernel will run: the value for ``pallas_call(interpret=...)`` and a label."""

    interpret: Any
    label: str

    def __str__(self) -> str:
        return self.label


def platform() -> str:
    """The default JAX backend: ``"cpu"``, ``"gpu"`` or ``"tpu"``."""
    return jax.default_backend()


def choose(tpu_features: bool = False, gpu_ok: bool = True, tpu_ok: bool = True) -> Execution:
    """Pick how a kernel runs here.

    tpu_features: the kernel uses TPU-only features (VMEM/SMEM scratch, scalar prefetch, manual
        DMAs and semaphores, ``pltpu.CompilerParams``); on a GPU it must be interpreted.
    gpu_ok: the kernel's block shapes and ops are supported by the GPU lowering.
    tpu_ok: the same for the TPU's (Mosaic); False for a kernel written for a GPU's blocks
        (assignment 11's: a 64-column slice of K failed Mosaic's alignment, E2003, on a TPU
        v5e), which then runs interpreted on a TPU.
    """
    backend = platform()
    if backend == "tpu" and not tpu_ok:
        return Execution(True, "interpret mode (a kernel for a GPU's blocks)")
    if backend == "tpu":
        return Execution(False, "compiled for TPU (Mosaic)")
    if backend == "gpu" and gpu_ok and not tpu_features:
        return Execution(False, "compiled for GPU")
    if tpu_features:
        return Execution(pltpu.InterpretParams(), f"TPU interpret mode on {backend.upper()}")
    return Execution(True, f"interpret mode on {backend.upper()}")


def gpu_interpret(interpret: Any = None) -> Any:
    """``plgpu.kernel(interpret=...)`` for a Mosaic GPU kernel, from the course's ``interpret``
    (an ``Execution``'s): ``True`` is GPU interpret mode (``plgpu.InterpretGPUParams()``:
    ``pallas_call``'s plain interpreter cannot resolve a Mosaic GPU grid's axis names),
    ``False`` compiled, an ``InterpretGPUParams`` itself; ``None`` (the default) what this
    machine needs, compiled on a GPU and interpreted anywhere else. ``NeedsNewerJax`` on a
    release without GPU interpret mode (jax 0.10.2, a TPU runtime's)."""
    if interpret is None:
        interpret = platform() != "gpu"
    if interpret is not True:
        return interpret or None
    from jax.experimental.pallas import mosaic_gpu as plgpu  # a second: Mosaic GPU kernels only

    return newer_api(plgpu, "InterpretGPUParams")()


# The TensorCores TPU interpret mode simulates for a "core_parallel" grid axis where there is no
# TPU: two, the split between two cores the course teaches (lesson 13, assignment 12).
INTERPRETED_TENSORCORES = 2


def tensorcores() -> int:
    """TensorCores one device of the present TPU drives, the size a ``pltpu.CORE_PARALLEL``
    grid axis must have to compile: ``pltpu.get_tpu_info().num_cores``, which reads the
    device (1 on v5e and v6e, measured 1 on a TPU v5e with jax 0.10.2; 2 on a megacore v4 or
    v5p; jax/_src/tpu_info.py). Off a TPU, ``INTERPRETED_TENSORCORES``: kernels run in TPU
    interpret mode there, which simulates as many cores as the axis has."""
    if platform() != "tpu":
        return INTERPRETED_TENSORCORES
    return int(pltpu.get_tpu_info().num_cores)
