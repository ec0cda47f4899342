"""What a view reads for one call, and the geometry of drawing an array as blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kernelsim.chips import DEFAULT_CHIP, Chip, get_chip
from kernelsim.cost.estimate import CallCost, compute
from kernelsim.cost.schedule import CallSchedule, build
from kernelsim.model import KernelCall, Operand

if TYPE_CHECKING:
    from kernelsim.trace_data import CallTrace, TraceData


@dataclass
class CallView:
    """One call under one model: the schedule and cost a view draws."""

    index: int
    trace: CallTrace
    model: str
    chip: Chip
    schedule: CallSchedule
    cost: CallCost

    @property
    def call(self) -> KernelCall:
        return self.trace.call


def call_view(t: TraceData, call: int = 0, model: str | None = None) -> CallView:
    """Call ``call`` of ``t``; ``model`` other than the trace's builds that model's schedule
    and cost from the same KernelCall (on the model's default chip)."""
    if not 0 <= call < len(t.calls):
        raise IndexError(f"call {call} out of range: the trace has {len(t.calls)} call(s)")
    ct = t.calls[call]
    if model is None or model == t.model:
        return CallView(call, ct, t.model, t.chip, ct.schedule, ct.cost)
    chip = get_chip(DEFAULT_CHIP[model])
    schedule = build(ct.call, model)  # type: ignore[arg-type]
    return CallView(call, ct, model, chip, schedule, compute(schedule, chip))


def check_step(view: CallView, step: int) -> int:
    n = view.call.steps
    if not -n <= step < n:
        raise IndexError(f"step {step} out of range: call {view.index} has {n} steps")
    return step % n


def panel_dims(op: Operand) -> tuple[int | None, int]:
    """The array axes drawn as (rows, cols): the last two; rank 1 -> (None, 0), one row."""
    nd = len(op.shape)
    if nd == 0:
        return None, -1
    if nd == 1:
        return None, 0
    return nd - 2, nd - 1


def panel_extent(op: Operand) -> tuple[int, int]:
    """(height, width) in elements of the drawn 2-D view of ``op``."""
    r, c = panel_dims(op)
    h = 1 if r is None else op.shape[r]
    w = 1 if c < 0 else op.shape[c]
    return h, w


def block_rects(op: Operand) -> np.ndarray:
    """float [steps, 4]: (x, y, w, h) of the block at every step in the drawn view, clipped
    to the array (x along the last axis, y along the second-to-last)."""
    r, c = panel_dims(op)
    idx = op.block_indices
    h_ext, w_ext = panel_extent(op)
    out = np.zeros((idx.shape[0], 4))
    for k, (axis, extent) in enumerate(((c, w_ext), (r, h_ext))):
        if axis is None or axis < 0:
            out[:, k], out[:, k + 2] = 0, 1
            continue
        dim = op.block_dims[axis]
        start = dim.start(idx[:, axis])
        lo = np.clip(start, 0, extent)
        hi = np.clip(start + dim.size, 0, extent)
        out[:, k], out[:, k + 2] = lo, hi - lo
    return out


def leading(op: Operand, step: int) -> str:
    """Label of the leading (not drawn) block indices at ``step``: '' for rank <= 2."""
    if len(op.shape) <= 2 or op.block_indices is None:
        return ""
    lead = op.block_indices[step, :-2]
    return "[" + ", ".join(str(int(v)) for v in lead) + ", :, :]"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
