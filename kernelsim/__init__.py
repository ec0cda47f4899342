"""kernelsim: which blocks a pallas_call moves between HBM and on-chip memory, step by step.

Data flows one way through its rooms: ``find`` (each kernel call as a ``model.KernelCall``:
grid, operands, index maps) -> ``body`` (the body's accesses and DMAs) -> ``cost`` (per-step
events, bytes, footprint, roofline) -> ``views``. ARCHITECTURE.md maps every module.
"""

from kernelsim import backend, chips, gpu, timing
from kernelsim.cost.schedule import StepEvent
from kernelsim.errors import TraceError
from kernelsim.trace import CallTrace, Trace, gpu_lowering_error, run, tpu_lowering_error, trace


def compare(*traces: Trace, labels: list[str] | None = None, call: int = 0):
    """Traces side by side: ``str()`` is a table of totals and estimates, ``.figure()`` a plot."""
    from kernelsim.views.compare import compare as _compare  # matplotlib: on the first compare

    return _compare(*traces, labels=labels, call=call)


__all__ = ["CallTrace", "StepEvent", "Trace", "TraceError", "backend", "chips", "compare", "gpu",
           "gpu_lowering_error", "run", "timing", "tpu_lowering_error", "trace"]
