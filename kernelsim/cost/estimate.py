"""Stage 3 of kernelsim: bytes, on-chip footprint and a roofline time estimate for one call.

Estimated time (seconds) = max(FLOPs / peak, HBM bytes / bandwidth) + steps x per-step cost
(https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html discusses the per-step overhead).
FLOPs are counted from the kernel jaxpr (dot_general 2*M*N*K, other arithmetic one per element)
at every grid step, each ``pl.when`` at the branch its predicate takes there where kernelsim
can evaluate it (``KernelCall.step_work``), unless the call carries its own
``pl.CostEstimate``. The peak and bandwidth are ``Chip.flops_per_second`` and
``Chip.estimate_bytes_per_second`` (the measured sustained rates where the chip table has
them, float32 matmuls at TF32 on a GPU);
a float32 dot with an operand that is not K-major runs at ``Chip.transposed_tf32_flops`` on
a Hopper GPU (WGMMA reads TF32 operands K-major only; see ``kernelsim.chips``).

GPU model: reads that programs running side by side share come from L2, not HBM
(``kernelsim.cost.l2``); ``OperandCost.l2_hit_bytes`` keeps them, so HBM + L2 is what the programs
load.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from kernelsim.chips import Chip
from kernelsim.cost.l2 import l2_hits, launch_rank
from kernelsim.cost.schedule import FETCH, KEEP, SKIP, WRITEBACK, CallSchedule
from kernelsim.model import OFF_CHIP, KernelCall, Operand


@dataclass(frozen=True)
class OperandCost:
    """Totals for one operand over the whole call (bytes are HBM bytes: the pipeline's copies
    plus the DMAs the kernel body starts to or from this operand). An output's ``fetches``
    are its ``RevisitMode.ANY`` read-backs (none otherwise). l2_hit_bytes: gpu model, an
    input's block reads that L2 serves (left out of ``hbm_read_bytes``; the two together are
    what the programs load)."""

    operand: Operand
    fetches: int
    skips: int
    writebacks: int
    keeps: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    onchip_bytes: int
    buffers: int
    l2_hit_bytes: int = 0

    # The operand's own facts, so a view reads one object per operand.
    name = property(lambda self: self.operand.name)
    role = property(lambda self: self.operand.role)
    shape = property(lambda self: self.operand.shape)
    dtype = property(lambda self: self.operand.dtype)
    block_shape = property(lambda self: self.operand.block_shape)
    memory_space = property(lambda self: self.operand.memory_space)


@dataclass(frozen=True)
class CallCost:
    """Totals for one call.

    onchip_peak_bytes: VMEM + SMEM held at once (the pipeline allocates every buffer for the
        whole call, so the peak is the sum), with the kernel body's ``run_scoped`` allocations
        at their peak (``KernelCall.scoped_vmem_bytes``; emit_pipeline's buffers among them).
        Under the tpu model each buffer is counted with Mosaic's tile padding
        (``model.tile_padded_bytes``: a (20, 100) float32 block takes (24, 128) words).
    body_values_vmem_bytes: tpu model, the kernel body's values Mosaic keeps in VMEM beside
        the buffers at their peak (``KernelCall.body_values_vmem_bytes``); 0 under gpu.
        ``mosaic_vmem_bytes`` adds them to ``vmem_bytes``: what Mosaic's scoped VMEM limit
        is checked against.
    hbm_read_bytes / hbm_write_bytes: in-bounds bytes (edge blocks count only the part inside
        the array; the gpu model leaves out L2 hits, see the module docstring);
        hbm_padded_bytes: reads plus writes with every pipeline copy counted as its whole
        block buffer, as TPU interpret mode copies it (see ``kernelsim.cost.schedule``).
    compute_seconds / memory_seconds: the two roofline terms; estimated_seconds adds the
        overhead to their maximum. On a chip with a fitted TPU time model
        (``Chip.tpu_time_model``) compute is the matmuls at ``Chip.mxu_efficiency`` of the peak
        plus the vector work (``KernelCall.vector_vregs_per_step``) at
        ``Chip.vector_vregs_per_second`` and the lane broadcasts
        (``KernelCall.lane_broadcast_vregs_per_step``) at ``Chip.lane_broadcast_seconds``
        each, over the working steps only (or each step's own, ``KernelCall.step_work``);
        memory is the longer of the reads and the writes (the DMAs move both at once) at
        ``Chip.dma_efficiency`` of the bandwidth; overhead is
        ``Chip.call_seconds`` plus ``per_step_seconds`` per working step and
        ``idle_step_seconds`` per skipped one.
    working_steps: tpu model, the grid steps that do work: where the body's ``pl.when``
        predicates were evaluated (``KernelCall.step_work``), those whose body computes or
        stores an array, else those the schedule takes for working (``working_steps``); all steps
        under gpu.
    own_flops: the FLOPs the kernel jaxpr performs over the call, each step's ``pl.when``
        branches as its predicates decide where kernelsim could evaluate them (``flops`` is
        the ``pl.CostEstimate``'s when the call gives one).
    own_compute_seconds: the compute term from the kernel jaxpr's own FLOP count, whatever a
        ``pl.CostEstimate`` says (``compute_seconds`` when the call gives none);
        ``own_estimated_seconds`` is the estimate with it: what a grader compares, which the
        kernel's author cannot set.
    time_terms: on a chip with a fitted TPU time model, what its constants scale
        (``TimeTerms``; bench/tpu_perf.py --fit refits them); None otherwise.
    """

    operands: list[OperandCost]
    hbm_read_bytes: int
    hbm_write_bytes: int
    hbm_padded_bytes: int
    vmem_bytes: int
    smem_bytes: int
    flops: int
    flops_source: str
    compute_seconds: float
    memory_seconds: float
    overhead_seconds: float
    body_values_vmem_bytes: int = 0
    working_steps: int = 0
    own_compute_seconds: float = 0.0
    time_terms: TimeTerms | None = None
    own_flops: int = 0

    @property
    def mosaic_vmem_bytes(self) -> int:
        """VMEM the kernel needs as Mosaic allocates it: buffers, scratch and the body's kept
        values (bytes)."""
        return self.vmem_bytes + self.body_values_vmem_bytes

    @property
    def l2_hit_bytes(self) -> int:
        """gpu model: the input block reads L2 serves, left out of ``hbm_read_bytes``."""
        return sum(c.l2_hit_bytes for c in self.operands)

    @property
    def onchip_peak_bytes(self) -> int:
        return self.vmem_bytes + self.smem_bytes

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def estimated_seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds) + self.overhead_seconds

    @property
    def own_estimated_seconds(self) -> float:
        return max(self.own_compute_seconds, self.memory_seconds) + self.overhead_seconds

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per HBM byte (0 when nothing moves)."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else 0.0


def _buffers(op: Operand, model: str) -> int:
    """On-chip buffers the pipeline allocates for ``op``."""
    if not op.pipelined and op.role in ("input", "output"):
        return 0
    if op.role in ("scratch", "scalar_prefetch"):
        return 1
    if model == "gpu":
        return 1
    return op.buffer_count


@dataclass(frozen=True)
class VmemLimit:
    """The VMEM a TPU kernel's allocation (``CallCost.mosaic_vmem_bytes``) must fit in, bytes,
    and what sets it: the call's ``vmem_limit_bytes``, else Mosaic's default scoped limit on the
    chip (16 MiB on v5e, measured), else the chip's physical VMEM."""

    bytes: int
    source: str


def vmem_limit(call: KernelCall, chip: Chip) -> VmemLimit:
    """The limit lint warns at and the views draw the footprint against."""
    if call.vmem_limit_bytes is not None:
        return VmemLimit(call.vmem_limit_bytes, "the call's vmem_limit_bytes")
    if chip.default_scoped_vmem_bytes:
        return VmemLimit(chip.default_scoped_vmem_bytes,
                         f"Mosaic's default scoped VMEM limit on {chip.name}")
    return VmemLimit(chip.vmem_bytes, f"{chip.name}'s VMEM")


def compute(schedule: CallSchedule, chip: Chip) -> CallCost:
    """Totals of ``schedule`` and its roofline estimate on ``chip``."""
    call: KernelCall = schedule.call
    by_name = {s.operand.name: s for s in schedule.operands}
    # Kernel-body DMAs: HBM bytes of the operand on the off-chip end of each copy.
    window = chip.sms if schedule.model == "gpu" else 0
    rank = launch_rank(call.grid) if window else None
    body_read: Counter[str] = Counter()
    body_write: Counter[str] = Counter()
    for copy in call.body_copies:
        if copy.src_space in OFF_CHIP:
            body_read[copy.src] += copy.bytes
        if copy.dst_space in OFF_CHIP:
            body_write[copy.dst] += copy.bytes
    costs = []
    for op in call.operands:
        buffers = _buffers(op, schedule.model)
        if schedule.model == "tpu":  # Mosaic pads every VMEM/SMEM buffer to its tiling
            onchip = buffers * op.tile_padded_buffer_bytes
        else:
            onchip = buffers * (op.block_buffer_bytes if op.pipelined else op.nbytes)
        if op.memory_space in ("hbm", "any", "semaphore"):
            onchip = 0
        sched = by_name.get(op.name)
        read, write = body_read[op.name], body_write[op.name]
        if op.role == "scalar_prefetch":
            costs.append(OperandCost(op, 1, 0, 0, 0, op.nbytes, 0, onchip, buffers))
        elif sched is None:
            costs.append(OperandCost(op, 0, 0, 0, 0, read, write, onchip, buffers))
        else:
            restored = int(sched.restored_bytes.sum())  # RevisitMode.ANY read-backs
            moved = int(sched.moved_bytes.sum()) - restored
            hit = (int(sched.block_bytes[l2_hits(op.block_indices, rank, window)].sum())
                   if op.role == "input" and window else 0)
            moved -= hit
            is_in = op.role == "input"
            costs.append(OperandCost(
                op, sched.count(FETCH) + int(sched.restores.sum()), sched.count(SKIP),
                sched.count(WRITEBACK), sched.count(KEEP),
                (moved if is_in else restored) + read, (0 if is_in else moved) + write,
                onchip, buffers, hit))
    read = sum(c.hbm_read_bytes for c in costs)
    write = sum(c.hbm_write_bytes for c in costs)
    edge_padding = sum(int((s.padded_moved_bytes - s.moved_bytes).sum())
                       for s in schedule.operands)
    vmem = call.scoped_vmem_bytes + sum(c.onchip_bytes for c in costs
                                        if c.operand.memory_space == "vmem")
    smem = call.scoped_smem_bytes + sum(c.onchip_bytes for c in costs
                                        if c.operand.memory_space == "smem")
    evaluated = call.step_work is not None and call.step_work.evaluated
    own_flops = int(call.step_work.flops.sum()) if evaluated else call.flops_per_step * call.steps
    if call.cost_estimate_flops is not None:
        flops, source = int(call.cost_estimate_flops), "pl.CostEstimate"
    else:
        flops, source = own_flops, "kernel jaxpr"
    tpu = schedule.model == "tpu"
    working = working_steps(schedule) if tpu else call.steps
    compute = _compute_seconds(call, flops, chip)
    own_compute = _compute_seconds(call, own_flops, chip)
    memory = (read + write) / chip.estimate_bytes_per_second
    overhead = call.steps * chip.per_step_seconds if tpu else 0.0
    terms = None
    if tpu and chip.tpu_time_model:
        # the chip's DMAs read and write HBM at once: on the v5e a softmax that reads and
        # writes 64 MiB took the device time of a row sum that only reads them (0.102 and
        # 0.094 ms, bench/recorded/tpu_perf_model-v5e.json), so the longer direction counts
        memory = max(read, write) / chip.estimate_bytes_per_second
        # the kernel's own work over its working steps, whatever a pl.CostEstimate says: a
        # count for the whole call cannot tell which steps the body skips (JAX's causal
        # flash attention gives the FLOPs of its plain-JAX reference, every score of the
        # N x N matrix, twice what its kernel multiplies; the v5e measured 0.36-0.44 of the
        # estimate that believed it, bench/recorded/tpu_perf-v5e.json)
        if evaluated:  # each step's work as its pl.when predicates decide it
            sw = call.step_work
            # a body that neither computes nor stores works where the schedule says it does
            working = int(np.count_nonzero(sw.computes)) if sw.computes.any() else working
            terms = TimeTerms(own_compute, int(sw.vector_vregs.sum()),
                              int(sw.lane_broadcast_vregs.sum()), working,
                              call.steps - working, memory)
        else:  # the same work at every step the schedule takes for a working one
            share = working / call.steps if call.steps else 1.0
            terms = TimeTerms(own_compute * share, working * call.vector_vregs_per_step,
                              working * call.lane_broadcast_vregs_per_step, working,
                              call.steps - working, memory)
        compute, memory, overhead = fitted_seconds(terms, TimeConstants.of(chip))
        own_compute = compute
    return CallCost(costs, read, write, read + write + edge_padding, vmem, smem, flops, source,
                    compute, memory, overhead,
                    call.body_values_vmem_bytes if tpu else 0, working, own_compute, terms,
                    own_flops)


@dataclass(frozen=True)
class TimeTerms:
    """What the fitted TPU time model (``fitted_seconds``) scales by its constants, for one
    call, or for many as numpy arrays (the fit in bench/tpu_perf.py --fit).

    matmul_seconds: the FLOPs of the working steps at the chip's peak, seconds.
    vector_vregs: tile-padded vector registers produced over the working steps.
    lane_broadcast_vregs: column vregs broadcast across the lanes over the working steps.
    working_steps / idle_steps: grid steps that do work and that are skipped
        (``working_steps``).
    dma_seconds: the HBM bytes of the longer direction (reads or writes: the DMAs run both at
        once) at the chip's bandwidth, seconds.
    """

    matmul_seconds: Any
    vector_vregs: Any
    lane_broadcast_vregs: Any
    working_steps: Any
    idle_steps: Any
    dma_seconds: Any


@dataclass(frozen=True)
class TimeConstants:
    """The fitted TPU time model's constants (``Chip``'s fields of the same names and units)."""

    call_seconds: float
    per_step_seconds: float
    idle_step_seconds: float
    mxu_efficiency: float
    vector_vregs_per_second: float
    lane_broadcast_seconds: float
    dma_efficiency: float

    @classmethod
    def of(cls, chip: Chip) -> TimeConstants:
        return cls(*(getattr(chip, f.name) for f in fields(cls)))


def fitted_seconds(t: TimeTerms, k: TimeConstants) -> tuple[Any, Any, Any]:
    """(compute, memory, overhead) seconds of the fitted TPU time model: the matmuls at
    ``mxu_efficiency`` of the peak plus the vector work and the lane broadcasts, the DMAs at
    ``dma_efficiency`` of the bandwidth, a cost per call, per working step and per skipped
    step. The estimate is max(compute, memory) + overhead (``CallCost.estimated_seconds``)."""
    compute = (np.maximum(t.matmul_seconds / k.mxu_efficiency,
                          t.vector_vregs / k.vector_vregs_per_second)
               + t.lane_broadcast_vregs * k.lane_broadcast_seconds)
    memory = t.dma_seconds / k.dma_efficiency
    overhead = (k.call_seconds + t.working_steps * k.per_step_seconds
                + t.idle_steps * k.idle_step_seconds)
    return compute, memory, overhead


def working_steps(schedule: CallSchedule) -> int:
    """Grid steps that do work, as the schedule suggests them: all but those where no
    pipelined input block is fetched and every output keeps its block -- the steps a kernel
    skips by repeating the last block it needs in its index maps (no DMA) and
    ``pl.when``-ing its body away, as a causal attention does above the diagonal. A kernel
    without pipelined inputs works at every step. (Where the body's ``pl.when`` predicates
    are evaluated, ``compute`` counts the steps that compute instead.)"""
    call = schedule.call
    inputs = [s for s in schedule.operands if s.operand.role == "input"]
    if not inputs or not call.steps:
        return call.steps
    works = np.zeros(call.steps, bool)
    works[0] = True
    for s in inputs:
        works |= s.actions == FETCH
    for s in schedule.operands:
        if s.operand.role == "output":
            index = s.operand.block_indices
            works[1:] |= np.any(index[1:] != index[:-1], axis=1)
    return int(np.count_nonzero(works))


def _compute_seconds(call: KernelCall, flops: int, chip: Chip) -> float:
    """``flops`` at the rate of the kernel's matmul dtypes (on a TPU, each matmul's dtype and
    precision, ``Chip.matmul_flops_per_second``, weighted by its FLOPs), except the share of
    its matmuls that transpose an operand in registers (``Chip.transposes_in_registers``),
    which runs at ``Chip.transposed_tf32_flops``. The shares are by the kernel jaxpr's count,
    so they hold for a ``pl.CostEstimate`` total too."""
    matmul_flops = sum(m.flops for m in call.matmuls)
    if chip.kind == "tpu" and matmul_flops:
        rate = matmul_flops / sum(m.flops / chip.matmul_flops_per_second(m)
                                  for m in call.matmuls)
    else:
        rate = chip.flops_per_second(call.matmul_dtypes)
    slow = sum(m.flops for m in call.matmuls if chip.transposes_in_registers(m))
    if not slow or not call.flops_per_step:
        return flops / rate
    share = flops * min(1.0, slow / call.flops_per_step)
    return (flops - share) / rate + share / chip.transposed_tf32_flops
