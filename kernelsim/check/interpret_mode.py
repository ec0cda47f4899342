"""Running a kernel in TPU interpret mode as kernelsim models it, and recording the copies the
interpreter makes (``kernelsim.verify`` compares them with kernelsim's own events)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kernelsim.adapter import MeshKernelParams, observing_interpret_mode
from kernelsim.model import MemorySpace


def in_row_major_order(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every grid axis "arbitrary".

    TPU interpret mode visits the coordinates of "parallel" axes in a random permutation (to
    expose order-dependent kernels); a single TensorCore runs them in row-major order, which is
    the order kernelsim models. Marking them arbitrary makes the interpreter use that order.
    (A ``pl.kernel`` takes no dimension semantics: it runs as it is.)
    """
    cp = params.get("compiler_params")
    if isinstance(params, MeshKernelParams):
        return params
    if getattr(cp, "dimension_semantics", None) is None:
        return params
    return {**params, "compiler_params": dataclasses.replace(cp, dimension_semantics=None)}


@dataclass(frozen=True)
class InterpretCopy:
    """One pipeline copy the TPU interpreter made: ``kind`` is "fetch" or "writeback"."""

    call: int
    operand: str
    kind: str
    block_index: tuple[int, ...]
    grid_index: tuple[int, ...]
    bytes: int
    device: int = 0


@dataclass(frozen=True)
class InterpretDma:
    """One DMA the kernel body started, as the TPU interpreter executed it: from the memory
    of device ``src_device`` into that of ``dst_device`` (the interpreter's device ids)."""

    call: int
    src_space: MemorySpace
    dst_space: MemorySpace
    bytes: int
    src_device: int = 0
    dst_device: int = 0


@contextlib.contextmanager
def recording_interpret_copies(sink: list[InterpretCopy], call_index: Callable[[], int],
                               dmas: list[InterpretDma] | None = None) -> Iterator[None]:
    """Record every pipeline copy of TPU interpret mode into ``sink`` while the block runs,
    and every DMA a kernel body starts into ``dmas``; ``call_index()`` numbers the call that
    is running (``adapter.observing_interpret_mode`` says what the interpreter shows)."""
    def on_copy(operand, kind, block_index, grid_index, nbytes, device):
        sink.append(InterpretCopy(call_index(), operand, kind, block_index, grid_index, nbytes,
                                  device))

    def on_dma(src_space, dst_space, nbytes, src_device, dst_device):
        dmas.append(InterpretDma(call_index(), src_space, dst_space, nbytes, src_device,
                                 dst_device))

    with observing_interpret_mode(on_copy, None if dmas is None else on_dma):
        yield
