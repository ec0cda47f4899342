"""How ``kernelsim.trace`` finds pallas_calls: from the jaxpr, computing only what schedules need.

The code around a kernel is not executed unless a schedule needs its value (a scalar-prefetch
operand, a dynamic grid bound, a loop's trip count or a branch predicate).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim

ROWS = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)  # 4 row blocks of (8, 128)


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _gather_kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]


def gather_blocks(idx, x):
    """Output block i is input block ``idx[i]`` (scalar prefetch picks the block)."""
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(idx.shape[0],),
        in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0)))
    return pl.pallas_call(_gather_kernel, grid_spec=spec,
                          out_shape=jax.ShapeDtypeStruct((8 * idx.shape[0], 128), x.dtype))(idx, x)


def _copy(x):
    return pl.pallas_call(_copy_kernel, grid=(x.shape[0] // 8,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _counted(counter: list):
    def host(v):
        counter.append(1)
        return v

    return lambda v: jax.pure_callback(host, jax.ShapeDtypeStruct(v.shape, v.dtype), v)


def test_code_a_schedule_does_not_need_never_runs():
    data_calls, index_calls = [], []
    data, index = _counted(data_calls), _counted(index_calls)

    def fn(idx, x):
        return gather_blocks(index(idx[::-1]), data(x) * 2.0)

    t = kernelsim.trace(jax.jit(fn), jnp.array([0, 1, 3], jnp.int32), ROWS)
    assert data_calls == [] and index_calls == [1]
    fetched = [e.block_index for e in t.steps() if e.operand == "x_ref" and e.action == "fetch"]
    assert fetched == [(3, 0), (1, 0), (0, 0)]


def test_a_result_of_a_function_around_a_kernel_the_program_drops_is_never_computed():
    """A jit (or a custom_vjp's rule) around a kernel may return more than its caller uses,
    e.g. a gradient's sum over the query heads (tokamax's splash attention backward)."""
    spent = []
    host = _counted(spent)

    @jax.jit
    def kernel_and_statistic(x):
        return _copy(x), jnp.sum(host(x))

    t = kernelsim.trace(lambda x: kernel_and_statistic(x)[0], ROWS)
    assert len(t.calls) == 1 and spent == []


def test_wrapper_primitive_without_an_eager_form_is_not_executed():
    def fn(x):
        return _copy(pltpu.with_memory_space_constraint(x, pltpu.HBM))

    assert kernelsim.trace(fn, ROWS).calls[0].hbm_read_bytes == ROWS.nbytes


def test_scan_makes_one_call_per_iteration_with_its_own_prefetch_values():
    def fn(idxs, x):
        def body(carry, idx):
            return carry, gather_blocks(idx, x)

        return jax.lax.scan(body, 0, idxs)[1]

    idxs = jnp.array([[0, 0], [2, 3], [1, 1]], jnp.int32)
    t = kernelsim.trace(jax.jit(fn), idxs, ROWS)
    assert len(t.calls) == 3
    for call, idx in enumerate(np.asarray(idxs)):
        fetched = [e.block_index[0] for e in t.steps(call)
                   if e.operand == "x_ref" and e.action == "fetch"]
        assert fetched == sorted(set(idx.tolist()), key=idx.tolist().index)


def test_computed_predicate_picks_the_branch_that_runs():
    def fn(flag, x):
        return jax.lax.cond(flag.sum() > 0, lambda v: _copy(v[:16]).sum(),
                            lambda v: _copy(v).sum(), x)

    assert kernelsim.trace(fn, jnp.array([1]), ROWS).calls[0].grid == (2,)
    assert kernelsim.trace(fn, jnp.array([0]), ROWS).calls[0].grid == (4,)


def test_python_branch_on_an_array_value_falls_back_to_running_the_function():
    def fn(x):
        if float(x[0, 1]) > 0:  # cannot be traced to a jaxpr
            return _copy(x[:8])
        return _copy(x)

    assert kernelsim.trace(fn, ROWS).calls[0].grid == (1,)


def _copy_leading_rows(n_ref, x_hbm, o_hbm, sem):
    """Copy the first ``n_ref[0, 0]`` rows of row block i: the DMA's size is block data."""
    rows = pl.ds(pl.program_id(0) * 8, n_ref[0, 0])
    pltpu.async_copy(x_hbm.at[rows], o_hbm.at[rows], sem).wait()


