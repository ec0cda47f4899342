"""Assignments 05 and 07: blocks the TPU accepts, and cases that catch plausible mistakes (issues
14, 16).

Every case of every task in 05 and 07 uses blocks JAX's lowering accepts: the instructor's
solution, set to compile instead of interpret, goes through Mosaic's TPU lowering
(``kernelsim.tpu_lowering_error``, no TPU needed), and a task whose solution runs with
``INTERPRET`` (compiled on a GPU too) also through the Triton GPU lowering.

Each planted answer below is a mistake a learner makes. The value mistakes pass the visible
case and fail the hidden case added for them, while the honest kernel (the same code with the
switch off) passes it; the traffic mistakes fail the visible case's budget, which shows the
visible cases are large enough for their budgets to fail. Cases run one at a time, as the grader
runs them (``grader.facts.work.run_case``), judged with the task's tolerance.
"""

from __future__ import annotations

import functools
import re

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from test_adversarial_a01_a04 import wrong_values

import kernelsim
from grader import tasks
from grader.learner import course

TPU_INTERPRET = pltpu.InterpretParams()
MINE = ("05_scalar_prefetch", "07_flash_attention")


def _fails(task_id: str, fn, *expected: str) -> str:
    """``fn`` fails the visible case with every text of ``expected`` in the message."""
    with pytest.raises(course.CheckFailed) as err:
        course.check(task_id, fn, quiet=True)
    for text in expected:
        assert text in str(err.value), str(err.value)
    return str(err.value)


# ----------------------------------------------------------------------- blocks that lower
def _solutions(assignment: str) -> tuple[dict, dict[str, str]]:
    """The instructor notebook's setup and solution cells run in one namespace with kernels set
    to compile, and task id -> the source of its solution cell."""
    sources = {gid.removesuffix("_solution"): source
               for gid, source in gradertools.cells(assignment).items()
               if gid.endswith("_solution")}
    return gradertools.run(assignment, **gradertools.COMPILED), sources


def _compiled_for_gpu(source: str) -> bool:
    """A solution run with INTERPRET compiles on a GPU; TPU_INTERPRET marks TPU-only features
    (scratch, scalar prefetch), interpreted there."""
    return set(re.findall(r"interpret=(\w+)", source)) == {"INTERPRET"}


def _lowering_errors(lowering, assignment: str, gpu_compiled_only: bool) -> list[str]:
    namespace, sources = _solutions(assignment)
    refused = []
    for task in (t for t in tasks.TASKS if t.assignment == assignment):
        if gpu_compiled_only and not _compiled_for_gpu(sources[task.id]):
            continue
        for case in task.cases:
            arrays = list(task.inputs(case).values())
            split = len(arrays) - task.host_inputs  # host inputs stay NumPy, as when graded
            host = [np.asarray(a) for a in arrays[split:]]
            error = lowering(
                lambda *a, t=task, c=case, h=host: t.call(namespace[t.id], [*a, *h], c.params),
                *[jnp.asarray(a) for a in arrays[:split]])
            if error is not None:
                refused.append(f"{task.id} case {case.name}: {error.splitlines()[0]}")
    return refused


@pytest.mark.parametrize("assignment", MINE)
def test_every_case_has_blocks_the_tpu_lowering_accepts(assignment):
    refused = _lowering_errors(kernelsim.tpu_lowering_error, assignment, False)
    assert not refused, "\n".join(refused)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_the_gpu_compiled_task_lowers_for_triton():
    """Only attention_scores runs compiled on a GPU (the others keep scratch or prefetch scalars,
    TPU-only, and are interpreted there); its blocks are powers of two in every case."""
    gpu = [task for assignment in MINE for task, source in _solutions(assignment)[1].items()
           if _compiled_for_gpu(source)]
    assert gpu == ["attention_scores"]
    refused = _lowering_errors(kernelsim.gpu_lowering_error, "07_flash_attention", True)
    assert not refused, "\n".join(refused)


def test_a_one_row_block_is_refused_by_the_lowering_and_the_grader():
    """Issue 16: the gather once asked for (1, D) blocks of the (V, D) table. The TPU lowering
    refuses them and accepts the (None, 1, D) block of the (V, 1, D) view the task asks for; the
    grader's block rule says so before a learner meets a TPU."""
    table, ids = jnp.zeros((32, 128), jnp.float32), jnp.arange(8, dtype=jnp.int32)
    def lowering_error(one_row_2d):
        fn = functools.partial(_bag(one_row_2d=one_row_2d, interpret=False), bag=4)
        return kernelsim.tpu_lowering_error(fn, table, ids)

    error = lowering_error(True)
    assert error is not None and "divisible by 8 and 128" in error, error
    assert lowering_error(False) is None
    _fails("embedding_bag", _bag(one_row_2d=True),
           "[FAIL] table (viewed as (V, 1, D)) block shape: required (None, 1, 128)")


