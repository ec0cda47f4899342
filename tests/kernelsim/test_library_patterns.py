"""How kernel libraries wrap their Pallas kernels, traced as the program runs them.

tokamax wraps every op in ``jax.custom_vmap`` and a ``custom_vjp``; its grouped matmuls and
flywheel's attention run ``emit_pipeline`` inside a jitted ``pallas_call``. Each case is
checked against the copies TPU interpret mode performs (``verify``), and ``trace`` must find
the calls ``verify`` ran.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.verify import verify

pytestmark = pytest.mark.interpret


def _double_body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def double(x):
    """x * 2 in (8, 128) row blocks; the grid walks the rows."""
    return pl.pallas_call(_double_body, grid=(x.shape[0] // 8,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


# The tokamax pattern (tokamax/_src/ops/op.py wraps each op's call in jax.custom_vmap): an op
# whose vmap rule folds the batch into the rows and calls the same kernel once.
@jax.custom_batching.custom_vmap
def folded_double(x):
    return double(x)


@folded_double.def_vmap
def _folded_double_vmap(axis_size, in_batched, x):
    del axis_size, in_batched
    return double(x.reshape(-1, x.shape[-1])).reshape(x.shape), True


X = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)


def _same_calls(fn, *args):
    """trace and verify see the same calls; verify agrees with the interpreter."""
    v = verify(fn, *args)
    assert v.ok, v.report()
    t = kernelsim.trace(fn, *args)
    assert [c.grid for c in t.calls] == [c.grid for c in v.trace.calls]
    assert [c.hbm_read_bytes for c in t.calls] == [c.hbm_read_bytes for c in v.trace.calls]
    return t, v


def test_custom_vmap_unbatched_runs_its_call():
    t, v = _same_calls(folded_double, X)
    assert [c.grid for c in t.calls] == [(4,)]
    np.testing.assert_array_equal(v.outputs, X * 2)


def test_custom_vmap_under_vmap_follows_the_rule_not_a_batched_grid():
    xs = jnp.stack([X, X + 1])
    t, v = _same_calls(jax.vmap(folded_double), xs)
    assert [c.grid for c in t.calls] == [(8,)]  # the rule's one folded call, no batch axis
    np.testing.assert_array_equal(v.outputs, xs * 2)


# A custom_vjp around custom_vmap'd forward and backward kernels: how JAX's custom_vmap
# documentation says to give an op both a vmap rule and reverse-mode autodiff.
@jax.custom_vjp
def doubled(x):
    return folded_double(x)


def _doubled_fwd(x):
    return folded_double(x), None


def _doubled_bwd(_, g):
    return (folded_double(g),)


doubled.defvjp(_doubled_fwd, _doubled_bwd)


def test_grad_through_custom_vjp_around_custom_vmap_traces_forward_and_backward_kernels():
    loss = jax.grad(lambda x: doubled(x).sum())
    t, v = _same_calls(loss, X)
    assert len(t.calls) == 2  # the forward kernel and the backward one
    np.testing.assert_array_equal(v.outputs, np.full(X.shape, 2.0, np.float32))
    t, v = _same_calls(jax.vmap(loss), jnp.stack([X, X]))
    # the forward kernel through the vmap rule; the backward one's cotangent (ones) is not
    # batched, so it runs unbatched, once
    assert [c.grid for c in t.calls] == [(8,), (4,)]


@jax.custom_vjp
def doubled_remat(x):
    return double(x)


# optimize_remat: under jax.grad the forward pass becomes a remat_opt primitive that runs it
doubled_remat.defvjp(_doubled_fwd, _doubled_bwd, optimize_remat=True)


def test_grad_through_a_remat_optimised_custom_vjp_runs_its_forward_kernel():
    loss = jax.grad(lambda x: doubled_remat(x).sum())
    t, v = _same_calls(loss, X)
    assert len(t.calls) == 2
    np.testing.assert_array_equal(v.outputs, np.full(X.shape, 2.0, np.float32))


def _pipelined_add_one(x_hbm, o_hbm):
    def block(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    pltpu.emit_pipeline(block, grid=(x_hbm.shape[0] // 8,),
                        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                        out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)


@jax.jit
def pipelined_add_one(x):
    """An HBM-to-HBM kernel whose body pipelines its own blocks (tokamax's gmm does this)."""
    return pl.pallas_call(_pipelined_add_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)


def test_verify_and_run_trace_kernel_bodies_as_the_program_does():
    # Run op by op under disable_jit, emit_pipeline's loop would trace in Python and ask the
    # CPU which TPU it is; traced from the program's jaxpr the body is what the program holds.
    v = verify(pipelined_add_one, X)
    assert v.ok, v.report()
    assert [(d.route, len(d.model_bytes)) for d in v.body_dma_checks] == [
        ("hbm -> vmem", 4), ("vmem -> hbm", 4)]
    np.testing.assert_array_equal(v.outputs, X + 1)
    # the code after the kernel was traced under the abstract TPU mesh (emit_pipeline asks
    # for its TPU); it still compiles and runs on this host
    out, t = kernelsim.run(lambda x: (pipelined_add_one(x) * 2).sum(axis=0), X)
    np.testing.assert_array_equal(out, ((X + 1) * 2).sum(axis=0))
    assert len(t.calls[0].call.body_copies) == 8


def test_run_computes_the_code_between_kernels_and_returns_the_function_outputs():
    def fn(x, scale):
        y = double(x * scale)
        return {"y": y, "total": jnp.sum(double(y))}

    out, t = kernelsim.run(fn, X, 0.5)
    np.testing.assert_array_equal(out["y"], X)
    assert float(out["total"]) == float(jnp.sum(X) * 2)
    assert len(t.calls) == 2


@jax.jit
def mesh_copy(x):
    """A pl.kernel whose TensorCore mesh asks the device how many cores it has (tokamax's
    linear softmax cross-entropy kernels build theirs this way), which a CPU cannot answer."""
    mesh = pltpu.create_tensorcore_mesh("core")

    def body(x_ref, o_ref):
        pltpu.sync_copy(x_ref, o_ref)

    return pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)(x)


def test_a_tensorcore_mesh_built_from_the_device_traces_on_a_cpu_host():
    with pytest.raises(AttributeError):  # what the program itself does on this host
        jax.jit(lambda: pltpu.create_tensorcore_mesh("core").num_cores)()
    t, v = _same_calls(mesh_copy, X)
    assert t.calls[0].grid == (1,)  # the abstract TPU device has one TensorCore
    assert [(d.route, d.model_bytes) for d in v.body_dma_checks] == [("hbm -> hbm", [X.nbytes])]
    np.testing.assert_array_equal(v.outputs, X)


def test_abstract_tpu_lets_such_a_kernel_run_in_interpret_mode_on_this_host():
    from kernelsim.trace import abstract_tpu

    with pytest.raises(ValueError, match="TPU device kind"):
        with pltpu.force_tpu_interpret_mode():
            pipelined_add_one.trace(X)
    with pltpu.force_tpu_interpret_mode(), abstract_tpu("tpu-v5e"):
        out = jax.jit(lambda x: pipelined_add_one(x) * 1)(X)
    np.testing.assert_array_equal(out, X + 1)
    with pytest.raises(kernelsim.TraceError, match="unknown TPU"):
        abstract_tpu("tpu-v99")