def leading_rows(counts, x):
    """Row block i of ``x`` keeps its first ``counts[i]`` rows (the rest stays zero)."""
    table = jnp.zeros((8 * counts.shape[0], 128), jnp.int32).at[::8, 0].set(counts)
    return pl.pallas_call(
        _copy_leading_rows, grid=(counts.shape[0],),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pltpu.SMEM),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=[pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(table, x)


def test_dma_size_read_from_an_input_block_is_computed_from_the_wrapper():
    """The size table is built inside the jitted wrapper; x's values decide nothing."""
    data_calls = []
    data = _counted(data_calls)
    counts = jnp.array([3, 8, 0, 5], jnp.int32)
    t = kernelsim.trace(jax.jit(lambda c, x: leading_rows(c, data(x))), counts, ROWS)
    copies = t.calls[0].call.body_copies
    assert [(c.step, c.bytes) for c in copies] == [(i, int(n) * 128 * 4)
                                                   for i, n in enumerate(counts)]
    assert t.calls[0].operand("x_hbm").hbm_read_bytes == 16 * 128 * 4
    assert data_calls == []


def _dma_after_host_math(x_hbm, o_ref, scratch, sem, *, size_from_host):
    """A DMA whose size is a constant or comes from host code (pure_callback) in the body."""
    host = _counted(CALLBACKS)
    block = host(scratch[...])  # block arithmetic nothing recorded depends on
    scratch[...] = block
    size = host(jnp.full((1,), 4, jnp.int32))[0] if size_from_host else 4
    pltpu.async_copy(x_hbm.at[pl.ds(0, size)], o_ref.at[pl.ds(0, size)], sem).wait()


CALLBACKS: list = []


@pytest.mark.parametrize("size_from_host, evaluated", [(False, 0), (True, 2)])
def test_body_values_nothing_recorded_depends_on_are_never_computed(size_from_host, evaluated):
    CALLBACKS.clear()
    kernel = functools.partial(_dma_after_host_math, size_from_host=size_from_host)
    fn = pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                                        pltpu.SemaphoreType.DMA],
                        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    t = kernelsim.trace(fn, ROWS)
    assert [c.bytes for c in t.calls[0].call.body_copies] == [4 * 128 * 4] * 2
    assert len(CALLBACKS) == evaluated  # one host call per step, only when a DMA needs it


def _row_from_table(idx_ref, x_ref, o_ref):
    """Copy the row of x that this step's SMEM block names (the index is block data)."""
    o_ref[...] = x_ref[pl.ds(idx_ref[0, 0], 1), :]


def test_recorded_accesses_use_indices_read_from_input_blocks():
    """The table of row indices is built inside the wrapper, so the walk must compute it."""
    def fn(picks, x):
        table = jnp.zeros((16, 128), jnp.int32).at[::8, 0].set(picks)
        return pl.pallas_call(
            _row_from_table, grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pltpu.SMEM),
                      pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((1, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((2, 128), jnp.float32))(table, x)

    picks = jnp.array([5, 2], jnp.int32)
    log = kernelsim.trace(jax.jit(fn), picks, ROWS[:8], record_access=True).calls[0].accesses
    reads = [a for a in log.accesses if a.operand == "x_ref" and a.kind == "read"]
    assert [(a.step, a.box[0]) for a in reads] == [(0, (5, 1, 1)), (1, (2, 1, 1))]
