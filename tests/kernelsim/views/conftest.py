import matplotlib

matplotlib.use("Agg")

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from views_kernels import gather_rows, matmul  # noqa: E402

import kernelsim  # noqa: E402


@pytest.fixture(scope="session")
def mm_trace():
    return kernelsim.trace(matmul, jnp.ones((512, 512)), jnp.ones((512, 512)))


@pytest.fixture(scope="session")
def gather_trace():
    return kernelsim.trace(gather_rows, jnp.array([3, 1, 1, 0], jnp.int32),
                           jnp.zeros((32, 128), jnp.float32))
