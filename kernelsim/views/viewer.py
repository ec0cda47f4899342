"""The interactive viewer: one ES module (``viewer.js``) shown by anywidget in a live notebook
and standalone (data inline) in ``Trace.to_html()`` and on the course site.

``viewer_data`` turns a Trace into what the module draws. Every number comes from the Trace
(its schedules and costs, rebuilt for the other model from the same KernelCall, and costed
on each chip of that model's kind); the module only draws it. Per-step arrays travel as
base64 typed arrays (``{"t": "i32", "b": ...}``) so a 4,096-step call stays well under 1 MB.

``gpu_viewer_data`` does the same for a Mosaic GPU kernel (``kernelsim.gpu.GpuKernel``): its
memories as lanes (global memory, shared memory, registers) and each warpgroup's events,
drawn by the same module; ``GpuKernel.show()`` and ``.to_html()`` reach it as a Trace's do.

``Trace.show()`` picks the form: the anywidget ``Viewer`` when a notebook front end sent the
cell (JupyterLab, Notebook 7 and VS Code send a ``cellId`` with it), else an object whose
mime bundle is the standalone viewer (nbclient and nbconvert, i.e. the site build, send
none), so one lesson cell works in both places.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html as _html
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kernelsim.chips import CHIPS, DEFAULT_CHIP
from kernelsim.cost.estimate import compute, vmem_limit
from kernelsim.cost.schedule import build
from kernelsim.memories import MEMORY_NAMES, MemoryNames, memory_spaces
from kernelsim.mosaic_gpu.kernel_data import MEMORY_SPACES as GPU_KERNEL_SPACES
from kernelsim.trace_data import body_dma_dict, device_dict
from kernelsim.views import palette as pal
from kernelsim.views.data import (
    block_rects,
    fmt_bytes,
    panel_dims,
    panel_extent,
)

if TYPE_CHECKING:
    from kernelsim.mosaic_gpu.kernel_data import GpuKernelData
    from kernelsim.trace_data import CallTrace, TraceData

JS = Path(__file__).with_name("viewer.js")
MODELS = ("tpu", "gpu")
SMEM_SHOWN = 256          # scalar-prefetch entries sent to the viewer per operand
ACCESS_CELLS = 16         # the access overlay's grid: at most this many cells per block side
_uid = itertools.count()


def _typed(a: np.ndarray, kind: str) -> dict[str, str]:
    """A numpy array as ``{"t": kind, "b": base64}`` (little-endian), for a JS typed array."""
    dtype = {"i8": "<i1", "u16": "<u2", "i32": "<i4", "f64": "<f8"}[kind]
    return {"t": kind, "b": base64.b64encode(np.ascontiguousarray(a, dtype).tobytes()).decode()}


def _index(values: np.ndarray) -> dict[str, str]:
    """Non-negative ints as the narrowest typed array that holds them."""
    return _typed(values, "u16" if values.size == 0 or values.max() < 65536 else "i32")


def _lines(op, axis) -> int:
    """Block size along a drawn axis when it is blocked (grid lines every that many), else 0."""
    if axis is None or axis < 0 or op.block_dims[axis].kind != "blocked":
        return 0
    return int(op.block_dims[axis].size)


def _cost(schedule, chip, names: MemoryNames) -> dict[str, Any]:
    c = compute(schedule, chip)
    # a TPU kernel's VMEM as Mosaic allocates it, against the limit the compile enforces
    limit = vmem_limit(schedule.call, chip) if names.scalars else None
    return {
        "hbm_read": c.hbm_read_bytes, "hbm_write": c.hbm_write_bytes, "vmem": c.vmem_bytes,
        "smem": c.smem_bytes, "flops": c.flops, "compute_s": c.compute_seconds,
        # against the on-chip capacity: without a scalar memory, everything held on chip
        "onchip": c.vmem_bytes if names.scalars else c.onchip_peak_bytes,
        "memory_s": c.memory_seconds, "overhead_s": c.overhead_seconds,
        "estimate_s": c.estimated_seconds,
        "bound": "compute" if c.compute_seconds >= c.memory_seconds else "memory",
        "chip_vmem": chip.vmem_bytes, "chip_smem": chip.smem_bytes,
        "mosaic_vmem": c.mosaic_vmem_bytes, "vmem_limit": limit and limit.bytes,
        "vmem_limit_source": limit and limit.source,
        "buffers": {o.name: o.buffers for o in c.operands},
    }


def _lane_id(name: str) -> str:
    """``data-lane`` of a memory's lane: its name's first word ("global memory" -> global)."""
    return name.split()[0].lower()


def lanes(model: str, ct: CallTrace) -> list[dict[str, str]]:
    """The memory lanes the viewer draws for ``model``, top to bottom. ``kind`` says how
    (``arrays``: the operands cut into blocks; ``buffers``: the on-chip slots and scratch;
    ``scalars``: scalar-prefetch entries; ``ici``: the remote copies between devices of a
    ``shard_map``; ``note``: a sentence), ``id`` is its ``data-lane``.
    A new kind of lane is a new entry here and a builder of that kind in viewer.js."""
    n = MEMORY_NAMES[model]
    out = [{"id": _lane_id(n.off_chip), "kind": "arrays", "title": n.off_chip,
            "note": "operands cut into blocks; the block this step uses is outlined"},
           {"id": _lane_id(n.on_chip), "kind": "buffers", "title": n.on_chip,
            "note": "on-chip buffers: the slot the kernel uses is outlined"}]
    if any(o.role == "scalar_prefetch" for o in ct.call.operands):
        out.append({"id": _lane_id(n.scalars), "kind": "scalars", "title": n.scalars,
                    "note": "scalar prefetch: entries the index maps read this step are filled"}
                   if n.scalars else
                   {"id": "prefetch", "kind": "note", "title": "scalar prefetch",
                    "note": "has no lowering under this model (Triton: \"scalar prefetch not "
                            "implemented\"); the blocks shown are where the index maps, run "
                            "on the prefetched values, point"})
    if any(c.remote for c in ct.call.body_copies):
        out.append({"id": "ici", "kind": "ici", "title": n.interconnect,
                    "note": "the chips' interconnect: the remote copies in flight this step, "
                            "from the step that starts each to the step that waits on it"}
                   if n.interconnect else
                   {"id": "remote", "kind": "note", "title": "remote copies",
                    "note": "pltpu.make_async_remote_copy is a TPU primitive; the tpu model "
                            "shows these copies on its ICI lane"})
    return out


def words(model: str) -> dict[str, Any]:
    """What the viewer says under ``model``: a template per action for the step's status
    (``{op}``, ``{blk}``, ``{slot}``, ``{bytes}`` filled in), the legend's labels, the
    memories' names and the memory spaces' names."""
    n = MEMORY_NAMES[model]
    off, on = n.off_chip, n.on_chip
    if model == "tpu":  # a sequential pipeline: blocks rotate through numbered slots
        status = {"fetch": f"{{op}} block {{blk}} {off}→{on} slot {{slot}}, {{bytes}}",
                  "skip": "{op} block {blk} reused in slot {slot}, no copy",
                  "writeback": f"{{op}} block {{blk}} written back {on}→{off} from slot "
                               "{slot}, {bytes}",
                  "keep": f"{{op}} block {{blk}} kept in {on} slot {{slot}}"}
    else:  # one program per grid point: each loads its blocks and stores its outputs
        status = {"fetch": f"{{op}} block {{blk}} loaded from {off}, {{bytes}}",
                  "skip": "{op} block {blk} reused, no copy",
                  "writeback": f"{{op}} block {{blk}} written back to {off}, {{bytes}}",
                  "keep": f"{{op}} block {{blk}} kept {n.kept}"}
    return {"status": status, "labels": n.action_labels(), "off_chip": off, "on_chip": on,
            "spaces": n.spaces, "scalars": n.scalars,
            "scalar_read": f"{n.scalars} entry read" if n.scalars else ""}


def _model_data(ct: CallTrace, model: str, chips: list[str], shown: np.ndarray) -> dict:
    """One model's schedule of call ``ct`` at the steps ``shown``, costed on ``chips``, with
    the lanes and words the viewer draws it in."""
    schedule = build(ct.call, model)  # type: ignore[arg-type]
    costs = {name: _cost(schedule, CHIPS[name], MEMORY_NAMES[model]) for name in chips}
    buffers = next(iter(costs.values()))["buffers"]
    ops = {}
    for s in schedule.operands:
        n = max(buffers[s.operand.name], 1)
        # the schedule alternates two buffers; a single-buffered operand (one buffer under
        # this model) always uses slot 0
        ops[s.operand.name] = {"actions": _typed(s.actions[shown], "i8"),
                               "slot": _typed(s.slots[shown] % n, "i8"),
                               "filling": _typed(s.filling[shown], "i8")}
    return {"operands": ops, "cumulative": _typed(schedule.cumulative_bytes[shown], "f64"),
            "total_bytes": int(schedule.cumulative_bytes[-1]) if ct.steps else 0,
            "costs": costs, "default_chip": DEFAULT_CHIP[model] if DEFAULT_CHIP[model] in costs
            else chips[0], "memory_spaces": memory_spaces(model),
            "lanes": lanes(model, ct), "words": words(model)}


def _windowed(ct: CallTrace, shown: np.ndarray) -> list[dict]:
    """The operands with a BlockSpec window: their distinct blocks at the ``shown`` steps
    (index, drawn rectangle, in-bounds bytes) and which block each step uses."""
    block_bytes = {s.operand.name: s.block_bytes for s in ct.schedule.operands}
    out = []
    for op in ct.call.operands:
        if op.role not in ("input", "output") or op.block_indices is None:
            continue
        r, c = panel_dims(op)
        h, w = panel_extent(op)
        blocks, first, at = np.unique(op.block_indices[shown], axis=0, return_index=True,
                                      return_inverse=True)
        steps = shown[first]
        nbytes = block_bytes.get(op.name)  # None: the kernel copies it by hand (pl.ANY)
        out.append({
            "name": op.name, "role": op.role, "dtype": op.dtype, "shape": list(op.shape),
            "block_shape": [None if b is None else int(b) for b in op.block_shape],
            "space": op.memory_space, "pipelined": op.pipelined,
            "buffer_bytes": op.block_buffer_bytes,
            "h": int(h), "w": int(w), "bh": _lines(op, r), "bw": _lines(op, c),
            "blocks": blocks.tolist(), "rects": block_rects(op)[steps].round(3).tolist(),
            "block_bytes": [0] * len(blocks) if nbytes is None else nbytes[steps].tolist(),
            "block_at": _index(at.reshape(-1)),
        })
    return out


def _prefetch(ct: CallTrace, shown: np.ndarray) -> list[dict]:
    out = []
    for op in ct.call.operands:
        if op.role != "scalar_prefetch":
            continue
        flat = np.asarray(op.value).reshape(-1) if op.value is not None else np.zeros(0)
        reads = ct.prefetch_reads.get(op.name)
        per_step = [reads.at(int(s)) if reads is not None else np.zeros(0, np.int64)
                    for s in shown]
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in per_step])])
        out.append({"name": op.name, "dtype": op.dtype, "shape": list(op.shape),
                    "size": int(flat.size), "values": flat[:SMEM_SHOWN].tolist(),
                    "read_offsets": _typed(offsets, "i32"),
                    "reads": _typed(np.concatenate(per_step) if per_step else [], "i32")})
    return out


def _scratch(ct: CallTrace) -> list[dict]:
    return [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape), "space": o.memory_space,
             "bytes": o.nbytes} for o in ct.call.operands if o.role == "scratch"]


def _accesses(ct: CallTrace, shown: np.ndarray) -> dict | None:
    """Per ref, per shown step, a coarse picture of the elements the body read and wrote:
    the last two dims of the ref cut into at most ACCESS_CELLS^2 cells, each cell 1 (read),
    2 (written) or 3 (both) if any of its elements was. Distinct pictures are sent once."""
    log = ct.accesses
    if log is None:
        return None
    out = {}
    for name, shape in log.shapes.items():
        h, w = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[0] if shape else 1)
        rows, cols = min(h, ACCESS_CELLS), min(w, ACCESS_CELLS)
        pictures: dict[bytes, int] = {}
        at = np.zeros(len(shown), np.int64)
        for k, step in enumerate(shown):
            cell = np.zeros((rows, cols), np.int8)
            for bit, kind in ((1, "read"), (2, "write")):
                m = log.mask(int(step), name, kind).reshape(-1, h, w).any(axis=0)
                hit = np.add.reduceat(np.add.reduceat(m, np.linspace(0, h, rows + 1)[:-1]
                                                      .astype(int), 0),
                                      np.linspace(0, w, cols + 1)[:-1].astype(int), 1) > 0
                cell |= np.where(hit, bit, 0).astype(np.int8)
            at[k] = pictures.setdefault(cell.tobytes(), len(pictures))
        out[name] = {"rows": rows, "cols": cols,
                     "pictures": ["".join(str(b) for b in p) for p in pictures],
                     "at": _index(at)}
    return out


def _measured(t: TraceData, ct: CallTrace) -> dict | None:
    """The call's measured time beside the trace's own estimate (its model and chip, seconds)
    and their ratio, or why it was not measured (``note``); None when not asked for."""
    m = ct.measured
    if m is None:
        return None
    return {"seconds": m.seconds, "device": m.device, "note": m.note,
            "repeats": m.repeats, "loop_calls": m.loop_calls,
            "dispatched_seconds": m.dispatched_seconds, "estimate_s": ct.estimated_seconds,
            "chip": t.chip.name, "ratio": ct.measured_over_estimated}


def _sample(steps: int, n: int) -> np.ndarray:
    """``n`` evenly spread steps of ``steps``, always the first and the last."""
    if steps <= 2 or n >= steps:
        return np.arange(steps)
    return np.unique(np.round(np.linspace(0, steps - 1, max(n, 2))).astype(np.int64))


def call_data(t: TraceData, call: int, models: tuple[str, ...] = MODELS,
              chips: dict[str, list[str]] | None = None,
              shown: np.ndarray | None = None) -> dict[str, Any]:
    """What the viewer draws for call ``call``: the models in ``models`` (each costed on
    ``chips[model]``, default every chip of its kind) at the steps ``shown`` (default all)."""
    ct = t.calls[call]
    shown = np.arange(ct.steps) if shown is None else np.asarray(shown, np.int64)
    chips = chips or {}
    grid = ct.call.grid_indices()[shown]
    return {
        "index": call, "name": ct.name, "grid": list(ct.grid), "total_steps": ct.steps,
        # the mesh device this call runs on (a shard_map), and its body's DMAs as to_dict has
        "device": device_dict(ct.call.device), "body_dmas": [
            {**body_dma_dict(c), "remote": c.remote} for c in ct.call.body_copies],
        "semantics": list(ct.dimension_semantics), "steps": _typed(shown, "i32"),
        "shown": int(len(shown)), "grid_index": _typed(grid.reshape(-1), "i32"),
        "operands": _windowed(ct, shown), "prefetch": _prefetch(ct, shown),
        "scratch": _scratch(ct), "accesses": _accesses(ct, shown),
        "measured": _measured(t, ct),
        "models": {m: _model_data(ct, m, chips.get(m) or
                                  [n for n, c in CHIPS.items() if c.kind == m], shown)
                   for m in models},
    }


def viewer_data(t: TraceData, call: int = 0, models: tuple[str, ...] = MODELS,
                chips: dict[str, list[str]] | None = None,
                max_bytes: int | None = None) -> dict[str, Any]:
    """Every call of ``t``, with call ``call`` selected; ``models`` and ``chips`` as in
    ``call_data``. With ``max_bytes`` (of JSON), a call whose data would exceed it keeps an
    even sample of its steps (always the first and the last)."""
    calls = []
    for i, ct in enumerate(t.calls):
        data = call_data(t, i, models, chips)
        if max_bytes is not None:
            size, n = len(json.dumps(data)), ct.steps
            while size > max_bytes and n > 2:
                n = max(2, min(n - 1, int(n * max_bytes / size * 0.95)))
                data = call_data(t, i, models, chips, _sample(ct.steps, n))
                size = len(json.dumps(data))
        calls.append(data)
    return {"calls": calls, "call": call, "model": t.model, "chip": t.chip.name,
            "chip_names": {m: [n for n, c in CHIPS.items() if c.kind == m] for m in MODELS},
            "palette": pal.as_json()}


# ---- a Mosaic GPU kernel (kernelsim.gpu) ---------------------------------------------------

GPU_EVENTS_SHOWN = 2_000  # events sent per warpgroup; the rest are counted, not listed

# what each event kind does, in the GPU's words ({src}, {dst}, {barrier}, {bytes}, {flops})
GPU_EVENT_WORDS = {
    "tma_load": ("TMA copy global → shared",
                 "TMA copy {src} → {dst} (global → shared memory), {bytes}, lands on {barrier}"),
    "tma_store": ("TMA copy shared → global",
                  "TMA copy {src} → {dst} (shared → global memory), {bytes}"),
    "barrier_wait": ("barrier wait", "waits on {barrier} until its TMA copies land"),
    "barrier_arrive": ("barrier arrive", "arrives on {barrier}"),
    "wgmma": ("WGMMA", "WGMMA: shared memory × shared memory → registers, {flops}"),
    "wgmma_wait": ("WGMMA wait", "waits for its WGMMAs to finish"),
    "commit_smem": ("commit shared memory", "commits its shared-memory writes for TMA"),
    "wait_tma_store": ("TMA store wait", "waits for its TMA stores"),
    "load": ("load global → registers", "loads {src} (global memory → registers), {bytes}"),
    "store": ("store registers → global", "stores {dst} (registers → global memory), {bytes}"),
}


def _gpu_event(e, regs: list[str]) -> dict[str, Any]:
    """One event as the viewer draws it: its sentence, and the buffers it touches."""
    fill = {"src": e.src, "dst": e.dst, "barrier": e.barrier or "no barrier",
            "bytes": fmt_bytes(e.bytes), "flops": f"{e.flops:,} FLOP"}
    where = (f"loop {e.loop} step {', '.join(map(str, e.step))}: " if e.step else "")
    text = where + GPU_EVENT_WORDS[e.kind][1].format(**fill)
    touched = [n for n in (e.src, e.dst, e.barrier) if n] + (regs if e.kind == "wgmma" else [])
    return {"kind": e.kind, "text": text + (" (under a branch kernelsim cannot decide)"
                                            if e.conditional else ""),
            "touch": touched, "bytes": e.bytes}


def gpu_viewer_data(k: GpuKernelData) -> dict[str, Any]:
    """What the viewer draws for a Mosaic GPU kernel: the GPU's memories as lanes (global
    memory, shared memory, registers), each warpgroup's events in program order (at most
    ``GPU_EVENTS_SHOWN`` each), and the kernel's totals -- every number from ``k``."""
    chip = CHIPS[k.chip]
    regs = [a.name for a in k.allocations if a.space == "regs"]
    per_wg: list[list[dict]] = [[] for _ in range(k.num_threads)]
    counts = [0] * k.num_threads
    gmem: dict[str, dict[str, int]] = {}
    for e in k.events:
        counts[e.warpgroup] += 1
        if len(per_wg[e.warpgroup]) < GPU_EVENTS_SHOWN:
            per_wg[e.warpgroup].append(_gpu_event(e, regs))
        if e.kind in ("tma_load", "load"):
            gmem.setdefault(e.src, {"read": 0, "written": 0})["read"] += e.bytes
        elif e.kind in ("tma_store", "store"):
            gmem.setdefault(e.dst, {"read": 0, "written": 0})["written"] += e.bytes
    names = dict(GPU_KERNEL_SPACES)
    notes = {"gmem": "the kernel's operands; the one this event copies is outlined",
             "smem": "the buffers and barriers the lowering allocates per CTA",
             "regs": "each warpgroup's WGMMA accumulator"}
    lanes_ = [{"id": _lane_id(names[i]), "kind": i, "title": names[i], "note": notes[i]}
              for i in ("gmem", "smem", "regs")]
    lanes_.append({"id": "warpgroups", "kind": "events", "title": "warpgroups",
                   "note": "each one's events in program order; their timing is not modelled"})
    shown = max((len(w) for w in per_wg), default=0)
    return {
        "kind": "gpu_kernel", "model": "gpu", "chip": chip.name, "palette": pal.as_json(),
        "lanes": lanes_,
        "kinds": {kind: {"label": label, "color": pal.EVENT_COLORS[kind]}
                  for kind, (label, _) in GPU_EVENT_WORDS.items()},
        "kernel": {
            "name": k.name, "grid": list(k.grid), "grid_names": list(k.grid_names),
            "ctas": k.ctas, "cta": list(k.cta), "warpgroups": k.num_threads,
            "smem_bytes": k.smem_bytes, "chip_smem": chip.vmem_bytes, "barriers": k.barriers,
            "gmem_read": k.gmem_read_bytes, "gmem_write": k.gmem_write_bytes,
            "flops": k.flops, "compute_s": k.compute_seconds, "memory_s": k.memory_seconds,
            "estimate_s": k.estimated_seconds,
            "bound": "compute" if k.compute_seconds >= k.memory_seconds else "memory",
            "warnings": list(k.warnings), "shown": shown, "event_counts": counts,
            "events_dropped": k.events_dropped},
        "gmem": [{"name": n, "read": b["read"], "written": b["written"]}
                 for n, b in sorted(gmem.items())],
        "allocations": [{"name": a.name, "space": a.space, "shape": list(a.shape),
                         "dtype": a.dtype, "bytes": a.bytes} for a in k.allocations],
        "events": per_wg,
    }


