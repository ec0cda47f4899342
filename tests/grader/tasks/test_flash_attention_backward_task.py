"""Assignment 07's backward tasks (``flash_attention_backward``, and ``attention_with_grad``,
which puts it behind ``jax.custom_vjp``): the instructor's kernels pass every case and agree
with ``jax.grad`` of plain JAX, and the mistakes a learner makes in a flash-attention backward
lose the task's points with a message that says what is wrong.

The kernels come from the notebook source itself; planted mistakes are made by editing that
source, so what is tested is what learners get. (Tasks 1-3 of the assignment:
tests/grader/tasks/test_adversarial_a05_a07.py, which also lowers every case of every task of the
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


WITH_GRAD = "attention_with_grad"


def test_the_tasks_have_a_solution_and_tests():
    cells = gradertools.cells(ASSIGNMENT)
    for task in (TASK, WITH_GRAD):
        assert {f"{task}_solution", f"{task}_visible", f"{task}_hidden"} <= set(cells), task
    ids = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]
    assert ids[ids.index(TASK):ids.index(TASK) + 2] == [TASK, WITH_GRAD]  # tasks 4 and 5


@pytest.mark.parametrize("task", [TASK, WITH_GRAD])
def test_the_reference_solution_passes(task, notebook):
    course.check(task, notebook[task], quiet=True)
    course.check(task, notebook[task], hidden=True, quiet=True)


def _plain_attention(q, k, v):
    s = jnp.dot(q, k.T, precision="highest") / math.sqrt(q.shape[1])
    return jnp.dot(jax.nn.softmax(s, axis=1), v, precision="highest")


def test_the_kernels_match_jax_grad_of_plain_attention(notebook):
    """Directly against ``jax.grad`` of plain-JAX attention, outside the grader and its stored
    references: the gradients of sum(attention(q, k, v) * do)."""
    task = tasks.get(TASK)
    case = next(c for c in task.cases if c.name == "h0")  # Lq != Lk
    q, k, v, o, lse, do = (jnp.asarray(a) for a in task.inputs(case).values())

    expected = jax.grad(lambda q, k, v: jnp.sum(_plain_attention(q, k, v) * do),
                        argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(o, _plain_attention(q, k, v), rtol=1e-6, atol=1e-6)
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


# ----------------------------------------------------------------------- behind jax.custom_vjp
def test_jax_grad_runs_the_learners_kernels(notebook):
    """``jax.grad`` itself, as a learner trains with it: the gradients equal plain JAX's, and
    its program runs the forward kernel and the three backward kernels."""
    task = tasks.get(WITH_GRAD)
    case = next(c for c in task.cases if c.name == "v0")
    q, k, v, do = (jnp.asarray(a) for a in task.inputs(case).values())

    def grads(attention):
        return jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * do), argnums=(0, 1, 2))

    mine = grads(lambda q, k, v: notebook[WITH_GRAD](q, k, v, **case.params))
    for g, e in zip(mine(q, k, v), grads(_plain_attention)(q, k, v), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
    # each kernel by the body's function ("dq_kernel at <file>:<line>")
    kernels = [e.params["jaxpr"].debug_info.func_src_info.split(" at ")[0]
               for e in jax.make_jaxpr(mine)(q, k, v).eqns if e.primitive.name == "pallas_call"]
    assert kernels == ["flash_kernel_with_lse", "delta_kernel", "dkv_kernel", "dq_kernel"], \
        kernels


def _with_grad(notebook, *edits):
    # the cell runs beside the notebook's names and plain attention, for a planted backward
    return gradertools.planted(ASSIGNMENT, {**notebook, "plain_attention": _plain_attention},
                               f"{WITH_GRAD}_solution", *edits)


def test_a_backward_in_plain_jax_fails(notebook):
    """The custom_vjp's backward is plain JAX's: the values pass, the kernel rules do not."""
    plain = _with_grad(notebook, ("return flash_attention_backward(*residuals, do, bq, bk)",
                                  "q, k, v, _, _ = residuals\n"
                                  "    return jax.vjp(plain_attention, q, k, v)[1](do)"))
    message = gradertools.fails(WITH_GRAD, plain, "[FAIL] a dk/dv kernel")
    assert "wrong values" not in message and "[FAIL] a dq kernel" in message, message


def test_lse_without_the_log_of_the_sum_fails(notebook):
    without_log = _with_grad(notebook, ("lse_ref[...] = m_ref[:, :1] + jnp.log(l_ref[:, :1])",
                                        "lse_ref[...] = m_ref[:, :1]"))
    gradertools.fails(WITH_GRAD, without_log, "wrong values for case v0")


def test_the_custom_vjp_blank_is_not_implemented():
    def attention_with_grad(q, k, v, bq, bk):
        raise NotImplementedError

    assert gradertools.fails(WITH_GRAD, attention_with_grad, "not implemented yet") == \
        f"{WITH_GRAD}: not implemented yet"
