"""What kernelsim knows of one Mosaic GPU kernel (``kernelsim.gpu``'s walk of one CTA): its
allocations, its events in program order and the launch's totals, as the viewer reads them.

``kernelsim.gpu.GpuKernel`` is a ``GpuKernelData`` with its viewer (``show``, ``to_html``); the
viewer (``kernelsim.views.viewer``) is handed one and never imports the walk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The memory spaces of the GPU model, as a view names them (id -> display name).
MEMORY_SPACES = (("gmem", "global memory"), ("smem", "shared memory"), ("regs", "registers"))

EVENT_KINDS = ("tma_load", "tma_store", "barrier_wait", "barrier_arrive", "wgmma", "wgmma_wait",
               "commit_smem", "wait_tma_store", "load", "store")


@dataclass(frozen=True)
class Allocation:
    """One buffer the kernel body allocates (``scratch_types`` or a ``pl.run_scoped``):
    ``space`` "smem", "regs" (a WGMMA accumulator) or "barrier"; bytes as allocated
    (SMEM rounded up to 1024)."""

    name: str
    space: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int


@dataclass(frozen=True)
class WgmmaOperand:
    """How a WGMMA reads one operand (``name`` "a" or "b"): from registers, or from shared
    memory through its transforms -- the swizzle in bytes (0: none), the tiling (``()``: none),
    read transposed (a ``.T`` on the ref); ``itemsize`` in bytes per element."""

    name: str
    in_registers: bool
    swizzle: int
    tiling: tuple[int, ...]
    transposed: bool
    itemsize: int


@dataclass(frozen=True)
class GpuEvent:
    """One thing one CTA's warpgroup does, in program order.

    kind: one of ``EVENT_KINDS``. ``tma_load``/``tma_store`` move ``bytes`` between global
    and shared memory (``src``/``dst`` name the refs, ``barrier`` the barrier a load completes
    on); ``load``/``store`` move them between global memory and registers; ``barrier_wait``
    waits on ``barrier``; ``wgmma`` performs ``flops``. step: the iteration of each enclosing
    loop (outermost first; ``()`` outside loops); loop: which loop of the body, numbered in
    program order from 0 (-1 outside loops; ``emit_pipeline``'s prologue, which fills the
    first slots, is one loop and its steady state the next). conditional: under a branch
    whose predicate kernelsim could not evaluate (the event is listed as if the branch ran).
    A ``wgmma`` also says how it reads its operands (``operands``) and which WGMMA onto its
    accumulator it is since the accumulator was allocated or stored to (``accumulation``: 1 for
    the first, which adds onto a fresh one).
    """

    order: int
    warpgroup: int
    kind: str
    step: tuple[int, ...] = ()
    loop: int = -1
    src: str = ""
    dst: str = ""
    barrier: str = ""
    bytes: int = 0
    flops: int = 0
    conditional: bool = False
    operands: tuple[WgmmaOperand, ...] = ()
    accumulation: int = 0


@dataclass
class GpuKernelData:
    """One Mosaic GPU kernel: its launch, one CTA's events and the whole launch's totals
    (``kernelsim.gpu.GpuKernel`` adds its viewer).

    grid: the CUDA grid (CTAs); num_threads: warpgroups per CTA. events: CTA ``cta``'s events
    (every warpgroup's). smem_bytes: shared memory the lowering allocates per CTA (see the
    module docstring). gmem_read_bytes / gmem_write_bytes / flops: for the whole launch, CTA
    ``cta``'s counts times the number of CTAs (the CTAs of the kernels modelled do equal work),
    reads from HBM only (``kernelsim.cost.l2.wave_read_bytes``); gmem_load_bytes: L2 hits included.
    chip: the chip (``kernelsim.chips``) it was modelled on.
    """

    name: str
    grid: tuple[int, ...]
    grid_names: tuple[str, ...]
    num_threads: int
    cta: tuple[int, ...]
    allocations: list[Allocation]
    smem_bytes: int
    barriers: int
    events: list[GpuEvent]
    events_dropped: int
    gmem_read_bytes: int
    gmem_write_bytes: int
    flops: int
    compute_seconds: float
    memory_seconds: float
    warnings: list[str] = field(default_factory=list)
    chip: str = "h100"
    gmem_load_bytes: int = 0

    @property
    def ctas(self) -> int:
        return math.prod(self.grid)

    @property
    def estimated_seconds(self) -> float:
        """Roofline: max(FLOPs / peak, global-memory bytes / bandwidth), seconds."""
        return max(self.compute_seconds, self.memory_seconds)

    def count(self, kind: str) -> int:
        return sum(e.kind == kind for e in self.events)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "backend": "mosaic_gpu", "chip": self.chip, "grid": list(self.grid),
            "grid_names": list(self.grid_names), "num_threads": self.num_threads,
            "cta": list(self.cta),
            "memory_spaces": [{"id": i, "name": n} for i, n in MEMORY_SPACES],
            "allocations": [{"name": a.name, "space": a.space, "shape": list(a.shape),
                             "dtype": a.dtype, "bytes": a.bytes} for a in self.allocations],
            "smem_bytes": self.smem_bytes, "barriers": self.barriers,
            "events": [{"order": e.order, "warpgroup": e.warpgroup, "kind": e.kind,
                        "step": list(e.step), "loop": e.loop, "src": e.src, "dst": e.dst,
                        "barrier": e.barrier, "bytes": e.bytes, "flops": e.flops,
                        "conditional": e.conditional} for e in self.events],
            "events_dropped": self.events_dropped,
            "gmem_read_bytes": self.gmem_read_bytes, "gmem_write_bytes": self.gmem_write_bytes,
            "gmem_load_bytes": self.gmem_load_bytes,
            "flops": self.flops, "compute_seconds": self.compute_seconds,
            "memory_seconds": self.memory_seconds,
            "estimated_seconds": self.estimated_seconds, "warnings": list(self.warnings),
        }
