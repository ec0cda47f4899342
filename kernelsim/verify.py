"""Check kernelsim's TPU model against the copies TPU interpret mode really performs.

``verify(fn, *args)`` runs ``fn`` with every pallas_call in ``pltpu.InterpretParams()`` mode,
records each pipeline DMA the interpreter issues (operand, block index, grid point, bytes) and
compares them, event by event, with kernelsim's ``tpu`` schedule of the same calls. The
interpreter runs every grid axis in row-major order (see ``interpret_mode.in_row_major_order``).
Kernels inside ``jax.shard_map`` run with all the mesh's devices at once; each device's copies,
remote ones included, are compared with kernelsim's call for that device, route by route and
device pair by device pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.experimental.pallas import tpu as pltpu

from kernelsim import adapter
from kernelsim.check import interpret_mode
from kernelsim.cost.schedule import FETCH, WRITEBACK
from kernelsim.errors import TraceError
from kernelsim.find import call_model, calls
from kernelsim.model import OFF_CHIP
from kernelsim.trace import Trace, analyse, collect, resolve


@dataclass
class OperandCheck:
    """Model vs interpreter for one operand: (grid index, block index) of every copy, and the
    bytes of those copies counting whole block buffers (the interpreter pads edge blocks)."""

    call: int
    operand: str
    kind: str  # "fetch" or "writeback"
    model_copies: list[tuple[tuple[int, ...], tuple[int, ...]]]
    interpreter_copies: list[tuple[tuple[int, ...], tuple[int, ...]]]
    model_bytes: int
    interpreter_bytes: int

    @property
    def copies_match(self) -> bool:
        return self.model_copies == self.interpreter_copies

    @property
    def bytes_match(self) -> bool:
        return self.model_bytes == self.interpreter_bytes


@dataclass
class BodyDmaCheck:
    """Model vs interpreter for the kernel-body DMAs of one call along one route (e.g.
    ``hbm -> vmem``; ``any`` counts as ``hbm``; in a shard_map also the devices, e.g.
    ``vmem -> vmem, device 0 -> 1``): the bytes of every copy, sorted."""

    call: int
    route: str
    model_bytes: list[int]
    interpreter_bytes: list[int]

    @property
    def ok(self) -> bool:
        return self.model_bytes == self.interpreter_bytes


@dataclass
class Verification:
    """The outcome of ``verify``: per-operand checks, the trace, and the function's outputs."""

    trace: Trace
    outputs: Any
    checks: list[OperandCheck] = field(default_factory=list)
    body_dma_checks: list[BodyDmaCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every copy, and every byte, the model predicts is what the interpreter did."""
        return (all(c.copies_match and c.bytes_match for c in self.checks)
                and all(c.ok for c in self.body_dma_checks))

    def report(self) -> str:
        lines = []
        for c in self.checks:
            verdict = "ok" if c.copies_match and c.bytes_match else "MISMATCH"
            lines.append(
                f"call {c.call} {c.operand:>12} {c.kind:<9} model {len(c.model_copies):>6} "
                f"copies {c.model_bytes:>12,} B | interpreter {len(c.interpreter_copies):>6} "
                f"copies {c.interpreter_bytes:>12,} B  {verdict}")
        for d in self.body_dma_checks:
            lines.append(
                f"call {d.call} {d.route:>12} body DMA  model {len(d.model_bytes):>6} "
                f"copies {sum(d.model_bytes):>12,} B | interpreter "
                f"{len(d.interpreter_bytes):>6} copies {sum(d.interpreter_bytes):>12,} B  "
                f"{'ok' if d.ok else 'MISMATCH'}")
        return "\n".join(lines)


def _route(src: str, dst: str, devices: tuple[int, int] | None = None) -> str:
    def side(space: str) -> str:
        return "hbm" if space in OFF_CHIP else space

    on = "" if devices is None else f", device {devices[0]} -> {devices[1]}"
    return f"{side(src)} -> {side(dst)}{on}"


class _InterpretedMap(calls.MappedRunner):
    """Runs a shard_map's kernels in TPU interpret mode and files what each device's kernel
    did under that device's call (``current``: the index the next call gets)."""

    def __init__(self, current: list[int], copies: list, dmas: list) -> None:
        self.current, self.copies, self.dmas = current, copies, dmas

    def prepare(self, params: dict) -> dict:
        return call_model.with_operand_names(interpret_mode.in_row_major_order(
            {**params, "interpret": pltpu.InterpretParams()}))

    def run(self, thunk: Callable[[], Any], captured: list) -> Any:
        ids = [c.device.id for c in captured]
        if len(set(ids)) != len(ids):
            raise TraceError("verify: a shard_map body with more than one kernel is not "
                             "supported (the interpreter's copies cannot be told apart)")
        base, first_copy, first_dma = self.current[0], len(self.copies), len(self.dmas)
        outs = thunk()
        jax.block_until_ready(outs)
        for k in range(first_copy, len(self.copies)):
            c = self.copies[k]
            self.copies[k] = dataclasses.replace(c, call=base + ids.index(c.device))
        for k in range(first_dma, len(self.dmas)):
            d = self.dmas[k]
            self.dmas[k] = dataclasses.replace(d, call=base + ids.index(d.src_device))
        self.current[0] = base + len(captured)
        return outs


def verify(fn: Callable, *args: Any, chip: str | None = None) -> Verification:
    """Run ``fn(*args)`` in TPU interpret mode and compare its DMAs with the ``tpu`` model."""
    copies: list[interpret_mode.InterpretCopy] = []
    dmas: list[interpret_mode.InterpretDma] = []
    current = [0]

    def execute(call_args: tuple, params: dict) -> Any:
        params = call_model.with_operand_names(interpret_mode.in_row_major_order(params))
        outs = adapter.execute(call_args, params, pltpu.InterpretParams())
        jax.block_until_ready(outs)  # the interpreter's callbacks have all run
        current[0] += 1
        return outs

    model, chip_ = resolve("tpu", chip)
    with interpret_mode.recording_interpret_copies(copies, lambda: current[0], dmas):
        outputs, captured = collect(fn, args, execute, chip_,
                                    _InterpretedMap(current, copies, dmas))
    trace = analyse(captured, model, chip_, strict=False)
    result = Verification(trace, outputs)
    for index, ct in enumerate(trace.calls):
        grid = [tuple(int(v) for v in row) for row in ct.call.grid_indices()]
        for sched in ct.schedule.operands:
            op = sched.operand
            kind, code = ("fetch", FETCH) if op.role == "input" else ("writeback", WRITEBACK)
            steps = (sched.actions == code).nonzero()[0]
            model = [(grid[s], tuple(int(v) for v in op.block_indices[s])) for s in steps]
            mine = [c for c in copies if c.call == index and c.operand == op.name
                    and c.kind == kind]
            result.checks.append(OperandCheck(
                index, op.name, kind, model, [(c.grid_index, c.block_index) for c in mine],
                int(sched.padded_moved_bytes.sum()), sum(c.bytes for c in mine)))
    for index, ct in enumerate(trace.calls):
        routes: dict[str, tuple[list[int], list[int]]] = {}
        # An empty DMA (a size read as 0) moves nothing, and whether the interpreter performs
        # it depends on its queue, not on the kernel: it performs a DMA when a wait on its
        # semaphore still lacks bytes and the DMA is the newest queued on it (a wait for 0
        # bytes returns at once, so an empty DMA runs only if a later wait pops it). Only
        # copies that move bytes are compared, on both sides.
        mapped = ct.call.device is not None
        for c in ct.call.body_copies:
            if c.bytes == 0:
                continue
            route = _route(c.src_space, c.dst_space,
                           (c.src_device, c.dst_device) if mapped else None)
            routes.setdefault(route, ([], []))[0].append(c.bytes)
        for d in dmas:
            if d.call == index and d.bytes:
                route = _route(d.src_space, d.dst_space,
                               (d.src_device, d.dst_device) if mapped else None)
                routes.setdefault(route, ([], []))[1].append(d.bytes)
        result.body_dma_checks += [BodyDmaCheck(index, route, sorted(m), sorted(i))
                                   for route, (m, i) in sorted(routes.items())]
    return result