# ------------------------------------------------------------------------------ embedding_bag
def _bag(one_row_2d=False, whole_table=False, bag_outer=False, interpret=TPU_INTERPRET):
    """An embedding bag (each bag's rows summed), right by default; each switch plants one
    mistake."""
    def embedding_bag(table, ids, bag):
        (vocab, dim), bags = table.shape, ids.shape[0] // bag

        def kernel(ids_ref, t_ref, o_ref):
            b, j = pl.program_id(1 if bag_outer else 0), pl.program_id(0 if bag_outer else 1)

            @pl.when(j == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)

            row = t_ref[ids_ref[b * bag + j]] if whole_table else t_ref[...]
            o_ref[...] += row.astype(jnp.float32)

        def at(f):  # grid indices in the order the grid has them
            return (lambda j, b, ids_ref: f(b, j, ids_ref)) if bag_outer else f

        if one_row_2d:
            view, rows = table, pl.BlockSpec((1, dim), lambda b, j, r: (r[b * bag + j], 0))
            out = pl.BlockSpec((1, dim), lambda b, j, r: (b, 0))
        else:
            view = table.reshape(vocab, 1, dim)
            block = (vocab, 1, dim) if whole_table else (None, 1, dim)
            rows = pl.BlockSpec(block, at(lambda b, j, r: (0 if whole_table else r[b * bag + j],
                                                           0, 0)))
            out = pl.BlockSpec((None, 1, dim), at(lambda b, j, r: (b, 0, 0)))
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(bag, bags) if bag_outer else (bags, bag),
            in_specs=[rows], out_specs=out)
        shape = (bags, dim) if one_row_2d else (bags, 1, dim)
        return pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
                              interpret=interpret)(ids, view).reshape(bags, dim)
    return embedding_bag


def test_honest_bag_passes_every_case():
    course.check("embedding_bag", _bag(), quiet=True)
    course.check("embedding_bag", _bag(), hidden=True, quiet=True)


def test_reading_the_whole_table_fails_the_visible_budget():
    _fails("embedding_bag", _bag(whole_table=True),
           "[FAIL] table (one row per id, never the whole table) HBM reads")


def test_walking_the_bag_in_the_outer_axis_is_caught_by_either_interpreter():
    """With the bag's axis first, the output block changes at every step, so each bag's
    partial sum leaves the chip and its block comes back zeroed. TPU interpret mode stops at
    the first revisit; the plain interpreter runs on, and the grader's grid and write budget
    say what went wrong."""
    _fails("embedding_bag", _bag(bag_outer=True), "Revisited block")
    _fails("embedding_bag", _bag(bag_outer=True, interpret=True),
           "[FAIL] grid", "[FAIL] HBM write traffic")


# ------------------------------------------------------------------------ block_sparse_matmul
def _bsmm(accumulate_in_input_dtype=False, every_k_block=False, at_least_one_step=True):
    """A block-sparse matmul, right by default; each switch plants one mistake."""
    def block_sparse_matmul(a, b, block_mask, bm, bk, bn):
        mask = np.asarray(block_mask).astype(bool)
        if every_k_block:  # visits every K block and skips the zero ones' work only
            mask = np.ones_like(mask)
        (gm, _), n = mask.shape, b.shape[1]
        counts = mask.sum(axis=1).astype(np.int32)
        width = max(int(counts.max()), 1) if at_least_one_step else int(counts.max())
        ids = np.zeros((gm, width), np.int32)
        for i in range(gm):
            nz = np.flatnonzero(mask[i])
            if len(nz):
                ids[i, :len(nz)], ids[i, len(nz):] = nz, nz[-1]
        acc_dtype = a.dtype if accumulate_in_input_dtype else jnp.float32

        def kernel(ids_ref, cnt_ref, a_ref, b_ref, o_ref, acc_ref):
            i, s = pl.program_id(0), pl.program_id(2)

            @pl.when(s == 0)
            def _():
                acc_ref[...] = jnp.zeros_like(acc_ref)

            @pl.when(s < cnt_ref[i])
            def _():
                acc_ref[...] += jnp.dot(a_ref[...], b_ref[...],
                                        precision=gradertools.precision_for(a_ref.dtype),
                                        preferred_element_type=jnp.float32).astype(acc_dtype)

            @pl.when(s == pl.num_programs(2) - 1)
            def _():
                o_ref[...] = acc_ref[...].astype(o_ref.dtype)

        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(gm, pl.cdiv(n, bn), width),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, s, ids, cnt: (i, ids[i * width + s])),
                      pl.BlockSpec((bk, bn), lambda i, j, s, ids, cnt: (ids[i * width + s], j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, s, ids, cnt: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)])
        return pl.pallas_call(
            kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((a.shape[0], n), a.dtype),
            interpret=TPU_INTERPRET)(jnp.asarray(ids.reshape(-1)), jnp.asarray(counts), a, b)
    return block_sparse_matmul


