"""kernelsim/find/index_maps.py additions for the views: prefetch reads of index maps."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim import adapter
from kernelsim.find import call_model, calls, index_maps


def test_prefetch_reads_lists_the_entries_each_steps_index_maps_read():
    def kernel(idx_ref, off_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def fn(idx, off, x):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(3,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, idx, off: (idx[2 - i], off[i, 1]))],
            out_specs=pl.BlockSpec((8, 128), lambda i, idx, off: (i, 0)))
        return pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct((24, 128), jnp.float32))(idx, off, x)

    found = []

    def handler(args, params):
        call = call_model.to_model(args, params)
        found.append(index_maps.prefetch_reads(params, call))
        return calls.zeros_for(params)

    with adapter.capturing(handler):
        fn(jnp.array([0, 2, 1], jnp.int32), jnp.zeros((3, 2), jnp.int32), jnp.zeros((24, 128)))
    reads = found[0]
    assert [reads["idx_ref"].at(s).tolist() for s in range(3)] == [[2], [1], [0]]
    assert [reads["off_ref"].at(s).tolist() for s in range(3)] == [[1], [3], [5]]  # flat (i,1)
    t = kernelsim.trace(fn, jnp.array([0, 2, 1], jnp.int32), jnp.zeros((3, 2), jnp.int32),
                        jnp.zeros((24, 128)))
    np.testing.assert_array_equal(t.calls[0].prefetch_reads["idx_ref"].at(0), [2])
