"""Assignment 07's backward task: the instructor's kernels pass every case and agree with
``jax.grad`` of plain JAX, and the mistakes a learner makes in a flash-attention backward lose
the task's points with a message that says what is wrong.

The kernels come from the notebook source itself; planted mistakes are made by editing that
source, so what is tested is what learners get. (Tasks 1-3 of the assignment:
tests/grader/test_adversarial_a05_a07.py, which also lowers every case of every task of the
assignment, this one's included, for a TPU.)
"""

from __future__ import annotations

import math

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from grader import tasks
from grader.learner import course

pytestmark = pytest.mark.interpret

ASSIGNMENT = "07_flash_attention"
TASK = "flash_attention_backward"
CELL = f"{TASK}_solution"


@pytest.fixture(scope="module")
def notebook() -> dict:
    return gradertools.run(ASSIGNMENT)


def _planted(notebook: dict, *edits: tuple[str, str]):
    return gradertools.planted(ASSIGNMENT, notebook, CELL, *edits)


def _wrong_values(fn) -> str:
    """``fn`` fails the visible case on its values."""
    return gradertools.fails(TASK, fn, "wrong values for case v0")


def test_the_task_has_a_solution_and_tests():
    assert {CELL, f"{TASK}_visible", f"{TASK}_hidden"} <= set(gradertools.cells(ASSIGNMENT))
    assert [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT][-1] == TASK


def test_the_reference_solution_passes(notebook):
    course.check(TASK, notebook[TASK], quiet=True)
    course.check(TASK, notebook[TASK], hidden=True, quiet=True)


def test_the_kernels_match_jax_grad_of_plain_attention(notebook):
    """Directly against ``jax.grad`` of plain-JAX attention, outside the grader and its stored
    references: the gradients of sum(attention(q, k, v) * do)."""
    task = tasks.get(TASK)
    case = next(c for c in task.cases if c.name == "h0")  # Lq != Lk
    q, k, v, o, lse, do = (jnp.asarray(a) for a in task.inputs(case).values())

    def attention(q, k, v):
        s = jnp.dot(q, k.T, precision="highest") / math.sqrt(q.shape[1])
        return jnp.dot(jax.nn.softmax(s, axis=1), v, precision="highest")

    expected = jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * do), argnums=(0, 1, 2))(
        q, k, v)
    np.testing.assert_allclose(o, attention(q, k, v), rtol=1e-6, atol=1e-6)
    got = notebook[TASK](q, k, v, o, lse, do, **case.params)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def test_forgetting_d_fails(notebook):
    _wrong_values(_planted(notebook, ("return p, p * (dp - delta)", "return p, p * dp")))


def test_dk_without_the_scale_fails(notebook):
    _wrong_values(_planted(notebook, (
        "preferred_element_type=jnp.float32) / math.sqrt(d)\n\n    @pl.when(i ==",
        "preferred_element_type=jnp.float32)\n\n    @pl.when(i ==")))


def test_dk_and_dv_swapped_fail(notebook):
    _wrong_values(_planted(notebook, ("return dq, dk, dv", "return dq, dv, dk")))


def test_p_not_transposed_fails(notebook):
    """``p @ do`` in place of ``p.T @ do``: the shapes agree on square blocks (the visible
    case's), the values do not."""
    _wrong_values(_planted(notebook, ("jnp.dot(p.T.astype", "jnp.dot(p.astype")))


def test_probabilities_written_to_hbm_fail_on_their_rule_alone(notebook):
    """The right gradients, but a kernel also stores every probability, (Lq, Lk), in HBM (to
    reuse them, say): only the rule on the writes fails."""
    def probabilities_kernel(q_ref, k_ref, lse_ref, p_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                precision=jax.lax.Precision.HIGHEST,
                                preferred_element_type=jnp.float32)
        p_ref[...] = jnp.exp(s / math.sqrt(q_ref.shape[1]) - lse_ref[...])

    def stored_probabilities(q, k, v, o, lse, do, bq, bk):
        (lq, d), lk = q.shape, k.shape[0]
        pl.pallas_call(
            probabilities_kernel, grid=(lq // bq, lk // bk),
            in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                      pl.BlockSpec((bk, d), lambda i, j: (j, 0)),
                      pl.BlockSpec((bq, 1), lambda i, j: (i, 0))],
            out_specs=pl.BlockSpec((bq, bk), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((lq, lk), jnp.float32),
            interpret=notebook["TPU_INTERPRET"])(q, k, lse)
        return notebook[TASK](q, k, v, o, lse, do, bq, bk)

    message = gradertools.fails(TASK, stored_probabilities,
                                "[FAIL] no (Lq, Lk) array in HBM")
    assert "wrong values" not in message and message.count("[FAIL]") == 1, message


def test_d_in_plain_jax_fails(notebook):
    """D summed by XLA and handed to the kernels: not a kernel's work."""
    outside = _planted(notebook, ("    delta = pl.pallas_call(",
                                  "    delta = jnp.sum(o * do, axis=1, keepdims=True)\n"
                                  "    pl.pallas_call("))
    message = gradertools.fails(TASK, outside, "[FAIL] kernel inputs are your function's inputs")
    assert "wrong values" not in message, message


def test_the_blank_is_not_implemented():
    def flash_attention_backward(q, k, v, o, lse, do, bq, bk):
        raise NotImplementedError

    assert gradertools.fails(TASK, flash_attention_backward, "not implemented yet") == \
        f"{TASK}: not implemented yet"
