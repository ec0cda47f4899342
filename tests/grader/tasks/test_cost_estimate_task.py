"""Assignment 06's matmul_costed: the instructor's sweep picks the fastest candidate and its
kernel passes on every case with a pl.CostEstimate that matches kernelsim's counts; it lowers
for TPU; wrong counts and wrong winners fail on their own rule.

The kernel comes from the notebook source; planted mistakes are edits of that source.
"""

from __future__ import annotations

import functools

import gradertools
import jax
import jax.numpy as jnp
import pytest

import kernelsim
from grader import tasks
from grader.tasks import a06_performance

pytestmark = pytest.mark.interpret

ASSIGNMENT = "06_performance"
CELL = "matmul_costed_solution"
TASK = tasks.get("matmul_costed")


@pytest.fixture(scope="module")
def notebook() -> dict:
    return gradertools.run(ASSIGNMENT)


def _planted(notebook: dict, *edits: tuple[str, str]):
    return gradertools.planted(ASSIGNMENT, notebook, CELL, *edits)


def test_the_reference_solution_passes(notebook):
    from grader.learner import course

    course.check("matmul_costed", notebook["matmul_costed"], quiet=True)
    course.check("matmul_costed", notebook["matmul_costed"], hidden=True, quiet=True)


@pytest.mark.parametrize("case", TASK.cases, ids=lambda c: c.name)
def test_every_case_has_one_fastest_candidate(case):
    """The runner-up is at least 15 % slower than the fastest candidate: the 5 % tie margin
    never lets a wrong pick through."""
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    seconds = sorted(a06_performance.candidate_seconds(
        m, k, n, case.dtype, tuple(map(tuple, case.params["candidates"]))).values())
    assert seconds[1] >= 1.15 * seconds[0], (case.name, seconds)


def test_the_sweep_estimates_here_and_ranks_as_the_grader(notebook):
    case = TASK.cases[0]
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    rows, source = notebook["sweep"](m, k, n, jnp.bfloat16, case.params["candidates"])
    assert "estimate" in source
    graded = a06_performance.candidate_seconds(m, k, n, case.dtype,
                                               tuple(map(tuple, case.params["candidates"])))
    assert rows[0][1] == min(graded, key=graded.get) == (256, 256, 256)


def test_every_case_lowers_for_tpu():
    compiled = gradertools.run(ASSIGNMENT, **gradertools.COMPILED)
    for case in TASK.cases:
        arrays = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in TASK.inputs(case).values()]
        error = kernelsim.tpu_lowering_error(
            functools.partial(compiled["matmul_costed"], **case.params), *arrays)
        assert error is None, (case.name, error)


_COST = ("cost = pl.CostEstimate(flops=2 * m * n * k,\n"
         "                           bytes_accessed=call.hbm_read_bytes + call.hbm_write_bytes,\n"
         "                           transcendentals=m * n)")


def _only_rule_failing(message: str, rule: str) -> None:
    assert f"[FAIL] {rule}" in message and message.count("[FAIL]") == 1, message


def test_no_cost_estimate_fails(notebook):
    none = _planted(notebook, (_COST, "cost = None"))
    _only_rule_failing(gradertools.fails("matmul_costed", none, "CostEstimate"),
                       "pl.CostEstimate passed to pallas_call")


def test_bytes_of_each_operand_once_fail(notebook):
    """The minimum traffic, not what these blocks move: the re-reads are missing."""
    once = _planted(notebook, ("bytes_accessed=call.hbm_read_bytes + call.hbm_write_bytes",
                               "bytes_accessed=a.nbytes + b.nbytes + m * n * a.dtype.itemsize"))
    _only_rule_failing(gradertools.fails("matmul_costed", once, "bytes_accessed"),
                       "CostEstimate bytes_accessed")


def test_multiply_adds_counted_as_one_flop_fail(notebook):
    half = _planted(notebook, ("flops=2 * m * n * k", "flops=m * n * k"))
    _only_rule_failing(gradertools.fails("matmul_costed", half, "flops"), "CostEstimate flops")


