"""Assignment 15 (Mosaic GPU): the instructor's predictions and kernel pass every case; planted
wrong ones fail on the case or the rule that tells them apart, judged as the grader judges
(``course.check``); the grader's answers, kernelsim's counts, equal what the Mosaic GPU
lowering allocates; and ``grader.grading.work`` sees a ``plgpu.kernel`` as a kernel call.

The planted answers are the mistakes the tasks are about: shared memory without the lowering's
rounding to 1024 bytes or without the barriers, a pipeline's slots rounded one by one (they are
one allocation), an accumulator counted in bytes rather than registers, and a matmul's copies
counted as if each operand were read once. The planted kernels read an input not
staged by TMA (global memory into registers), leave a copy unwaited, compute outside the
kernel, or are plain JAX.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernelsim
from grader import tasks
from grader.grading import calling, gpu_facts, verdict, work
from grader.learner import course
from grader.tasks import a15_mosaic_gpu as a15

ASSIGNMENT = "15_mosaic_gpu"
REPO = Path(__file__).resolve().parents[2]
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


@pytest.fixture(scope="module")
def solutions() -> dict:
    """The setup and solution cells of the instructor notebook, run in one namespace."""
    return gradertools.run(ASSIGNMENT)


def test_the_assignment_has_its_tasks():
    assert TASKS == ["predict_staging_smem", "predict_pipeline_smem",
                     "predict_accumulator_registers", "predict_matmul_tma_bytes",
                     "rms_norm_mgpu"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_reference_solution_passes(solutions, task, hidden):
    course.check(task, solutions[task], hidden=hidden, quiet=True)


def _fails(task: str, fn, case: str, hidden: bool) -> None:
    with pytest.raises(course.CheckFailed) as err:
        course.check(task, fn, hidden=hidden, quiet=True)
    assert f"wrong values for case {case}" in str(err.value), str(err.value)


def test_shared_memory_without_rounding_fails_hidden():
    unrounded = lambda rows, cols, itemsize: rows * cols * itemsize + 8  # noqa: E731
    course.check("predict_staging_smem", unrounded, quiet=True)  # 32 KiB: already rounded
    _fails("predict_staging_smem", unrounded, "h0", hidden=True)


def test_shared_memory_without_the_barrier_fails_visible():
    _fails("predict_staging_smem", lambda rows, cols, itemsize: rows * cols * itemsize,
           "v0", hidden=False)


def test_slots_rounded_one_by_one_fail_on_small_tiles():
    def per_slot(tm, tn, stages, itemsize):
        tile = -(-tm * tn * itemsize // 1024) * 1024
        return (stages + 1) * tile + 8 * stages

    course.check("predict_pipeline_smem", per_slot, quiet=True)
    _fails("predict_pipeline_smem", per_slot, "h2", hidden=True)


def test_accumulator_in_bytes_fails():
    _fails("predict_accumulator_registers", lambda tm, tn: tm * tn * 4 // 128, "v0",
           hidden=False)


def test_matmul_operands_read_once_fail():
    once = lambda m, n, k, tm, tn, tk, itemsize: (m * k + k * n) * itemsize  # noqa: E731
    _fails("predict_matmul_tma_bytes", once, "v0", hidden=False)


def _lowering_smem(fn, *shapes) -> int:
    with mgpu_core.artificial_shared_memory_limit(0), pytest.raises(ValueError) as err:
        jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    return int(re.search(r"smem_bytes=(\d+)", str(err.value)).group(1))


@pytest.mark.parametrize("rows,cols,itemsize", [(64, 128, 4), (64, 100, 4), (128, 256, 2)])
def test_staging_answer_is_the_lowerings_allocation(monkeypatch, rows, cols, itemsize):
    """The grader's answer (kernelsim on the task's kernel) equals the lowering's count."""
    seen = []
    monkeypatch.setattr(a15, "_analyse", lambda kernel, *shapes: seen.append(
        (kernel, shapes)) or a15.kernelsim.gpu.analyse(kernel, *shapes)[0])
    answer = a15.staging_smem_bytes(rows, cols, itemsize)
    (kernel, shapes), = seen
    assert answer == _lowering_smem(kernel, *shapes)


@pytest.mark.parametrize("tm,tn,stages,itemsize", [(64, 128, 3, 4), (128, 64, 4, 2)])
def test_pipeline_answer_is_the_lowerings_allocation(monkeypatch, tm, tn, stages, itemsize):
    seen = []
    monkeypatch.setattr(a15, "_analyse", lambda kernel, *shapes: seen.append(
        (kernel, shapes)) or a15.kernelsim.gpu.analyse(kernel, *shapes)[0])
    answer = a15.pipeline_smem_bytes(tm, tn, stages, itemsize)
    (kernel, shapes), = seen
    assert answer == _lowering_smem(kernel, *shapes)
    assert jnp.dtype(shapes[0].dtype).itemsize == itemsize


