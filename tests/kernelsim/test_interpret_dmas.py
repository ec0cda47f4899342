"""kernelsim's tpu model equals the pipeline copies TPU interpret mode really performs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernelsim import examples as ex
from kernelsim.check import interpret_mode
from kernelsim.verify import verify

pytestmark = pytest.mark.interpret


def _normal(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _assert_exact(v, expected_reference=None):
    assert v.checks, "no windowed operand was checked"
    for c in v.checks:
        assert c.interpreter_copies, f"the interpreter reported no {c.kind} for {c.operand}"
        assert c.copies_match, (c.operand, c.model_copies[:5], c.interpreter_copies[:5])
        assert c.bytes_match, (c.operand, c.model_bytes, c.interpreter_bytes)
    if expected_reference is not None:
        np.testing.assert_allclose(v.outputs, expected_reference, rtol=1e-4, atol=1e-3)


def test_add():
    x, y = _normal((512, 512), 0), _normal((512, 512), 1)
    v = verify(functools.partial(ex.add, block=(128, 256)), x, y)
    _assert_exact(v, x + y)
    assert [c.operand for c in v.checks] == ["x_ref", "y_ref", "o_ref"]
    assert len(v.checks[0].model_copies) == 8


def test_matmul_with_accumulator():
    x, y = _normal((256, 512), 0), _normal((512, 256), 1)
    v = verify(functools.partial(ex.matmul, bm=128, bk=128, bn=128), x, y)
    _assert_exact(v, x @ y)
    assert len(v.checks[2].model_copies) == 4  # one writeback per output block


def test_matmul_single_k_block_reads_x_once():
    x, y = _normal((256, 128), 0), _normal((128, 512), 1)
    v = verify(functools.partial(ex.matmul, bm=128, bk=128, bn=128), x, y)
    _assert_exact(v, x @ y)
    assert len(v.checks[0].model_copies) == 2  # x's block (i, 0) stays while j moves


def test_transpose():
    x = _normal((256, 384), 0)
    _assert_exact(verify(functools.partial(ex.transpose, block=128), x), x.T)


def test_block_sparse_with_scalar_prefetch():
    counts, rows, cols = ex.block_band_pattern(4, 3)
    x, y = _normal((512, 512), 0), _normal((512, 128), 1)
    v = verify(ex.block_sparse_matmul, counts, rows, cols, x, y)
    _assert_exact(v, ex.block_sparse_reference(counts, rows, cols, x, y))
    skips = v.trace.calls[0].operand("x_ref").skips
    assert skips == 3  # rows 2 and 3 are padded by 1 and 2 repeated entries


def test_vmapped_kernel():
    x, y = _normal((3, 256, 256), 0), _normal((3, 256, 256), 1)
    v = verify(jax.vmap(functools.partial(ex.add, block=(128, 128))), x, y)
    _assert_exact(v, x + y)
    assert v.trace.calls[0].grid == (3, 2, 2)


def test_ragged_edges_padded_bytes_match_the_interpreter_and_totals_stay_in_bounds():
    x, y = _normal((200, 300), 0), _normal((200, 300), 1)
    v = verify(functools.partial(ex.add, block=(128, 128)), x, y)
    _assert_exact(v, x + y)
    for c in v.checks:  # the interpreter copies whole padded edge blocks; so does the check
        assert c.model_bytes == c.interpreter_bytes == 2 * 3 * 128 * 128 * 4
    call = v.trace.calls[0]
    assert call.hbm_read_bytes == 2 * 200 * 300 * 4  # totals count in-bounds bytes
    assert call.hbm_write_bytes == 200 * 300 * 4
    assert call.cost.hbm_padded_bytes == 3 * 2 * 3 * 128 * 128 * 4


def _double_buffered_scale(x):
    """Manual double buffering from pl.ANY: step i starts block i + 1's copy into the other
    slot, waits for its own block, scales it and writes it back with a synchronous copy."""
    nblocks = x.shape[0] // 8

    def kernel(x_hbm, o_hbm, buf, sems):
        i = pl.program_id(0)

        def fetch(block, slot):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(block * 8, 8)], buf.at[slot],
                                         sems.at[slot])

        @pl.when(i == 0)
        def _():
            fetch(0, 0).start()

        @pl.when(i + 1 < nblocks)
        def _():
            fetch(i + 1, (i + 1) % 2).start()

        fetch(i, i % 2).wait()
        buf[i % 2] = buf[i % 2] * 2.0
        pltpu.sync_copy(buf.at[i % 2], o_hbm.at[pl.ds(i * 8, 8)])

    return pl.pallas_call(
        kernel, grid=(nblocks,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


def test_kernel_body_dmas_match_the_interpreter_copy_for_copy():
    x = _normal((48, 128), 0)
    v = verify(_double_buffered_scale, x)
    np.testing.assert_allclose(v.outputs, 2 * x)
    assert v.ok, v.report()
    routes = {d.route: d for d in v.body_dma_checks}
    assert routes["hbm -> vmem"].model_bytes == [8 * 128 * 4] * 6
    assert routes["vmem -> hbm"].interpreter_bytes == [8 * 128 * 4] * 6
    call = v.trace.calls[0]
    assert (call.hbm_read_bytes, call.hbm_write_bytes) == (x.nbytes, x.nbytes)
    assert call.warnings == []


def _guarded_rescale(x):
    """``_double_buffered_scale`` with flywheel's overflow guard (flywheel_tpu/pallas/
    fwd_pipeline.py, ``guard_smem``): each step flags a block holding a value over 1 in SMEM
    and halves it row by row in VMEM when flagged. The flag decides no DMA, yet JAX shares
    jaxprs between it and what does: the next block's index and the flag both come from
    ``jnp.where`` on (bool, int32, int32), and the loop that halves has the condition of the
    loop that starts the first copy."""
    nblocks = x.shape[0] // 8

    def kernel(x_hbm, o_hbm, buf, sems, flag):
        i = pl.program_id(0)

        def fetch(block, slot):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(block * 8, 8)], buf.at[slot],
                                         sems.at[slot])

        def first(k, carry):
            fetch(k, k).start()
            return carry

        lax.fori_loop(0, jnp.where(i == 0, jnp.int32(1), jnp.int32(0)), first, None)  # block 0
        following = jnp.where(i + 1 < nblocks, i + 1, jnp.int32(0))

        @pl.when(i + 1 < nblocks)
        def _():
            fetch(following, following % 2).start()

        fetch(i, i % 2).wait()
        flag[0] = jnp.where(jnp.any(buf[i % 2] > 1.0), jnp.int32(1), jnp.int32(0))

        @pl.when(flag[0] > 0)
        def _():
            def halve(row, carry):
                buf[i % 2, row] = buf[i % 2, row] * 0.5
                return carry

            lax.fori_loop(0, 8 + 0 * i, halve, None)

        pltpu.sync_copy(buf.at[i % 2], o_hbm.at[pl.ds(i * 8, 8)])

    return pl.pallas_call(
        kernel, grid=(nblocks,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,)),
                        pltpu.SMEM((1,), jnp.int32)],
    )(x)


def _eqns(jaxpr):
    """Every eqn of ``jaxpr``, nested ones included."""
    from kernelsim.jaxpr.nesting import sub_jaxprs

    for eqn in jaxpr.eqns:
        yield eqn
        for sub, _ in sub_jaxprs(eqn):
            yield from _eqns(sub)


def test_a_value_that_decides_no_dma_is_not_computed_to_trace_the_dmas(monkeypatch):
    import kernelsim
    from kernelsim.body import steps

    x = _normal((48, 128), 0) * jnp.repeat(jnp.array([0.1, 3.0] * 3), 8)[:, None]
    blocks = x.reshape(6, 8, 128)
    expected = jnp.where(jnp.any(blocks > 1.0, axis=(1, 2))[:, None, None], blocks * 0.5,
                         blocks).reshape(x.shape)
    v = verify(_guarded_rescale, x)
    assert v.ok, v.report()
    np.testing.assert_allclose(v.outputs, expected)
    kernel = jax.make_jaxpr(_guarded_rescale)(x).eqns[0].params["jaxpr"]
    wheres = [e for e in kernel.eqns
              if e.primitive.name in ("pjit", "jit") and e.params["name"] == "_where"]
    assert len({id(e.params["jaxpr"]) for e in wheres}) == 1 < len(wheres)  # one shared jaxpr
    conditions = [id(e.params["cond_jaxpr"]) for e in _eqns(kernel) if e.primitive.name == "while"]
    assert len(set(conditions)) == 1 < len(conditions)  # one shared loop condition

    evaluated = []

    def counting(eqn, vals, budget):
        evaluated.append((eqn.primitive.name, np.shape(vals[0]) if vals else ()))
        return numpy_eqn(eqn, vals, budget)

    numpy_eqn = steps.numpy_eqn
    monkeypatch.setattr(steps, "numpy_eqn", counting)
    t = kernelsim.trace(_guarded_rescale, x)
    assert [c.bytes for c in t.calls[0].call.body_copies] == [8 * 128 * 4] * 12
    assert not [e for e in evaluated if e[1]], evaluated  # no block-sized value, no guard
    # recording the accesses needs the flag: its 8 row writes at the flagged steps only
    log = kernelsim.trace(_guarded_rescale, x, record_access=True).calls[0].accesses
    assert [len([a for a in log.at(step, "buf") if a.kind == "write"])
            for step in range(6)] == [0, 8] * 3


def test_jvp_of_a_kernel_is_checked_under_positional_operand_names():
    """jax.jvp's pallas_call records no parameter names: model and interpreter both use in0..."""
    x, t = _normal((256, 256), 0), _normal((256, 256), 1)
    v = verify(lambda x, t: jax.jvp(functools.partial(ex.add, block=(128, 128)), (x, x),
                                    (t, t)), x, t)
    _assert_exact(v)
    assert [c.operand for c in v.checks] == ["in0", "in1", "in2", "in3", "out0", "out1"]


