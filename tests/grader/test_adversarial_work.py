"""Who did the work (issue 25): each attack below gets the values right and smuggles in work the
learner did not do; each must fail, saying what was found, while the honest kernel passes.

- a kernel body the course ships, re-created from its source text with ``exec`` (so its debug
  info names the notebook, not ``lessons/``), and one padded with dead arithmetic;
- a Pallas op JAX ships, called, and re-created from its source the same way;
- the arithmetic done by a host callback (``jax.pure_callback``), outside or inside a kernel;
- a reduction's total computed outside, in a while loop (whose work the FLOP count saw once),
  and handed to the kernel as a scalar-prefetch operand;
- a "predict" task answered by calling the grader's byte count or kernelsim, or by first
  switching off what watches the prediction.

Judged as in one process (``course.check``); the instructor's solutions keep passing (the
exercise tests), and no stored fingerprint is one of theirs (``test_no_solution_is_shipped``).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import subprocess
import sys
from pathlib import Path

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader import devices, tasks
from grader.grading import calling, fingerprint, work
from grader.learner import course
from grader.tasks import collect_shipped, shipped

TPU_INTERPRET = pltpu.InterpretParams()


def _fails(task_id: str, fn, *expected: str) -> str:
    with pytest.raises(course.CheckFailed) as err:
        course.check(task_id, fn, quiet=True)
    for text in expected:
        assert text in str(err.value), str(err.value)
    return str(err.value)


def _recreated(module) -> dict:
    """``module``'s source executed as the notebook would: text copied, then ``exec``."""
    namespace: dict = {"__name__": "copied"}
    exec(compile(inspect.getsource(module), "<notebook cell>", "exec"), namespace)  # noqa: S102
    return namespace


# ----------------------------------------------------------------------- shipped kernel bodies
def _lesson_cell(lesson: str, defines: str) -> str:
    """The code of the lesson cell that defines ``defines``, up to the lesson's own check."""
    import jupytext

    path = gradertools.SOURCE.parents[1] / "lessons" / lesson
    (source,) = [c.source for c in jupytext.read(path).cells
                 if c.cell_type == "code" and f"def {defines}(" in c.source]
    return source.split("_course.check(")[0]


def test_a_lesson_kernel_recreated_from_its_source_is_not_the_learners():
    """Lesson 8's causal flash attention, its cell copied and executed in the notebook: the
    right values and every traffic rule, on a batch of one head."""
    copied: dict = {"functools": functools, "jax": jax, "jnp": jnp, "pl": pl, "pltpu": pltpu,
                    "SCALE": 1 / 8}  # 1 / sqrt(d) for the cases' d = 64
    exec(compile(_lesson_cell("08-flash-attention.py", "flash_kernel"), "<notebook cell>",
                 "exec"), copied)  # noqa: S102

    def causal_flash_attention(q, k, v, bq, bk):
        return copied["flash_attention"](q[None], k[None], v[None], bq=bq, bkv=bk, causal=True,
                                         interpret=TPU_INTERPRET)[0]

    _fails("causal_flash_attention", causal_flash_attention, "[FAIL] kernels are your own",
           "pallas_call #0's kernel body is the one lessons/08-flash-attention.py ships, up to "
           "renaming")


def test_dead_arithmetic_does_not_hide_a_copied_body():
    """The same body with unused work added keeps its fingerprint (dead code is dropped)."""
    from kernelsim import examples

    def padded_kernel(x_ref, y_ref, o_ref, acc_ref):
        unused = jnp.sin(x_ref[...]) * 3.0  # noqa: F841 - the padding
        examples.matmul_kernel(x_ref, y_ref, o_ref, acc_ref)

    def program(kernel):
        a, b = jnp.zeros((32, 256)), jnp.zeros((256, 128))
        call = pl.pallas_call(
            kernel, grid=(2, 1, 2), in_specs=[pl.BlockSpec((16, 128), lambda i, j, k: (i, k)),
                                              pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((16, 128), lambda i, j, k: (i, j)),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)], interpret=TPU_INTERPRET)
        (body,) = calling.kernel_bodies(jax.make_jaxpr(call)(a, b))
        return body

    assert fingerprint.fingerprint(program(padded_kernel)) == \
        fingerprint.fingerprint(program(examples.matmul_kernel))


def test_a_pallas_op_jax_ships_is_not_the_learners():
    from jax.experimental.pallas.ops.gpu import softmax

    def column_softmax(x, bn):
        return softmax.softmax(x.T, axis=-1, interpret=True).T

    _fails("column_softmax", column_softmax,
           "pallas_call #0 runs a Pallas op JAX ships (jax.experimental.pallas.ops)")

    copied = _recreated(softmax)

    def recreated(x, bn):
        return copied["softmax"](x.T, axis=-1, interpret=True).T

    _fails("column_softmax", recreated, "kernel body is the one jax...ops.gpu.softmax ships")


def shipped_solution_bodies(assignments) -> list[tuple[str, str]]:
    """(task, where the corpus says it ships) for every instructor solution of
    ``assignments`` whose kernel body the stored corpus holds. On the way, each solution's
    program crosses to the checker as grading sends it (pickled, read back through the
    checker's allow-list) and runs no Python there: a program naming what the list refuses
    passes every in-process test and fails only in a jailed batch (the dropout task's key)."""
    found = []
    for assignment in assignments:
        for task_id, fn in gradertools.solutions(assignment).items():
            task = tasks.get(task_id)
            case = next(c for c in task.cases if not c.hidden)
            arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
            traced = work.trace_case(task, fn, arrays, case.params)
            assert traced.error is None, (task_id, traced.error)
            if traced.program is not None:
                gradertools.as_the_checker_reads(traced.program, task_id)
            found += [(task_id, shipped.known()[fingerprint.fingerprint(b)])
                      for b in calling.kernel_bodies(traced.program)
                      if fingerprint.fingerprint(b) in shipped.known()]
    return found


