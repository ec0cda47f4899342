"""Warnings about a call's shape that a real backend would reject or run badly.

Each message names the operand and the rule; the rules' sources:
- (8, 128) tiling: https://docs.jax.dev/en/latest/pallas/tpu/details.html ("Block shapes")
- parallel after arbitrary, output revisits: same page, "Multicore / Pipelining" sections, and
  the TPU interpreter's revisit check (jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py).
"""

from __future__ import annotations

import numpy as np

from kernelsim.chips import Chip
from kernelsim.cost import CallCost
from kernelsim.model import KernelCall, Operand
from kernelsim.schedule import CallSchedule


def _tiling(op: Operand) -> str | None:
    """The (8, 128) rule for the last two block dims on TPU; None when it holds."""
    dims = op.block_dims or ()
    problems = []
    for dim, extent, multiple, pos in zip(dims[::-1][:2], op.shape[::-1][:2], (128, 8),
                                          ("last", "second-to-last"), strict=False):
        if dim.kind == "squeezed":
            continue
        if dim.size % multiple and dim.size != extent:
            problems.append(f"{pos} dim {dim.size} is neither a multiple of {multiple} "
                            f"nor the array's {extent}")
    if not problems:
        return None
    return (f"operand {op.name!r}: block {op.block_shape} breaks TPU's (8, 128) tiling rule: "
            + "; ".join(problems) + ". Mosaic will reject this block shape.")


def _revisits(op: Operand) -> list[int]:
    """Block indices of ``op`` (by step) that come back after another block was visited."""
    starts = op.block_indices
    change = np.flatnonzero(np.any(starts[1:] != starts[:-1], axis=1)) + 1
    runs = np.concatenate([[0], change])
    seen: dict[tuple, int] = {}
    steps = []
    for first in runs:
        key = tuple(starts[first])
        if key in seen:
            steps.append(int(first))
        seen[key] = int(first)
    return steps


def lint(call: KernelCall, schedule: CallSchedule, cost: CallCost, chip: Chip) -> list[str]:
    """Every warning for ``call`` on ``chip`` under its schedule's model."""
    warnings = []
    tpu = schedule.model == "tpu"
    capacity = chip.vmem_bytes
    if cost.vmem_bytes > capacity:
        warnings.append(
            f"on-chip footprint {cost.vmem_bytes:,} B exceeds {chip.name}'s "
            f"{'VMEM' if tpu else 'shared memory'} of {capacity:,} B: use smaller blocks.")
    if tpu and chip.smem_bytes and cost.smem_bytes > chip.smem_bytes:
        warnings.append(f"SMEM footprint {cost.smem_bytes:,} B exceeds {chip.name}'s "
                        f"{chip.smem_bytes:,} B: prefetch fewer scalars.")
    sem = call.dimension_semantics
    if tpu and "arbitrary" in sem:
        first_arbitrary = sem.index("arbitrary")
        late = [i for i, s in enumerate(sem) if "parallel" in s and i > first_arbitrary]
        if late:
            warnings.append(
                f"grid axis {late[0]} is {sem[late[0]]!r} but comes after 'arbitrary' axis "
                f"{first_arbitrary}: parallel axes must be a prefix of the grid "
                "(dimension_semantics=" + repr(sem) + ").")
    for op in call.operands:
        if op.role in ("input", "output") and op.memory_space in ("any", "hbm"):
            warnings.append(f"operand {op.name!r} stays in {op.memory_space.upper()}: the "
                            "pipeline copies nothing for it; manual DMAs in the kernel body "
                            "are not counted.")
        if not op.pipelined:
            continue
        if tpu and op.memory_space == "vmem" and (msg := _tiling(op)):
            warnings.append(msg)
        if op.role == "output" and (steps := _revisits(op)):
            block = tuple(int(v) for v in op.block_indices[steps[0]])
            warnings.append(
                f"output {op.name!r} revisits block {block} non-consecutively (first again at "
                f"step {steps[0]}, {len(steps)} revisit(s)): "
                "TPU writes a block back when its index changes, so the revisit overwrites it "
                "with a partial result. Make the reduction axis the innermost grid axis.")
    return warnings
