"""Assignment 12 (the kernel API of today): the instructor's kernels pass on every case and
lower for TPU, and plausible wrong answers fail with a message that says what is wrong.

The kernels come from the notebook source itself; planted mistakes are made by editing that
source, so what is tested is what learners get.
"""

from __future__ import annotations

import functools

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelsim
from grader import tasks
from grader.calling import softmax_rows
from grader.learner import course

pytestmark = pytest.mark.interpret

ASSIGNMENT = "12_kernel_api"
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


@pytest.fixture(scope="module")
def notebook() -> dict:
    return gradertools.run(ASSIGNMENT)


def _planted(notebook: dict, cell: str, *edits: tuple[str, str]):
    return gradertools.planted(ASSIGNMENT, notebook, cell, *edits)


_fails = gradertools.fails


def test_every_task_has_a_solution_and_tests():
    cells = gradertools.cells(ASSIGNMENT)
    assert TASKS == ["softmax_in_parts", "matmul_bias_relu_cores"]
    for task in TASKS:
        assert {f"{task}_solution", f"{task}_visible", f"{task}_hidden"} <= set(cells), task


@pytest.mark.parametrize("task", TASKS)
def test_the_reference_solution_passes(task, notebook):
    course.check(task, notebook[task], quiet=True)
    course.check(task, notebook[task], hidden=True, quiet=True)


def test_the_kernels_match_plain_jax(notebook):
    """Directly against plain JAX, outside the grader: the softmax and the two-core matmul."""
    x = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
    np.testing.assert_allclose(notebook["softmax_in_parts"](x, 4), softmax_rows(x),
                               rtol=1e-5, atol=1e-6)
    a = jax.random.normal(jax.random.key(1), (384, 256), jnp.float32)
    b = jax.random.normal(jax.random.key(2), (256, 256), jnp.float32)
    bias = jax.random.normal(jax.random.key(3), (1, 256), jnp.float32)
    out = notebook["traced_as_tpu"](notebook["matmul_bias_relu_cores"])(a, b, bias, 128, 128,
                                                                        128)
    np.testing.assert_allclose(out, jnp.maximum(jnp.dot(a, b, precision="highest") + bias, 0),
                               rtol=1e-4, atol=1e-3)


def test_every_solution_case_lowers_for_tpu(notebook):
    for task_id in TASKS:
        task = tasks.get(task_id)
        for case in task.cases:
            arrays = [jax.ShapeDtypeStruct(s, jnp.bfloat16 if case.dtype == "bfloat16"
                                           else jnp.float32) for s in case.arrays.values()]
            fn = functools.partial(notebook[task_id], **case.params, interpret=False)
            error = kernelsim.tpu_lowering_error(fn, *arrays)
            assert error is None, (task_id, case.name, error)


def test_semaphores_as_call_scratch_fail(notebook):
    """The semaphores in scratch_shapes instead of pl.run_scoped."""
    def as_scratch(x, parts, interpret=notebook["TPU_INTERPRET"]):
        pl, pltpu = notebook["pl"], notebook["pltpu"]
        m, n = x.shape
        rows = m // parts

        def kernel(x_hbm, o_hbm, buf, sems):
            part_rows = [pl.ds(p * rows, rows) for p in range(parts)]
            copies = [pltpu.async_copy(x_hbm.at[r], buf.at[r], sems.at[p])
                      for p, r in enumerate(part_rows)]
            for copy, r in zip(copies, part_rows, strict=True):
                copy.wait()
                buf[r, :] = jax.nn.softmax(buf[r, :].astype(jnp.float32), axis=1
                                           ).astype(buf.dtype)
            pltpu.sync_copy(buf, o_hbm)

        return pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA((parts,))],
            interpret=interpret)(x)

    _fails("softmax_in_parts", as_scratch, "scratch_shapes")


