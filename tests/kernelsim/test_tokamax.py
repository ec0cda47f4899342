"""tokamax 0.0.17's public TPU ops (installed from PyPI), traced and checked against TPU interpret
mode: every call, pipeline copy and body DMA the interpreter performs, forward and backward.

Skipped where tokamax is not installed (it needs Python >= 3.12 and jax >= 0.11.1; CI does not
install it: ``pip install tokamax==0.0.17`` adds about 45 packages). tokamax refuses to run its TPU
kernels on a CPU unless asked to cross-compile (``tokamax.config.cross_compile``), which is how
these run in interpret mode here.
"""

import jax
import jax.numpy as jnp
import pytest

import kernelsim
from kernelsim.verify import verify

tokamax = pytest.importorskip("tokamax", minversion="0.0.17")
pytestmark = pytest.mark.interpret


def _key(i):
    return jax.random.key(i)


def ragged_dot():
    """tokamax.ragged_dot (megablox's grouped matmul): gmm forward; gmm and tgmm backward."""
    args = (jax.random.normal(_key(0), (512, 256)), jax.random.normal(_key(1), (4, 256, 256)),
            jnp.array([128, 64, 192, 128], jnp.int32))
    return (lambda lhs, rhs, sizes: tokamax.ragged_dot(lhs, rhs, sizes, implementation="mosaic"),
            (0, 1), args)


def attention():
    """tokamax.dot_product_attention: splash attention forward; forward and dkv backward."""
    q, k, v = (jax.random.normal(_key(i), (1, 256, 2, 128)) for i in range(3))
    return (lambda q, k, v: tokamax.dot_product_attention(q, k, v, implementation="mosaic"),
            (0, 1, 2), (q, k, v))


def cross_entropy():
    """tokamax.linear_softmax_cross_entropy_loss: pl.kernel on a TensorCore mesh, both ways."""
    args = (jax.random.normal(_key(0), (256, 256)), jax.random.normal(_key(1), (256, 512)),
            jax.random.randint(_key(2), (256,), 0, 512))
    return (lambda x, w, labels: tokamax.linear_softmax_cross_entropy_loss(
        x, labels, w, implementation="mosaic_tpu"), (0, 1), args)


OPS = {"ragged_dot": ragged_dot, "dot_product_attention": attention,
       "linear_softmax_cross_entropy_loss": cross_entropy}


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("name", list(OPS))
def test_tokamax_op_equals_the_interpreter(name, direction):
    op, wrt, args = OPS[name]()
    fn = op if direction == "fwd" else jax.grad(lambda *a: op(*a).sum(), argnums=wrt)
    with tokamax.config.cross_compile(True):
        v = verify(fn, *args)
        t = kernelsim.trace(fn, *args)
    assert v.ok, v.report()
    assert v.checks or v.body_dma_checks
    assert len(v.trace.calls) >= (1 if direction == "fwd" else 2)
    assert [(c.name, c.grid) for c in t.calls] == [(c.name, c.grid) for c in v.trace.calls]
    assert [c.call.body_copies for c in t.calls] == [c.call.body_copies for c in v.trace.calls]
    assert [c.hbm_read_bytes for c in t.calls] == [c.hbm_read_bytes for c in v.trace.calls]
