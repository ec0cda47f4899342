"""Stage 2 of kernelsim: per-step copy events of one pallas_call under a pipeline model.

``tpu`` (docs.jax.dev/en/latest/pallas/tpu/details.html, "Pipelining"; the same predicates as
the TPU interpreter, jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py): the grid runs
sequentially in row-major order; an input block is copied HBM->on-chip at the first step and
whenever its start indices differ from the previous step's, otherwise the step *skips* the copy;
an output block is written back when its start indices differ from the next step's, and at the
last step; otherwise it is *kept* on chip. Operands in ``pl.ANY``/HBM get no automatic copies.

``gpu`` (one program per grid point, as the Triton lowering emits): every step loads every
input block and stores every output block; nothing is reused between programs. (Which of
those loads L2 serves rather than HBM is a cost matter: ``kernelsim.cost.estimate``.)

``RevisitMode.ANY`` (an output's ``pl.Buffered(1, revisit=pl.RevisitMode.ANY)``): an output
block may come back after other blocks were visited, and the pipeline "will insert additional
DMAs as needed to restore the buffer state" (``RevisitMode``'s docstring,
jax/_src/pallas/core.py). jax passes the mode on to Mosaic (``revisit_mode`` in
jax/_src/pallas/mosaic/lowering.py), whose schedule is not public; kernelsim models the
restore the docstring describes: at every step where such a block comes back, one read of
the block from HBM (``restores``), besides the usual write-backs. TPU interpret mode does not
implement the mode (it rejects the revisit), so nothing checks this copy for copy.

Edge blocks of non-divisible shapes: each copy carries two sizes. ``block_bytes`` counts only
the in-bounds part -- the bytes of the array that exist in HBM, which is what the totals use,
because no byte outside the array is read from or written to it. ``padded_moved_bytes`` counts
the whole block buffer, which is what TPU interpret mode copies (it pads the edge block); the
DMA a real chip issues for the padded region is not documented, so kernelsim reports both and
``verify`` compares the padded size with the interpreter's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from kernelsim.errors import TraceError
from kernelsim.model import KernelCall, Operand

Model = Literal["tpu", "gpu"]
Action = Literal["fetch", "skip", "writeback", "keep"]
ACTIONS: tuple[Action, ...] = ("fetch", "skip", "writeback", "keep")
FETCH, SKIP, WRITEBACK, KEEP = range(4)


@dataclass(frozen=True)
class StepEvent:
    """What happens to one operand's block at one grid step.

    bytes: HBM bytes moved by this event (0 for ``skip`` and ``keep``).
    """

    step: int
    grid_index: tuple[int, ...]
    operand: str
    block_index: tuple[int, ...]
    action: Action
    bytes: int


@dataclass
class OperandSchedule:
    """Per-step arrays for one windowed operand (each of length ``steps``).

    actions: int8 codes indexing ``ACTIONS``.
    block_bytes: in-bounds bytes of the block at each step (what a copy would move).
    restores: bool, outputs with ``RevisitMode.ANY`` only: the block is read back from HBM
        at this step because it comes back after another block (all False otherwise).
    """

    operand: Operand
    actions: np.ndarray
    block_bytes: np.ndarray
    restores: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.restores is None:
            self.restores = np.zeros(self.actions.shape[0], bool)

    @property
    def moved_bytes(self) -> np.ndarray:
        """In-bounds HBM bytes moved at each step (restore reads included)."""
        return (np.where(self.moving, self.block_bytes, 0)
                + np.where(self.restores, self.block_bytes, 0))

    @property
    def restored_bytes(self) -> np.ndarray:
        """In-bounds HBM bytes read back at each step (``RevisitMode.ANY`` restores)."""
        return np.where(self.restores, self.block_bytes, 0)

    @property
    def padded_moved_bytes(self) -> np.ndarray:
        """Bytes moved at each step counting the whole (edge-padded) block buffer."""
        return (np.where(self.moving, self.operand.block_buffer_bytes, 0)
                + np.where(self.restores, self.operand.block_buffer_bytes, 0))

    @property
    def moving(self) -> np.ndarray:
        """bool [steps]: the block is copied (fetched or written back) at this step."""
        return (self.actions == FETCH) | (self.actions == WRITEBACK)

    def count(self, action: int) -> int:
        return int(np.count_nonzero(self.actions == action))

    def transfer_counts(self) -> np.ndarray:
        """int64 array with one cell per block position: how often that block was copied.

        Inputs count fetches, outputs write-backs; the shape is ``BlockDim.block_count`` of each
        dimension (for ``element`` dims, one cell per valid start offset).
        """
        op = self.operand
        shape = tuple(d.block_count(e) for d, e in zip(op.block_dims, op.shape, strict=True))
        counts = np.zeros(shape, np.int64)
        np.add.at(counts, tuple(op.block_indices[self.moving].T), 1)
        return counts

    @property
    def slots(self) -> np.ndarray:
        """int64 [steps]: which on-chip buffer (0 or 1) holds the block the kernel uses.

        A double-buffered input alternates buffers at every fetch, an output at every
        write-back (the next block goes to the other buffer while this one drains); a single
        buffer (``pl.Buffered(1)``, a trivial window, the ``gpu`` model) is always slot 0.
        """
        if self.operand.buffer_count < 2:
            return np.zeros(self.actions.shape[0], np.int64)
        if self.operand.role == "input":
            return (np.cumsum(self.actions == FETCH) - 1) % 2
        written = np.cumsum(self.actions == WRITEBACK)
        return np.concatenate([[0], written[:-1]]) % 2

    @property
    def filling(self) -> np.ndarray:
        """bool [steps]: while the kernel runs this step, a copy uses the *other* buffer.

        Inputs: the next step's block is being fetched into it. Outputs: the block finished
        at the previous step is being written back from it.
        """
        moving = self.actions == (FETCH if self.operand.role == "input" else WRITEBACK)
        out = np.zeros(self.actions.shape[0], bool)
        if self.operand.role == "input":
            out[:-1] = moving[1:]
        else:
            out[1:] = moving[:-1]
        return out


@dataclass
class CallSchedule:
    """The schedule of one call: the windowed operands' per-step arrays, in pallas_call order."""

    call: KernelCall
    model: Model
    operands: list[OperandSchedule]

    @property
    def step_bytes(self) -> np.ndarray:
        """int64 [steps]: HBM bytes the pipeline moves at each step, all operands together."""
        total = np.zeros(self.call.steps, np.int64)
        for s in self.operands:
            total += s.moved_bytes
        return total

    @property
    def cumulative_bytes(self) -> np.ndarray:
        """int64 [steps]: HBM bytes moved by the pipeline up to and including each step."""
        return np.cumsum(self.step_bytes)

    def operand_schedule(self, name: str) -> OperandSchedule:
        """The schedule of the windowed operand called ``name``."""
        for s in self.operands:
            if s.operand.name == name:
                return s
        raise KeyError(f"{name!r} has no schedule; windowed operands: "
                       f"{[s.operand.name for s in self.operands]}")

    def events(self) -> list[StepEvent]:
        """Every event, ordered by step, then operand (pallas_call order). An output's
        ``RevisitMode.ANY`` restore is a "fetch" event just before its own event."""
        grid_index = [tuple(int(v) for v in row) for row in self.call.grid_indices()]
        per_operand = [
            (s, [tuple(int(v) for v in row) for row in s.operand.block_indices],
             (s.moved_bytes - s.restored_bytes).tolist(), s.restored_bytes.tolist())
            for s in self.operands
        ]
        events = []
        for step in range(self.call.steps):
            for sched, blocks, moved, restored in per_operand:
                if sched.restores[step]:
                    events.append(StepEvent(step, grid_index[step], sched.operand.name,
                                            blocks[step], "fetch", restored[step]))
                events.append(StepEvent(step, grid_index[step], sched.operand.name,
                                        blocks[step], ACTIONS[sched.actions[step]], moved[step]))
        return events