def _json(data: dict) -> str:
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def _host(data: dict, key: str, label: str, total: int, shown: int) -> str:
    """The standalone viewer of ``data`` as one ``<div>`` with its module inline."""
    module = JS.read_text(encoding="utf-8")
    uid = "ks-" + hashlib.sha1(f"{key}:{next(_uid)}".encode()).hexdigest()[:10]
    return (f'<div class="ks-viewer-host" id="{uid}" aria-label="{_html.escape(label)}" '
            f'data-total-steps="{total}" data-shown-steps="{shown}"></div>\n'
            f'<script type="application/json" id="{uid}-data">{_json(data)}</script>\n'
            f'<script type="module">\n{module}\n'
            f'standalone(document.getElementById("{uid}"), '
            f'JSON.parse(document.getElementById("{uid}-data").textContent));\n</script>')


def _page(body: str, title: str, path: str | Path | None, fragment_only: bool = False) -> str:
    """``body`` as a full page titled ``title`` (or as it is, ``fragment_only``); written to
    ``path`` if given."""
    if not fragment_only:
        body = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                '<link rel="icon" href="data:,">'
                f'<title>{_html.escape(title)}</title></head>\n<body style="margin:8px">\n'
                f'{body}\n</body></html>\n')
    if path is not None:
        Path(path).write_text(body, encoding="utf-8")
    return body