def test_a_tanh_per_k_step_counted_fails(notebook):
    per_step = _planted(notebook, ("transcendentals=m * n",
                                   "transcendentals=m * n * (k // blocks[1])"))
    _only_rule_failing(gradertools.fails("matmul_costed", per_step, "transcendentals"),
                       "CostEstimate transcendentals")


def test_the_traced_function_reads_what_tune_recorded_outside_it(notebook):
    """Autotuning outside the traced function, as JAX's tuned kernels do: ``tune`` records
    its winner in ``TUNED``; ``matmul_costed``, traced, takes its blocks from there and times
    nothing (a chip's clock that preferred other blocks is followed)."""
    case = TASK.cases[0]
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    candidates = tuple(map(tuple, case.params["candidates"]))
    rows, _ = notebook["tune"](m, k, n, jnp.bfloat16, candidates)
    key = (m, k, n, "bfloat16", candidates)
    assert notebook["TUNED"][key][0] == rows[0][1]
    notebook["TUNED"][key] = rows[-1][1:]  # as if this chip's clock had ranked it first
    try:
        traced = kernelsim.trace(functools.partial(notebook["matmul_costed"],
                                                   candidates=candidates),
                                 jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                                 jax.ShapeDtypeStruct((k, n), jnp.bfloat16)).calls[0]
    finally:
        del notebook["TUNED"][key]
    slowest = rows[-1][2]
    assert traced.steps == slowest.steps != rows[0][2].steps
    assert traced.cost_estimate["bytes_accessed"] == (slowest.hbm_read_bytes
                                                      + slowest.hbm_write_bytes)


def test_the_slowest_candidate_fails(notebook):
    slowest = _planted(notebook, ("candidates)[0][0][1:]", "candidates)[0][-1][1:]"))
    message = gradertools.fails("matmul_costed", slowest, "the sweep's fastest candidate")
    assert "(128, 128, 128)" in message and message.count("[FAIL]") == 1, message


def test_blocks_outside_the_candidates_fail(notebook):
    other = _planted(notebook, ("return tanh_matmul(a, b, blocks, cost)",
                                "return tanh_matmul(a, b, (256, 512, 512), cost)"))
    message = gradertools.fails("matmul_costed", other, "not one of the candidates")
    assert "[FAIL] blocks: the sweep's fastest candidate" in message, message


def test_the_blank_is_not_implemented():
    def matmul_costed(a, b, candidates):
        raise NotImplementedError

    assert gradertools.fails("matmul_costed", matmul_costed, "not implemented yet") == \
        "matmul_costed: not implemented yet"


def test_kernelsim_copies_equal_tpu_interpret_mode():
    """The winner's block copies as kernelsim models them (the bytes its CostEstimate gives)
    equal those TPU interpret mode performs."""
    from kernelsim.verify import verify

    interpreted = gradertools.run(ASSIGNMENT, TPU_INTERPRET=True)
    case = TASK.cases[0]
    a, b = (jnp.asarray(v) for v in TASK.inputs(case).values())
    checked = verify(functools.partial(interpreted["matmul_costed"], **case.params), a, b)
    assert checked.ok, checked.report()


def test_where_the_sweep_timed_a_chip_any_candidate_passes(notebook, monkeypatch):
    """The check cannot replay a chip's clock: on an accelerator (here: the check told it runs
    on one) the slowest candidate passes, and blocks outside the candidates still fail."""
    import types

    from grader.learner import course

    monkeypatch.setattr(a06_performance, "timing",
                        types.SimpleNamespace(accelerator=lambda: "TPU v5 lite"))
    slowest = _planted(notebook, ("candidates)[0][0][1:]", "candidates)[0][-1][1:]"))
    course.check("matmul_costed", slowest, quiet=True)
    other = _planted(notebook, ("return tanh_matmul(a, b, blocks, cost)",
                                "return tanh_matmul(a, b, (256, 512, 512), cost)"))
    message = gradertools.fails("matmul_costed", other, "[FAIL] blocks: one of the sweep's")
    assert "timed them on this TPU v5 lite" in message, message
