"""Assignment 07's dropout_attention: the instructor's kernel passes on every case, draws a mask
whose output is plain JAX's attention with it, lowers for TPU, and plausible wrong dropouts fail
on the property a right one has (its mask is its own random draw, so no fixed answer exists).

The kernel comes from the notebook source; planted mistakes are edits of that source.
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
from grader.learner import course

pytestmark = pytest.mark.interpret

ASSIGNMENT = "07_flash_attention"
CELL = "dropout_attention_solution"


@pytest.fixture(scope="module")
def notebook() -> dict:
    return gradertools.run(ASSIGNMENT)


def _planted(notebook: dict, *edits: tuple[str, str]):
    return gradertools.planted(ASSIGNMENT, notebook, CELL, *edits)


def _inputs(case_name: str) -> tuple[list, dict]:
    task = tasks.get("dropout_attention")
    case = next(c for c in task.cases if c.name == case_name)
    return [jnp.asarray(v) for v in task.inputs(case).values()], case.params


def test_the_reference_solution_passes(notebook):
    course.check("dropout_attention", notebook["dropout_attention"], quiet=True)
    course.check("dropout_attention", notebook["dropout_attention"], hidden=True, quiet=True)


def test_the_program_crosses_to_the_checker_and_runs_there(notebook):
    """As grading passes it: traced in the notebook's process, pickled, read back through the
    checker's allow-list (a key's type names its PRNG implementation's functions, which the
    list once refused: the instructor scored 15 of 18 in a jailed batch) and run."""
    from grader.calling import Traced, trace_case
    from grader.facts import work

    task = tasks.get("dropout_attention")
    case = next(c for c in task.cases if c.name == "v0")
    arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
    traced = trace_case(task, notebook["dropout_attention"], arrays, case.params)
    program = gradertools.as_the_checker_reads(traced.program)
    run = work.run_traced(Traced(program, arrays))
    assert run.error is None, run.error
    assert not [r for r in task.output_rules(case, task.inputs(case), run.output) if not r.ok]


def test_the_kernel_is_attention_with_its_own_mask(notebook):
    """Directly against plain JAX, outside the grader: the output is softmax times the kernel's
    mask over 1 - rate, times v; the mask keeps about 1 - rate; the same seed draws it again."""
    (q, k, v, seed, _), params = _inputs("v0")
    out, keep = notebook["dropout_attention"](q, k, v, seed, **params)
    again = notebook["dropout_attention"](q, k, v, seed, **params)[1]
    np.testing.assert_array_equal(keep, again)
    p = jax.nn.softmax(jnp.dot(q, k.T, precision="highest") / np.sqrt(q.shape[1]), axis=-1)
    expected = jnp.dot(p * keep / (1 - params["rate"]), v, precision="highest")
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert abs(float(keep.mean()) - (1 - params["rate"])) < 0.03


def test_every_case_lowers_for_tpu():
    compiled = gradertools.run(ASSIGNMENT, **gradertools.COMPILED)
    task = tasks.get("dropout_attention")
    for case in task.cases:
        arrays = [jax.ShapeDtypeStruct(v.shape, v.dtype)
                  for v in list(task.inputs(case).values())[:4]]  # q, k, v and the seed
        error = kernelsim.tpu_lowering_error(
            functools.partial(compiled["dropout_attention"], **case.params), *arrays)
        assert error is None, (case.name, error)


_FOLD = "i * pl.num_programs(1) + j"


def test_one_key_for_every_block_fails(notebook):
    """Seeded by the seed alone, every block draws the same bits."""
    same = _planted(notebook, (_FOLD, "0"))
    message = gradertools.fails("dropout_attention", same,
                                "[FAIL] every (bq, bk) block draws its own bits")
    assert "3 of 4 blocks repeat another" in message, message


def test_a_key_per_query_block_only_fails(notebook):
    per_row = _planted(notebook, (_FOLD, "i"))
    gradertools.fails("dropout_attention", per_row,
                      "[FAIL] every (bq, bk) block draws its own bits")


def test_a_seed_the_kernel_ignores_fails(notebook):
    fixed = _planted(notebook, ("jax.random.key(seed_ref[0])", "jax.random.key(7)"))
    message = gradertools.fails("dropout_attention", fixed, "[FAIL] the seed decides the bits")
    assert "0.0% differ" in message, message


def test_keeping_with_probability_rate_fails_on_the_fraction_alone(notebook):
    """Keeping where the bits are below the threshold keeps a fraction rate, not 1 - rate; the
    output is still the attention with that mask, so only the fraction fails."""
    inverted = _planted(notebook, (">= threshold", "< threshold"))
    message = gradertools.fails("dropout_attention", inverted, "[FAIL] kept fraction")
    assert message.count("[FAIL]") == 1, message


def test_no_rescaling_fails_on_the_output(notebook):
    unscaled = _planted(notebook, ("(l_ref[...] * (1 - rate))", "l_ref[...]"))
    message = gradertools.fails("dropout_attention", unscaled,
                                "[FAIL] output = attention with your keep mask")
    assert message.count("[FAIL]") == 1, message


def test_the_tpu_generator_draws_zeros_in_interpret_mode_and_fails(notebook):
    """pltpu.prng_random_bits is zeros in TPU interpret mode: nothing is kept."""
    hardware = _planted(notebook, (
        "key = jax.random.fold_in(jax.random.key(seed_ref[0]), " + _FOLD + ")\n"
        "        keep = jax.random.bits(key, (bq, bk), jnp.uint32) >= threshold",
        "pltpu.prng_seed(seed_ref[0], i, j)\n"
        "        keep = pltpu.bitcast(pltpu.prng_random_bits((bq, bk)), jnp.uint32) >= threshold"))
    gradertools.fails("dropout_attention", hardware, "[FAIL] kept fraction")


def test_the_blank_is_not_implemented():
    def dropout_attention(q, k, v, seed, bq, bk, rate):
        raise NotImplementedError

    assert gradertools.fails("dropout_attention", dropout_attention, "not implemented yet") == \
        "dropout_attention: not implemented yet"


def test_kernelsim_copies_equal_tpu_interpret_mode():
    """The solution's block copies as kernelsim models them equal those TPU interpret mode
    performs (the seed in SMEM, the mask written block by block)."""
    from kernelsim.verify import verify

    interpreted = gradertools.run(ASSIGNMENT, TPU_INTERPRET=True)
    (q, k, v, seed, _), params = _inputs("v0")
    checked = verify(functools.partial(interpreted["dropout_attention"], **params), q, k, v, seed)
    assert checked.ok, checked.report()