def fragment(t: TraceData, call: int = 0, max_bytes: int = 1_000_000) -> str:
    """The standalone viewer as one ``<div>`` with its module inline (several fit a page)."""
    budget = max_bytes - len(JS.read_bytes()) - 2_000
    data = viewer_data(t, call, max_bytes=max(budget, 20_000))
    ct = data["calls"][call]
    note = (f"showing {ct['shown']:,} of {ct['total_steps']:,} steps"
            if ct["shown"] < ct["total_steps"] else f"all {ct['total_steps']:,} steps")
    return _host(data, t.calls[call].name,
                 f"kernelsim viewer: call {call} {t.calls[call].name}, {note}",
                 ct["total_steps"], ct["shown"])


def to_html(t: TraceData, path: str | Path | None = None, call: int = 0,
            fragment_only: bool = False, max_bytes: int = 1_000_000) -> str:
    """The standalone viewer as a full page (or a fragment); written to ``path`` if given."""
    body = fragment(t, call, max_bytes - (0 if fragment_only else 500))
    return _page(body, f"kernelsim: {t.calls[call].name}", path, fragment_only)


def gpu_fragment(k: GpuKernelData) -> str:
    """The standalone viewer of a Mosaic GPU kernel as one ``<div>`` with its module inline."""
    data = gpu_viewer_data(k)
    n = data["kernel"]["shown"]
    return _host(data, k.name, f"kernelsim viewer: Mosaic GPU kernel {k.name}, {n:,} events "
                 "per warpgroup", n, n)