def _block_bytes(call: KernelCall, op: Operand) -> np.ndarray:
    """In-bounds bytes of ``op``'s block at every step; raises TraceError when a block leaves."""
    idx = op.block_indices
    extent_bytes = np.full(idx.shape[0], op.itemsize, dtype=np.int64)
    for axis, (dim, extent) in enumerate(zip(op.block_dims, op.shape, strict=True)):
        col = idx[:, axis]
        count = dim.block_count(extent)
        bad = np.flatnonzero((col < 0) | (col >= count))
        if bad.size:
            step = int(bad[0])
            grid_point = tuple(int(v) for v in call.grid_indices()[step])
            block = tuple(int(v) for v in idx[step])
            raise TraceError(
                f"pallas_call {call.name!r}: the index map of operand {op.name!r} "
                f"(shape {op.shape}, block {op.block_shape}) returns block index {block} at "
                f"grid step {step} (grid index {grid_point}); dimension {axis} has {count} "
                f"{'blocks' if dim.kind == 'blocked' else 'valid positions'} (0..{count - 1}). "
                "Fix the index map or the grid so every block stays inside the array."
            )
        start = dim.start(col)
        inside = np.minimum(start + dim.size, extent) - np.maximum(start, 0)
        extent_bytes *= np.clip(inside, 0, None)
    return extent_bytes


