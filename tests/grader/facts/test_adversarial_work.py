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
import types
from pathlib import Path

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader import calling, devices, tasks
from grader.facts import fingerprint, work
from grader.learner import course
from grader.tasks import collect_shipped, core, shipped
from grader.verdict import verdict

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
                      if fingerprint.fingerprint(b) in shipped.known()
                      and fingerprint.fingerprint(b) not in shipped.allowed(task_id)]
    return found


def test_no_solution_is_shipped():
    """The stored corpus holds no instructor solution's body but the one its task's text gives
    (``Task.given_body``): an honest learner's kernel may be exactly that, and must not fail
    for it. An assignment on a ring of devices is traced in a process started with them (XLA
    counts its CPU devices once, when JAX starts)."""
    here = [a for a in tasks.ASSIGNMENTS if devices.devices_of(a) <= jax.device_count()]
    found = shipped_solution_bodies(here)
    for assignment in sorted(set(tasks.ASSIGNMENTS) - set(here)):
        code = (f"import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, "
                f"{str(Path(__file__).parents[1])!r}]\n"
                "import test_adversarial_work as t\n"
                f"print(repr(t.shipped_solution_bodies([{assignment!r}])))")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=devices.cpu_devices_env(os.environ,
                                                         devices.devices_of(assignment)),
                             timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        found += ast.literal_eval(res.stdout.strip().splitlines()[-1])
    assert found == []


def _as_exec_leaves_it(kernel):
    """``kernel`` as copying its source text and running it with ``exec`` leaves it: the same
    code, closure and globals, its debug info naming the notebook, not the course's file."""
    if isinstance(kernel, functools.partial):
        return functools.partial(_as_exec_leaves_it(kernel.func), *kernel.args,
                                 **kernel.keywords)
    copy = types.FunctionType(kernel.__code__.replace(co_filename="<notebook cell>"),
                              kernel.__globals__, kernel.__name__, kernel.__defaults__,
                              kernel.__closure__)
    copy.__kwdefaults__ = kernel.__kwdefaults__
    return copy


def _ref_ranks(body) -> tuple[int, ...]:
    return tuple(len(getattr(v.aval, "shape", ())) for v in calling.open_jaxpr(body).invars)


def _planted_on(task, fn, case, body_print: str) -> tuple[bool, bool] | None:
    """(whether the body ``fn`` runs on ``case`` is the shipped program whose fingerprint is
    ``body_print``, whether "kernels are your own" passes) for ``fn`` with its kernel planted;
    None where it does not trace (the check fails on it anyway)."""
    arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
    traced = calling.trace_case(task, fn, arrays, case.params)
    if traced.error is not None or traced.program is None:
        return None
    facts = verdict.work_from_dict(work.facts(traced.program))
    return (any(c.fingerprint == body_print for c in facts.calls),
            core.own_kernels(facts, task.id).ok)


def planted_copies(assignments) -> list[tuple[str, str, str, bool, bool]]:
    """(task, where the kernel ships, case, the planted body is a shipped one there, "kernels
    are your own" passed) for every case of every shipped kernel planted in the instructor
    solution of each task of ``assignments`` whose one ``pallas_call`` takes refs of the same
    ranks: that call runs the shipped kernel, re-created as ``exec`` leaves it, in place of its
    own. Pairs whose planted program does not trace on the first visible case (the kernel
    does not fit the task's blocks) are left out, as are a task's given bodies
    (``Task.given_body``)."""
    shipped_ones = [(where, kernel, _ref_ranks(body), fingerprint.fingerprint(body))
                    for where, kernel, body in collect_shipped.shipped_kernels(log=lambda _: None)
                    if kernel is not None]
    original, found = pl.pallas_call, []
    for assignment in assignments:
        for task_id, fn in gradertools.solutions(assignment).items():
            task = tasks.get(task_id)
            if not task.own_kernels:
                continue
            visible = next(c for c in task.cases if not c.hidden)
            arrays = [jnp.asarray(v) for v in task.inputs(visible).values()]
            bodies = calling.kernel_bodies(calling.trace_case(task, fn, arrays,
                                                              visible.params).program)
            if len(bodies) != 1:
                continue
            for where, kernel, ranks, body_print in shipped_ones:
                if ranks != _ref_ranks(bodies[0]) or body_print in shipped.allowed(task_id):
                    continue
                planted: list = []
                copy = _as_exec_leaves_it(kernel)

                def plant(_, *args, copy=copy, planted=planted, **kw):
                    planted.append(True)
                    return original(copy, *args, **kw)

                pl.pallas_call = plant
                try:
                    if _planted_on(task, fn, visible, body_print) is None or not planted:
                        continue  # it does not fit, or the solution makes no pallas_call
                    found += [(task_id, where, c.name, *seen) for c in task.cases
                              if (seen := _planted_on(task, fn, c, body_print)) is not None]
                finally:
                    pl.pallas_call = original
    return found


@pytest.mark.slow
def test_a_planted_copy_of_each_shipped_kernel_loses_its_task():
    """Every shipped kernel, at any size, planted in each task whose kernel it fits, fails
    "kernels are your own" on every case where it is the program the course ships (issue 52:
    the 4-equation body of lesson 3's ``tiled_add``, copied, kept 9/9), whatever its size. A
    body is the shipped program on the cases whose dtypes the course runs it with: a lesson's
    bfloat16 matmul planted in ``matmul`` fails its bfloat16 cases, visible and hidden."""
    here = [a for a in tasks.ASSIGNMENTS if devices.devices_of(a) <= jax.device_count()]
    found = planted_copies(here)
    copies = [f for f in found if f[3]]
    assert copies, "no shipped kernel fits any task: the planting is broken"
    kept = [f[:3] for f in copies if f[4]]
    assert kept == [], "\n".join(map(str, kept))
    print("planted bodies that are no shipped program on any case of the task (their "
          "values decide):", sorted({f[:2] for f in found if not f[3]} -
                                   {f[:2] for f in copies}))


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


def test_debug_body_printis_not_a_callback():
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
    assert collect_shipped.collect(log=lambda _: None) == \
        (shipped.known(), {t: sorted(shipped.allowed(t)) for t in tasks.BY_ID
                           if shipped.allowed(t)}), \
        "the shipped-kernel corpus is stale: run `python -m grader.tasks.collect_shipped`"
