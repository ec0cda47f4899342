"""kernelsim: which blocks a pallas_call moves between HBM and on-chip memory, step by step.

Data flows one way: captured ``pallas_call`` -> ``model`` (grid, operands, index maps) ->
``schedule`` (per-step events) -> ``cost`` (bytes, footprint, roofline) -> views.
"""

from kernelsim import backend, chips
from kernelsim.errors import TraceError
from kernelsim.schedule import StepEvent
from kernelsim.trace import CallTrace, Trace, run, trace

__all__ = ["CallTrace", "StepEvent", "Trace", "TraceError", "backend", "chips", "run", "trace"]
