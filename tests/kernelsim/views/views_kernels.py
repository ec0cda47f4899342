"""Kernels the view tests trace (the matmul is kernelsim's own example)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernelsim.examples import matmul  # noqa: F401 - re-exported for the view tests


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
