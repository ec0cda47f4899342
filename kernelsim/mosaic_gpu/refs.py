"""The refs kernelsim.gpu's walk of a CTA follows: global-memory operands and the buffers the
body allocates (``Ref``), a value the walk could not compute (``UNKNOWN``), and what a ref's
transforms select (its shape after slicing and reshapes, the pipeline slot it indexes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Ref:
    """A ref of the walk: ``space`` "gmem", "smem", "regs" or "barrier"."""

    name: str
    space: str
    shape: tuple[int, ...]
    dtype: Any


UNKNOWN = object()  # a value the walk does not compute (array data, an unknown scalar)


def ref_name(ref) -> str:
    """The name of a ref kernelsim follows, "?" for anything else."""
    return ref.name if isinstance(ref, Ref) else "?"


def transformed_shape(ref, treedef, leaves) -> tuple[int, ...]:
    """The shape of ``ref`` after its transforms (slicing, indexing, reshapes)."""
    if not isinstance(ref, Ref):
        return ()
    shape = ref.shape
    values = [np.int32(0) if v is UNKNOWN or not np.isscalar(v) else np.int32(v)
              for v in leaves]
    try:
        for t in treedef.unflatten(values):
            if hasattr(t, "get_indexer_shape"):  # an indexer: ref.at[...]
                shape = tuple(t.get_indexer_shape())
            elif hasattr(t, "transform_shape"):  # reshapes, tiling, transposes
                shape = tuple(t.transform_shape(shape))
    except Exception:  # noqa: BLE001 - a transform kernelsim cannot size: the whole ref
        return ref.shape
    return shape


def slot_index(ref, treedef, leaves) -> int | None:
    """The slot of a multi-buffered allocation a ref transform selects (``smem.at[slot]``: an
    integer index on the first axis), when kernelsim knows its value; else None."""
    if not isinstance(ref, Ref) or treedef is None:
        return None
    unknown = [np.int32(0) for _ in leaves]
    values = [u if v is UNKNOWN or not np.isscalar(v) else np.int32(v)
              for u, v in zip(unknown, leaves, strict=True)]
    try:  # the indexer may follow layout transforms (unswizzle, untile), which select nothing
        indexer = next((t for t in treedef.unflatten(values) if hasattr(t, "indices")), None)
    except Exception:  # noqa: BLE001 - transforms kernelsim cannot read: no slot
        return None
    index = indexer.indices[0] if indexer is not None else None
    if index is None or any(index is u for u in unknown) or not np.isscalar(index):
        return None
    return int(index)


def smem_layout(treedef, leaves) -> tuple[int, tuple[int, ...], bool]:
    """(swizzle in bytes, tiling, transposed) of a shared-memory ref as its transforms read it:
    an allocation with ``plgpu.SwizzleTransform`` and ``plgpu.TilingTransform`` is read through
    an unswizzle and an untiling transform, and ``ref.T`` adds a transpose. (0, (), False) for
    a ref without transforms."""
    if treedef is None:
        return 0, (), False
    values = [np.int32(0) if v is UNKNOWN or not np.isscalar(v) else np.int32(v) for v in leaves]
    try:
        transforms = treedef.unflatten(values)
    except Exception:  # noqa: BLE001 - transforms kernelsim cannot read: none known
        return 0, (), False
    swizzle, tiling, transposed = 0, (), False
    for t in transforms:
        kind = type(t).__name__
        if kind == "UnswizzleRef":
            swizzle = int(t.swizzle)
        elif kind == "UntilingTransform":
            tiling = tuple(int(x) for x in t.tiling)
        elif kind == "TransposeTransform":
            transposed = tuple(t.permutation) != tuple(range(len(t.permutation)))
    return swizzle, tiling, transposed