# ----------------------------------------------------------------- task 5: the kernel
def _rms_kernel(x, w, interpret, *, load_w=True, wait_w=True, scale=None):
    """A band-per-CTA RMS norm, varied the ways a learner's may go wrong."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(m // 64,), grid_names=("band",),
        scratch_types=dict(x_smem=plgpu.SMEM((64, n), x.dtype), w_smem=plgpu.SMEM((n,), w.dtype),
                           x_bar=plgpu.Barrier(), w_bar=plgpu.Barrier()),
        interpret=interpret)
    def kernel(x_gmem, w_gmem, o_gmem, x_smem, w_smem, x_bar, w_bar):
        band = pl.ds(jax.lax.axis_index("band") * 64, 64)
        plgpu.copy_gmem_to_smem(x_gmem.at[band], x_smem, x_bar)
        if load_w:
            plgpu.copy_gmem_to_smem(w_gmem, w_smem, w_bar)
        plgpu.barrier_wait(x_bar)
        if load_w and wait_w:
            plgpu.barrier_wait(w_bar)
        rows = x_smem[...].astype(jnp.float32)
        weights = (w_smem[...] if load_w else w_gmem[...]).astype(jnp.float32)
        ms = jnp.mean(rows * rows, axis=1, keepdims=True)
        x_smem[...] = (rows * jax.lax.rsqrt(ms + a15.RMS_EPS) * weights).astype(x.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[band])
        plgpu.wait_smem_to_gmem(0)

    return kernel(x if scale is None else x * scale, w)


def _rule_fails(fn, rule: str) -> None:
    with pytest.raises(course.CheckFailed) as err:
        course.check("rms_norm_mgpu", fn, quiet=True)
    assert f"[FAIL] {rule}" in str(err.value), str(err.value)


def test_the_variant_kernel_passes():
    """The planted kernels below differ from this one in one thing each."""
    course.check("rms_norm_mgpu", _rms_kernel, quiet=True)


def test_weights_read_from_global_memory_fail_the_tma_rules():
    fn = functools.partial(_rms_kernel, load_w=False)
    _rule_fails(fn, "inputs staged by TMA")
    _rule_fails(fn, "global memory only through the TMA")


def test_a_copy_never_waited_on_fails():
    _rule_fails(functools.partial(_rms_kernel, wait_w=False), "every TMA copy waited on")


def test_work_outside_the_kernel_fails():
    """x * 1.0 fed in is computed outside: the kernel's input is not the function's."""
    _rule_fails(functools.partial(_rms_kernel, scale=1.0),
                "kernel inputs are your function's inputs")


def test_plain_jax_fails():
    with pytest.raises(course.CheckFailed) as err:
        course.check("rms_norm_mgpu", lambda x, w, interpret: a15.rms_norm_reference(x, w),
                     quiet=True)
    assert "never calls plgpu.kernel" in str(err.value), str(err.value)


def test_grader_work_sees_a_plgpu_kernel(solutions):
    """plgpu.kernel binds mpmd_map inside custom_vmap_call: the work facts follow the data
    through both, and name the body's inputs, its source and its primitives."""
    x = jnp.ones((128, 256), jnp.float32)
    w = jnp.ones((256,), jnp.float32)
    fn = functools.partial(solutions["rms_norm_mgpu"], interpret=plgpu.InterpretGPUParams())
    facts = work.facts(jax.make_jaxpr(fn)(x, w))
    assert facts["outputs"] == [{"from": "plgpu.kernel #0", "kind": "kernel"}]
    (call,) = facts["calls"]
    assert [o["kind"] for o in call["operands"]] == ["input", "input"]
    assert call["unread"] == [] and not call["course_kernel"] and call["dma"] is None
    assert {"copy_gmem_to_smem", "barrier_wait", "copy_smem_to_gmem"} <= set(call["primitives"])
    assert facts["outside_flops"] == 0
    (body,) = calling.kernel_bodies(jax.make_jaxpr(fn)(x, w))
    assert work.kernel_file(body).startswith("mosaic_gpu.py")  # the notebook, not JAX's wrapper


def test_an_unread_input_is_named():
    """An input the kernel body never reads (here w, read neither by TMA nor directly)."""

    def ignores_w(x, w, interpret):
        @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                           interpret=interpret)
        def kernel(x_gmem, w_gmem, o_gmem):
            o_gmem[...] = x_gmem[...]

        return kernel(x, w)

    x, w = jnp.ones((64, 128)), jnp.ones((128,))
    facts = work.facts(jax.make_jaxpr(functools.partial(ignores_w, interpret=None))(x, w))
    assert facts["calls"][0]["unread"] == [1]


