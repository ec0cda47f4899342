"""The example kernels kernelsim ships compute what their plain-JAX references compute."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelsim import examples as ex


def _normal(shape, seed, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


@pytest.mark.parametrize("shape,block", [((512, 512), (256, 256)), ((300, 200), (128, 128))])
def test_add_matches_reference(shape, block):
    x, y = _normal(shape, 0), _normal(shape, 1)
    np.testing.assert_allclose(ex.add(x, y, block, interpret=True), ex.add_reference(x, y))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-4), (jnp.bfloat16, 2e-2)])
def test_matmul_matches_reference(dtype, tol):
    x, y = _normal((256, 384), 0, dtype), _normal((384, 128), 1, dtype)
    got = ex.matmul(x, y, 128, 128, 128, interpret=True).astype(jnp.float32)
    want = ex.matmul_reference(x, y).astype(jnp.float32)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def test_transpose_matches_reference():
    x = _normal((256, 384), 2)
    np.testing.assert_array_equal(ex.transpose(x, 128, interpret=True), ex.transpose_reference(x))


def test_block_sparse_matches_reference():
    counts, rows, cols = ex.block_band_pattern(4, 3)
    x, y = _normal((512, 512), 3), _normal((512, 128), 4)
    got = ex.block_sparse_matmul(counts, rows, cols, x, y, 128, interpret=True)
    np.testing.assert_allclose(got, ex.block_sparse_reference(counts, rows, cols, x, y),
                               rtol=1e-4, atol=1e-3)