def test_dma_sized_by_block_data_matches_the_interpreter():
    """Each step copies as many rows as its SMEM block says (tests/kernelsim/test_capture.py)."""
    from test_capture import ROWS, leading_rows

    counts = jnp.array([3, 8, 0, 5], jnp.int32)
    v = verify(jax.jit(leading_rows), counts, ROWS)
    assert v.ok, v.report()
    assert v.body_dma_checks[0].interpreter_bytes == [1536, 2560, 4096]  # the 0-row copy: no bytes
    assert [c.bytes for c in v.trace.calls[0].call.body_copies] == [1536, 4096, 0, 2560]
    assert v.trace.calls[0].warnings == []


def _copy_leading_rows_then_nothing(n_ref, x_hbm, o_hbm, sem):
    """Start the copy of the first ``n_ref[0, 0]`` rows of row block i, then an empty copy
    (``n_ref[1, 0]`` rows, 0 here) on the same semaphore, then wait for both."""
    i = pl.program_id(0)
    rows = pl.ds(i * 8, n_ref[0, 0])
    none = pl.ds(i * 8, n_ref[1, 0])
    full = pltpu.make_async_copy(x_hbm.at[rows], o_hbm.at[rows], sem)
    empty = pltpu.make_async_copy(x_hbm.at[none], o_hbm.at[none], sem)
    full.start()
    empty.start()
    full.wait()
    empty.wait()


