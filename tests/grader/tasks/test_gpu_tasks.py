"""Assignment 11 (Pallas on GPU): the instructor's solutions pass every case and lower for a GPU
(Triton) and a TPU (Mosaic); planted wrong answers fail with the rule or the lowering that
catches them, judged as the grader judges (``course.check`` in one process).

The planted answers are the mistakes lesson 11 is about: the TPU shape of a reduction (a grid
axis over K that revisits the output block, which interpret mode computes correctly and both
lowerings accept), a load whose size is not a power of two, TPU compiler parameters, a
kernel that ignores ``interpret=``, a float32 product at the default precision (TF32 on a
GPU), a bfloat16 running total, and predictions that count the TPU pipeline's skipped copies
or ignore edge blocks.
"""

from __future__ import annotations

import functools

import gradertools
import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from test_adversarial_a04_a06 import judged

import kernelsim
from grader import tasks
from grader.facts import work
from grader.learner import course
from grader.verdict import refs, verdict

ASSIGNMENT = "11_gpu"
NOTEBOOK = gradertools.notebook(ASSIGNMENT)
TASKS = ["gpu_row_sums", "gpu_matmul", "predict_gpu_reads"]
pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")


@pytest.fixture(scope="module")
def solutions() -> dict:
    """The setup and solution cells of the instructor notebook, run in one namespace."""
    return gradertools.run(ASSIGNMENT)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_reference_solution_passes(solutions, task, hidden):
    course.check(task, solutions[task], hidden=hidden, quiet=True)


@pytest.mark.parametrize("task_id", ["gpu_row_sums", "gpu_matmul"])
def test_reference_solution_lowers_for_gpu_and_tpu(solutions, task_id):
    """Every case's kernel, compiled rather than interpreted, passes JAX's Triton lowering
    (what a GPU compiles) and its Mosaic TPU lowering (the (8, 128) block rule)."""
    task = tasks.get(task_id)
    for case in task.cases:
        arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
        fn = functools.partial(solutions[task_id], **case.params, interpret=False)
        assert kernelsim.gpu_lowering_error(fn, *arrays) is None, case.name
        assert kernelsim.tpu_lowering_error(fn, *arrays) is None, case.name


def test_on_a_tpu_the_assignments_kernels_run_interpreted(monkeypatch):
    """On a TPU v5e, gpu_matmul's solution compiled by Mosaic failed its alignment (E2003, a
    64-column slice of K; issue 33): the assignment's kernels are written for a GPU's blocks,
    so on a TPU they run interpreted, and every task is for a GPU, which makes the TPU pass
    (bench/on_device.py) count those runs as declared fallbacks."""
    from kernelsim import backend

    monkeypatch.setattr(backend, "platform", lambda: "tpu")
    assert backend.choose(tpu_ok=False).interpret is True
    assert backend.choose().interpret is False
    assert "INTERPRET = choose(tpu_ok=False).interpret" in gradertools.cells("11_gpu")["setup"]
    assert {t.target for t in tasks.TASKS if t.assignment == "11_gpu"} == {"gpu"}


def _wrong_values(task_id: str, case: str, fn) -> str | None:
    """None when ``fn`` gets case ``case`` of ``task_id`` right, else what is wrong (one case
    at a time, as the grader runs it)."""
    refdir = refs.REPO / "exercises" / "refs"
    entry = refs.load_manifest(refdir)["cases"][f"{task_id}/{case}"]
    inputs, expected, params = refs.load_case(refdir, entry)
    run = work.run_case(tasks.get(task_id), fn, [jnp.asarray(v) for v in inputs.values()],
                        params)
    if run.error is not None:
        return run.error
    return verdict.compare(run.output, expected, entry["rtol"], entry["atol"])


def _fails(task: str, fn, *expected: str, hidden: bool = False) -> str:
    with pytest.raises(course.CheckFailed) as err:
        course.check(task, fn, hidden=hidden, quiet=True)
    message = str(err.value)
    for text in expected:
        assert text in message, message
    return message


# ----------------------------------------------------------------------------- row sums
def _row_sums_call(kernel, x, bm, grid, in_spec, out_spec, interpret, **kw):
    m, _ = x.shape
    return pl.pallas_call(kernel, grid=grid, in_specs=[in_spec], out_specs=out_spec,
                          out_shape=jax.ShapeDtypeStruct((m, 1), x.dtype),
                          interpret=interpret, **kw)(x)


