"""Matplotlib views, for static output (print, PDF, nbconvert): one grid step
(``step_figure``), the copy heatmap, the traffic timeline and the in-block access figure.
Figures are built with ``matplotlib.figure.Figure`` (no pyplot state), so they render with Agg
and in notebooks alike.

Legible where the course shows them: figures are as wide as a lesson's output area on the
site (``WIDTH`` inches at 72 dpi, ~570 px: the text column less the prompt), so they are not
scaled down there, and no text is smaller than ``FONT`` points, i.e. 11 CSS px; the layout
engine keeps texts from overlapping.

Readable as ``kernelsim.views.readability.unreadable_text`` checks (the tests check each figure
here with it): no text overlapping another, running into it or past the figure's edge, none
below a WCAG 2 contrast of 4.5:1 against its fill (count labels take ``readable_ink``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.collections import LineCollection
from matplotlib.colors import BoundaryNorm, LinearSegmentedColormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from kernelsim.cost.estimate import vmem_limit
from kernelsim.cost.schedule import ACTIONS
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
from kernelsim.views.readability import readable_ink
from kernelsim.views.report import seconds

if TYPE_CHECKING:
    from kernelsim.trace_data import TraceData

WIDTH = 7.9          # inches: a lesson output at 72 dpi (the column less the prompt)
DPI = 72
FONT = 11            # points: the smallest text in any figure
MAX_TICKS = 8        # block-coordinate ticks per axis
PANELS_PER_ROW = 3   # operand panels per row of the step figure
SMEM_CELLS = 16      # scalar-prefetch entries drawn per operand
SLOTS_SHOWN = 3      # buffers drawn per operand (pl.Buffered(n) with n > 3 draws 3)
ACCESS_LINES = 14    # accesses listed beside the access figure


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
        setter([])
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
    return [Patch(facecolor=pal.ACTION_COLORS[a], hatch=pal.ACTION_HATCHES[a],
                  edgecolor="white", label=pal.ACTION_LABELS[a]) for a in ACTIONS]


def legible(ax) -> None:
    """Tick labels and the axis offset text (``1e6``) of ``ax`` at the figures' FONT."""
    ax.tick_params(labelsize=FONT)
    for axis in (ax.xaxis, ax.yaxis):
        axis.get_offset_text().set_fontsize(FONT)


def seconds_axis(axis, intervals: int = 4) -> None:
    """At most ``intervals`` + 1 ticks on ``axis`` (matplotlib's ``ax.xaxis``), a time in
    seconds, labelled as ``seconds`` writes times (``120 us``): the default labels, fixed
    decimals such as ``0.00012``, ran into each other. A narrow axis takes fewer intervals
    (``compare``'s, about 240 px wide: 2)."""
    axis.set_major_locator(MaxNLocator(intervals))
    axis.set_major_formatter(FuncFormatter(lambda s, _: seconds(s) if s else "0"))


# decimal units for a bytes axis, largest first: its ticks fall on round numbers of them
BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def bytes_axis(axis) -> None:
    """``axis`` (matplotlib's ``ax.yaxis``), a count of bytes, labelled in one readable unit
    (``2 MB``, ``4 MB``) chosen from its largest value: matplotlib's own labels put the scale in
    an offset text (``1e6``) at the axis's end, which reads as a number of its own."""
    def label(v, _):
        top = max(abs(x) for x in axis.get_view_interval())
        unit, scale = next(((u, s) for u, s in BYTE_UNITS if top >= s), ("B", 1))
        return f"{v / scale:g} {unit}" if v else "0"

    axis.set_major_formatter(FuncFormatter(label))


def _tint(color: str, alpha: float = 0.22) -> tuple:
    """``color`` mixed with white: a fill that black text stays readable on."""
    r, g, b, _ = to_rgba(color)
    return (1 - alpha * (1 - r), 1 - alpha * (1 - g), 1 - alpha * (1 - b), 1.0)