X32 = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)


def _leading_rows_then_nothing(table, x, interpret=False):
    return pl.pallas_call(
        _copy_leading_rows_then_nothing, grid=(4,), interpret=interpret,
        in_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0), memory_space=pltpu.SMEM),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=[pltpu.SemaphoreType.DMA],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(table, x)


def test_zero_length_dmas_the_interpreter_performs_are_no_mismatch():
    # The wait for the full copy pops the newest queued DMA first: the interpreter performs
    # the empty one (0 bytes) before the full one. Neither side counts it.
    counts = jnp.array([3, 8, 1, 5], jnp.int32)
    table = jnp.zeros((16 * 4, 128), jnp.int32).at[::16, 0].set(counts)
    performed = []
    with interpret_mode.recording_interpret_copies([], lambda: 0, performed):
        jax.block_until_ready(_leading_rows_then_nothing(table, X32, pltpu.InterpretParams()))
    assert sorted(d.bytes for d in performed) == [0, 0, 0, 0, 512, 1536, 2560, 4096]
    v = verify(jax.jit(_leading_rows_then_nothing), table, X32)
    assert v.ok, v.report()
    assert [c.bytes for c in v.trace.calls[0].call.body_copies] == [
        1536, 0, 4096, 0, 512, 0, 2560, 0]
    assert v.body_dma_checks[0].interpreter_bytes == [512, 1536, 2560, 4096]