def row_sums_revisiting(x, bm, bk, interpret=True):
    """The TPU shape: grid (i, k), each k step adding into output block (i, 0)."""
    m, k = x.shape

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _zero():
            o_ref[...] = jnp.zeros_like(o_ref)

        part = jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True)
        o_ref[...] += part.astype(o_ref.dtype)

    return _row_sums_call(kernel, x, bm, (pl.cdiv(m, bm), k // bk),
                          pl.BlockSpec((bm, bk), lambda i, kk: (i, kk)),
                          pl.BlockSpec((bm, 1), lambda i, kk: (i, 0)), interpret)


def test_revisiting_row_sums_lower_and_compute_but_fail_the_gpu_rule():
    """Interpret mode runs the grid in order and both lowerings accept the kernel: only the
    structural rule sees the race a GPU would run into."""
    x = jnp.ones((64, 384), jnp.float32)
    fn = functools.partial(row_sums_revisiting, bm=16, bk=128, interpret=False)
    assert kernelsim.gpu_lowering_error(fn, x) is None
    assert kernelsim.tpu_lowering_error(fn, x) is None
    # the float32 visible case (v1, bfloat16, fails its values first: the output block is a
    # bfloat16 accumulator)
    v = judged("gpu_row_sums", "v0", row_sums_revisiting)
    for text in ("[FAIL] each output block written by exactly one grid step: required 4 grid "
                 "steps", "found 12 grid steps, 4 writebacks", "[FAIL] grid"):
        assert text in v.message, v.message
    assert "wrong values" not in v.message


def row_sums_whole_band(x, bm, bk, interpret=True):
    """GPU-safe, but the (bm, K) band is loaded at once, not in bk-wide chunks."""
    m, k = x.shape

    def kernel(x_ref, o_ref):
        def body(_, total):
            return total + jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True)

        o_ref[...] = jax.lax.fori_loop(0, 1, body, jnp.zeros((bm, 1), jnp.float32)
                                       ).astype(o_ref.dtype)

    return _row_sums_call(kernel, x, bm, (pl.cdiv(m, bm),),
                          pl.BlockSpec((bm, k), lambda i: (i, 0)),
                          pl.BlockSpec((bm, 1), lambda i: (i, 0)), interpret)


def test_a_load_that_is_not_a_power_of_two_fails_the_triton_lowering():
    _fails("gpu_row_sums", row_sums_whole_band, "TritonLoweringRefused",
           "whose size is a power of 2", "shape (16, 384)")


def row_sums_bf16_total(x, bm, bk, interpret=True):
    """The solution with the running total kept in the input's dtype."""
    m, k = x.shape

    def kernel(x_ref, o_ref):
        def body(c, total):
            return total + jnp.sum(x_ref[:, pl.ds(c * bk, bk)], axis=1, keepdims=True)

        o_ref[...] = jax.lax.fori_loop(0, k // bk, body, jnp.zeros((bm, 1), x.dtype))

    return _row_sums_call(kernel, x, bm, (pl.cdiv(m, bm),),
                          pl.BlockSpec((bm, k), lambda i: (i, 0)),
                          pl.BlockSpec((bm, 1), lambda i: (i, 0)), interpret)


def test_a_bfloat16_running_total_fails_the_bfloat16_cases():
    # the visible long positive bfloat16 rows show it (issue 25), the hidden cases again
    _fails("gpu_row_sums", row_sums_bf16_total, "wrong values for case v1")
    _fails("gpu_row_sums", row_sums_bf16_total, "wrong values for case h0", hidden=True)
    assert _wrong_values("gpu_row_sums", "h4", row_sums_bf16_total)  # the long positive rows


def test_an_ignored_interpret_argument_fails(solutions):
    """A kernel built with interpret=True whatever it is asked would lower anywhere."""
    def always_interpreted(x, bm, bk, interpret=True):
        return solutions["gpu_row_sums"](x, bm, bk, interpret=True)

    _fails("gpu_row_sums", always_interpreted, "InterpretIgnored",
           "pass its interpret argument on to pl.pallas_call")


# ----------------------------------------------------------------------------- matmul
def matmul_revisiting(a, b, bm, bn, bk, interpret=True, scratch=False, compiler_params=None):
    """The TPU shape of lessons 4 and 7: grid (i, j, k), the output block (or a VMEM scratch
    accumulator) revisited across k."""
    (m, k), n = a.shape, b.shape[1]

    def kernel(a_ref, b_ref, o_ref, *acc):
        target = acc[0] if scratch else o_ref

        @pl.when(pl.program_id(2) == 0)
        def _zero():
            target[...] = jnp.zeros_like(target)

        target[...] += jnp.dot(a_ref[...], b_ref[...], precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=jnp.float32).astype(target.dtype)
        if scratch:
            @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
            def _store():
                o_ref[...] = target[...].astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)] if scratch else [],
        compiler_params=compiler_params, interpret=interpret)(a, b)


