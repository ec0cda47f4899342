"""kernelsim on kernels transcribed from JAX's own Pallas tests (jax-ml/jax tests/pallas/).

Each builder re-writes one JAX test's kernel with the same grid, BlockSpecs, index maps, memory
spaces and DMAs (shapes made small) and returns ``(fn, args)``. Every kernel is traced with no
error; every one TPU interpret mode can run on a CPU is also verified copy for copy against the
interpreter. ``emit_pipeline`` kernels are trace only: interpret mode needs a real TPU device
kind for them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.verify import verify


def _iota(shape, dtype=jnp.float32):
    return jnp.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


PREFETCH = jnp.array([4, 3, 2, 5, 3, 5, 2, 7], jnp.int32)


def _copy_body(_, x_ref, o_ref):
    o_ref[...] = x_ref[...]


# ---------------------------------------------------------------- tpu_pallas_test.py


# jax tests/pallas/tpu_pallas_test.py TPUPipelineModeTest.test_two_input_vadd
def two_input_vadd_buffered():
    block = 1024

    def body(x_ref, y_ref, o_ref):
        o_ref[:] = x_ref[:] + y_ref[:]

    @jax.jit
    def vadd(x, y):
        x = pltpu.with_memory_space_constraint(x, pltpu.HBM)
        y = pltpu.with_memory_space_constraint(y, pltpu.HBM)
        return pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=x.shape[0] // block,
            in_specs=[pl.BlockSpec((block,), lambda i: i, pipeline_mode=pl.Buffered(2)),
                      pl.BlockSpec((block,), lambda i: i, pipeline_mode=pl.Buffered(1))],
            out_specs=pl.BlockSpec((block,), lambda i: i),
        )(x, y)

    return vadd, (_iota((8 * block,)), _iota((8 * block,)))


# jax tests/pallas/tpu_pallas_test.py TPUPipelineModeRevisitTest.test_block_reduction_with_non_immediate_revisit  # noqa: E501
def block_reduction_non_immediate_revisit():
    def body(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[:] = o_ref[:] + x_ref[:]

    fn = jax.jit(pl.pallas_call(
        body, grid=(3, 3), out_shape=jax.ShapeDtypeStruct((8, 3 * 128), jnp.float32),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, j),
                               pipeline_mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY)),
    ))
    return fn, (_iota((3 * 8, 3 * 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_trivial_scalar_prefetch
def trivial_scalar_prefetch():
    x = _iota((8 * 8, 128), jnp.int32)
    fn = pl.pallas_call(
        _copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=8,
            in_specs=[pl.BlockSpec((8, 128), lambda i, s_ref: (s_ref[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, _: (i, 0))),
    )
    return fn, (PREFETCH, x)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_f32_scalar_prefetch
def f32_scalar_prefetch():
    def body(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.broadcast_to(s_ref[0], x_ref.shape)

    x = _iota((8, 128))
    fn = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1))
    return fn, (jnp.array([5.0], jnp.float32), x)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_trivial_scalar_prefetch_with_windowless_args  # noqa: E501
def scalar_prefetch_windowless_args():
    x = _iota((8 * 8, 128), jnp.int32)
    fn = pl.pallas_call(_copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1))
    return fn, (PREFETCH, x)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_scalar_prefetch_calling_convention  # noqa: E501
def scalar_prefetch_calling_convention():
    def kernel(s_refs, src, to_store, dst, sems):
        s_ref, _, _ = s_refs
        del src, sems
        dst[pl.ds(s_ref[pl.program_id(0)], 1), :] = to_store[...]

    @jax.jit
    def f(x, grid_size, to_store):
        s = jnp.array([1, 0], jnp.int32)  # step 0 -> block 1, step 1 -> block 0
        call = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((64, 128), x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(grid_size,),  # one pytree of scalars
                in_specs=[pl.BlockSpec((8, 128), lambda i, s_ref: (s_ref[0][i], 0)),
                          pl.BlockSpec((1, 128), lambda i, s_ref: (0, 0))],
                out_specs=pl.BlockSpec((32, 128), lambda i, s_ref: (s_ref[0][i], 0)),
                scratch_shapes=[pltpu.SemaphoreType.REGULAR((3,))]),
        )
        return call((s, jnp.arange(3, dtype=jnp.int32), None), x, to_store)

    return f, (_iota((16, 128)), 2, _iota((1, 128)))


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_vmap_scalar_prefetch
def vmap_scalar_prefetch():
    def f(x):
        return pl.pallas_call(
            _copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=8,
                in_specs=[pl.BlockSpec((x.shape[0] // 8, x.shape[1]),
                                       lambda i, s_ref: (s_ref[i], 0))],
                out_specs=pl.BlockSpec((x.shape[0] // 8, x.shape[1]), lambda i, _: (i, 0))),
        )(PREFETCH, x)

    return jax.vmap(f), (_iota((2, 8 * 8, 128), jnp.int32),)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_multiple_scalar_prefetch
def multiple_scalar_prefetch():
    def body(s1_ref, s2_ref, x_ref, o_ref):
        del s1_ref, s2_ref
        o_ref[...] = x_ref[...]

    fn = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.int32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=8,
            in_specs=[pl.BlockSpec((8, 128), lambda i, s1, _: (s1[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, _, s2: (s2[i], 0))),
    )
    s2 = jnp.arange(7, -1, -1, dtype=jnp.int32)
    return fn, (PREFETCH, s2, _iota((64, 128), jnp.int32))


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_scalar_interpreter
def scalar_interpreter():
    def body(program_ref, x_ref, o_ref, state_ref):
        def add(j):
            state_ref[...] += j.astype(jnp.float32)
            return ()

        def mul(j):
            state_ref[...] *= j.astype(jnp.float32)
            return ()

        def instruction(i, _):
            lax.switch(program_ref[i], (add, mul), i)

        state_ref[...] = x_ref[...]
        lax.fori_loop(0, program_ref.shape[0], instruction, None, unroll=True)
        o_ref[...] = state_ref[...]

    x = _iota((8 * 8, 128))
    fn = pl.pallas_call(
        body,
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct((8, 128), jnp.float32)],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=8,
            in_specs=[pl.BlockSpec((8, 128), lambda i, *_: (i, 0))],
            out_specs=[pl.BlockSpec((8, 128), lambda i, *_: (i, 0)),
                       pl.BlockSpec((8, 128), lambda *_: (0, 0))]),
    )
    return fn, (jnp.array([0, 0, 1, 0, 1, 1], jnp.int32), x)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_scalar_interpreter_dynamic_loop  # noqa: E501
def scalar_interpreter_dynamic_loop():
    def body(loop_end_ref, out_ref):
        out_ref[...] = jnp.zeros_like(out_ref)

        def step(i, carry):
            out_ref[...] += 1

        lax.fori_loop(0, loop_end_ref[0], step, None)

    fn = pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=1,
            out_specs=pl.BlockSpec((8, 128), lambda *_: (0, 0))),
    )
    return fn, (jnp.array([5], jnp.int32),)


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_nontrivial_vmap_scalar_prefetch  # noqa: E501
def nontrivial_vmap_scalar_prefetch():
    @jax.jit
    @jax.vmap
    def kernel(s, x):
        return pl.pallas_call(
            _copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=8,
                in_specs=[pl.BlockSpec((x.shape[0] // 8, x.shape[1]),
                                       lambda i, s_ref: (s_ref[i], 0))],
                out_specs=pl.BlockSpec((x.shape[0] // 8, x.shape[1]), lambda i, _: (i, 0))),
            compiler_params=pltpu.CompilerParams(allow_input_fusion=[False, True]),
        )(s, x)

    s = jnp.stack([PREFETCH, PREFETCH[::-1]])
    return kernel, (s, _iota((2, 8 * 8, 128), jnp.int32))


# jax tests/pallas/tpu_pallas_test.py PallasCallScalarPrefetchTest.test_input_output_aliasing_with_scalar_prefetch  # noqa: E501
def io_aliasing_with_scalar_prefetch():
    def kernel(_, x_ref, y_ref):
        y_ref[...] = x_ref[...] + 1.0

    @functools.partial(jax.jit, donate_argnums=(0,))
    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(x.shape[0],),
                in_specs=[pl.BlockSpec((None, 16, 128), lambda i, _: (i, 0, 0))],
                out_specs=pl.BlockSpec((None, 16, 128), lambda i, _: (i, 0, 0))),
            input_output_aliases={1: 0},
        )(jnp.array([1, 2, 3]), x)

    return f, (jnp.ones((4, 16, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDynamicGridTest.test_dynamic_grid
def dynamic_grid():
    def kernel(y_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            y_ref[...] = jnp.zeros_like(y_ref)

        y_ref[...] += 1

    @jax.jit
    def f(steps):
        return pl.pallas_call(kernel, grid=(steps * 2,),
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))()

    return f, (jnp.int32(4),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDynamicGridTest.test_dynamic_grid_overflow
def dynamic_grid_3d():
    def kernel(y_ref):
        @pl.when(pl.program_id(0) + pl.program_id(1) + pl.program_id(2) == 0)
        def _():
            y_ref[...] = jnp.zeros_like(y_ref)

        y_ref[...] += 1

    @jax.jit
    def f(steps):
        return pl.pallas_call(kernel, grid=(steps * 2, steps + 1, 3),
                              out_specs=pl.BlockSpec((8, 128), lambda *_: (0, 0)),
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))()

    return f, (jnp.int32(2),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDynamicGridTest.test_dynamic_grid_scalar_input
def dynamic_grid_scalar_input():
    def kernel(scalar_ref, o_ref):
        o_ref[...] = jnp.full_like(o_ref, scalar_ref[0, 0])

    @jax.jit
    def f(steps):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(steps * 2,),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        )(jnp.array([[42]], jnp.int32))

    return f, (jnp.int32(4),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDynamicGridTest.test_vmap_dynamic_grid
def vmap_dynamic_grid():
    def kernel(x_ref, y_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            y_ref[...] = x_ref[...]

        y_ref[...] += 1.0

    @jax.jit
    def f(x, steps):
        return pl.pallas_call(kernel, grid=(steps * 2,),
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)

    return jax.jit(jax.vmap(f, in_axes=(0, None))), (_iota((4, 8, 128)), jnp.int32(4))


# jax tests/pallas/tpu_pallas_test.py PallasCallDynamicGridTest.test_num_programs_block_spec
def num_programs_block_spec():
    def kernel(x_ref, y_ref):
        y_ref[...] = x_ref[...]

    @jax.jit
    def f(steps, x):
        return pl.pallas_call(
            kernel, grid=(steps * 2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (1 + 8 - pl.num_programs(0), 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
        )(x)

    return f, (jnp.int32(4), _iota((4 * 8, 128), jnp.int32))


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_scoped_allocation
def scoped_allocation():
    def kernel(y_ref):
        def body(x_ref):
            x_ref[...] = jnp.ones_like(x_ref)
            y_ref[...] = 4 * x_ref[...]

        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32)), ()


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_run_scoped_can_return_scalar_value
def run_scoped_returns_scalar():
    def kernel(y_ref):
        def body(x_ref):
            x_ref[0] = 0
            x_ref[0] += 1
            return x_ref[0] + 2

        y_ref[0] = pl.run_scoped(body, pltpu.SMEM((1,), jnp.int32))

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, out_specs=pl.BlockSpec(memory_space=pltpu.SMEM)),
    )
    return fn, ()


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_can_wait_on_semaphore_array_with_dynamic_index  # noqa: E501
def semaphore_array_dynamic_index():
    def kernel(y_ref):
        i = pl.program_id(0)

        def body(sems):
            pl.semaphore_signal(sems.at[i, 0])
            pl.semaphore_wait(sems.at[i, 0])
            pl.semaphore_signal(sems.at[i, 1], 2)
            pl.semaphore_wait(sems.at[i, 1])
            pl.semaphore_wait(sems.at[i, 1])

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR((4, 3)))

    fn = pl.pallas_call(kernel, in_specs=[], grid=4,
                        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    return fn, ()


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hbm_hbm_dma
def hbm_hbm_dma():
    def kernel(x_hbm_ref, y_hbm_ref):
        pltpu.sync_copy(x_hbm_ref.at[:8, :], y_hbm_ref.at[:, :128])

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    return fn, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hbm_hbm_grid_dma
def hbm_hbm_grid_dma():
    def kernel(x_hbm_ref, y_hbm_ref):
        i = pl.program_id(0)

        def body(sem):
            pltpu.async_copy(x_hbm_ref.at[pl.ds(i, 1)], y_hbm_ref.at[pl.ds(i, 1)], sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        out_shape=jax.ShapeDtypeStruct((2, 8, 128), jnp.float32))
    return fn, (_iota((2, 8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hbm_vmem_dma
def hbm_vmem_dma():
    def kernel(x_hbm_ref, y_ref):
        def body(x_ref, sem):
            pltpu.async_copy(x_hbm_ref.at[pl.ds(8), :], x_ref.at[:, pl.ds(128)], sem).wait()
            y_ref[...] = x_ref[...]

        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    return fn, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_vmem_hbm_vmem_dma
def vmem_hbm_vmem_dma():
    def kernel(x_hbm_ref, y_hbm_ref):
        def body(x_ref, y_ref, sem):
            pltpu.async_copy(x_hbm_ref, x_ref, sem).wait()
            y_ref[...] = x_ref[...]
            pltpu.async_copy(y_ref, y_hbm_ref, sem).wait()

        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32), pltpu.VMEM((8, 128), jnp.float32),
                      pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    return fn, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hbm_smem_dma
def hbm_smem_dma():
    def kernel(x_hbm_ref, y_ref):
        def body(x_ref, sem):
            pltpu.async_copy(x_hbm_ref, x_ref, sem).wait()
            y_ref[...] = x_ref[0, 0] * jnp.ones_like(y_ref)

        pl.run_scoped(body, pltpu.SMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    return fn, (4 * jnp.ones((8, 128), jnp.float32),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_smem_hbm_dma
def smem_hbm_dma():
    def kernel(x_ref, y_hbm_ref):
        def body(y_ref, sem):
            y_ref[0, 0] = 0.0
            y_ref[0, 1] = x_ref[4, 4]
            pltpu.async_copy(y_ref, y_hbm_ref, sem).wait()

        pl.run_scoped(body, pltpu.SMEM((1, 2), jnp.float32), pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        out_shape=jax.ShapeDtypeStruct((1, 2), jnp.float32))
    return fn, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hbm_vmem_dma_slicing
def hbm_vmem_dma_slicing():
    def kernel(x_hbm_ref, y_ref):
        def body(sem):
            first = pltpu.async_copy(x_hbm_ref.at[pl.ds(0, 8)], y_ref.at[pl.ds(0, 8)], sem)
            second = pltpu.async_copy(x_hbm_ref.at[pl.ds(8, 8)], y_ref.at[pl.ds(8, 8)], sem)
            first.wait()
            second.wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))
    return fn, (_iota((16, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hbm_vmem_dma_indexing
def hbm_vmem_dma_indexing():
    def kernel(x_hbm_ref, y_ref):
        def body(sem):
            first = pltpu.async_copy(x_hbm_ref.at[0], y_ref.at[pl.ds(0, 8)], sem)
            second = pltpu.async_copy(x_hbm_ref.at[1], y_ref.at[pl.ds(8, 8)], sem)
            first.wait()
            second.wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    fn = pl.pallas_call(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))
    return fn, (_iota((2, 8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hoisted_scratch_space
def hoisted_scratch_space():
    def kernel(x_ref, y_ref, scratch_ref):
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _():
            scratch_ref[...] = x_ref[...]

        scratch_ref[...] += jnp.ones_like(scratch_ref)

        @pl.when(i == 2)
        def _():
            y_ref[...] = scratch_ref[...]

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, grid=(3,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)]),
    )
    return fn, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hoisted_smem_space
def hoisted_smem_space():
    def kernel(y_ref, scratch_ref):
        scratch_ref[0, 0] = pl.program_id(0)
        y_ref[...] = jnp.broadcast_to(scratch_ref[0, 0], y_ref.shape)

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2, 8, 128), jnp.int32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, grid=(2,), in_specs=[],
            out_specs=pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0)),
            scratch_shapes=[pltpu.SMEM((1, 1), jnp.int32)]),
    )
    return fn, ()


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_hoisted_semaphore
def hoisted_semaphore():
    def kernel(x_hbm_ref, y_ref, sem, dma_sem):
        pl.semaphore_signal(sem)
        pl.semaphore_wait(sem)
        pltpu.async_copy(x_hbm_ref, y_ref, dma_sem).wait()

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            scratch_shapes=[pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.DMA]),
    )
    return fn, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallDMATest.test_dynamic_dma_on_2nd_minor
def dynamic_dma_on_2nd_minor():
    def kernel(array, data, index, size, _, sem):
        pltpu.async_copy(data.at[pl.ds(0, size[0])], array.at[pl.ds(index[0], size[0])],
                         sem).wait()

    def f(array, data, index, size):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(array.shape, array.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.VMEM),
                      pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            input_output_aliases={0: 0},
        )(array, data, index, size)

    return f, (jnp.zeros((64, 128), jnp.int32), jnp.ones((8, 128), jnp.int32),
               jnp.array([3], jnp.int32), jnp.array([5], jnp.int32))


# jax tests/pallas/tpu_pallas_test.py PallasCallTest.test_double_replicated_reduction
def double_replicated_reduction():
    block = 2 * 1024

    def body(o_ref):
        total = jnp.sum(jnp.full((4, 2, 9), 2.0, jnp.float32))
        o_ref[:] = jnp.full((block,), total)

    fn = jax.jit(pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((2 * block,), jnp.float32),
                                in_specs=[], out_specs=pl.BlockSpec((block,), lambda i: i),
                                grid=2))
    return fn, ()


# jax tests/pallas/tpu_pallas_test.py PallasCallTest.test_scalar_any_input
def scalar_any_input():
    def kernel(src, dst, sem):
        pltpu.async_copy(src, dst, sem).wait()

    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
                        scratch_shapes=[pltpu.SemaphoreType.DMA])
    return fn, (jnp.full((1,), 3.1415, jnp.float32),)


# jax tests/pallas/tpu_pallas_test.py PallasCallTest.test_sum_in_smem
def sum_in_smem():
    def kernel(x, out):
        a = jnp.array(0, dtype=jnp.int32)
        for i in range(4):
            for j in range(4):
                out[i, j] = a.astype(out.dtype)
                a += x[i, j].astype(jnp.int32)

    spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    x = jnp.ones((4, 4), jnp.int16)
    fn = pl.pallas_call(kernel, in_specs=[spec], out_specs=spec,
                        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
    return fn, (x,)


# jax tests/pallas/tpu_pallas_test.py PallasCallTest.test_jitted_kernel_with_program_id
def jitted_kernel_with_program_id():
    @jax.jit
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + pl.program_id(0).astype(x_ref.dtype)

    fn = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((2048,), jnp.float32), grid=(2,),
                        in_specs=[pl.BlockSpec((1024,), lambda i: i)],
                        out_specs=pl.BlockSpec((1024,), lambda i: i))
    return fn, (_iota((2048,)),)


# jax tests/pallas/tpu_pallas_test.py PallasCallTest.test_fori_loop_unroll_with_program_id
def fori_loop_unroll_with_program_id():
    def body(x_ref, y_ref):
        y_ref[...] = x_ref[...]

        def step(i, _):
            y_ref[...] += pl.program_id(0) + i

        lax.fori_loop(0, 4, step, None, unroll=2)

    fn = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((512,), jnp.int32), grid=(2,),
                        in_specs=(pl.BlockSpec((256,), lambda i: (i,)),),
                        out_specs=pl.BlockSpec((256,), lambda i: (i,)))
    return fn, (jnp.zeros((512,), jnp.int32),)


# jax tests/pallas/tpu_pallas_test.py PallasMegacoreTest.test_megacore_splitting
def megacore_splitting():
    def matmul_kernel(x_ref, y_ref, z_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            z_ref[...] = jnp.zeros_like(z_ref)

        z_ref[...] += x_ref[...] @ y_ref[...]

    call = pl.pallas_call(
        matmul_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32), grid=(2, 2, 2),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                  pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
    )
    k1, k2 = jax.random.split(jax.random.key(0))
    return jax.vmap(jax.vmap(call)), (jax.random.uniform(k1, (2, 2, 256, 256)),
                                      jax.random.uniform(k2, (2, 2, 256, 256)))


# jax tests/pallas/tpu_pallas_test.py PallasCallVmapTest.test_scratch_input_vmap
def scratch_input_vmap():
    def add_one_with_scratch(x_ref, o_ref, scratch_ref):
        scratch_ref[...] = jnp.ones_like(scratch_ref[...])
        o_ref[...] = x_ref[...] + scratch_ref[...]

    call = pl.pallas_call(
        add_one_with_scratch, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.int32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, grid=(2, 2),
            in_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
            scratch_shapes=[pltpu.VMEM((128, 128), jnp.int32)]),
    )
    x = jnp.broadcast_to(jnp.arange(256, dtype=jnp.int32), (3, 256, 256))
    return jax.vmap(call), (x,)


# ---------------------------------------------------------------- tpu_pallas_async_test.py


def _copy_start(x):
    def kernel(x_ref, aliased_x_ref, o_ref, sem):
        del aliased_x_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), pl.ANY(x.shape, x.dtype),
                   pltpu.SemaphoreType.DMA(())),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=(pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY),
                   pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
        input_output_aliases={0: 0},
    )(x)


def _copy_done(x, out, sem):
    def kernel(x_ref, o_ref, sem, aliased_o_ref):
        del aliased_o_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    return pl.pallas_call(
        kernel, out_shape=pl.ANY(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec(memory_space=pltpu.SEMAPHORE)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        input_output_aliases={1: 0},
    )(x, out, sem)


# jax tests/pallas/tpu_pallas_async_test.py PallasCallAsyncCopyTest.test_basic_async_copy
def basic_async_copy():
    @jax.jit
    def f(x):
        x, out, sem = _copy_start(x)
        return _copy_done(x, out, sem)

    return f, (_iota((8, 128)),)


# jax tests/pallas/tpu_pallas_async_test.py PallasCallAsyncCopyTest.test_copy_in_a_loop
def async_copy_in_a_loop():
    @jax.jit
    def f(x):
        def step(_, carry):
            x, out, sem = _copy_start(carry)
            return _copy_done(x, out, sem)

        return lax.fori_loop(0, x.shape[0], step, x)

    return f, (_iota((3, 8, 128)),)


# ---------------------------------------------------------------- tpu_pallas_pipeline_test.py


# jax tests/pallas/tpu_pallas_pipeline_test.py PallasCallPipelineTest.test_hbm_output
def emit_pipeline_hbm_output():
    def kernel(x_hbm_ref, o_hbm_ref):
        def inner(x_ref, o_ref):
            pltpu.sync_copy(x_ref, o_ref.at[:, pl.ds(pl.program_id(0) * 128, 128)])

        pltpu.emit_pipeline(
            inner, grid=(4,), in_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
            out_specs=pl.BlockSpec((8, 512), lambda i: (0, 0), memory_space=pltpu.HBM),
        )(x_hbm_ref, o_hbm_ref)

    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 512), jnp.int32),
                        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
                        out_specs=pl.BlockSpec(memory_space=pltpu.HBM))
    return fn, (_iota((8, 512), jnp.int32),)


# jax tests/pallas/tpu_pallas_pipeline_test.py PallasCallMultipleBufferedPipelineTest.test_copy
def emit_pipeline_multiple_buffered_copy():
    def kernel(x_hbm_ref, o_hbm_ref):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        pltpu.emit_pipeline(
            inner, grid=(2, 2),
            in_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j),
                                   pipeline_mode=pl.Buffered(buffer_count=4))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j),
                                   pipeline_mode=pl.Buffered(buffer_count=2)),
        )(x_hbm_ref, o_hbm_ref)

    x = _iota((256, 256), jnp.int32)
    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY))
    return fn, (x,)


# jax tests/pallas/tpu_pallas_pipeline_test.py PallasCallMultipleBufferedPipelineTest.test_block_gather  # noqa: E501
def emit_pipeline_block_gather():
    indices = [0, 0, 2, 2, 1, 3]

    def kernel(x_hbm_ref, indices_ref, o_hbm_ref):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        pltpu.emit_pipeline(
            inner, grid=(len(indices),),
            in_specs=[pl.BlockSpec((128, 128), lambda i: (indices_ref[i], 0),
                                   pipeline_mode=pl.Buffered(buffer_count=2))],
            out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0),
                                   pipeline_mode=pl.Buffered(buffer_count=2)),
        )(x_hbm_ref, o_hbm_ref)

    fn = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((len(indices) * 128, 128), jnp.int32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
    )
    return fn, (_iota((512, 128), jnp.int32), jnp.array(indices, jnp.int32))


# ---------------------------------------------------------------- tpu_pallas_interpret_test.py


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_matmul_example
def interpret_matmul_example():
    def matmul_kernel(x_ref, y_ref, z_ref):
        z_ref[...] = x_ref[...] @ y_ref[...]

    @jax.jit
    def matmul(x, y):
        return pl.pallas_call(
            matmul_kernel, grid=(2, 2),
            out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
            in_specs=[pl.BlockSpec((x.shape[0] // 2, x.shape[1]), lambda i, j: (i, 0)),
                      pl.BlockSpec((y.shape[0], y.shape[1] // 2), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((x.shape[0] // 2, y.shape[1] // 2), lambda i, j: (i, j)),
        )(x, y)

    k1, k2 = jax.random.split(jax.random.key(0))
    return matmul, (jax.random.normal(k1, (256, 256)), jax.random.normal(k2, (256, 256)))


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_inputs_and_outputs_not_evenly_divisible_by_block_shape  # noqa: E501
def ragged_3d_blocks():
    def kernel(x_ref, y_ref):
        y_ref[...] = x_ref[...] + 1.0

    shape = (3, 24, 160)
    fn = jax.jit(pl.pallas_call(
        kernel, grid=(2, 2, 2), out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
        in_specs=[pl.BlockSpec((2, 16, 128), lambda i, j, k: (i, j, k))],
        out_specs=pl.BlockSpec((2, 16, 128), lambda i, j, k: (i, j, k)),
    ))
    return fn, (_iota(shape),)


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_scalar_prefetch_example
def block_dynamic_slice():
    def kernel(indices, x_ref, o_ref):
        del indices
        o_ref[...] = x_ref[...]

    @functools.partial(jax.jit, static_argnums=(2,))
    def f(x, starts, sizes):
        call = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(sizes, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(1, 1),
                in_specs=[pl.BlockSpec(sizes, lambda i, j, idx: (idx[0], idx[1]))],
                out_specs=pl.BlockSpec(sizes, lambda *_: (0, 0))),
        )
        return call(jnp.array([starts[0] // sizes[0], starts[1] // sizes[1]]), x)

    return f, (_iota((256, 512), jnp.int32), jnp.array([128, 256]), (128, 128))


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_dynamic_grid_and_aliasing
def dynamic_grid_and_aliasing():
    def kernel(s1_ref, s2_ref, x_ref, o_ref):
        del s2_ref
        o_ref[...] = x_ref[...] + s1_ref[0].astype(x_ref.dtype)

    @jax.jit
    def f(s1, s2, x, iters):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(iters,),
                in_specs=[pl.BlockSpec(x.shape, lambda i, *_: (0, 0))],
                out_specs=pl.BlockSpec(x.shape, lambda i, *_: (0, 0))),
            input_output_aliases={2: 0},
        )(s1, s2, x)

    return f, (jnp.array([1], jnp.int32), jnp.array([2], jnp.int32), _iota((32, 128)),
               jnp.int32(5))


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_aliasing
def transposed_output_aliasing():
    def kernel(x_ref, o_ref, s_ref):
        @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
        def _():
            s_ref[0] = jnp.int32(0)

        s = s_ref[0]
        s_ref[0] = s + 1
        o_ref[:] = x_ref[:] + s.astype(x_ref.dtype)

    fn = pl.pallas_call(
        kernel, grid=(4, 4), out_shape=jax.ShapeDtypeStruct((4 * 8, 4 * 128), jnp.float32),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (j, i)),
        scratch_shapes=(pltpu.SMEM((1,), jnp.int32),),
        input_output_aliases={0: 0},
    )
    return fn, (jnp.zeros((4 * 8, 4 * 128)),)


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_randomization_of_parallel_dimensions  # noqa: E501
def parallel_arbitrary_semantics():
    def kernel(s_ref, o_ref):
        s = s_ref[0]
        s_ref[0] = s + 1
        o_ref[:] = jnp.full_like(o_ref, s)

    fn = jax.jit(pl.pallas_call(
        kernel, grid=(4, 4), out_shape=jax.ShapeDtypeStruct((32, 512), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
    ))
    return fn, (jnp.zeros((1,), jnp.int32),)


# ------------------------------------------- pl.kernel / pl.core_map (the mpmd_map primitive)
# From jax-ml/jax main at cec06d1 (after 0.11.0; the 0.12.0.1 wheel ships no tests). The mesh
# is made with create_tensorcore_mesh, which both supported releases have.


# jax tests/pallas/tpu_pallas_interpret_test.py InterpretTest.test_core_map
def core_map(num_cores):
    mesh = pltpu.create_tensorcore_mesh("x", num_cores=num_cores)

    @jax.jit
    def f(x):
        y = jnp.zeros_like(x)

        def inner(refs):
            x_ref, y_ref = refs

            @pl.core_map(mesh)
            def _():
                slc_size = 16 // num_cores

                def alloc(x_vmem_ref, y_vmem_ref, dma_sem, sem):
                    for i in range(num_cores):  # a barrier: the cores run at once
                        pl.semaphore_signal(sem, 1, core_index=i)
                    pl.semaphore_wait(sem, num_cores)
                    slc = pl.ds(jax.lax.axis_index("x") * slc_size, slc_size)
                    pltpu.async_copy(x_ref.at[slc], x_vmem_ref, dma_sem).wait()
                    y_vmem_ref[...] = x_vmem_ref[...] + jax.lax.axis_index("x") + 1
                    pltpu.async_copy(y_vmem_ref, y_ref.at[slc], dma_sem).wait()

                pl.run_scoped(alloc, pltpu.VMEM((slc_size, 128), x_ref.dtype),
                              pltpu.VMEM((slc_size, 128), y_ref.dtype),
                              pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.REGULAR)

        _, y = pl.run_state(inner)((x, y))
        return y

    return f, (_iota((16, 128), jnp.int32),)


# jax tests/pallas/tpu_pallas_state_test.py CoreMapTest.test_kernel_helper_basic
def kernel_helper_basic():
    def body(x_ref, o_ref):
        pltpu.sync_copy(x_ref, o_ref)

    x = _iota((8, 128), jnp.int32)
    mesh = pltpu.create_tensorcore_mesh("x", num_cores=1)
    return pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh), (x,)


# jax tests/pallas/tpu_pallas_state_test.py CoreMapTest.test_can_query_core_index
def kernel_core_index():
    mesh = pltpu.create_tensorcore_mesh("x", num_cores=2)
    slc_size = 16 // 2

    @jax.jit
    def f(x):
        @functools.partial(
            pl.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
            scratch_types=[pltpu.VMEM((slc_size, 128), x.dtype),
                           pltpu.VMEM((slc_size, 128), x.dtype), pltpu.SemaphoreType.DMA])
        def kernel(x_ref, y_ref, x_vmem_ref, y_vmem_ref, sem):
            slc = pl.ds(jax.lax.axis_index("x") * slc_size, slc_size)
            pltpu.async_copy(x_ref.at[slc], x_vmem_ref, sem).wait()
            y_vmem_ref[...] = x_vmem_ref[...] + jax.lax.axis_index("x")
            pltpu.async_copy(y_vmem_ref, y_ref.at[slc], sem).wait()

        return kernel(x)

    return f, (_iota((16, 128), jnp.int32),)


# jax tests/pallas/tpu_pallas_state_test.py CoreMapTest.test_capture_scalar (TensorCore mesh)
def kernel_capture_scalar():
    mesh = pltpu.create_tensorcore_mesh("x", num_cores=1)

    @jax.jit
    def f(x, i):
        @functools.partial(pl.kernel, mesh=mesh,
                           out_type=jax.ShapeDtypeStruct((1, *x.shape[1:]), jnp.int32))
        def kernel(x_ref, out_ref):
            pltpu.sync_copy(x_ref.at[i], out_ref.at[jax.lax.axis_index("x")])

        return kernel(x)

    return f, (_iota((4, 8, 128), jnp.int32), jnp.int32(2))


# ---------------------------------------------------------------- pallas_test.py


# jax tests/pallas/pallas_test.py PallasCallTest.test_block_spec_with_padding
def block_spec_with_padding():
    def kernel(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, pl.program_id(0))

    fn = pl.pallas_call(kernel, jax.ShapeDtypeStruct((8,), jnp.int32), grid=(3,),
                        out_specs=pl.BlockSpec((3,), lambda i: i))
    return fn, ()


# jax tests/pallas/pallas_test.py PallasCallTest.test_block_spec_mapped_dimension
def block_spec_mapped_dimension():
    def add_vectors(x_ref, y_ref, o_ref):
        o_ref[:] = x_ref[:] + y_ref[:]

    fn = pl.pallas_call(add_vectors, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32), grid=1,
                        in_specs=[pl.BlockSpec((None, 4), lambda _: (0, 0)),
                                  pl.BlockSpec((None, 4), lambda _: (1, 0))])
    xy = _iota((2, 4))
    return fn, (xy, xy)


# jax tests/pallas/pallas_test.py PallasCallElementIndexingTest.test_block_spec_element
def block_spec_element_high_padding():
    def kernel(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, pl.program_id(0))

    fn = pl.pallas_call(
        kernel, jax.ShapeDtypeStruct((14, 128), jnp.int32), grid=(2,),
        out_specs=pl.BlockSpec((pl.Element(8, (0, 2)), pl.Element(128, (0, 0))),
                               lambda i: (8 * i, 0)),
    )
    return fn, ()


# jax tests/pallas/pallas_test.py PallasCallElementIndexingTest.test_element_indexing
def element_indexing():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[pl.ds(0, 8)] + x_ref[pl.ds(8, 8)]

    fn = pl.pallas_call(
        kernel, grid=(7,), out_shape=jax.ShapeDtypeStruct((7 * 8, 128), jnp.float32),
        in_specs=(pl.BlockSpec((pl.Element(2 * 8), pl.Element(128)), lambda i: (i * 8, 0)),),
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
    )
    return fn, (_iota((8 * 8, 128)),)


# jax tests/pallas/pallas_test.py PallasCallElementIndexingTest.test_unblocked_indexing_with_padding
def unblocked_indexing_with_padding():
    def kernel(x_ref, y_ref):
        y_ref[...] = x_ref[pl.ds(0, 8)]

    fn = pl.pallas_call(
        kernel, grid=(1,), out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=(pl.BlockSpec((pl.Element(2 * 8, (0, 8)), pl.Element(128)), lambda i: (0, 0)),),
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
    )
    return fn, (_iota((8, 128)),)


# jax tests/pallas/pallas_test.py PallasCallInputOutputAliasingTest.test_vector_input_output_aliasing  # noqa: E501
def vector_input_output_aliasing():
    def kernel(x_ref, y_ref):
        y_ref[...] = x_ref[...] + 1.0

    @functools.partial(jax.jit, donate_argnums=(0,))
    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0],),
            in_specs=[pl.BlockSpec((None, 128, 128), lambda i: (i, 0, 0))],
            out_specs=pl.BlockSpec((None, 128, 128), lambda i: (i, 0, 0)),
            input_output_aliases={0: 0},
        )(x)

    return f, (jnp.ones((4, 128, 128)),)


# jax tests/pallas/pallas_test.py PallasCallInputOutputAliasingTest.test_scalar_input_output_aliasing  # noqa: E501
def scalar_input_output_aliasing():
    def kernel(x_ref, y_ref):
        y_ref[0] = x_ref[0] + 1.0

    spec = pl.BlockSpec((1,), lambda *_: (0,), memory_space=pltpu.SMEM)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              in_specs=[spec], out_specs=spec, grid=(1,),
                              input_output_aliases={0: 0})(x)

    return f, (jnp.array([41.0], jnp.float32),)


# jax tests/pallas/pallas_test.py PallasControlFlowTest.test_cond_threebranch_matrix_out
def cond_threebranch_matrix_out():
    bx, by = 8, 64

    def f(branch_ref, x_ref, y_ref, o_ref):
        o_ref[...] = lax.switch(
            branch_ref[...],
            (lambda x, y: (x - y) ** 2, lambda x, y: -jnp.abs(x - y),
             lambda x, y: jnp.sqrt(jnp.abs(x - y))),
            x_ref[...], y_ref[...])

    fn = pl.pallas_call(
        f, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        grid=(32 // bx, 128 // by),
        in_specs=[pl.BlockSpec((), lambda _, __: ()),
                  pl.BlockSpec((bx, 1), lambda i, _: (i, 0)),
                  pl.BlockSpec((1, by), lambda _, j: (0, j))],
        out_specs=pl.BlockSpec((bx, by), lambda i, j: (i, j)),
    )
    return fn, (jnp.int32(2), jnp.arange(32.0)[:, None], jnp.arange(128.0)[None, :])


# jax tests/pallas/pallas_test.py PallasCallAutodifferentiationTest.test_jvp
def jvp_of_scalar_kernel():
    def kernel(x_ref, o_ref):
        x = x_ref[()]
        o_ref[()] = jnp.sin(x) * x

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((), jnp.float32))
    return (lambda x, t: jax.jvp(call, (x,), (t,))), (jnp.float32(0.5), jnp.float32(1.5))


# ---------------------------------------------------------------- pallas_vmap_test.py


# jax tests/pallas/pallas_vmap_test.py PallasCallVmapTest.test_double_vmap_of_slicing_kernel_different_axes  # noqa: E501
def double_vmap_slicing_different_axes():
    def sin(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[i] = jnp.sin(x_ref[i])

    call = pl.pallas_call(sin, out_shape=jax.ShapeDtypeStruct((4,), jnp.float32), grid=(4,))
    return jax.vmap(jax.vmap(call, in_axes=1), in_axes=0), (jnp.arange(64.0).reshape(8, 4, 2),)


# jax tests/pallas/pallas_vmap_test.py PallasCallVmapTest.test_vmap_of_kernel_with_input_output_aliases  # noqa: E501
def vmap_kernel_with_io_aliases():
    def add(x_ref, _, o_ref):
        o_ref[()] = x_ref[()] + o_ref[()] + 1

    call = pl.pallas_call(add, out_shape=jax.ShapeDtypeStruct((), jnp.int32),
                          input_output_aliases={1: 0}, grid=())
    return jax.vmap(call, in_axes=(0, None)), (jnp.arange(8, dtype=jnp.int32), jnp.int32(1))


# jax tests/pallas/pallas_vmap_test.py PallasCallVmapTest.test_quadruple_vmap_of_batched_kernel
def quadruple_vmap_batched_kernel():
    def add_one(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[i] = x_ref[i] + 1

    call = pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct((3,), jnp.int32), grid=(3,))
    fn = jax.vmap(jax.vmap(jax.vmap(jax.vmap(call))))
    return fn, (jnp.arange(2 * 2 * 1 * 2 * 3, dtype=jnp.int32).reshape(2, 2, 1, 2, 3),)


# ---------------------------------------------------------------- the suite

# name -> (builder, verifiable)
CASES = {
    "two_input_vadd_buffered": (two_input_vadd_buffered, True),
    # interpret mode refuses the revisit: "RuntimeError: Revisited block ... of output 0"
    "block_reduction_non_immediate_revisit": (block_reduction_non_immediate_revisit, False),
    "trivial_scalar_prefetch": (trivial_scalar_prefetch, True),
    "f32_scalar_prefetch": (f32_scalar_prefetch, True),
    "scalar_prefetch_windowless_args": (scalar_prefetch_windowless_args, True),
    "scalar_prefetch_calling_convention": (scalar_prefetch_calling_convention, True),
    "vmap_scalar_prefetch": (vmap_scalar_prefetch, True),
    "multiple_scalar_prefetch": (multiple_scalar_prefetch, True),
    "scalar_interpreter": (scalar_interpreter, True),
    "scalar_interpreter_dynamic_loop": (scalar_interpreter_dynamic_loop, True),
    "nontrivial_vmap_scalar_prefetch": (nontrivial_vmap_scalar_prefetch, True),
    "io_aliasing_with_scalar_prefetch": (io_aliasing_with_scalar_prefetch, True),
    "dynamic_grid": (dynamic_grid, True),
    "dynamic_grid_3d": (dynamic_grid_3d, True),
    "dynamic_grid_scalar_input": (dynamic_grid_scalar_input, True),
    "vmap_dynamic_grid": (vmap_dynamic_grid, True),
    "num_programs_block_spec": (num_programs_block_spec, True),
    "scoped_allocation": (scoped_allocation, True),
    "run_scoped_returns_scalar": (run_scoped_returns_scalar, True),
    "semaphore_array_dynamic_index": (semaphore_array_dynamic_index, True),
    "hbm_hbm_dma": (hbm_hbm_dma, True),
    "hbm_hbm_grid_dma": (hbm_hbm_grid_dma, True),
    "hbm_vmem_dma": (hbm_vmem_dma, True),
    "vmem_hbm_vmem_dma": (vmem_hbm_vmem_dma, True),
    "hbm_smem_dma": (hbm_smem_dma, True),
    "smem_hbm_dma": (smem_hbm_dma, True),
    "hbm_vmem_dma_slicing": (hbm_vmem_dma_slicing, True),
    "hbm_vmem_dma_indexing": (hbm_vmem_dma_indexing, True),
    "hoisted_scratch_space": (hoisted_scratch_space, True),
    "hoisted_smem_space": (hoisted_smem_space, True),
    "hoisted_semaphore": (hoisted_semaphore, True),
    "dynamic_dma_on_2nd_minor": (dynamic_dma_on_2nd_minor, True),
    "double_replicated_reduction": (double_replicated_reduction, True),
    "scalar_any_input": (scalar_any_input, True),
    "sum_in_smem": (sum_in_smem, True),
    "jitted_kernel_with_program_id": (jitted_kernel_with_program_id, True),
    "fori_loop_unroll_with_program_id": (fori_loop_unroll_with_program_id, True),
    "megacore_splitting": (megacore_splitting, True),
    "scratch_input_vmap": (scratch_input_vmap, True),
    # interpret mode cannot allocate a semaphore *output* ("NotImplementedError: nan + dma_sem")
    "basic_async_copy": (basic_async_copy, False),
    "async_copy_in_a_loop": (async_copy_in_a_loop, False),
    "emit_pipeline_hbm_output": (emit_pipeline_hbm_output, False),
    "emit_pipeline_multiple_buffered_copy": (emit_pipeline_multiple_buffered_copy, False),
    "emit_pipeline_block_gather": (emit_pipeline_block_gather, False),
    "interpret_matmul_example": (interpret_matmul_example, True),
    "ragged_3d_blocks": (ragged_3d_blocks, True),
    "block_dynamic_slice": (block_dynamic_slice, True),
    "dynamic_grid_and_aliasing": (dynamic_grid_and_aliasing, True),
    "transposed_output_aliasing": (transposed_output_aliasing, True),
    "parallel_arbitrary_semantics": (parallel_arbitrary_semantics, True),
    "core_map_one_core": (functools.partial(core_map, 1), True),
    "core_map_two_cores": (functools.partial(core_map, 2), True),
    "kernel_helper_basic": (kernel_helper_basic, True),
    "kernel_core_index": (kernel_core_index, True),
    # TPU interpret mode on a CPU misreads the closed-over scalar as a buffer id (its
    # fallback lowering skips the TPU lowering's scalar rewrite): trace only.
    "kernel_capture_scalar": (kernel_capture_scalar, False),
    "block_spec_with_padding": (block_spec_with_padding, True),
    "block_spec_mapped_dimension": (block_spec_mapped_dimension, True),
    "block_spec_element_high_padding": (block_spec_element_high_padding, True),
    "element_indexing": (element_indexing, True),
    "unblocked_indexing_with_padding": (unblocked_indexing_with_padding, True),
    "vector_input_output_aliasing": (vector_input_output_aliasing, True),
    "scalar_input_output_aliasing": (scalar_input_output_aliasing, True),
    "cond_threebranch_matrix_out": (cond_threebranch_matrix_out, True),
    "jvp_of_scalar_kernel": (jvp_of_scalar_kernel, True),
    "double_vmap_slicing_different_axes": (double_vmap_slicing_different_axes, True),
    "vmap_kernel_with_io_aliases": (vmap_kernel_with_io_aliases, True),
    "quadruple_vmap_batched_kernel": (quadruple_vmap_batched_kernel, True),
}

# Where kernelsim fails today: name -> the exact failure (the lead removes an entry once fixed).
TRACE_XFAIL: dict[str, str] = {}
VERIFY_XFAIL: dict[str, str] = {}


def _params(names, xfail):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=xfail[n]))
            if n in xfail else n for n in names]


@pytest.mark.parametrize("name", _params(list(CASES), TRACE_XFAIL))
def test_jax_test_kernel_traces(name):
    fn, args = CASES[name][0]()
    t = kernelsim.trace(fn, *args)
    assert len(t.calls) >= 1
    assert all(c.steps >= 1 for c in t.calls)


@pytest.mark.interpret
@pytest.mark.parametrize("name", _params([n for n, (_, ok) in CASES.items() if ok],
                                         VERIFY_XFAIL))
def test_jax_test_kernel_matches_interpret_mode(name):
    fn, args = CASES[name][0]()
    v = verify(fn, *args)
    assert v.ok, v.report()