def revisit_steps(starts: np.ndarray) -> np.ndarray:
    """Steps at which a block comes back after another block was visited in between (int64).

    ``starts``: [steps, ndim] start indices per step; consecutive steps on one block are one
    visit.
    """
    change = np.flatnonzero(np.any(starts[1:] != starts[:-1], axis=1)) + 1
    seen: set[tuple] = {tuple(starts[0])} if starts.shape[0] else set()
    steps = []
    for first in change:
        key = tuple(starts[first])
        if key in seen:
            steps.append(int(first))
        seen.add(key)
    return np.array(steps, np.int64)


def _changed(starts: np.ndarray, shift: int) -> np.ndarray:
    """Per step, whether the start indices differ from the step ``shift`` away (-1 prev, +1 next).

    The step with no neighbour (the first for -1, the last for +1) counts as changed.
    """
    changed = np.ones(starts.shape[0], dtype=bool)
    if starts.shape[0] > 1:
        diff = np.any(starts[1:] != starts[:-1], axis=1)
        if shift < 0:
            changed[1:] = diff
        else:
            changed[:-1] = diff
    return changed


def build(call: KernelCall, model: Model) -> CallSchedule:
    """Per-step events of every windowed input and output of ``call`` under ``model``."""
    if model not in ("tpu", "gpu"):
        raise TraceError(f"unknown model {model!r}: choose 'tpu' or 'gpu'")
    scheds = []
    for op in call.operands:
        if op.role not in ("input", "output") or op.block_indices is None:
            continue
        block_bytes = _block_bytes(call, op)
        if not op.pipelined:  # pl.ANY / HBM: the kernel copies by hand, if at all.
            continue
        starts = np.stack([d.start(op.block_indices[:, a]) for a, d in enumerate(op.block_dims)],
                          axis=1) if op.block_dims else np.zeros((call.steps, 0), np.int64)
        if op.role == "input":
            moves = _changed(starts, -1) if model == "tpu" else np.ones(call.steps, bool)
            actions = np.where(moves, FETCH, SKIP)
        else:
            moves = _changed(starts, +1) if model == "tpu" else np.ones(call.steps, bool)
            actions = np.where(moves, WRITEBACK, KEEP)
        restores = np.zeros(call.steps, bool)
        if op.revisit_any and op.role == "output" and model == "tpu":
            restores[revisit_steps(starts)] = True
        scheds.append(OperandSchedule(op, actions.astype(np.int8), block_bytes, restores))
    return CallSchedule(call, model, scheds)
