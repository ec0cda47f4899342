"""Matplotlib views: one grid step (``StepFigure``), the fetch heatmap, the traffic timeline
and the in-block access figure. Figures are built with ``matplotlib.figure.Figure`` (no pyplot
state), so they render with Agg and in notebooks alike.

``StepFigure`` creates every artist once; ``update(step)`` only changes positions, colours and
texts, which is what the widget calls on every slider move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from kernelsim.schedule import ACTIONS, FETCH, WRITEBACK
from kernelsim.views import palette as pal
from kernelsim.views.data import (
    CallView,
    block_rects,
    call_view,
    check_step,
    fmt_bytes,
    leading,
    panel_dims,
    panel_extent,
)

if TYPE_CHECKING:
    from kernelsim.trace import Trace

MAX_TICKS = 12
SMEM_CELLS = 32


def _tuple(t) -> str:
    return "(" + ", ".join(str(int(v)) for v in t) + ")"


def _block_ticks(ax, op, axis: int | None, which: str) -> None:
    """Tick labels at block centres, labelled with the block coordinate."""
    setter = ax.set_xticks if which == "x" else ax.set_yticks
    if axis is None or axis < 0:
        setter([])
        return
    dim, extent = op.block_dims[axis], op.shape[axis]
    if dim.kind != "blocked":
        return
    n = dim.block_count(extent)
    every = max(1, -(-n // MAX_TICKS))
    idx = np.arange(0, n, every)
    centres = np.minimum(idx * dim.size + dim.size / 2, extent - 0.5 if extent > 1 else 0.5)
    setter(centres, [str(i) for i in idx])


def _grid_lines(op, axis: int | None, vertical: bool, h: int, w: int) -> list:
    if axis is None or axis < 0 or op.block_dims[axis].kind != "blocked":
        return []
    size = op.block_dims[axis].size
    extent = w if vertical else h
    if extent // size > 256:
        return []
    return [[(p, 0), (p, h)] if vertical else [(0, p), (w, p)]
            for p in range(size, extent, size)]


def _legend_handles() -> list[Patch]:
    return [Patch(facecolor=pal.ACTION_COLORS[a], label=pal.ACTION_LABELS[a]) for a in ACTIONS]


class StepFigure:
    """The step view of one call; ``update(step)`` moves the highlights without rebuilding.

    Artists carry gids a test or a tool can find: ``block:NAME`` (the highlighted block),
    ``slot:NAME:K`` (on-chip buffers), ``scratch:NAME``, ``smem:NAME:I`` (SMEM cells) and
    ``gridpoint``.
    """

    def __init__(self, view: CallView, hidden: tuple[str, ...] = (), dpi: int = 72,
                 figsize: tuple[float, float] | None = None):
        self.view = view
        call, sched = view.call, view.schedule
        self.scheds = [s for s in sched.operands if s.operand.name not in hidden]
        self.prefetch = [o for o in call.operands if o.role == "scalar_prefetch"]
        self.scratch = [o for o in call.operands if o.role == "scratch"]
        self.cum = sched.cumulative_bytes
        self.total = int(self.cum[-1]) if self.cum.size else 0
        self.grid_points = call.grid_indices()
        self.rects = {s.operand.name: block_rects(s.operand) for s in self.scheds}
        self.slots = {s.operand.name: s.slots for s in self.scheds}
        self.filling = {s.operand.name: s.filling for s in self.scheds}
        self.buffers = {c.name: c.buffers for c in view.cost.operands}
        n_top = max(len(self.scheds), 1)
        width = max(3.3 * n_top, 10.5)
        self.fig = Figure(figsize=figsize or (width, 7.2), dpi=dpi)
        self.fig.set_layout_engine(None)
        top = self.fig.add_gridspec(1, n_top, left=0.06, right=0.98, top=0.86, bottom=0.45,
                                    wspace=0.35)
        n_bottom = 3 if self.prefetch else 2
        bottom = self.fig.add_gridspec(1, n_bottom, left=0.04, right=0.98, top=0.31,
                                       bottom=0.09, wspace=0.25,
                                       width_ratios=[1, 1.6, 1.2][:n_bottom])
        self.header = self.fig.text(0.5, 0.965, "", ha="center", va="top", fontsize=12,
                                    color=pal.INK, weight="bold")
        self.subheader = self.fig.text(0.5, 0.925, "", ha="center", va="top", fontsize=9,
                                       color=pal.INK)
        self.fig.legend(handles=_legend_handles(), loc="lower center", ncol=4, fontsize=8,
                        frameon=False, bbox_to_anchor=(0.5, 0.0))
        self.panels = {}
        for k, s in enumerate(self.scheds):
            self.panels[s.operand.name] = self._operand_panel(self.fig.add_subplot(top[0, k]), s)
        self._grid_panel(self.fig.add_subplot(bottom[0, 0]))
        self._onchip_panel(self.fig.add_subplot(bottom[0, 1]))
        if self.prefetch:
            self._smem_panel(self.fig.add_subplot(bottom[0, 2]))
        self.step = -1

    # -- building ---------------------------------------------------------------------------

    def _operand_panel(self, ax, sched) -> dict:
        op = sched.operand
        h, w = panel_extent(op)
        r, c = panel_dims(op)
        ax.set_xlim(0, w)
        ax.set_ylim(h, 0)
        ratio = h / w if w else 1
        if 1 / 6 <= ratio <= 6:
            ax.set_aspect("equal")
        else:  # very wide (rank 1) or very tall arrays: a readable strip, not a square
            ax.set_aspect("auto")
            ax.set_box_aspect(min(max(ratio, 0.08), 3.0))
        ax.add_patch(Rectangle((0, 0), w, h, facecolor=pal.IDLE, edgecolor=pal.INK, lw=0.8))
        lines = _grid_lines(op, c, True, h, w) + _grid_lines(op, r, False, h, w)
        if lines:
            ax.add_collection(LineCollection(lines, colors=pal.EDGE, linewidths=0.8))
        _block_ticks(ax, op, c, "x")
        _block_ticks(ax, op, r, "y")
        ax.tick_params(labelsize=7, length=2)
        ax.set_xlabel("block col" if c is not None and c >= 0 else "", fontsize=7)
        ax.set_ylabel("block row" if r is not None else "", fontsize=7)
        block = "x".join("-" if b is None else str(b) for b in op.block_shape)
        ax.set_title(f"{op.name}  {op.role}\n{op.dtype}{list(op.shape)}  block {block}",
                     fontsize=8, color=pal.INK)
        rect = Rectangle((0, 0), 1, 1, facecolor=pal.ACTION_COLORS["fetch"], edgecolor=pal.INK,
                         lw=1.5, gid=f"block:{op.name}")
        ax.add_patch(rect)
        label = ax.text(0, 0, "", ha="center", va="center", fontsize=7, color="white",
                        weight="bold")
        action = ax.text(0.5, -0.13, "", transform=ax.transAxes, ha="center", va="top",
                         fontsize=9, weight="bold")
        return {"rect": rect, "label": label, "action": action, "op": op, "sched": sched}

    def _grid_panel(self, ax) -> None:
        grid = self.view.call.grid
        self.grid_shape = (1, 1) if not grid else (1, grid[0]) if len(grid) == 1 \
            else tuple(grid[-2:])
        gh, gw = self.grid_shape
        ax.set_xlim(0, gw)
        ax.set_ylim(gh, 0)
        ax.set_aspect("equal" if 1 / 8 <= gh / gw <= 8 else "auto")
        ax.add_patch(Rectangle((0, 0), gw, gh, facecolor=pal.IDLE, edgecolor=pal.INK, lw=0.8))
        lines = ([[(x, 0), (x, gh)] for x in range(1, gw)] if gw <= 64 else []) + \
            ([[(0, y), (gw, y)] for y in range(1, gh)] if gh <= 64 else [])
        if lines:
            ax.add_collection(LineCollection(lines, colors=pal.EDGE, linewidths=0.8))
        ax.tick_params(labelsize=7, length=2)
        ax.set_xticks([])
        ax.set_yticks([])
        sem = self.view.call.dimension_semantics
        ax.set_xlabel("axis " + str(max(len(grid) - 1, 0)) +
                      (f" ({sem[-1]})" if sem else ""), fontsize=7)
        if len(grid) >= 2:
            ax.set_ylabel(f"axis {len(grid) - 2} ({sem[-2]})", fontsize=7)
        self.grid_title = ax.set_title("", fontsize=8, color=pal.INK)
        self.grid_marker = Rectangle((0, 0), 1, 1, facecolor=pal.INK, edgecolor=pal.INK,
                                     gid="gridpoint")
        ax.add_patch(self.grid_marker)

    def _onchip_panel(self, ax) -> None:
        ax.set_axis_off()
        ax.set_title("on-chip (VMEM / SMEM buffers)", fontsize=8, color=pal.INK)
        rows = len(self.scheds) + len(self.scratch)
        ax.set_xlim(0, 1)
        ax.set_ylim(max(rows, 1), 0)
        self.slot_artists: dict[str, list[tuple[Rectangle, object]]] = {}
        y = 0
        costs = {c.name: c for c in self.view.cost.operands}
        for s in self.scheds:
            op = s.operand
            n = max(1, min(self.buffers.get(op.name, 1), 3))
            ax.text(0.0, y + 0.5, f"{op.name}\n{op.memory_space} x{n}, "
                    f"{fmt_bytes(op.block_buffer_bytes)} each", fontsize=7, va="center")
            arts = []
            for k in range(n):
                x0 = 0.38 + k * 0.31
                rect = Rectangle((x0, y + 0.12), 0.29, 0.76, facecolor=pal.IDLE,
                                 edgecolor=pal.INK, lw=0.8, gid=f"slot:{op.name}:{k}")
                ax.add_patch(rect)
                text = ax.text(x0 + 0.145, y + 0.5, "", fontsize=6.5, ha="center",
                               va="center")
                arts.append((rect, text))
            self.slot_artists[op.name] = arts
            y += 1
        for op in self.scratch:
            ax.text(0.0, y + 0.5, f"{op.name}\nscratch {op.memory_space}", fontsize=7,
                    va="center")
            size = fmt_bytes(costs[op.name].onchip_bytes) if op.name in costs else "?"
            ax.add_patch(Rectangle((0.38, y + 0.12), 0.6, 0.76, facecolor=pal.SCRATCH,
                                   edgecolor=pal.INK, lw=0.8, gid=f"scratch:{op.name}"))
            ax.text(0.68, y + 0.5, f"{op.dtype}{list(op.shape)}  {size}", fontsize=7,
                    ha="center", va="center")
            y += 1

    def _smem_panel(self, ax) -> None:
        ax.set_axis_off()
        ax.set_title("SMEM: scalar prefetch (read this step)", fontsize=8, color=pal.INK)
        ax.set_xlim(0, 8)
        ax.set_ylim(len(self.prefetch) * 5, 0)
        self.smem: dict[str, list[tuple[Rectangle, object]]] = {}
        reads = self.view.trace.prefetch_reads
        self.smem_reads = {o.name: reads.get(o.name) for o in self.prefetch}
        for p, op in enumerate(self.prefetch):
            y0 = p * 5
            ax.text(0, y0 + 0.4, f"{op.name} {op.dtype}{list(op.shape)}", fontsize=7,
                    va="center")
            cells = []
            for i in range(min(SMEM_CELLS, int(np.prod(op.shape)) or 1)):
                x, y = i % 8, y0 + 1 + i // 8
                rect = Rectangle((x, y), 0.95, 0.95, facecolor=pal.IDLE, edgecolor=pal.INK,
                                 lw=0.5, gid=f"smem:{op.name}:{i}")
                ax.add_patch(rect)
                cells.append((rect, ax.text(x + 0.47, y + 0.5, "", fontsize=6, ha="center",
                                            va="center")))
            self.smem[op.name] = cells

    def dynamic_artists(self) -> list:
        """Every artist ``update`` changes (drawn over a cached background by the widget)."""
        arts = [self.header, self.subheader, self.grid_marker, self.grid_title]
        for panel in self.panels.values():
            arts += [panel["rect"], panel["label"], panel["action"]]
        for pairs in self.slot_artists.values():
            arts += [a for pair in pairs for a in pair]
        for pairs in getattr(self, "smem", {}).values():
            arts += [a for pair in pairs for a in pair]
        return arts

    # -- updating ---------------------------------------------------------------------------

    def update(self, step: int) -> None:
        """Show grid step ``step``: header, highlighted blocks, buffers, SMEM, grid point."""
        step = check_step(self.view, step)
        self.step = step
        v = self.view
        point = self.grid_points[step]
        self.header.set_text(f"step {step + 1} of {v.call.steps:,}   grid index {_tuple(point)}"
                             f"   HBM {fmt_bytes(int(self.cum[step]))} of "
                             f"{fmt_bytes(self.total)}")
        self.subheader.set_text(f"call {v.index}: {v.call.name}   model {v.model} on "
                                f"{v.chip.name}   cumulative HBM bytes "
                                f"{int(self.cum[step]):,}")
        for name, panel in self.panels.items():
            sched, op = panel["sched"], panel["op"]
            action = ACTIONS[sched.actions[step]]
            color = pal.ACTION_COLORS[action]
            x, y, w, h = self.rects[name][step]
            panel["rect"].set_bounds(x, y, w, h)
            panel["rect"].set_facecolor(color)
            blk = op.block_indices[step]
            panel["label"].set_position((x + w / 2, y + h / 2))
            panel["label"].set_text(_tuple(blk[-2:]) if blk.size else "()")
            moved = int(sched.moved_bytes[step])
            panel["action"].set_text(f"{action}{leading(op, step)}"
                                     + (f"  {fmt_bytes(moved)}" if moved else ""))
            panel["action"].set_color(color)
            self._update_slots(name, sched, step, action)
        gh, gw = self.grid_shape
        col = int(point[-1]) if point.size else 0
        row = int(point[-2]) if point.size >= 2 else 0
        self.grid_marker.set_xy((col, row))
        lead = ""
        if point.size > 2:
            lead = "\nshown: last two axes at " + ", ".join(
                f"axis {a} = {int(p)}" for a, p in enumerate(point[:-2]))
        self.grid_title.set_text(f"grid {tuple(v.call.grid)}: point {_tuple(point)}{lead}")
        if self.prefetch:
            self._update_smem(step)

    def _update_slots(self, name: str, sched, step: int, action: str) -> None:
        arts = self.slot_artists[name]
        used = int(self.slots[name][step]) % len(arts)
        is_in = sched.operand.role == "input"
        for k, (rect, text) in enumerate(arts):
            if k == used:
                rect.set_facecolor(pal.ACTION_COLORS[action])
                rect.set_hatch("")
                text.set_text("kernel reads" if is_in else "kernel writes")
            elif self.filling[name][step]:
                rect.set_facecolor(pal.ACTION_COLORS["fetch" if is_in else "writeback"])
                rect.set_hatch("///")
                text.set_text("filling (next)" if is_in else "draining")
            else:
                rect.set_facecolor(pal.IDLE)
                rect.set_hatch("")
                text.set_text("idle")

    def _update_smem(self, step: int) -> None:
        for op in self.prefetch:
            cells = self.smem[op.name]
            reads = self.smem_reads[op.name]
            read = reads.at(step) if reads is not None else np.zeros(0, np.int64)
            flat = np.asarray(op.value).reshape(-1)
            start = 0
            if read.size and read.max() >= len(cells):  # slide the window to the reads
                start = int(min(read.min(), max(flat.size - len(cells), 0)))
            hot = set(int(r) for r in read)
            for i, (rect, text) in enumerate(cells):
                e = start + i
                rect.set_facecolor(pal.SMEM_READ if e in hot else pal.IDLE)
                text.set_text(f"{flat[e]}" if e < flat.size else "")
                text.set_color("white" if e in hot else pal.INK)


def step_figure(t: Trace, step: int, call: int = 0, model: str | None = None,
                hidden: tuple[str, ...] = (), dpi: int = 72) -> Figure:
    """The step view of ``step`` of call ``call`` (see ``StepFigure``)."""
    sf = StepFigure(call_view(t, call, model), hidden=hidden, dpi=dpi)
    sf.update(step)
    return sf.fig


def _collapse(counts: np.ndarray) -> tuple[np.ndarray, str]:
    if counts.ndim == 0:
        return counts.reshape(1, 1), ""
    if counts.ndim == 1:
        return counts.reshape(1, -1), ""
    if counts.ndim == 2:
        return counts, ""
    return counts.reshape(-1, *counts.shape[-2:]).sum(axis=0), " (summed over leading dims)"


def heatmap(t: Trace, call: int = 0, counts: bool = True) -> Figure:
    """Per windowed operand, how many times each block position was copied.

    Inputs count fetches, outputs write-backs (``OperandSchedule.transfer_counts``); with
    ``counts`` the numbers are written in the cells (for up to 32 x 32 cells).
    """
    v = call_view(t, call)
    scheds = v.schedule.operands
    fig = Figure(figsize=(max(3.4 * len(scheds), 5), 3.8), dpi=72)
    fig.set_layout_engine("constrained")
    fig.suptitle(f"call {call}: {v.call.name} - copies per block ({v.model})", fontsize=10)
    axes = fig.subplots(1, max(len(scheds), 1), squeeze=False)[0]
    for ax, s in zip(axes, scheds, strict=False):
        grid, note = _collapse(s.transfer_counts())
        color = "fetch" if s.operand.role == "input" else "writeback"
        from matplotlib.colors import LinearSegmentedColormap

        cmap = LinearSegmentedColormap.from_list(color, [pal.IDLE, pal.ACTION_COLORS[color]])
        im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=max(int(grid.max()), 1),
                       interpolation="nearest", aspect="auto" if max(grid.shape) > 4 *
                       min(grid.shape) else "equal")
        im.set_gid(f"heatmap:{s.operand.name}")
        verb = "fetches" if s.operand.role == "input" else "write-backs"
        ax.set_title(f"{s.operand.name}: {verb}{note}\ntotal {int(grid.sum())}, "
                     f"max {int(grid.max())} per block", fontsize=8)
        ax.set_xlabel("block col", fontsize=7)
        ax.set_ylabel("block row", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # block coordinates are ints
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if counts and grid.shape[0] <= 32 and grid.shape[1] <= 32:
            top = grid.max() or 1
            for (i, j), n in np.ndenumerate(grid):
                ax.text(j, i, str(int(n)), ha="center", va="center", fontsize=7,
                        color="white" if n > top / 2 else pal.INK,
                        gid=f"count:{s.operand.name}:{i}:{j}")
        fig.colorbar(im, ax=ax, shrink=0.8)
    for ax in axes[len(scheds):]:
        ax.set_axis_off()
    return fig


def timeline(t: Trace, call: int = 0) -> Figure:
    """Bytes moved per step by operand (stacked), cumulative HBM traffic, and the roofline
    bar: compute time vs memory time (+ per-step overhead) on the trace's chip."""
    from kernelsim.report import seconds

    v = call_view(t, call)
    sched, cost = v.schedule, v.cost
    fig = Figure(figsize=(10, 5.6), dpi=72)
    fig.set_layout_engine("constrained")
    ax, bar = fig.subplots(2, 1, height_ratios=[3, 1])
    steps = np.arange(v.call.steps)
    per_op = [s.moved_bytes for s in sched.operands]
    colors = [pal.OPERAND_CYCLE[k % len(pal.OPERAND_CYCLE)] for k in range(len(per_op))]
    if per_op:
        ax.stackplot(steps, *per_op, labels=[s.operand.name for s in sched.operands],
                     colors=colors, step="mid")
    ax.set_xlabel("grid step")
    ax.set_ylabel("bytes moved at step")
    ax.set_xlim(-0.5, max(v.call.steps - 0.5, 0.5))
    cum_ax = ax.twinx()
    cum_ax.plot(steps, sched.cumulative_bytes, color=pal.INK, lw=1.5, label="cumulative",
                gid="cumulative")
    cum_ax.set_ylabel("cumulative HBM bytes")
    handles = ax.get_legend_handles_labels()[0] + cum_ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.set_title(f"call {call}: {v.call.name}  {v.call.steps:,} steps  "
                 f"HBM {fmt_bytes(cost.hbm_bytes)}  model {v.model} on {v.chip.name}",
                 fontsize=10)
    terms = [("compute", cost.compute_seconds, pal.OPERAND_CYCLE[2]),
             ("memory", cost.memory_seconds, pal.ACTION_COLORS["fetch"]),
             ("overhead", cost.overhead_seconds, pal.ACTION_COLORS["skip"])]
    for k, (label, secs, color) in enumerate(terms):
        bar.barh(k, secs, color=color, gid=f"roofline:{label}")
        bar.text(secs, k, f" {seconds(secs)}", va="center", fontsize=8)
    bar.set_yticks(range(len(terms)), [t[0] for t in terms], fontsize=8)
    bar.invert_yaxis()
    bound = "compute" if cost.compute_seconds >= cost.memory_seconds else "memory"
    bar.set_title(f"roofline: estimate {seconds(cost.estimated_seconds)} = max(compute, "
                  f"memory) + overhead  [{bound}-bound]", fontsize=9)
    bar.set_xlabel("seconds")
    return fig