def test_the_solution_lowers_for_cuda(solutions):
    """The instructor's kernel is one an H100/H200 compiles (its layouts given): nothing
    runs here; JAX's Mosaic GPU lowering accepts it."""
    x = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((256,), jnp.bfloat16)
    fn = functools.partial(solutions["rms_norm_mgpu"], interpret=None)
    jax.jit(fn).trace(x, w).lower(lowering_platforms=("cuda",))


def test_the_solution_matches_plain_jax(solutions):
    x = jax.random.normal(jax.random.key(0), (192, 128), jnp.float32) * 3 + 1
    w = jax.random.normal(jax.random.key(1), (128,), jnp.float32)
    got = solutions["rms_norm_mgpu"](x, w, interpret=plgpu.InterpretGPUParams())
    np.testing.assert_allclose(got, a15.rms_norm_reference(x, w), rtol=1e-5, atol=1e-5)


def test_the_verdict_reads_gpu_facts_and_refuses_garbage():
    """The checker's answer carries each Mosaic GPU kernel's facts (grader.grading.gpu_facts); the
    trusted verdict reads them strictly, as it reads kernelsim's TPU trace."""
    x = jnp.ones((128, 256), jnp.float32)
    w = jnp.ones((256,), jnp.float32)
    program = jax.make_jaxpr(functools.partial(_rms_kernel, interpret=None))(x, w)
    trace = gpu_facts.trace(kernelsim.gpu.kernels_in(program))
    (k,) = verdict.facts_from_dict(trace).gpu
    assert (k.grid, k.tma_sources, k.tma_targets, k.unwaited_loads) == \
        ((2,), ("in0", "in1"), ("out0",), 0)
    # the (64, 256) and (256,) float32 tiles, the row mean's reduction scratch, 2 barriers
    assert k.smem_bytes == 64 * 256 * 4 + 1024 + kernelsim.gpu.REDUCTION_SCRATCH_BYTES + 2 * 8
    for bad in ({"tma_loads": "2"}, {"tma_sources": "in0"}, {"complete": 1}):
        broken = {"calls": [], "gpu_kernels": [{**trace["gpu_kernels"][0], **bad}]}
        with pytest.raises(ValueError):
            verdict.facts_from_dict(broken)


def _waits_for_nothing(x, w, interpret):
    """Waits on w's barrier, but w's copy completes on x's: GPU interpret mode, like a GPU,
    would wait forever."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_types=dict(x_smem=plgpu.SMEM((m, n), x.dtype), x_bar=plgpu.Barrier(),
                           w_bar=plgpu.Barrier()),
        interpret=interpret)
    def kernel(x_gmem, w_gmem, o_gmem, x_smem, x_bar, w_bar):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, x_bar)
        plgpu.barrier_wait(w_bar)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return kernel(x, w)


def test_a_wait_nothing_signals_is_an_error_not_a_hang(monkeypatch):
    """Stopped before it runs (``grader.grading.gpu_facts.would_hang``), as a hung case would cost
    its cell's time limit; the message says what to do. (Were it run, this test would say so
    rather than hang.)"""
    def never(*_):
        raise AssertionError("the program was executed")

    monkeypatch.setattr(work, "jaxpr_as_fun", never)
    x, w = np.ones((64, 128), np.float32), np.ones((128,), np.float32)
    traced = calling.trace_case(tasks.get("rms_norm_mgpu"), _waits_for_nothing, [x, w], {})
    run = work.run_traced(traced)
    assert run.error.startswith("BarrierWouldHang: plgpu.kernel kernel waits on barrier"), \
        run.error
    assert "pass the barrier to the plgpu.copy_gmem_to_smem" in run.error


# a fresh interpreter: the checker of one job, and which primitives it knows
CHECKER_OF = """
import sys
from grader.grading import checker
from grader.tasks import a15_mosaic_gpu  # noqa: F401 - the tasks are imported, their API is not
known = checker.Checker({{"cases": {{"{task}/visible": []}}}}, {{}}).known
print("jax.experimental.mosaic.gpu" in sys.modules,
      any(getattr(p, "name", "") == "copy_gmem_to_smem" for p in known.values()))
"""


@pytest.mark.parametrize("task, loaded", [("add", "False False"),
                                          ("rms_norm_mgpu", "True True")])
def test_a_checker_loads_mosaic_gpu_only_for_its_assignment(task, loaded):
    """Mosaic GPU's Pallas API is half a second of a checker's start: only a job of this
    assignment loads it, and then before the primitives its programs hold are read."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CHECKER_OF.format(task=task)], check=True,
                         capture_output=True, text=True, cwd=REPO).stdout
    assert out.split("\n")[-2] == loaded, out
