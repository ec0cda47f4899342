"""L2 between the programs of a GPU launch: which global-memory reads cross HBM and which
the L2 cache serves, because a program running alongside read the same data just before.

A GPU runs many programs (thread blocks, CTAs) at once -- at least one per SM -- and a block
that one program reads is read again by its neighbours (a matmul's row band by every program
of that row) while it is still in L2, so it crosses HBM once, not once per program. Both
rules here assume the programs resident at once are the ``Chip.sms`` consecutive ones in
launch order, and that L2 holds what they read meanwhile (its size is not modelled).

``pallas_call`` (the Triton lowering, ``kernelsim.cost.estimate``): an input block read counts as an
L2 hit when a program at most ``sms - 1`` places earlier in launch order read the same block
(``l2_hits``). The launch order is the Triton lowering's: grid dimension 0 fastest
(``_process_grid_to_3d_grid`` in jax/_src/pallas/triton/lowering.py maps it to CUDA's x,
which the hardware dispatches first -- an observed order, not a documented one). The reuse
is keyed by block, not by what the body reads of it (a whole-array block is one block).

Mosaic GPU (``kernelsim.gpu``): ``wave_read_bytes``, from one CTA's reads and its
neighbours'.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np


def launch_rank(grid: tuple[int, ...]) -> np.ndarray:
    """int64 [steps]: each step's (row-major grid point's) place in a GPU's launch order,
    grid dimension 0 fastest (see the module docstring)."""
    if not grid:
        return np.zeros(1, np.int64)
    idx = np.indices(grid, dtype=np.int64).reshape(len(grid), -1)
    return np.ravel_multi_index(tuple(idx), grid, order="F").astype(np.int64)


def l2_hits(block_indices: np.ndarray, rank: np.ndarray, window: int) -> np.ndarray:
    """bool [steps]: the step's block was read by a program fewer than ``window`` places
    before it in launch order (``rank``), so it comes from L2 (all False if ``window`` < 2).

    block_indices: int64 [steps, ndim], the operand's block index per step.
    """
    hits = np.zeros(rank.shape[0], bool)
    if window < 2 or rank.shape[0] < 2:
        return hits
    keys = (np.unique(block_indices, axis=0, return_inverse=True)[1].ravel()
            if block_indices.shape[1] else np.zeros(rank.shape[0], np.int64))
    order = np.lexsort((rank, keys))  # by block, then launch order
    same = keys[order][1:] == keys[order][:-1]
    near = np.diff(rank[order]) < window
    hits[order[1:]] = same & near
    return hits


def read_key(values, unknown) -> tuple:
    """Offsets of a read as a key: a value not computed (``unknown``, or not a scalar) becomes
    a fresh object, so two reads with unknown offsets never count as the same."""
    return tuple(object() if v is unknown or not np.isscalar(v) else int(v) for v in values)


def wave_read_bytes(reads: list[tuple[tuple, int]],
                    neighbour_reads: Callable[[dict[str, int]], list[tuple[tuple, int]]],
                    names: tuple[str, ...], grid: tuple[int, ...], coords: dict[str, int],
                    sms: int, sizes: dict[str, int]) -> float:
    """Global-memory bytes one CTA of a Mosaic GPU kernel reads from HBM on average, L2
    reuse counted.

    reads: the CTA at ``coords`` (grid axis name -> index)'s global reads in program order,
    each ``((operand, transforms, offsets), bytes)``, offsets ints where known;
    neighbour_reads: the same list for the CTA at other coordinates; sizes: bytes of each
    operand.

    CTAs run in waves of ``sms`` (at least one per SM is resident), launched in row-major
    order of the grid: the Mosaic GPU lowering reverses the grid so that its last axis is
    CUDA's x (``parallel_grid[::-1]`` in jax/_src/pallas/mosaic_gpu/lowering.py), which the
    hardware dispatches first (observed, not documented). A read that a CTA and its
    neighbour along a grid axis make at the same point of their programs with the same
    offsets does not depend on that axis: the CTAs of a wave that differ only along such
    axes share it, so it crosses HBM once per distinct combination of the axes it does
    depend on (the rest are L2 hits). Each axis is judged by one neighbour (the CTA one
    further along it); a persistent kernel whose CTAs share a read with only some others is
    judged by that pair. A read whose offsets kernelsim cannot compute (they come from data
    the kernel loads, a ragged kernel's group sizes) cannot be matched: a wave's such reads
    of one operand count at most the operand's bytes (each byte from HBM once per wave, the
    same assumption as for a matched read). Without ``sms`` (a
    TPU chip table), or a grid whose axes have no names to move a CTA along: every read from
    HBM.
    """
    total = sum(b for _, b in reads)
    ctas = math.prod(grid)
    if not sms or ctas < 2 or not reads or len(names) < len(grid):
        return float(total)
    wave = min(sms, ctas)
    unmatched: Counter = Counter()
    for key, nbytes in reads:
        if not all(isinstance(v, int) for v in key[2]):
            unmatched[key[0]] += nbytes
    fetched = sum(min(b * wave, sizes.get(name, b * wave)) / wave
                  for name, b in unmatched.items())
    depends = np.zeros((len(reads), len(grid)), bool)
    for axis, (name, extent) in enumerate(zip(names, grid, strict=False)):
        if extent < 2:
            continue
        moved = {**coords, name: (coords.get(name, 0) + 1) % extent}
        other = neighbour_reads(moved)
        if len(other) != len(reads):
            depends[:, axis] = True
            continue
        depends[:, axis] = [a[0] != b[0] for a, b in zip(reads, other, strict=True)]
    points = np.stack(np.unravel_index(np.arange(wave), grid), axis=1)
    matched = np.array([all(isinstance(v, int) for v in k[2]) for k, _ in reads])
    for pattern in {tuple(row) for row in depends}:
        mask = np.all(depends == pattern, axis=1) & matched
        nbytes = sum(b for (_, b), m in zip(reads, mask, strict=True) if m)
        distinct = len(np.unique(points[:, list(pattern)], axis=0)) if any(pattern) else 1
        fetched += nbytes * distinct / wave
    return fetched