class StepFigure:
    """The step view of one call; ``update(step)`` moves the highlights without rebuilding.

    Artists carry gids a test or a tool can find: ``block:NAME`` (the highlighted block),
    ``slot:NAME:K`` (on-chip buffers), ``scratch:NAME``, ``smem:NAME:I`` (SMEM cells) and
    ``gridpoint``. Steps count from 0, as in ``Trace.steps()``.
    """

    def __init__(self, view: CallView, hidden: tuple[str, ...] = (), dpi: int = DPI):
        self.view = view
        call, sched = view.call, view.schedule
        self.scheds = [s for s in sched.operands if s.operand.name not in hidden]
        self.prefetch = [o for o in call.operands if o.role == "scalar_prefetch"]
        self.scratch = [o for o in call.operands if o.role == "scratch"]
        self.cum = sched.cumulative_bytes
        self.total = int(self.cum[-1]) if self.cum.size else 0
        self.grid_points = call.grid_indices()
        self.rects = {s.operand.name: block_rects(s.operand) for s in self.scheds}
        self.buffers = {c.name: c.buffers for c in view.cost.operands}
        op_rows = max(-(-len(self.scheds) // PANELS_PER_ROW), 1)
        chip_rows = len(self.scheds) + len(self.scratch)
        heights = [2.9] * op_rows + [0.5 * max(chip_rows, 1) + 0.5, 2.6]
        self.fig = Figure(figsize=(WIDTH, sum(heights) + 1.5), dpi=dpi,
                          layout="constrained")
        rows = self.fig.add_gridspec(len(heights), 1, height_ratios=heights)
        self.header = self.fig.suptitle("", fontsize=FONT + 1, color=pal.INK)
        self.fig.legend(handles=_legend_handles(), loc="outside lower center", ncol=2,
                        fontsize=FONT, frameon=False)
        self.panels = {}
        for r in range(op_rows):
            cells = rows[r].subgridspec(1, PANELS_PER_ROW)
            for c, s in enumerate(self.scheds[r * PANELS_PER_ROW:(r + 1) * PANELS_PER_ROW]):
                ax = self.fig.add_subplot(cells[0, c])
                self.panels[s.operand.name] = self._operand_panel(ax, s)
        self._onchip_panel(self.fig.add_subplot(rows[op_rows]))
        bottom = rows[op_rows + 1].subgridspec(1, 2 if self.prefetch else 1)
        self._grid_panel(self.fig.add_subplot(bottom[0, 0]))
        if self.prefetch:
            self._smem_panel(self.fig.add_subplot(bottom[0, 1]))
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
        legible(ax)
        ax.tick_params(length=2)
        block = "×".join("-" if b is None else str(b) for b in op.block_shape)
        ax.set_title(f"{op.name} ({op.role})\n{op.dtype}{list(op.shape)}\nblock {block}",
                     fontsize=FONT, color=pal.INK)
        rect = Rectangle((0, 0), 1, 1, facecolor=pal.ACTION_COLORS["fetch"], edgecolor=pal.INK,
                         lw=1.5, gid=f"block:{op.name}")
        ax.add_patch(rect)
        return {"rect": rect, "ax": ax, "op": op, "sched": sched}

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
        ax.set_xticks([])
        ax.set_yticks([])
        sem = self.view.call.dimension_semantics
        ax.set_xlabel(f"axis {max(len(grid) - 1, 0)}" + (f" ({sem[-1]})" if sem else "")
                      + " →", fontsize=FONT)
        if len(grid) >= 2:
            ax.set_ylabel(f"axis {len(grid) - 2} ({sem[-2]}) →", fontsize=FONT)
        self.grid_title = ax.set_title("", fontsize=FONT, color=pal.INK)
        self.grid_marker = Rectangle((0, 0), 1, 1, facecolor=pal.INK, edgecolor=pal.INK,
                                     gid="gridpoint")
        ax.add_patch(self.grid_marker)

    def _onchip_panel(self, ax) -> None:
        """One row per operand: its label, then its buffers; scratch rows after them."""
        ax.set_axis_off()
        if self.view.model == "gpu":
            footprint = self.view.cost.vmem_bytes + self.view.cost.smem_bytes
            title = (f"on chip (shared memory): {fmt_bytes(footprint)} of "
                     f"{fmt_bytes(self.view.chip.vmem_bytes)} on {self.view.chip.name}")
        else:  # what Mosaic allocates, against the limit its compile enforces
            limit = vmem_limit(self.view.call, self.view.chip)
            title = (f"on chip (VMEM): Mosaic allocates "
                     f"{fmt_bytes(self.view.cost.mosaic_vmem_bytes)}, limit "
                     f"{fmt_bytes(limit.bytes)}")
        ax.set_title(title, fontsize=FONT, color=pal.INK, loc="left")
        rows = len(self.scheds) + len(self.scratch)
        ax.set_xlim(0, 10)
        ax.set_ylim(max(rows, 1), 0)
        self.slot_artists: dict[str, list[tuple[Rectangle, Rectangle, object]]] = {}
        costs = {c.name: c for c in self.view.cost.operands}
        for y, s in enumerate(self.scheds):
            op = s.operand
            n = max(1, min(self.buffers.get(op.name, 1), SLOTS_SHOWN))
            ax.text(0, y + 0.5, f"{op.name}: {n} × {fmt_bytes(op.block_buffer_bytes)}",
                    fontsize=FONT, va="center")
            width = 6.7 / n
            arts = []
            for k in range(n):
                x0 = 3.3 + k * width
                rect = Rectangle((x0, y + 0.1), width - 0.1, 0.8, facecolor="white",
                                 edgecolor=pal.INK, lw=0.8, gid=f"slot:{op.name}:{k}")
                swatch = Rectangle((x0 + 0.08, y + 0.25), 0.3, 0.5, facecolor=pal.IDLE,
                                   edgecolor=pal.INK, lw=0.5)
                ax.add_patch(rect)
                ax.add_patch(swatch)
                text = ax.text(x0 + 0.5, y + 0.5, "", fontsize=FONT, va="center")
                arts.append((rect, swatch, text))
            self.slot_artists[op.name] = arts
        for y, op in enumerate(self.scratch, start=len(self.scheds)):
            size = fmt_bytes(costs[op.name].onchip_bytes) if op.name in costs else "?"
            ax.text(0, y + 0.5, f"{op.name}: scratch", fontsize=FONT, va="center")
            ax.add_patch(Rectangle((3.3, y + 0.1), 6.6, 0.8, facecolor=_tint(pal.SCRATCH),
                                   edgecolor=pal.INK, lw=0.8, gid=f"scratch:{op.name}"))
            ax.text(3.4, y + 0.5, f"{op.dtype}{list(op.shape)}, {size}, lives for the call",
                    fontsize=FONT, va="center")

    def _smem_panel(self, ax) -> None:
        ax.set_axis_off()
        ax.set_title("SMEM: scalar prefetch (read this step)", fontsize=FONT, color=pal.INK)
        per_op = 1 + -(-SMEM_CELLS // 8)
        ax.set_xlim(0, 8)
        ax.set_ylim(len(self.prefetch) * per_op, 0)
        self.smem: dict[str, list[tuple[Rectangle, object]]] = {}
        reads = self.view.trace.prefetch_reads
        self.smem_reads = {o.name: reads.get(o.name) for o in self.prefetch}
        for p, op in enumerate(self.prefetch):
            y0 = p * per_op
            ax.text(0, y0 + 0.5, f"{op.name} {op.dtype}{list(op.shape)}", fontsize=FONT,
                    va="center")
            cells = []
            for i in range(min(SMEM_CELLS, int(np.prod(op.shape)) or 1)):
                x, y = i % 8, y0 + 1 + i // 8
                rect = Rectangle((x, y), 0.95, 0.95, facecolor=pal.IDLE, edgecolor=pal.INK,
                                 lw=0.5, gid=f"smem:{op.name}:{i}")
                ax.add_patch(rect)
                cells.append((rect, ax.text(x + 0.47, y + 0.5, "", fontsize=FONT,
                                            ha="center", va="center")))
            self.smem[op.name] = cells

    # -- updating ---------------------------------------------------------------------------

    def update(self, step: int) -> None:
        """Show grid step ``step``: header, highlighted blocks, buffers, SMEM, grid point."""
        step = check_step(self.view, step)
        self.step = step
        v = self.view
        point = self.grid_points[step]
        self.header.set_text(
            f"step {step} of 0–{v.call.steps - 1:,}, grid index {_tuple(point)}; "
            f"HBM {fmt_bytes(int(self.cum[step]))} of {fmt_bytes(self.total)} so far\n"
            f"call {v.index}: {v.call.name}, model {v.model} on {v.chip.name}, "
            f"cumulative HBM bytes {int(self.cum[step]):,}")
        for name, panel in self.panels.items():
            sched, op = panel["sched"], panel["op"]
            action = ACTIONS[sched.actions[step]]
            color = pal.ACTION_COLORS[action]
            x, y, w, h = self.rects[name][step]
            panel["rect"].set_bounds(x, y, w, h)
            panel["rect"].set_facecolor(color)
            panel["rect"].set_hatch(pal.ACTION_HATCHES[action])
            panel["rect"].set_edgecolor(pal.INK)
            moved = int(sched.moved_bytes[step])
            blk = op.block_indices[step]
            # in ink: the actions' colours are fills, too light for text on white (keep's
            # green: 3.4:1, below WCAG's 4.5:1); the label names the action in words
            panel["ax"].set_xlabel(
                f"{action} {_tuple(blk[-2:]) if blk.size else '()'}{leading(op, step)}"
                + (f", {fmt_bytes(moved)}" if moved else ""), fontsize=FONT, weight="bold",
                color=pal.INK)
            self._update_slots(name, sched, step, action)
        col = int(point[-1]) if point.size else 0
        row = int(point[-2]) if point.size >= 2 else 0
        self.grid_marker.set_xy((col, row))
        lead = ""
        if point.size > 2:
            lead = "\nshown at " + ", ".join(f"axis {a} = {int(p)}"
                                             for a, p in enumerate(point[:-2]))
        self.grid_title.set_text(f"grid {tuple(v.call.grid)}: point {_tuple(point)}{lead}")
        if self.prefetch:
            self._update_smem(step)

    def _update_slots(self, name: str, sched, step: int, action: str) -> None:
        arts = self.slot_artists[name]
        used = int(sched.slots[step]) % len(arts)
        is_in = sched.operand.role == "input"
        copy = "fetch" if is_in else "writeback"
        other = (used + (1 if is_in else -1)) % len(arts) \
            if len(arts) > 1 and sched.filling[step] else -1
        for k, (rect, swatch, text) in enumerate(arts):
            if k == used:
                state, fill = action, _tint(pal.ACTION_COLORS[action])
                text.set_text(f"{k}: kernel {'reads' if is_in else 'writes'}")
            elif k == other:
                state, fill = copy, "white"
                text.set_text(f"{k}: {'filling (next)' if is_in else 'draining'}")
            else:
                state, fill = None, "white"
                text.set_text(f"{k}: idle")
            rect.set_facecolor(fill)
            rect.set_linewidth(2.2 if k == used else 0.8)
            swatch.set_facecolor(pal.ACTION_COLORS[state] if state else pal.IDLE)
            swatch.set_hatch(pal.ACTION_HATCHES[state] if state else "")
            swatch.set_edgecolor("white" if state else pal.INK)

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
                text.set_color(readable_ink(pal.SMEM_READ) if e in hot else pal.INK)
                text.set_weight("bold" if e in hot else "normal")


def step_figure(t: TraceData, step: int, call: int = 0, model: str | None = None,
                hidden: tuple[str, ...] = (), dpi: int = DPI) -> Figure:
    """The step view of ``step`` (0-based) of call ``call`` (see ``StepFigure``)."""
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
    return counts.reshape(-1, *counts.shape[-2:]).sum(axis=0), "\nleading dims summed"


def _count_scale(top: int, color: str):
    """A discrete colour scale for whole-number counts 0..``top``: one colour per count (at
    most 12 bins), integer ticks on the colour bar."""
    bounds = MaxNLocator(12, integer=True).tick_values(0, top + 1) if top > 11 \
        else np.arange(top + 2)
    bounds = bounds[bounds <= top + 1] - 0.5
    cmap = LinearSegmentedColormap.from_list(color, [pal.IDLE, pal.ACTION_COLORS[color]],
                                             N=len(bounds) - 1)
    return cmap, BoundaryNorm(bounds, cmap.N)


def heatmap(t: TraceData, call: int = 0, counts: bool = True) -> Figure:
    """Per windowed operand, how many times each block position was copied.

    Inputs count fetches, outputs write-backs (``OperandSchedule.transfer_counts``); with
    ``counts`` the numbers are written in the cells (for up to 16 x 16 cells). Counts are
    whole numbers: the colour scale is discrete and every tick an integer.
    """
    v = call_view(t, call)
    scheds = v.schedule.operands
    cols = min(max(len(scheds), 1), PANELS_PER_ROW)
    rows = max(-(-len(scheds) // PANELS_PER_ROW), 1)
    fig = Figure(figsize=(WIDTH, 3.9 * rows + 0.6), dpi=DPI, layout="constrained")
    fig.suptitle(f"call {call}: {v.call.name}, copies per block (model {v.model})",
                 fontsize=FONT + 1)
    axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
    for ax, s in zip(axes, scheds, strict=False):
        grid, note = _collapse(s.transfer_counts())
        color = "fetch" if s.operand.role == "input" else "writeback"
        top = int(grid.max())
        cmap, norm = _count_scale(top, color)
        # square cells unless that squeezes the panel (and its title) into a sliver
        square = min(grid.shape) > 1 and max(grid.shape) <= 4 * min(grid.shape)
        im = ax.imshow(grid, cmap=cmap, norm=norm, interpolation="nearest",
                       aspect="equal" if square else "auto")
        im.set_gid(f"heatmap:{s.operand.name}")
        verb = "fetches" if s.operand.role == "input" else "write-backs"
        ax.set_title(f"{s.operand.name}: {verb}{note}\ntotal {int(grid.sum())}, "
                     f"max {top} per block", fontsize=FONT)
        ax.set_xlabel("block col", fontsize=FONT)
        ax.set_ylabel("block row", fontsize=FONT)
        legible(ax)
        for set_ticks, n in ((ax.set_xticks, grid.shape[1]), (ax.set_yticks, grid.shape[0])):
            set_ticks(np.arange(0, n, -(-n // MAX_TICKS)))  # block coordinates: whole numbers
        ax.set_xlim(-0.5, grid.shape[1] - 0.5)
        ax.set_ylim(grid.shape[0] - 0.5, -0.5)
        if counts and grid.shape[0] <= 16 and grid.shape[1] <= 16:
            for (i, j), n in np.ndenumerate(grid):
                ax.text(j, i, str(int(n)), ha="center", va="center", fontsize=FONT,
                        color=readable_ink(cmap(norm(n))),
                        gid=f"count:{s.operand.name}:{i}:{j}")
        bar = fig.colorbar(im, ax=ax, shrink=0.8)
        bar.set_ticks(MaxNLocator(6, integer=True).tick_values(0, top))
        bar.ax.set_ylim(-0.5, top + 0.5)
        legible(bar.ax)
    for ax in axes[len(scheds):]:
        ax.set_axis_off()
    return fig


def timeline(t: TraceData, call: int = 0) -> Figure:
    """Bytes moved per step by operand (stacked), cumulative HBM traffic, and the roofline
    bar: compute time vs memory time (+ per-step overhead) on the trace's chip."""
    v = call_view(t, call)
    sched, cost = v.schedule, v.cost
    fig = Figure(figsize=(WIDTH, 6.4), dpi=DPI, layout="constrained")
    ax, bar = fig.subplots(2, 1, height_ratios=[3, 1.3])
    steps = np.arange(v.call.steps)
    per_op = [s.moved_bytes for s in sched.operands]
    colors = [pal.OPERAND_CYCLE[k % len(pal.OPERAND_CYCLE)] for k in range(len(per_op))]
    if per_op:
        ax.stackplot(steps, *per_op, labels=[s.operand.name for s in sched.operands],
                     colors=colors, step="mid")
    ax.set_xlabel("grid step (from 0)", fontsize=FONT)
    ax.set_ylabel("bytes moved at step", fontsize=FONT)
    legible(ax)
    bytes_axis(ax.yaxis)
    ax.xaxis.set_major_locator(MaxNLocator(8, integer=True))
    ax.set_xlim(-0.5, max(v.call.steps - 0.5, 0.5))
    cum_ax = ax.twinx()
    cum_ax.plot(steps, sched.cumulative_bytes, color=pal.INK, lw=1.5, label="cumulative",
                gid="cumulative")
    cum_ax.set_ylabel("cumulative HBM bytes", fontsize=FONT)
    legible(cum_ax)
    bytes_axis(cum_ax.yaxis)
    handles = ax.get_legend_handles_labels()[0] + cum_ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=FONT, loc="upper left")
    ax.set_title(f"call {call}: {v.call.name}, {v.call.steps:,} steps, "
                 f"HBM {fmt_bytes(cost.hbm_bytes)}, model {v.model} on {v.chip.name}",
                 fontsize=FONT + 1)
    terms = [("compute", cost.compute_seconds, pal.OPERAND_CYCLE[2]),
             ("memory", cost.memory_seconds, pal.ACTION_COLORS["fetch"]),
             ("overhead", cost.overhead_seconds, pal.ACTION_COLORS["skip"])]
    for k, (label, secs, color) in enumerate(terms):
        bar.barh(k, secs, color=color, gid=f"roofline:{label}")
        bar.text(secs, k, f" {seconds(secs)}", va="center", fontsize=FONT)
    bar.set_yticks(range(len(terms)), [t[0] for t in terms], fontsize=FONT)
    legible(bar)
    bar.set_xlim(0, max(max(t[1] for t in terms), 1e-12) * 1.25)  # room for the labels
    bar.invert_yaxis()
    bound = "compute" if cost.compute_seconds >= cost.memory_seconds else "memory"
    bar.set_title(f"roofline: estimate {seconds(cost.estimated_seconds)} = max(compute, "
                  f"memory) + overhead  [{bound}-bound]", fontsize=FONT)
    seconds_axis(bar.xaxis)
    bar.set_xlabel("time", fontsize=FONT)
    return fig


def access_figure(t: TraceData, step: int, operand: str, call: int = 0) -> Figure:
    """Which elements of ``operand`` the kernel body read and wrote at ``step``, and in which
    order (colour = rank of the first access touching the element). Needs a trace made with
    ``record_access=True``."""
    v = call_view(t, call)
    step = check_step(v, step)
    log = v.trace.accesses
    if log is None:
        raise ValueError("this trace has no accesses: trace with record_access=True")
    if operand not in log.shapes:
        raise KeyError(f"no ref {operand!r}; recorded refs: {sorted(log.shapes)}")
    accesses = log.at(step, operand)
    fig = Figure(figsize=(WIDTH, 4.8), dpi=DPI, layout="constrained")
    fig.suptitle(f"{operand} at step {step} of 0–{v.call.steps - 1:,} (grid index "
                 f"{_tuple(v.call.grid_indices()[step])}): {len(accesses)} accesses",
                 fontsize=FONT + 1)
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 1.1])
    for ax, kind in ((axes[0], "read"), (axes[1], "write")):
        order = log.first_order(step, operand, kind)
        order = order.reshape(1, -1) if order.ndim <= 1 else \
            order.reshape(-1, *order.shape[-2:]).max(axis=0)
        masked = np.ma.masked_less(order, 0)
        cmap = colormaps["viridis"].with_extremes(bad=pal.IDLE)
        n = int(order.max()) + 1
        im = ax.imshow(masked, cmap=cmap, vmin=0, vmax=max(n - 1, 1), interpolation="nearest",
                       aspect="auto")
        im.set_gid(f"access:{kind}")
        ax.set_title(f"{kind}s: {int((order >= 0).sum()):,} elements\n{n} accesses",
                     fontsize=FONT)
        legible(ax)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(6, integer=True))
        if n:
            bar = fig.colorbar(im, ax=ax, shrink=0.8)
            bar.set_label(f"{kind} order", fontsize=FONT)
            bar.set_ticks(MaxNLocator(6, integer=True).tick_values(0, max(n - 1, 1)))
            legible(bar.ax)
    axes[2].set_axis_off()
    lines = []
    for a in accesses[:ACCESS_LINES]:
        where = ", ".join(f"{s}:{s + n * st}" + (f":{st}" if st != 1 else "")
                          for s, n, st in a.box) if a.box is not None else \
            f"{len(a.points)} points"
        lines.append(f"{a.order:>3} {a.kind:<5} [{where}]")
    if len(accesses) > ACCESS_LINES:
        lines.append(f"... {len(accesses) - ACCESS_LINES} more")
    axes[2].text(0, 1, "\n".join(lines) or "no accesses", va="top", family="monospace",
                 fontsize=FONT, transform=axes[2].transAxes)
    return fig