def test_honest_block_sparse_matmul_passes_the_new_cases():
    for case in ("h3", "h4"):
        assert wrong_values("block_sparse_matmul", case, _bsmm()) is None, case


def test_long_positive_bfloat16_case_catches_a_bfloat16_accumulator():
    wrong = _bsmm(accumulate_in_input_dtype=True)
    assert wrong_values("block_sparse_matmul", "v0", wrong) is None  # float32
    assert "elements differ" in wrong_values("block_sparse_matmul", "v1", wrong)  # visible
    # h3's sums all grow in one direction, so no cancellation is needed to show the roundings
    # (h1, N(0, 1) inputs, shows them too where a sum cancels)
    assert "elements differ" in wrong_values("block_sparse_matmul", "h3", wrong)


def test_a_mask_with_no_block_catches_an_empty_grid_axis():
    """The longest list is 0 long when no block is non-zero: with no step to write it the
    output is never written (here the index map reads past the empty list)."""
    wrong = _bsmm(at_least_one_step=False)
    course.check("block_sparse_matmul", wrong, quiet=True)
    assert wrong_values("block_sparse_matmul", "h4", wrong) is not None


def test_visiting_every_k_block_fails_the_visible_budget():
    _fails("block_sparse_matmul", _bsmm(every_k_block=True), "[FAIL] A (only its ",
           "non-zero blocks, per column block) HBM reads")


