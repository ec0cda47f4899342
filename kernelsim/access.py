"""In-kernel memory accesses as plain data: what the kernel body reads and writes, per step.

``kernelsim.trace(..., record_access=True)`` interprets each kernel jaxpr at every grid step
(``kernelsim.body.steps``) and records every ``ref[...]`` read and write as an ``Access``. The
kernel runs on zero-filled blocks (scalar-prefetch values are the real ones), so the recorded
indices are right only when they do not depend on block *data* -- loop bounds and offsets from
``pl.program_id``, Python constants and scalar prefetch are fine; an index read out of a VMEM
block is not (it reads 0).

Also here: ``PrefetchReads``, which scalar-prefetch entries each step's index maps read.
Coordinates are in the kernel's view of the ref (squeezed block dims dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

AccessKind = Literal["read", "write"]


@dataclass(frozen=True)
class Access:
    """One read or write of a ref by the kernel body at one grid step.

    order: position of this access among all accesses of its step (0-based, program order).
    box: per ref dimension ``(start, size, stride)`` when the access is a strided box
        (full block, static or dynamic slices, ``pl.ds``, integer indices); else ``None``.
    points: int64 [n, ndim] element coordinates, for gathers/scatters (``box`` is ``None``).
    """

    step: int
    order: int
    operand: str
    kind: AccessKind
    shape: tuple[int, ...]
    box: tuple[tuple[int, int, int], ...] | None = None
    points: np.ndarray | None = None

    def mask(self) -> np.ndarray:
        """bool array of the ref's shape: the elements this access touches."""
        m = np.zeros(self.shape, bool)
        if self.box is not None:
            m[tuple(slice(s, s + n * st, st) if n else slice(0, 0) for s, n, st in self.box)] \
                = True
        else:
            m[tuple(self.points.T)] = True
        return m

    def elements(self) -> set[tuple[int, ...]]:
        """The touched element coordinates as a set of tuples."""
        return {tuple(int(v) for v in p) for p in np.argwhere(self.mask())}

    @property
    def count(self) -> int:
        if self.box is not None:
            return int(np.prod([n for _, n, _ in self.box], dtype=np.int64))
        return int(len(np.unique(self.points, axis=0)))


@dataclass
class AccessLog:
    """Every recorded access of one call, in step then program order.

    shapes: the kernel-side shape of every ref that was accessed (operands, scratch and
        ``pl.run_scoped`` allocations, which are named ``scoped0``, ``scoped1``, ...).
    """

    steps: int
    shapes: dict[str, tuple[int, ...]]
    accesses: list[Access] = field(default_factory=list)

    def at(self, step: int, operand: str | None = None) -> list[Access]:
        """The accesses of ``step`` (to ``operand`` only, if given), in program order."""
        return [a for a in self._by_step().get(step, ())
                if operand is None or a.operand == operand]

    def _by_step(self) -> dict[int, list[Access]]:
        cache = self.__dict__.get("_cache")
        if cache is None or cache[0] != len(self.accesses):
            groups: dict[int, list[Access]] = {}
            for a in self.accesses:
                groups.setdefault(a.step, []).append(a)
            cache = (len(self.accesses), groups)
            self.__dict__["_cache"] = cache
        return cache[1]

    def mask(self, step: int, operand: str, kind: AccessKind) -> np.ndarray:
        """bool array: the elements of ``operand`` that ``step`` reads (or writes)."""
        m = np.zeros(self.shapes[operand], bool)
        for a in self.at(step, operand):
            if a.kind == kind:
                m |= a.mask()
        return m

    def first_order(self, step: int, operand: str, kind: AccessKind) -> np.ndarray:
        """int64 array: per element, the rank (0, 1, ...) of the first ``kind`` access of
        ``operand`` at ``step`` that touches it, counting only those accesses; -1 if none."""
        out = np.full(self.shapes[operand], -1, np.int64)
        rank = 0
        for a in self.at(step, operand):
            if a.kind != kind:
                continue
            m = a.mask() & (out < 0)
            out[m] = rank
            rank += 1
        return out


@dataclass(frozen=True)
class PrefetchReads:
    """Which entries of one scalar-prefetch operand the index maps read, step by step.

    steps / flat_index: parallel int64 arrays, one row per (step, entry) read.
    """

    operand: str
    shape: tuple[int, ...]
    steps: np.ndarray
    flat_index: np.ndarray

    def at(self, step: int) -> np.ndarray:
        """Sorted unique flat indices of the entries read at ``step``."""
        return np.unique(self.flat_index[self.steps == step])