def gpu_to_html(k: GpuKernelData, path: str | Path | None = None,
                fragment_only: bool = False) -> str:
    """``gpu_fragment`` as a full page (or the fragment); written to ``path`` if given."""
    return _page(gpu_fragment(k), f"kernelsim: {k.name} (Mosaic GPU)", path, fragment_only)


class Standalone:
    """The standalone viewer as a display object (what ``show()`` returns without a live
    front end): its mime bundle is the HTML fragment (made when displayed), its plain text a
    one-line note."""

    def __init__(self, html: Callable[[], str], text: str):
        self.html, self.text = html, text

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return {"text/html": self.html(), "text/plain": self.text}


def live_frontend() -> bool:
    """True when the running cell came from a notebook front end that renders widgets:
    JupyterLab, Notebook 7 and VS Code put a ``cellId`` in the request's metadata; nbclient
    (nbconvert, the site build) and plain IPython do not."""
    try:
        from IPython import get_ipython  # optional: present where a notebook runs
    except ImportError:
        return False
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return False
    parent = kernel.get_parent("shell") or {}
    return bool(parent.get("metadata", {}).get("cellId"))


@functools.cache
def _widget_class():
    """The anywidget class, made on first use (anywidget imports ipywidgets)."""
    import anywidget  # imports ipywidgets: on the first live viewer only
    import traitlets

    class Viewer(anywidget.AnyWidget):
        """The viewer in a live kernel. ``step``, ``call``, ``model`` and ``chip`` sync with
        the front end; changing ``model`` or ``chip`` recomputes the data here, in the
        kernel, from the trace's KernelCalls."""

        _esm = JS
        data = traitlets.Dict().tag(sync=True)
        step = traitlets.Int(0).tag(sync=True)
        call = traitlets.Int(0).tag(sync=True)
        model = traitlets.Unicode("tpu").tag(sync=True)
        chip = traitlets.Unicode("").tag(sync=True)
        hidden = traitlets.List(traitlets.Unicode()).tag(sync=True)

        def __init__(self, t: TraceData, call: int = 0):
            self.trace = t
            super().__init__(call=call, model=t.model, chip=t.chip.name, data=viewer_data(
                t, call, (t.model,), {t.model: [t.chip.name]}))
            self.observe(self._recompute, names=["model", "chip"])

        def _recompute(self, change) -> None:
            model = self.model
            chip = self.chip if CHIPS.get(self.chip, None) and \
                CHIPS[self.chip].kind == model else DEFAULT_CHIP[model]
            if (self.data.get("model"), self.data.get("chip")) == (model, chip):
                return  # the chip fix-up below re-enters here
            data = viewer_data(self.trace, self.call, (model,), {model: [chip]})
            data.update(model=model, chip=chip)
            with self.hold_sync():
                self.chip = chip
                self.data = data

    return Viewer


