"""Kernels the view tests trace."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def mm_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += x_ref[...] @ y_ref[...]

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...]


def matmul(x, y, bm=128, bk=128, bn=128):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        mm_kernel, grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, y)


def gather_rows(idx, x):
    """Scalar prefetch picks the row block of x; a rank-3 output, a rank-1 bias input."""
    def kernel(idx_ref, x_ref, b_ref, o_ref):
        o_ref[...] = x_ref[...] + b_ref[...]

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(2, 4),
        in_specs=[pl.BlockSpec((8, 128), lambda b, i, idx: (idx[i], 0)),
                  pl.BlockSpec((128,), lambda b, i, idx: (0,))],
        out_specs=pl.BlockSpec((None, 8, 128), lambda b, i, idx: (b, i, 0)))
    return pl.pallas_call(kernel, grid_spec=spec,
                          out_shape=jax.ShapeDtypeStruct((2, 32, 128), jnp.float32))(
        idx, x, jnp.zeros((128,), jnp.float32))
