"""Small reference kernels kernelsim's tests, benchmarks and docs trace.

Each kernel has a plain-JAX reference (``*_reference``); tests check one against the other.
Each ``*_target`` function returns ``(fn, args)`` for ``kernelsim trace examples.py:NAME``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add(x: jax.Array, y: jax.Array, block: tuple[int, int] = (256, 256), interpret=False):
    """Tiled elementwise add; every block is read once, nothing is reused."""
    bm, bn = block
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(
        add_kernel,
        grid=(pl.cdiv(x.shape[0], bm), pl.cdiv(x.shape[1], bn)),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, y)


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _finalize():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x: jax.Array, y: jax.Array, bm: int = 128, bk: int = 128, bn: int = 128,
           interpret=False):
    """Blocked matmul, k innermost: the output block stays on chip across the k loop."""
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        matmul_kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        interpret=interpret,
    )(x, y)


def transpose_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


def transpose(x: jax.Array, block: int = 128, interpret=False):
    """Transpose through the index map: output block (i, j) reads input block (j, i)."""
    m, n = x.shape
    return pl.pallas_call(
        transpose_kernel,
        grid=(n // block, m // block),
        in_specs=[pl.BlockSpec((block, block), lambda i, j: (j, i))],
        out_specs=pl.BlockSpec((block, block), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
        interpret=interpret,
    )(x)


def block_sparse_kernel(counts_ref, rows_ref, cols_ref, x_ref, y_ref, o_ref):
    del rows_ref, cols_ref  # read by the index maps only
    i, k = pl.program_id(0), pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    # Padded steps repeat the row's last block: its copy is skipped, and so is the work.
    @pl.when(k < counts_ref[i])
    def _accumulate():
        o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def block_sparse_matmul(counts: jax.Array, rows: jax.Array, cols: jax.Array, x: jax.Array,
                        y: jax.Array, block: int = 128, interpret=False):
    """Block-sparse ``x`` @ dense ``y``: only ``x``'s listed nonzero blocks are read.

    ``rows``/``cols`` (int32, SMEM) list the nonzero blocks of ``x``, ``per_row`` entries for
    each output row-block, padded by repeating that row's last entry; ``counts[i]`` is the
    number of real entries of row-block i. The grid is (row-blocks, per_row).
    """
    n_row_blocks = x.shape[0] // block
    per_row = rows.shape[0] // n_row_blocks

    def x_map(i, k, counts_ref, rows_ref, cols_ref):
        return rows_ref[i * per_row + k], cols_ref[i * per_row + k]

    def y_map(i, k, counts_ref, rows_ref, cols_ref):
        return cols_ref[i * per_row + k], 0

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(n_row_blocks, per_row),
        in_specs=[pl.BlockSpec((block, block), x_map),
                  pl.BlockSpec((block, y.shape[1]), y_map)],
        out_specs=pl.BlockSpec((block, y.shape[1]), lambda i, k, *_: (i, 0)),
    )
    return pl.pallas_call(
        block_sparse_kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(counts, rows, cols, x, y)


def block_band_pattern(n_row_blocks: int, per_row: int):
    """(counts, rows, cols) of a banded pattern: row-block i holds blocks i..i+per_row-1,
    clipped at the edge and padded by repeating the row's last block."""
    counts, rows, cols = [], [], []
    for i in range(n_row_blocks):
        real = min(per_row, n_row_blocks - i)
        counts.append(real)
        for k in range(per_row):
            rows.append(i)
            cols.append(i + min(k, real - 1))
    return (np.array(counts, np.int32), np.array(rows, np.int32), np.array(cols, np.int32))


def dense_from_blocks(x, rows, cols, block: int):
    """``x`` with every block not listed in (rows, cols) set to zero."""
    mask = np.zeros(x.shape, np.float32)
    for r, c in set(zip(np.asarray(rows).tolist(), np.asarray(cols).tolist(), strict=True)):
        mask[r * block:(r + 1) * block, c * block:(c + 1) * block] = 1
    return x * mask


# --- plain-JAX references ------------------------------------------------------------------

def add_reference(x, y):
    return x + y


def matmul_reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def transpose_reference(x):
    return x.T


def block_sparse_reference(counts, rows, cols, x, y, block: int = 128):
    dense = dense_from_blocks(x, rows, cols, block)
    return jnp.dot(dense, y, preferred_element_type=jnp.float32)


# --- targets for `kernelsim trace kernelsim/examples.py:NAME` --------------------------------

def _inputs(*shapes, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    return tuple(jax.random.normal(k, s, dtype) for k, s in zip(keys, shapes, strict=True))


def add_target():
    return add, _inputs((1024, 1024), (1024, 1024))


def matmul_target():
    return functools.partial(matmul, bm=128, bk=128, bn=128), _inputs((1024, 1024), (1024, 1024))


def block_sparse_target():
    counts, rows, cols = block_band_pattern(8, 3)
    x, y = _inputs((1024, 1024), (1024, 256))
    pattern = tuple(jnp.asarray(a) for a in (counts, rows, cols))
    return block_sparse_matmul, (*pattern, x, y)
