"""deltanet-tpu 0.3.0's public Pallas TPU kernels (installed from PyPI), traced and checked
against TPU interpret mode (every pipeline copy) and their values against the library's own
plain-JAX reference recurrences (``deltanet_tpu.reference``), forward and backward.

Skipped where deltanet-tpu is not installed: CI does not install it (0.3.0 pins jax < 0.12, so
it goes in with ``pip install --no-deps deltanet-tpu==0.3.0``). On a CPU the library runs its
kernels with ``interpret=True`` itself (``gdn2.py``: any backend but TPU); kernelsim and
``verify`` read them all the same.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelsim
from kernelsim.verify import verify

deltanet = pytest.importorskip("deltanet_tpu", minversion="0.3.0")
reference = pytest.importorskip("deltanet_tpu.reference")
pytestmark = [pytest.mark.interpret,
              pytest.mark.filterwarnings("ignore:deltanet-tpu. running on non-TPU backend")]

B, L, H, D = 1, 256, 2, 128  # two chunks of the 128 tokens the kernels require


def _normal(i, shape):
    return jax.random.normal(jax.random.key(i), shape, jnp.float32)


def _qkv():
    q, k, v = (_normal(i, (B, L, H, D)) for i in range(3))
    # unit-norm keys keep the delta rule's state bounded, as the library's own tests do
    return q, k / jnp.linalg.norm(k, axis=-1, keepdims=True), v


def _gate():
    return jax.nn.sigmoid(_normal(4, (B, L, H)))


def chunk_gdn():
    """Gated DeltaNet: scalar log-decay per head (prepass and split kernels, both ways)."""
    return "chunk_gdn", (0, 1, 2), (*_qkv(), -jax.nn.softplus(_normal(3, (B, L, H))), _gate())


def chunk_kda():
    """Kimi Delta Attention: channel-wise log-decay."""
    return "chunk_kda", (0, 1, 2), (*_qkv(), -jax.nn.softplus(_normal(3, (B, L, H, D))),
                                    _gate())


def chunk_delta_rule():
    """The plain delta rule: no decay."""
    return "chunk_delta_rule", (0, 1, 2), (*_qkv(), _gate())


def _op(name):
    return lambda *a: getattr(deltanet, name)(*a, precision="fp32")


def _reference(name):
    return getattr(reference, "reference_" + name.removeprefix("chunk_"))


CASES = {"chunk_gdn": chunk_gdn, "chunk_kda": chunk_kda, "chunk_delta_rule": chunk_delta_rule}


def ops():
    """name -> builder of (op, argnums to differentiate, operands), as test_tokamax's OPS."""
    def build(case):
        name, wrt, args = case()
        return _op(name), wrt, args

    return {name: (lambda case=case: build(case)) for name, case in CASES.items()}


OPS = ops()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("name", list(CASES))
def test_deltanet_kernel_equals_the_interpreter_and_the_reference(name, direction):
    if direction == "bwd" and name != "chunk_gdn":
        pytest.skip("one backward: every variant runs the same chunk_gdn2 kernels")
    _, wrt, args = CASES[name]()
    op, ref = _op(name), _reference(name)
    if direction == "bwd":
        op, ref = (jax.grad(lambda *a, f=f: f(*a).sum(), argnums=wrt) for f in (op, ref))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        v = verify(op, *args)
        t = kernelsim.trace(op, *args)
    assert v.ok, v.report()
    assert v.checks
    assert [(c.name, c.grid) for c in t.calls] == [(c.name, c.grid) for c in v.trace.calls]
    assert [c.hbm_read_bytes for c in t.calls] == [c.hbm_read_bytes for c in v.trace.calls]
    for got, want in zip(jax.tree_util.tree_leaves(v.outputs),
                         jax.tree_util.tree_leaves(ref(*args)), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