def access_figure(t: Trace, step: int, operand: str, call: int = 0) -> Figure:
    """Which elements of ``operand`` the kernel body read and wrote at ``step``, and in which
    order (colour = rank of the first access touching the element). Needs a trace made with
    ``record_access=True``."""
    from matplotlib import colormaps

    v = call_view(t, call)
    step = check_step(v, step)
    log = v.trace.accesses
    if log is None:
        raise ValueError("this trace has no accesses: trace with record_access=True")
    if operand not in log.shapes:
        raise KeyError(f"no ref {operand!r}; recorded refs: {sorted(log.shapes)}")
    accesses = log.at(step, operand)
    fig = Figure(figsize=(10, 4.6), dpi=72)
    fig.set_layout_engine("constrained")
    fig.suptitle(f"{operand} at step {step + 1} of {v.call.steps:,} (grid index "
                 f"{_tuple(v.call.grid_indices()[step])}): {len(accesses)} accesses",
                 fontsize=10)
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 0.9])
    for ax, kind, color in ((axes[0], "read", pal.READ), (axes[1], "write", pal.WRITE)):
        order = log.first_order(step, operand, kind)
        order = order.reshape(1, -1) if order.ndim <= 1 else \
            order.reshape(-1, *order.shape[-2:]).max(axis=0)
        masked = np.ma.masked_less(order, 0)
        cmap = colormaps["viridis"].with_extremes(bad=pal.IDLE)
        n = int(order.max()) + 1
        im = ax.imshow(masked, cmap=cmap, vmin=0, vmax=max(n - 1, 1), interpolation="nearest",
                       aspect="auto")
        im.set_gid(f"access:{kind}")
        ax.set_title(f"{kind}s: {int((order >= 0).sum()):,} elements, {n} accesses",
                     fontsize=9, color=color)
        ax.tick_params(labelsize=7)
        if n:
            fig.colorbar(im, ax=ax, shrink=0.8, label=f"{kind} order")
    axes[2].set_axis_off()
    lines = []
    for a in accesses[:18]:
        where = ", ".join(f"{s}:{s + n * st}" + (f":{st}" if st != 1 else "")
                          for s, n, st in a.box) if a.box is not None else \
            f"{len(a.points)} points"
        lines.append(f"{a.order:>3} {a.kind:<5} [{where}]")
    if len(accesses) > 18:
        lines.append(f"... {len(accesses) - 18} more")
    axes[2].text(0, 1, "\n".join(lines) or "no accesses", va="top", family="monospace",
                 fontsize=7.5, transform=axes[2].transAxes)
    return fig


# Re-exported for the widget and HTML views.
__all__ = ["FETCH", "WRITEBACK", "StepFigure", "access_figure", "heatmap", "step_figure",
           "timeline"]