# ----------------------------------------------------------------------------- grouped_matmul
def test_reading_every_groups_weights_fails_the_visible_budget():
    def every_group(x, w, group_sizes, bm, bn):
        (m, k), (g, _, n) = x.shape, w.shape
        gid = np.repeat(np.arange(g, dtype=np.int32), np.asarray(group_sizes) // bm)

        def kernel(gid_ref, x_ref, w_ref, o_ref):  # all groups on chip, one picked per block
            o_ref[...] = jnp.dot(x_ref[...], w_ref[gid_ref[pl.program_id(0)]],
                                 precision=gradertools.precision_for(x_ref.dtype),
                                 preferred_element_type=jnp.float32).astype(o_ref.dtype)

        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(m // bm, pl.cdiv(n, bn)),
            in_specs=[pl.BlockSpec((bm, k), lambda i, j, gid: (i, 0)),
                      pl.BlockSpec((g, k, bn), lambda i, j, gid: (0, 0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, gid: (i, j)))
        return pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
                              interpret=TPU_INTERPRET)(jnp.asarray(gid), x, w)

    _fails("grouped_matmul", every_group,
           "[FAIL] w (only the block's own group, never all groups) HBM reads")


# -------------------------------------------------------------------------- flash attention
def last_query_block(i, bq, bk):  # the key block holding query block i's last query
    return (i * bq + bq - 1) // bk


def first_query_block(i, bq, bk):  # the key block of its first query: short when bq > bk
    return i * bq // bk


def floor_count_block(i, bq, bk):  # (blocks needed) - 1 with the count rounded down
    return (i + 1) * bq // bk - 1


def _widen(stat, width):
    """Lesson 8's (bq, 128) statistic, every lane of a row holding its value, as ``width``;
    a (bq, 1) column as it is."""
    if stat.shape[1] == 1:
        return stat
    return jnp.tile(stat, (1, pl.cdiv(width, 128)))[:, :width]


def _flash(causal=False, subtract_max=True, last_block=last_query_block, clamp=True,
           residuals=False, lanes=128):
    """Flash attention in lesson 8's fast form, right by default; each switch plants one
    mistake."""
    def attention(q, k, v, bq, bk):
        (lq, d), lk = q.shape, k.shape[0]

        def kernel(q_ref, k_ref, v_ref, o_ref, *refs):
            *res_refs, m_ref, l_ref, acc_ref = refs
            i, j = pl.program_id(0), pl.program_id(1)

            @pl.when(j == 0)
            def _():
                m_ref[...] = jnp.full_like(m_ref, -jnp.inf if subtract_max else 0.0)
                l_ref[...] = jnp.zeros_like(l_ref)
                acc_ref[...] = jnp.zeros_like(acc_ref)

            def step():
                s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                        precision=gradertools.precision_for(q_ref.dtype),
                                        preferred_element_type=jnp.float32) / np.sqrt(d)
                if causal:
                    q_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
                    k_pos = j * bk + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
                    s = jnp.where(k_pos <= q_pos, s, -jnp.inf)
                # without the max subtracted, m stays 0 and exp(s) is taken as it is
                m_new = jnp.maximum(m_ref[...], s.max(axis=1, keepdims=True)) \
                    if subtract_max else m_ref[...]
                p, alpha = jnp.exp(s - _widen(m_new, bk)), jnp.exp(m_ref[...] - m_new)
                l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
                acc_ref[...] = _widen(alpha, d) * acc_ref[...] + jnp.dot(
                    p.astype(v_ref.dtype), v_ref[...],
                    precision=gradertools.precision_for(v_ref.dtype),
                    preferred_element_type=jnp.float32)
                m_ref[...] = m_new

            if causal:
                pl.when(j <= last_block(i, bq, bk))(step)
            else:
                step()

            @pl.when(j == pl.num_programs(1) - 1)
            def _():
                o_ref[...] = (acc_ref[...] / _widen(l_ref[...], d)).astype(o_ref.dtype)
                if residuals:  # "kept for the backward pass"
                    m_out, l_out = res_refs
                    m_out[...], l_out[...] = m_ref[:, :1], l_ref[:, :1]

        def kv_map(i, j):
            return (jnp.minimum(j, last_block(i, bq, bk)) if causal and clamp else j), 0

        rows = pl.BlockSpec((bq, d), lambda i, j: (i, 0))
        stats = pl.BlockSpec((bq, 1), lambda i, j: (i, 0))
        out = pl.pallas_call(
            kernel, grid=(pl.cdiv(lq, bq), lk // bk),
            in_specs=[rows, pl.BlockSpec((bk, d), kv_map), pl.BlockSpec((bk, d), kv_map)],
            out_specs=[rows, stats, stats] if residuals else rows,
            out_shape=[jax.ShapeDtypeStruct((lq, d), q.dtype)] +
            [jax.ShapeDtypeStruct((lq, 1), jnp.float32)] * 2 if residuals else
            jax.ShapeDtypeStruct((lq, d), q.dtype),
            scratch_shapes=[pltpu.VMEM((bq, lanes), jnp.float32)] * 2 +
            [pltpu.VMEM((bq, d), jnp.float32)],
            interpret=TPU_INTERPRET,
        )(q, k, v)
        return out[0] if residuals else out
    return attention


@pytest.mark.parametrize("task_id, causal", [("flash_attention", False),
                                             ("causal_flash_attention", True)])
def test_large_logits_catch_a_softmax_without_the_max(task_id, causal):
    wrong = _flash(causal=causal, subtract_max=False)
    # N(0, 1) scores: exp does not overflow; the visible large-logit case v1 shows it
    assert wrong_values(task_id, "v0", wrong) is None
    assert "elements differ" in wrong_values(task_id, "v1", wrong)
    assert "elements differ" in wrong_values(task_id, "h3", wrong)
    assert wrong_values(task_id, "h3", _flash(causal=causal)) is None


def test_bq_above_bk_catches_the_block_of_the_first_query():
    wrong = _flash(causal=True, last_block=first_query_block)
    course.check("causal_flash_attention", wrong, quiet=True)  # bq == bk: the same block
    assert "elements differ" in wrong_values("causal_flash_attention", "h0", wrong)


def test_bq_below_bk_catches_a_block_count_rounded_down():
    wrong = _flash(causal=True, last_block=floor_count_block)
    course.check("causal_flash_attention", wrong, quiet=True)  # bq == bk
    assert wrong_values("causal_flash_attention", "h0", wrong) is None  # bq a multiple of bk
    assert wrong_values("causal_flash_attention", "h4", wrong) is not None
    assert wrong_values("causal_flash_attention", "h4", _flash(causal=True)) is None


def test_an_unclamped_index_map_fails_the_visible_causal_budget():
    _fails("causal_flash_attention", _flash(causal=True, clamp=False),
           "[FAIL] k (only the 10 blocks at or below the diagonal) HBM reads")


def test_writing_the_softmax_statistics_fails_the_visible_write_budget():
    _fails("flash_attention", _flash(residuals=True), "[FAIL] HBM write traffic",
           "[FAIL] no (Lq, Lk) scores in HBM")


@pytest.mark.parametrize("task_id, causal", [("flash_attention", False),
                                             ("causal_flash_attention", True)])
def test_column_statistics_lose_the_lane_rows_rule(task_id, causal):
    """Right values, but the running max and sum as (bq, 1) columns: the form lesson 8 measured
    1.6-1.8x slower on a TPU v5e (bench/recorded/speed_probe-v5e-flash.json)."""
    _fails(task_id, _flash(causal=causal, lanes=1),
           "[FAIL] running max and sum as (bq, 128) rows")
    assert wrong_values(task_id, "h3", _flash(causal=causal, lanes=1)) is None
