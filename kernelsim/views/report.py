"""Text view of a Trace: one table per call, and optionally its first and last steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelsim.trace_data import CallTrace, TraceData


def _shape(shape) -> str:
    return "(" + ", ".join("None" if s is None else str(s) for s in shape) + ")"


def seconds(s: float) -> str:
    """Seconds with a unit a person reads at a glance."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def table(rows: list[list[str]]) -> str:
    """Left-aligned text columns; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def measured_line(c: CallTrace, chip: str) -> str:
    """The call's measured time beside its estimate on ``chip`` (``run(..., measure=True)``),
    or why it was not measured; "" when no measurement was asked for."""
    m = c.measured
    if m is None:
        return ""
    if m.seconds is None:
        return f"not measured: {m.note}"
    return (f"measured {seconds(m.seconds)} on {m.device} · estimated "
            f"{seconds(c.estimated_seconds)} on {chip} ({c.measured_over_estimated:.2f}x the "
            f"estimate); device time, {m.loop_calls} calls in one jitted loop, median of "
            f"{m.repeats}; dispatched one by one from Python {seconds(m.dispatched_seconds)} "
            "per call")


def call_summary(t: TraceData, index: int, steps: int = 0) -> str:
    c: CallTrace = t.calls[index]
    cost = c.cost
    semantics = ", ".join(c.dimension_semantics) or "-"
    count = f"{c.steps:,} step{'s' if c.steps != 1 else ''}"
    grid = f"grid {_shape(c.grid)} = {count}" if c.grid else f"no grid: {count}"
    head = (f"call {index}: {c.name!r}  {grid}  "
            f"semantics {semantics}  model {t.model} on {t.chip.name}")
    if c.call.device is not None:
        where = ", ".join(f"{a}={i}" for a, i in zip(c.call.device.axes, c.call.device.coords,
                                                      strict=True))
        head += f"  on device {c.call.device.id} ({where})"
    rows = [["operand", "role", "shape", "dtype", "block", "space", "bufs", "fetches", "skips",
             "writebacks", "HBM read B", "HBM write B", "on-chip B"]]
    for o in c.operands:
        rows.append([o.name, o.role, _shape(o.shape), o.dtype,
                     "-" if o.block_shape is None else _shape(o.block_shape), o.memory_space,
                     str(o.buffers), f"{o.fetches:,}", f"{o.skips:,}", f"{o.writebacks:,}",
                     f"{o.hbm_read_bytes:,}", f"{o.hbm_write_bytes:,}", f"{o.onchip_bytes:,}"])
    bound = "compute" if cost.compute_seconds >= cost.memory_seconds else "memory"
    padded = (f"; {cost.hbm_padded_bytes:,} B with edge blocks padded"
              if cost.hbm_padded_bytes != cost.hbm_bytes else "")
    lines = [head, table(rows),
             f"HBM traffic {cost.hbm_bytes:,} B (read {cost.hbm_read_bytes:,}, write "
             f"{cost.hbm_write_bytes:,}{padded}); on-chip peak {cost.onchip_peak_bytes:,} B "
             f"(VMEM {cost.vmem_bytes:,}, SMEM {cost.smem_bytes:,})",
             f"{cost.flops:,} FLOPs ({cost.flops_source}); arithmetic intensity "
             f"{cost.arithmetic_intensity:.3g} FLOP/B (ridge {t.chip.ridge_flops_per_byte:.0f})",
             f"estimate {seconds(cost.estimated_seconds)} = max(compute "
             f"{seconds(cost.compute_seconds)}, memory {seconds(cost.memory_seconds)}) + "
             f"overhead {seconds(cost.overhead_seconds)}  [{bound}-bound]"]
    measured = measured_line(c, t.chip.name)
    if measured:
        lines.append(measured)
    remote = [d for d in c.call.body_copies if d.remote]
    if remote:
        lines.append(f"remote copies: {len(remote)}, {sum(d.bytes for d in remote):,} B sent; "
                     + "; ".join(f"step {d.step}: {d.bytes:,} B device {d.src_device} -> "
                                 f"{d.dst_device}" for d in remote[:8])
                     + ("; ..." if len(remote) > 8 else ""))
    lines += [f"warning: {w}" for w in c.warnings]
    lines += [f"work: {w}" for w in c.work_unevaluated]
    if steps:
        events = c.schedule.events()
        per_step = len(c.schedule.operands) or 1
        n = c.steps
        shown = sorted(set(range(min(steps, n))) | set(range(max(n - steps, 0), n)))
        rows = [["step", "grid index", "operand", "block", "action", "bytes"]]
        previous = -1
        for s in shown:
            if previous >= 0 and s != previous + 1:
                rows.append(["...", "", "", "", "", ""])
            previous = s
            for e in events[s * per_step:(s + 1) * per_step]:
                rows.append([str(e.step), _shape(e.grid_index), e.operand, _shape(e.block_index),
                             e.action, f"{e.bytes:,}"])
        lines.append(table(rows))
    return "\n".join(lines)


def summary(t: TraceData, steps: int = 0) -> str:
    return "\n\n".join(call_summary(t, i, steps) for i in range(len(t.calls)))
