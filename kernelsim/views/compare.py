"""Several traces side by side (block size A vs B, grid order A vs B): totals and estimates
as a text table, and a figure of cumulative traffic and estimated time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from kernelsim.views import palette as pal
from kernelsim.views.data import CallView, call_view
from kernelsim.views.figure import DPI, FONT, WIDTH, bytes_axis, legible, seconds_axis
from kernelsim.views.report import seconds, table

if TYPE_CHECKING:
    from kernelsim.trace_data import TraceData


@dataclass
class Comparison:
    """The compared calls; ``str()`` is the table, ``figure()`` the plot."""

    labels: list[str]
    views: list[CallView]

    def table(self) -> str:
        """Two tables, one row per trace: what moves (grid, steps, bytes), then what it costs
        (FLOPs, time); one table of all 15 columns is too wide for a notebook's output."""
        moves = [["trace", "call", "grid", "steps", "HBM read B", "HBM write B", "HBM total B",
                  "on-chip peak B"]]
        costs = [["trace", "FLOPs", "AI FLOP/B", "compute", "memory", "overhead", "estimate",
                  "bound"]]
        for label, v in zip(self.labels, self.views, strict=True):
            c = v.cost
            moves.append([label, v.call.name, str(tuple(v.call.grid)), f"{v.call.steps:,}",
                          f"{c.hbm_read_bytes:,}", f"{c.hbm_write_bytes:,}", f"{c.hbm_bytes:,}",
                          f"{c.onchip_peak_bytes:,}"])
            costs.append([label, f"{c.flops:,}", f"{c.arithmetic_intensity:.3g}",
                          seconds(c.compute_seconds), seconds(c.memory_seconds),
                          seconds(c.overhead_seconds), seconds(c.estimated_seconds),
                          "compute" if c.compute_seconds >= c.memory_seconds else "memory"])
        return table(moves) + "\n\n" + table(costs)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())

    def figure(self) -> Figure:
        """Cumulative HBM bytes over the run (x: fraction of steps done) and the estimate."""
        fig = Figure(figsize=(WIDTH, 4.6), dpi=DPI, layout="constrained")
        ax, bars = fig.subplots(1, 2, width_ratios=[1.4, 1])
        for k, (label, v) in enumerate(zip(self.labels, self.views, strict=True)):
            cum = v.schedule.cumulative_bytes
            x = (np.arange(cum.size) + 1) / max(cum.size, 1)
            ax.plot(x, cum, label=label, color=pal.OPERAND_CYCLE[k % len(pal.OPERAND_CYCLE)],
                    gid="compare:cumulative")
        ax.set_xlabel("fraction of grid steps done", fontsize=FONT)
        ax.set_ylabel("cumulative HBM bytes", fontsize=FONT)
        legible(ax)
        bytes_axis(ax.yaxis)
        ax.legend(fontsize=FONT)
        ax.set_title("HBM traffic", fontsize=FONT + 1)
        y = np.arange(len(self.views))
        comp = [v.cost.compute_seconds for v in self.views]
        mem = [v.cost.memory_seconds for v in self.views]
        est = [v.cost.estimated_seconds for v in self.views]
        bars.barh(y - 0.27, comp, height=0.25, color=pal.OPERAND_CYCLE[2], label="compute")
        bars.barh(y, mem, height=0.25, color=pal.ACTION_COLORS["fetch"], label="memory")
        bars.barh(y + 0.27, est, height=0.25, color=pal.INK, label="estimate")
        for k, e in enumerate(est):
            bars.text(e, k + 0.27, f" {seconds(e)}", va="center", fontsize=FONT)
        bars.set_yticks(y, self.labels, fontsize=FONT)
        legible(bars)
        seconds_axis(bars.xaxis, intervals=2)
        bars.set_xlim(0, max(max(est), max(comp), max(mem), 1e-12) * 1.45)  # room for labels
        bars.invert_yaxis()
        bars.set_xlabel("time", fontsize=FONT)
        # below the axes: inside, the legend would cover the estimate labels of the bars
        bars.legend(fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2,
                    frameon=False)
        bars.set_title("roofline estimate", fontsize=FONT + 1)
        return fig


def compare(*traces: TraceData, labels: list[str] | None = None, call: int = 0) -> Comparison:
    """Compare call ``call`` of each trace; ``labels`` default to "A", "B", ..."""
    if not traces:
        raise ValueError("compare needs at least one trace")
    labels = list(labels) if labels is not None else [chr(ord("A") + i) if i < 26 else str(i)
                                                       for i in range(len(traces))]
    if len(labels) != len(traces):
        raise ValueError(f"{len(labels)} labels for {len(traces)} traces")
    return Comparison(labels, [call_view(t, call) for t in traces])
