"""Assignment 15 (Mosaic GPU): the instructor's predictions pass every case; planted wrong ones
fail on the case that tells them apart, judged as the grader judges (``course.check``); and the
grader's answers, kernelsim's counts, equal what the Mosaic GPU lowering allocates.

The planted answers are the mistakes the tasks are about: shared memory without the lowering's
rounding to 1024 bytes or without the barriers, a pipeline's slots rounded one by one (they are
one allocation), an accumulator counted in bytes rather than registers, and a matmul's copies
counted as if each operand were read once.
"""

from __future__ import annotations

import re

import gradertools
import jax
import jax.numpy as jnp
import pytest
from jax.experimental.mosaic.gpu import core as mgpu_core

from grader import course, tasks
from grader.tasks import a15_mosaic_gpu as a15

ASSIGNMENT = "15_mosaic_gpu"
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


@pytest.fixture(scope="module")
def solutions() -> dict:
    """The setup and solution cells of the instructor notebook, run in one namespace."""
    return gradertools.run(ASSIGNMENT)


def test_the_assignment_has_its_tasks():
    assert TASKS == ["predict_staging_smem", "predict_pipeline_smem",
                     "predict_accumulator_registers", "predict_matmul_tma_bytes"]


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
