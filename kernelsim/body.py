"""Kernel-body DMAs as events in time: where each starts and where it is waited on.

The adapter (``kernelsim._jax``) interprets a kernel body step by step and reports, in body
order, each DMA it starts (``start``) and each wait on a DMA semaphore (``wait``), as plain
data. A wait completes the oldest DMA still in flight on the same semaphore, as the TPU's DMA
semaphores count completed copies in the order they were issued on one engine queue; a DMA
that is never waited on keeps ``wait_step = None``.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from kernelsim.model import BodyCopy, MemorySpace, Slice


class DmaLedger:
    """The body DMAs of one kernel call, matched to the waits that complete them."""

    def __init__(self) -> None:
        self.copies: list[BodyCopy] = []
        self._in_flight: dict[str, deque[int]] = {}

    def start(self, step: int, pos: int, src: str, dst: str, src_space: MemorySpace,
              dst_space: MemorySpace, nbytes: int, src_slice: Slice | None,
              dst_slice: Slice | None, semaphore: str, src_device: int | None = None,
              dst_device: int | None = None) -> None:
        """A DMA started at grid step ``step``, body event ``pos`` of that step, from the
        memory of device ``src_device`` into that of ``dst_device`` (None: not in a mesh)."""
        self._in_flight.setdefault(semaphore, deque()).append(len(self.copies))
        self.copies.append(BodyCopy(step, src, dst, src_space, dst_space, nbytes, src_slice,
                                    dst_slice, semaphore, pos, src_device=src_device,
                                    dst_device=dst_device))

    def wait(self, step: int, pos: int, semaphore: str) -> None:
        """A wait on ``semaphore`` at ``step``/``pos``: completes its oldest DMA in flight."""
        queue = self._in_flight.get(semaphore)
        if queue:
            k = queue.popleft()
            self.copies[k] = dataclasses.replace(self.copies[k], wait_step=step, wait_pos=pos)
