"""What a kernel inside ``jax.shard_map`` sends to other devices, read from kernelsim's trace
dict (``Trace.to_dict()``, its ``device`` and ``body_dmas``) for ``grader.verdict.verdict``'s
call facts: assignment 13's rules count them per device. ValueError when the dict is not what
kernelsim writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RemoteCopy:
    """A DMA a kernel inside ``jax.shard_map`` starts into another device's memory
    (``pltpu.make_async_remote_copy``), as kernelsim reads it from the body: the devices it
    goes from and to (``MeshDevice.id``), its bytes, the grid step and body position that start
    it, and the grid step and body position that wait on it (None: never waited on); the ref it
    writes on the receiving device and where in it the copy lands (the first element of the box
    it writes, per dimension; None when the copy writes no single box)."""

    src_device: int
    dst_device: int
    bytes: int
    start_step: int
    start_pos: int
    wait_step: int | None
    wait_pos: int | None
    dst: str = ""
    dst_start: tuple[int, ...] | None = None


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} is {type(v).__name__}, not an integer")
    return v


def _optional_int(v: Any, what: str) -> int | None:
    return None if v is None else _int(v, what)


def mesh_device(d: Any) -> int | None:
    """A call's device in a mesh (``trace_data.device_dict``) as its id; None outside one."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ValueError(f"device is {type(d).__name__}, not a mapping")
    return _int(d.get("id"), "device id")


def _box_start(box: Any) -> tuple[int, ...] | None:
    """A body DMA's slice (per dimension ``[start, size, stride]``) as its first element."""
    if box is None:
        return None
    if not isinstance(box, list) or not all(isinstance(d, list) and d for d in box):
        raise ValueError("a DMA's slice is not a list of [start, size, stride]")
    return tuple(_int(d[0], "slice start") for d in box)


def remote_copies(dmas: Any) -> tuple[RemoteCopy, ...]:
    """The remote copies among a call's body DMAs (``trace_data.body_dma_dict``): those whose
    source and destination devices differ."""
    if not isinstance(dmas, list) or not all(isinstance(d, dict) for d in dmas):
        raise ValueError("body_dmas is not a list of mappings")
    return tuple(
        RemoteCopy(src_device=_int(d.get("src_device"), "src_device"),
                   dst_device=_int(d.get("dst_device"), "dst_device"),
                   bytes=_int(d.get("bytes"), "bytes"),
                   start_step=_int(d.get("start_step"), "start_step"),
                   start_pos=_int(d.get("start_pos"), "start_pos"),
                   wait_step=_optional_int(d.get("wait_step"), "wait_step"),
                   wait_pos=_optional_int(d.get("wait_pos"), "wait_pos"),
                   dst=str(d.get("dst")), dst_start=_box_start(d.get("dst_slice")))
        for d in dmas if d.get("src_device") is not None
        and d.get("src_device") != d.get("dst_device"))