def test_revisiting_matmul_fails_the_gpu_rule():
    """On the float32 visible case its values are right and the GPU rule fails (the bfloat16
    case v1 fails its values first: the output block is a bfloat16 accumulator)."""
    v = judged("gpu_matmul", "v0", matmul_revisiting)
    assert not v.passed and "[FAIL] each output block written by exactly one grid step" in \
        v.message and "found 12 grid steps, 2 writebacks" in v.message, v.message


def test_a_scratch_accumulator_fails_the_triton_lowering():
    _fails("gpu_matmul", functools.partial(matmul_revisiting, scratch=True),
           "TritonLoweringRefused", "scratch memory not implemented in the Triton backend")


def matmul_gpu_shape(a, b, bm, bn, bk, interpret=True, input_dtype_acc=False,
                     compiler_params=None, precision=jax.lax.Precision.HIGHEST):
    """The GPU shape (grid (i, j), a loop over K), with three planted choices: an accumulator
    in the inputs' dtype, compiler parameters and the dot's precision."""
    (m, k), n = a.shape, b.shape[1]
    acc_dtype = a.dtype if input_dtype_acc else jnp.float32

    def kernel(a_ref, b_ref, o_ref):
        def body(c, acc):
            ks = pl.ds(c * bk, bk)
            product = jnp.dot(a_ref[:, ks], b_ref[ks, :], precision=precision,
                              preferred_element_type=jnp.float32)
            return acc + product.astype(acc_dtype)

        acc = jax.lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), acc_dtype))
        o_ref[...] = acc.astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        compiler_params=compiler_params, interpret=interpret)(a, b)


def test_the_planted_gpu_shape_itself_passes():
    course.check("gpu_matmul", matmul_gpu_shape, quiet=True)


def test_tpu_compiler_parameters_fail_the_triton_lowering():
    """The GPU shape with the "parallel" semantics a TPU wants: the Triton lowering refuses
    TPU compiler parameters."""
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
    message = _fails("gpu_matmul", functools.partial(matmul_gpu_shape, compiler_params=params),
                     "TritonLoweringRefused")
    # the ValueError needs the TPU rule loaded (any TPU lowering in this process does it);
    # before that the pinned release stops at a bare assert, which the grader explains
    assert ("Compiler params for platform tpu cannot be used for gpu lowering" in message
            or "no GPU lowering rule for this pallas_call's compiler_params" in message), message


def test_a_float32_product_at_default_precision_is_refused():
    """Interpret mode computes it in float32 and passes the values; the Triton lowering would
    compute it in TF32 on a GPU, so the check refuses it before the values count."""
    default = functools.partial(matmul_gpu_shape, precision=None)
    assert _wrong_values("gpu_matmul", "v0", default).startswith("Tf32OnGpu")
    _fails("gpu_matmul", default, "Tf32OnGpu", "precision=jax.lax.Precision.HIGHEST")
    # bfloat16 inputs are not affected: the bfloat16 cases pass with the default precision
    assert _wrong_values("gpu_matmul", "h0", default) is None


def test_a_bfloat16_accumulator_fails_the_long_positive_case():
    bf16_acc = functools.partial(matmul_gpu_shape, input_dtype_acc=True)
    _fails("gpu_matmul", bf16_acc, "wrong values for case v1")  # visible: long positive K
    assert _wrong_values("gpu_matmul", "h2", bf16_acc)


# ----------------------------------------------------------------------------- prediction
def _tpu_model_reads(m, k, n, bm, bn, itemsize):
    """What the TPU model counts: A's band is skipped while j moves along a row of the grid,
    B's band too when the grid has one column."""
    col_blocks, row_blocks = -(-n // bn), -(-m // bm)
    return itemsize * (m * k + (1 if col_blocks == 1 else row_blocks) * k * n)


def _ignores_edges(m, k, n, bm, bn, itemsize):
    """Every band counted whole, as if the edge blocks were full."""
    col_blocks, row_blocks = -(-n // bn), -(-m // bm)
    return itemsize * (col_blocks * row_blocks * bm * k + row_blocks * col_blocks * k * bn)


def test_the_tpu_models_count_fails_the_visible_prediction():
    _fails("predict_gpu_reads", _tpu_model_reads, "wrong values for case v0")


def test_a_prediction_that_ignores_edge_blocks_fails_only_hidden():
    course.check("predict_gpu_reads", _ignores_edges, quiet=True)
    _fails("predict_gpu_reads", _ignores_edges, "wrong values for case h1", hidden=True)


def test_every_prediction_case_matches_the_notebooks_formula(solutions):
    """The reference is kernelsim's GPU-model count of the task's BlockSpecs; the notebook's
    formula (a read once per grid column, b once per grid row) must agree on every case."""
    task = tasks.get("predict_gpu_reads")
    for case in task.cases:
        want = int(task.expected(case, {})[0, 0])
        assert solutions["predict_gpu_reads"](**case.params) == want, case.name