def test_no_solution_is_shipped():
    """The stored corpus holds no instructor solution's body: an honest learner's kernel may
    be exactly that, and must not fail for it. An assignment on a ring of devices is traced in
    a process started with them (XLA counts its CPU devices once, when JAX starts)."""
    here = [a for a in tasks.ASSIGNMENTS if devices.devices_of(a) <= jax.device_count()]
    found = shipped_solution_bodies(here)
    for assignment in sorted(set(tasks.ASSIGNMENTS) - set(here)):
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                "import test_adversarial_work as t\n"
                f"print(repr(t.shipped_solution_bodies([{assignment!r}])))")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=devices.cpu_devices_env(os.environ,
                                                         devices.devices_of(assignment)),
                             timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        found += ast.literal_eval(res.stdout.strip().splitlines()[-1])
    assert found == []


# ----------------------------------------------------------------------- host callbacks
def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def test_arithmetic_in_a_host_callback_fails():
    def add(x, y):
        total = jax.pure_callback(lambda a, b: np.asarray(a) + np.asarray(b),
                                  jax.ShapeDtypeStruct(x.shape, x.dtype), x, y)
        # the kernel adds zero to what the host computed: values right, work done in NumPy
        return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(total, y - y)

    _fails("add", add, "[FAIL] no host callbacks", "found pure_callback")


def test_debug_print_is_not_a_callback():
    def add(x, y):
        def kernel(x_ref, y_ref, o_ref):
            jax.debug.print("step {}", 0)
            o_ref[...] = x_ref[...] + y_ref[...]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x, y)

    course.check("add", add, quiet=True)


# ----------------------------------------------------------------------- scalar prefetch
def test_a_total_smuggled_in_as_a_prefetch_scalar_fails():
    """sum_all's answer computed by a while loop outside the kernel, bit-cast to int32 and
    passed as a scalar-prefetch operand; the kernel sums its blocks for show and writes the
    smuggled total."""

    def sum_all(x, block):
        (m, n), (bm, bn) = x.shape, block

        def add_row(state):
            i, acc = state
            return i + 1, acc + jnp.sum(x[i].astype(jnp.float32))

        _, total = jax.lax.while_loop(lambda s: s[0] < m, add_row, (0, jnp.float32(0)))
        smuggled = jax.lax.bitcast_convert_type(total, jnp.int32).reshape(1)

        def kernel(t_ref, x_ref, o_ref):
            o_ref[...] = jnp.zeros_like(o_ref) + jnp.sum(x_ref[...]) * 0 + \
                jax.lax.bitcast_convert_type(t_ref[0], jnp.float32)

        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
                in_specs=[pl.BlockSpec((bm, bn), lambda i, j, t: (i, j))],
                out_specs=pl.BlockSpec((1, 1), lambda i, j, t: (0, 0))),
            interpret=TPU_INTERPRET)(smuggled, x)

    _fails("sum_all", sum_all, "[FAIL] scalar prefetch carries indices",
           "scalar-prefetch operand 0 of pallas_call #0",
           "from floating-point data", "a while loop computing")


# ----------------------------------------------------------------------- predictions
def test_a_prediction_that_calls_the_grader_fails():
    from grader.tasks.a04_memory_spaces import matmul_read_bytes

    _fails("predict_matmul_reads", lambda **p: matmul_read_bytes(**p),
           "CourseCodeCalled", "matmul_read_bytes (a04_memory_spaces.py)")


def test_a_prediction_that_runs_kernelsim_fails():
    import kernelsim
    from kernelsim import examples

    def predict(m, k, n, bm, bk, bn, itemsize):
        a = np.zeros((m, k), np.float32)
        b = np.zeros((k, n), np.float32)
        call = kernelsim.trace(lambda a, b: examples.matmul(a, b, bm, bk, bn), a, b).calls[0]
        return int(call.hbm_read_bytes * itemsize // 4)

    _fails("predict_matmul_reads", predict, "CourseCodeCalled", "kernelsim")


def test_a_prediction_that_switches_off_the_watch_fails():
    def predict(m, k, n, bm, bk, bn, itemsize):
        sys.setprofile(None)
        return 0

    _fails("predict_matmul_reads", predict, "CourseCodeCalled", "sys.setprofile")


def test_the_honest_prediction_passes():
    predict = gradertools.solutions("04_memory_spaces")["predict_matmul_reads"]
    course.check("predict_matmul_reads", predict, quiet=True)
    course.check("predict_matmul_reads", predict, hidden=True, quiet=True)


# ----------------------------------------------------------------------- the stored corpus
@pytest.mark.slow
def test_the_stored_corpus_holds_jaxs_ops():
    """Every body of the JAX ops the corpus traces is stored (none is a solution); the whole
    corpus, lessons included: the slow test below."""
    missing = [where for where, fn, args in collect_shipped.shipped_calls()
               if where.startswith("jax")
               for body in calling.kernel_bodies(jax.make_jaxpr(fn)(*args))
               if fingerprint.fingerprint(body) not in shipped.known()]
    assert missing == []


@pytest.mark.slow
def test_the_stored_corpus_is_current():
    """``python -m grader.tasks.collect_shipped`` run now writes what is stored: regenerate after
    changing a lesson's kernels. When none of the files the corpus is made from changed since
    it was made (its stored digest), it is current without remaking it (2.5 minutes)."""
    if shipped.stored_digest() == collect_shipped.sources_digest():
        return
    assert collect_shipped.collect(log=lambda _: None) == shipped.known(), \
        "the shipped-kernel corpus is stale: run `python -m grader.tasks.collect_shipped`"