def paged_gather(page_table, pages):
    """Output block (b, p) is page ``page_table[b, p]`` of ``pages`` (HBM), fetched by one DMA
    per grid step: the access pattern of paged attention's KV-cache reads (JAX's bundled
    ``paged_attention`` copies each page it needs from an HBM page pool the same way)."""
    batch, per_seq = page_table.shape
    _, rows, lanes = pages.shape

    def kernel(table_ref, pages_hbm, o_ref, buf, sem):
        b, p = pl.program_id(0), pl.program_id(1)
        copy = pltpu.make_async_copy(pages_hbm.at[table_ref[b, p]], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]

    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(batch, per_seq),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((None, None, rows, lanes), lambda b, p, t: (b, p, 0, 0)),
        scratch_shapes=[pltpu.VMEM((rows, lanes), pages.dtype), pltpu.SemaphoreType.DMA])
    return pl.pallas_call(kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct(
        (batch, per_seq, rows, lanes), pages.dtype))(page_table, pages)


def paged_case(batch, per_seq):
    """A page table that visits every page of a pool of ``batch * per_seq`` (8, 128) pages."""
    n = batch * per_seq
    table = jnp.asarray(np.random.default_rng(0).permutation(n).reshape(batch, per_seq),
                        jnp.int32)
    return paged_gather, (table, _normal((n, 8, 128), 0))


def test_paged_gather_dmas_match_the_interpreter():
    fn, (table, pages) = paged_case(2, 8)
    v = verify(fn, table, pages)
    assert v.ok, v.report()
    assert v.body_dma_checks[0].model_bytes == [8 * 128 * 4] * 16
    np.testing.assert_array_equal(v.outputs, pages[table])


def test_body_dmas_are_events_from_their_start_to_the_wait_that_completes_them():
    x = _normal((48, 128), 0)
    v = verify(_double_buffered_scale, x)
    assert v.ok, v.report()
    t = v.trace
    fetches = [c for c in t.body_dmas() if c.src == "x_hbm"]
    # block i + 1 is fetched at step i into slot (i + 1) % 2 and waited on at step i + 1,
    # after that step's own prefetch (none at the last step)
    assert [(c.step, c.start_pos, c.wait_step, c.wait_pos, c.semaphore) for c in fetches] == [
        (0, 0, 0, 2, "sems[0]"), *((i, 1 if i == 0 else 0, i + 1, 1 if i < 4 else 0,
                                    f"sems[{(i + 1) % 2}]") for i in range(5))]
    assert [(c.src_slice, c.dst_slice) for c in fetches[:2]] == [
        (((0, 8, 1), (0, 128, 1)), ((0, 1, 1), (0, 8, 1), (0, 128, 1))),
        (((8, 8, 1), (0, 128, 1)), ((1, 1, 1), (0, 8, 1), (0, 128, 1)))]
    writes = [c for c in t.body_dmas() if c.dst == "o_hbm"]  # sync_copy: waited where it starts
    assert all(c.wait_step == c.step and c.wait_pos == c.start_pos + 1 for c in writes)
    assert [c.dst_slice[0] for c in writes] == [(8 * i, 8, 1) for i in range(6)]
    first = t.to_dict()["calls"][0]["body_dmas"][0]
    assert first == {"src": "x_hbm", "dst": "buf", "src_space": "any", "dst_space": "vmem",
                     "bytes": 8 * 128 * 4, "src_slice": [[0, 8, 1], [0, 128, 1]],
                     "dst_slice": [[0, 1, 1], [0, 8, 1], [0, 128, 1]], "semaphore": "sems[0]",
                     "start_step": 0, "start_pos": 0, "wait_step": 0, "wait_pos": 2,
                     "src_device": None, "dst_device": None}  # not in a shard_map
