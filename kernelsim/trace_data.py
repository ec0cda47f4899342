"""What a trace holds: one call's model, schedule, cost and warnings (``CallTrace``), and the
calls one function reached under one model and chip (``TraceData``), as every view reads them.

``kernelsim.trace.Trace`` is a ``TraceData`` with its views (``summary``, ``figure``, ``show``,
...); a view (``kernelsim.views``, ``kernelsim.views.report``) is handed one and reads it here, and
never imports the tracer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernelsim import timing
from kernelsim.access import AccessLog, PrefetchReads
from kernelsim.chips import Chip
from kernelsim.cost.estimate import CallCost, OperandCost
from kernelsim.cost.schedule import CallSchedule, Model, StepEvent
from kernelsim.memories import memory_spaces
from kernelsim.model import BodyCopy, KernelCall, MeshDevice


@dataclass
class CallTrace:
    """Everything kernelsim knows about one pallas_call: model, schedule, cost and warnings.

    prefetch_reads: per scalar-prefetch operand, the entries the index maps read per step.
    accesses: the kernel body's ref reads and writes per step (``record_access=True``).
    measured: the call timed on the device (``run(..., measure=True)``; ``timing.Measurement``,
        seconds), or why it was not; None when not asked.
    """

    call: KernelCall
    schedule: CallSchedule
    cost: CallCost
    warnings: list[str]
    prefetch_reads: dict[str, PrefetchReads] = field(default_factory=dict)
    accesses: AccessLog | None = None
    measured: timing.Measurement | None = None

    name = property(lambda self: self.call.name)
    grid = property(lambda self: self.call.grid)
    steps = property(lambda self: self.call.steps)
    dimension_semantics = property(lambda self: self.call.dimension_semantics)
    operands = property(lambda self: self.cost.operands)
    hbm_read_bytes = property(lambda self: self.cost.hbm_read_bytes)
    hbm_write_bytes = property(lambda self: self.cost.hbm_write_bytes)
    onchip_peak_bytes = property(lambda self: self.cost.onchip_peak_bytes)
    flops = property(lambda self: self.cost.flops)
    estimated_seconds = property(lambda self: self.cost.estimated_seconds)
    own_estimated_seconds = property(lambda self: self.cost.own_estimated_seconds)
    own_flops = property(lambda self: self.cost.own_flops)

    @property
    def work_unevaluated(self) -> tuple[str, ...]:
        """Why some of the body's ``pl.when`` work is counted at every step: each predicate
        kernelsim could not evaluate per grid step (``kernelsim.model.StepWork``)."""
        return () if self.call.step_work is None else self.call.step_work.unevaluated

    @property
    def cost_estimate(self) -> dict[str, int] | None:
        """The call's own ``pl.CostEstimate`` (flops, bytes_accessed, transcendentals,
        remote_bytes_transferred), or None."""
        c = self.call
        if c.cost_estimate_flops is None:
            return None
        return {"flops": c.cost_estimate_flops, "bytes_accessed": c.cost_estimate_bytes,
                "transcendentals": c.cost_estimate_transcendentals,
                "remote_bytes_transferred": c.cost_estimate_remote_bytes}

    @property
    def measured_over_estimated(self) -> float | None:
        """The measured time over the estimate (both in seconds); None without a measured
        time."""
        if self.measured is None or self.measured.seconds is None or not self.estimated_seconds:
            return None
        return self.measured.seconds / self.estimated_seconds

    def operand(self, name: str) -> OperandCost:
        """The operand called ``name`` (the kernel's parameter name, e.g. ``"x_ref"``)."""
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(f"call {self.name!r} has no operand {name!r}; it has "
                       f"{[o.name for o in self.operands]}")

    def to_dict(self) -> dict[str, Any]:
        c = self.cost
        return {
            "name": self.name, "grid": list(self.grid), "steps": self.steps,
            "dimension_semantics": list(self.dimension_semantics),
            "operands": [{
                "name": o.name, "role": o.role, "shape": list(o.shape), "dtype": o.dtype,
                "block_shape": None if o.block_shape is None else list(o.block_shape),
                "memory_space": o.memory_space, "buffers": o.buffers,
                "fetches": o.fetches, "skips": o.skips, "writebacks": o.writebacks,
                "keeps": o.keeps, "hbm_read_bytes": o.hbm_read_bytes,
                "hbm_write_bytes": o.hbm_write_bytes, "onchip_bytes": o.onchip_bytes,
            } for o in self.operands],
            "hbm_read_bytes": c.hbm_read_bytes, "hbm_write_bytes": c.hbm_write_bytes,
            "hbm_padded_bytes": c.hbm_padded_bytes, "onchip_peak_bytes": c.onchip_peak_bytes,
            "vmem_bytes": c.vmem_bytes,
            "body_values_vmem_bytes": c.body_values_vmem_bytes,
            "mosaic_vmem_bytes": c.mosaic_vmem_bytes,
            "smem_bytes": c.smem_bytes, "flops": c.flops, "flops_source": c.flops_source,
            "own_flops": self.own_flops, "cost_estimate": self.cost_estimate,
            "compute_seconds": c.compute_seconds, "memory_seconds": c.memory_seconds,
            "overhead_seconds": c.overhead_seconds, "estimated_seconds": c.estimated_seconds,
            "own_estimated_seconds": c.own_estimated_seconds,
            "device": device_dict(self.call.device),
            "body_dmas": [body_dma_dict(c) for c in self.call.body_copies],
            "warnings": list(self.warnings),
            "work_unevaluated": list(self.work_unevaluated),
            "measured": None if self.measured is None else self.measured.to_dict(),
            "measured_over_estimated": self.measured_over_estimated,
        }


def device_dict(device: MeshDevice | None) -> dict[str, Any] | None:
    """A call's mesh device in ``to_dict``: its id and its coordinate per mesh axis; None
    outside a ``shard_map``."""
    if device is None:
        return None
    return {"id": device.id, "coords": dict(zip(device.axes, device.coords, strict=True))}


def body_dma_dict(copy: BodyCopy) -> dict[str, Any]:
    """One body DMA in ``to_dict``: operand names and memory spaces of both ends, bytes, the
    slice of each end (per dimension ``[start, size, stride]`` in elements, None if not one
    box), the semaphore it signals, and the grid step and body position (the order of DMA
    starts and waits within that step, from 0) where it starts and where it is waited on
    (``wait_step``/``wait_pos`` None: never waited on in the kernel); for a kernel in a
    ``shard_map``, the device it reads from and the one it writes (``src_device``,
    ``dst_device``; they differ for a remote copy), else None."""
    def box(s):
        return None if s is None else [list(d) for d in s]

    return {"src": copy.src, "dst": copy.dst, "src_space": copy.src_space,
            "dst_space": copy.dst_space, "bytes": copy.bytes, "src_slice": box(copy.src_slice),
            "dst_slice": box(copy.dst_slice), "semaphore": copy.semaphore,
            "start_step": copy.step, "start_pos": copy.start_pos, "wait_step": copy.wait_step,
            "wait_pos": copy.wait_pos, "src_device": copy.src_device,
            "dst_device": copy.dst_device}


@dataclass
class TraceData:
    """The pallas_calls one function reached, in program order, under one model and chip: what
    every view reads (``kernelsim.trace.Trace`` adds the views)."""

    model: Model
    chip: Chip
    calls: list[CallTrace]

    def steps(self, call: int = 0) -> list[StepEvent]:
        """Per-step events of call number ``call``: step, grid index, operand, block, action
        (the pipeline's copies; the DMAs the body starts itself are ``body_dmas``)."""
        return self.calls[call].schedule.events()

    def body_dmas(self, call: int = 0) -> list[BodyCopy]:
        """The DMAs call number ``call``'s body starts, in start order, each with the step and
        body position where it starts and where it is waited on (``model.BodyCopy``)."""
        return list(self.calls[call].call.body_copies)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable counts, bytes and estimates of every call."""
        return {"model": self.model, "chip": self.chip.name,
                "memory_spaces": memory_spaces(self.model),
                "calls": [c.to_dict() for c in self.calls]}
