"""What the lessons' tests share."""

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def jax_default_matmul_precision_restored():
    """A test module that imports ``lessons/_course.py``, as every lesson does, sets JAX's
    default matmul precision for the whole process (to "highest"; in a notebook that is the
    lesson's own kernel). Given back when the module ends, so the tests that share this process
    later (kernelsim's GPU cost model reads the precision a dot was traced with) see JAX's
    default. Module-scoped, as the module fixtures that import ``_course`` are set up first."""
    before = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", before)