def test_a_wait_after_the_compute_is_a_race(notebook):
    """Computing a part before waiting for its copy: the race detector fails it."""
    early = _planted(notebook, "softmax_in_parts_solution",
                     ("                copy.wait()\n", ""),
                     ("            pltpu.sync_copy(buf, o_hbm)",
                      "            for copy in copies:\n                copy.wait()\n"
                      "            pltpu.sync_copy(buf, o_hbm)"))
    with pytest.raises(course.CheckFailed):
        course.check("softmax_in_parts", early, quiet=True)


def test_both_cores_doing_everything_fail(notebook):
    """No core_axis: each core runs the whole pipeline; right values, twice the traffic."""
    both = _planted(notebook, "matmul_bias_relu_cores_solution",
                    ("            core_axis=0,\n", ""))
    _fails("matmul_bias_relu_cores", both, "HBM write traffic")


ONE_CORE = ("grid=(tensorcores(),)", "grid=(1,)")


def test_one_core_fails_the_grid_rule(notebook):
    """Interpreted, the grid must have the two cores the interpreter simulates."""
    one = _planted(notebook, "matmul_bias_relu_cores_solution", ONE_CORE)
    _fails("matmul_bias_relu_cores", one, "grid")


def test_tensorcores_is_the_chips_count(monkeypatch):
    """On a TPU the count comes from the chip (its device kind): 1 on a TPU v5e, whose one
    TensorCore refused the solution's core-parallel axis of 2 (issue 33), 2 on a megacore v5p;
    off a TPU the two cores interpret mode simulates."""
    from kernelsim import adapter, backend

    assert backend.tensorcores() == 2  # this CPU
    monkeypatch.setattr(backend, "platform", lambda: "tpu")
    with adapter.on_abstract_tpu("TPU v5 lite"):
        assert backend.tensorcores() == 1
    with jax.sharding.use_abstract_mesh(adapter.abstract_mesh("TPU v5", num_cores=2)):
        assert backend.tensorcores() == 2


def test_a_one_core_chip_takes_the_one_core_grid(notebook, monkeypatch):
    """Graded where the chip has one TensorCore (a TPU v5e), the grid (1,) passes every case
    and a grid of 2, which that chip cannot compile, fails."""
    from kernelsim import backend

    monkeypatch.setattr(backend, "tensorcores", lambda: 1)
    one = _planted(notebook, "matmul_bias_relu_cores_solution", ONE_CORE)
    course.check("matmul_bias_relu_cores", one, quiet=True)
    course.check("matmul_bias_relu_cores", one, hidden=True, quiet=True)
    two = _planted(notebook, "matmul_bias_relu_cores_solution",
                   ("grid=(tensorcores(),)", "grid=(2,)"))
    assert "(1,): one index per TensorCore" in _fails("matmul_bias_relu_cores", two, "grid")


def test_parallel_instead_of_core_parallel_fails(notebook):
    parallel = _planted(notebook, "matmul_bias_relu_cores_solution",
                        ("dimension_semantics=(pltpu.CORE_PARALLEL,)",
                         "dimension_semantics=(pltpu.PARALLEL,)"))
    _fails("matmul_bias_relu_cores", parallel, "core_parallel")



def test_kernelsim_copies_equal_tpu_interpret_mode(notebook):
    """The solutions' DMAs as kernelsim models them equal those TPU interpret mode performs."""
    from kernelsim.verify import verify

    x = jax.device_put(jax.random.normal(jax.random.key(4), (64, 256), jnp.float32))
    assert verify(functools.partial(notebook["softmax_in_parts"], parts=4,
                                    interpret=True), x).ok
    a, b = (jax.device_put(jax.random.normal(jax.random.key(i), s, jnp.float32))
            for i, s in ((5, (384, 256)), (6, (256, 256))))
    bias = jax.device_put(jax.random.normal(jax.random.key(7), (1, 256), jnp.float32))
    fn = notebook["traced_as_tpu"](functools.partial(
        notebook["matmul_bias_relu_cores"], bm=128, bk=128, bn=128, interpret=True))
    checked = verify(fn, a, b, bias)
    assert checked.ok, checked.report()
