"""What a chain of ref transforms (``ref.at[...]``, ``.reshape``, ``.bitcast``) selects of a
ref: the flat indices of its elements, and the strided box when the selection is one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernelsim.adapter import BitcastTransform, IndexSlice, NDIndexer, ReshapeTransform
from kernelsim.errors import TraceError


class Selection:
    """What a chain of ref transforms selects of a ref.

    size: how many of the ref's elements it selects (with repeats; ``ids.size``); box: per
    dimension ``(start, size, stride)`` when the selection is one strided box of the ref, else
    None; nbytes: the bytes the view holds; exact: the view's elements are the ref's
    own (no bitcast between); ids: flat indices of the ref's elements, shaped as the view (plus
    a trailing axis of the ref elements one view element packs, after a bitcast to a wider
    dtype; a narrower one repeats each ref element once per view element it holds) -- made
    only when asked for, as a DMA's size and box need none.
    """

    __slots__ = ("size", "box", "nbytes", "exact", "_ids", "_grid")

    def __init__(self, size: int, box: tuple | None, nbytes: int, exact: bool,
                 ids: np.ndarray | None = None, grid: tuple | None = None):
        self.size, self.box, self.nbytes, self.exact = size, box, nbytes, exact
        self._ids, self._grid = ids, grid  # grid: (shape, coords) for _flat_ids

    @property
    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._ids = _flat_ids(*self._grid)
        return self._ids


def select(shape: tuple[int, ...], transforms: tuple, itemsize: int = 1) -> Selection:
    """What a chain of ``ref.at[...]`` indexers, ``ref.reshape`` and ``ref.bitcast`` views
    selects of a ref of ``shape`` whose elements are ``itemsize`` bytes.

    The box is only given for a single indexer of slices and integers (or no transform). The
    work is proportional to the selection, not to the ref: slices and integers narrow one
    coordinate range per dimension of the ref; a gather, reshape or bitcast makes the indices
    of the region selected so far explicit.
    """
    shape = tuple(int(n) for n in shape)
    coords: list[Any] = [range(n) for n in shape]  # int: a dropped dim
    if not transforms:  # ref[...]: the whole ref
        size = math.prod(shape)
        return Selection(size, tuple((0, n, 1) for n in shape), size * itemsize, True,
                         grid=(shape, coords))
    if len(transforms) == 1 and _is_indexer(transforms[0]):
        boxed = _one_box(shape, transforms[0].indices, itemsize)
        if boxed is not None:
            return boxed
    ids: np.ndarray | None = None  # explicit indices, once a view made them necessary
    pack, view_itemsize = 1, itemsize  # ref elements per view element; bytes per one
    for t in transforms:
        if not _is_indexer(t) and isinstance(t, (ReshapeTransform, BitcastTransform)):
            ids = _flat_ids(shape, coords) if ids is None else ids
            if isinstance(t, ReshapeTransform):
                ids = ids.reshape(tuple(t.shape) + ((pack,) if pack > 1 else ()))
                continue
            ids, pack, view_itemsize = _bitcast_view(ids, pack, view_itemsize,
                                                     np.dtype(t.dtype).itemsize)
            continue
        if not _is_indexer(t):
            raise TraceError(f"kernelsim follows ref indexing, reshape and bitcast, not "
                             f"{type(t).__name__}")
        index = []
        for ix in t.indices:
            if isinstance(ix, IndexSlice):
                start, size, stride = int(ix.start), int(ix.size), int(ix.stride)
                index.append(slice(start, start + size * stride, stride))
            else:
                index.append(np.asarray(ix, dtype=np.int64))
        if ids is None and all(not isinstance(i, np.ndarray) or i.ndim == 0 for i in index):
            view = [d for d, c in enumerate(coords) if not isinstance(c, int)]
            for d, i in zip(view, index, strict=False):
                coords[d] = coords[d][i] if isinstance(i, slice) else coords[d][int(i)]
            continue
        if ids is None:
            ids = _flat_ids(shape, coords)
        ids = ids[tuple(index)]
    if ids is None:
        size = math.prod(len(c) for c in coords if not isinstance(c, int))
        return Selection(size, None, size * view_itemsize, True, grid=(shape, coords))
    return Selection(ids.size, None, ids.size // pack * view_itemsize,
                     view_itemsize == itemsize, ids)


def _is_indexer(t: Any) -> bool:
    # the exact type first: NDIndexer is a Protocol subclass, whose isinstance is slow
    return type(t) is NDIndexer or isinstance(t, NDIndexer)


def _one_box(shape: tuple[int, ...], indices: tuple, itemsize: int) -> Selection | None:
    """``select`` of one indexer of slices and integers, one per dimension (the usual
    ``ref.at[...]``/``ref[...]``), in one pass: the only selection that is a box (besides the
    whole ref); None for any other indexer."""
    if len(indices) != len(shape):
        return None
    box, coords, size = [], [], 1
    for n, ix in zip(shape, indices, strict=True):
        if isinstance(ix, IndexSlice):
            start, count, stride = int(ix.start), int(ix.size), int(ix.stride)
            box.append((start, count, stride))
            coord = range(n)[start:start + count * stride:stride]  # clamped, as numpy slices
            size *= len(coord)
        elif getattr(ix, "ndim", 0) == 0:
            box.append((int(ix), 1, 1))
            coord = range(n)[int(ix)]
        else:
            return None
        coords.append(coord)
    return Selection(size, tuple(box), size * itemsize, True, grid=(shape, coords))


def _bitcast_view(ids: np.ndarray, pack: int, itemsize: int, new_itemsize: int
                  ) -> tuple[np.ndarray, int, int]:
    """``ids`` (a view packing ``pack`` ref elements each, of ``itemsize`` bytes) seen as
    ``new_itemsize``-byte elements, as a TPU ref bitcast does: the second-minor dimension
    shrinks or grows by the ratio (jax/_src/state/utils.py, ``bitcast``)."""
    view = ids.shape[:-1] if pack > 1 else ids.shape
    if len(view) < 2 and new_itemsize != itemsize:
        raise TraceError("a bitcast that changes the element size of a 1-D ref")
    if new_itemsize > itemsize:  # r rows of the old view make one row of the new one
        r = new_itemsize // itemsize
        n, m = view[-2], view[-1]
        lead = view[:-2]
        tail = (pack,) if pack > 1 else ()
        grouped = ids.reshape(lead + (n // r, r, m) + tail)
        grouped = np.moveaxis(grouped, len(lead) + 1, -1 if not tail else -2)
        return grouped.reshape(lead + (n // r, m, r * pack)), r * pack, new_itemsize
    if new_itemsize < itemsize:  # each old row makes k rows of the new view
        k = itemsize // new_itemsize
        if pack > 1 and pack % k == 0:
            lead, n, m = view[:-2], view[-2], view[-1]
            split = ids.reshape(lead + (n, m, k, pack // k))
            split = np.moveaxis(split, -2, len(lead) + 1)
            new_pack = pack // k
            out = split.reshape(lead + (n * k, m) + ((new_pack,) if new_pack > 1 else ()))
            return out, new_pack, new_itemsize
        if pack > 1:
            raise TraceError("a bitcast kernelsim cannot follow (it splits packed elements)")
        return np.repeat(ids, k, axis=-2), 1, new_itemsize
    return ids, pack, itemsize


def _flat_ids(shape: tuple[int, ...], coords: list[Any]) -> np.ndarray:
    """Row-major flat indices of the open grid ``coords`` (per dimension of ``shape``: an
    int for a dropped dimension, else a range of coordinates), shaped as the grid."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    view = [k for k, c in enumerate(coords) if not isinstance(c, int)]
    offset = sum(c * strides[k] for k, c in enumerate(coords) if isinstance(c, int))
    ids = np.full(tuple(len(coords[k]) for k in view), offset, np.int64)
    for j, k in enumerate(view):
        axis = [1] * len(view)
        axis[j] = -1
        c = coords[k]
        ids += (np.arange(c.start, c.stop, c.step, dtype=np.int64) * strides[k]).reshape(axis)
    return ids