@functools.cache
def _gpu_widget_class():
    import anywidget  # imports ipywidgets: on the first live viewer only
    import traitlets

    class GpuViewer(anywidget.AnyWidget):
        """A Mosaic GPU kernel's viewer in a live kernel; ``step`` syncs with the front end."""

        _esm = JS
        data = traitlets.Dict().tag(sync=True)
        step = traitlets.Int(0).tag(sync=True)
        model = traitlets.Unicode("gpu").tag(sync=True)

        def __init__(self, k: GpuKernelData):
            self.kernel = k
            super().__init__(data=gpu_viewer_data(k))

    return GpuViewer


def viewer(t: TraceData, call: int = 0):
    """The anywidget ``Viewer`` of ``t`` (call ``call`` selected)."""
    return _widget_class()(t, call)


def gpu_viewer(k: GpuKernelData):
    """The anywidget viewer of a Mosaic GPU kernel."""
    return _gpu_widget_class()(k)


def show(t: TraceData, call: int = 0):
    """The live widget in a notebook front end, the standalone viewer elsewhere."""
    if not 0 <= call < len(t.calls):
        raise IndexError(f"call {call} out of range: the trace has {len(t.calls)} call(s)")
    if live_frontend():
        return viewer(t, call)
    c = t.calls[call]
    return Standalone(functools.partial(fragment, t, call),
                      f"kernelsim viewer of call {call} ({c.name}, {c.steps:,} steps)")


def show_gpu(k: GpuKernelData):
    """A Mosaic GPU kernel's viewer: the live widget in a notebook front end (its data made
    once: the model is the kernel's own), the standalone viewer elsewhere."""
    if live_frontend():
        return gpu_viewer(k)
    return Standalone(functools.partial(gpu_fragment, k),
                      f"kernelsim viewer of Mosaic GPU kernel {k.name} "
                      f"({len(k.events):,} events)")
