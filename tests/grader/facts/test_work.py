"""The kernel must do the work (issue 14, class 2), judged in one process (``course.check``).

Each cheat gets the values right for task ``add`` (or ``matmul``) but leaves the work outside
the kernel, feeds it decoys, splits it over several kernels or only behaves while traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from grader import calling
from grader.facts import fingerprint
from grader.learner import course, selfcheck


def _call(kernel, x, *operands):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=True)(*operands)


def _copy(s_ref, o_ref):
    o_ref[...] = s_ref[...]


def _add(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def honest(x, y):
    return _call(_add, x, x, y)


def sum_outside(x, y):  # the kernel only copies what jnp computed
    return _call(_copy, x, x + y)


def math_after(x, y):  # the kernel passes x through; the addition happens after it
    return _call(_copy, x, x) + y


def decoy(x, y):  # the kernel is fed y and ignores it; the sum comes from outside
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...]
    return _call(kernel, x, x, y) + y


def constant_operand(x, y):  # a zeros decoy instead of an input
    return _call(_add, x, jnp.zeros_like(x), x + y)


def two_kernels(x, y):  # every pallas_call is judged, not only the first
    return _call(_copy, x, _call(_add, x, x, y))


def no_add_in_kernel(x, y):  # right values without the task's operation in the kernel
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] - (-y_ref[...])
    return _call(kernel, x, x, y)


def honest_only_when_traced(x, y):  # a kernel for kernelsim, plain jnp otherwise
    if jax.config.jax_disable_jit:
        return honest(x, y)
    return x + y


def test_honest_kernel_passes(capsys):
    course.check("add", honest)
    assert capsys.readouterr().out.startswith("add: 1 visible case(s) passed and all ")
    record: dict = {}  # the rules that held, as `pallas-course check --verbose` lists them
    selfcheck.check("add", honest, hidden=False, quiet=True, record=record)
    held = [r for r in record["rules"] if r.startswith("[ok")]
    for rule in ("result comes from the kernel", "kernel inputs are your function's inputs",
                 "compute outside kernels", "kernel computes add", "every kernel input is read",
                 "kernels are your own"):
        assert any(r.split("] ", 1)[1].startswith(f"{rule}:") for r in held), rule


@pytest.mark.parametrize("fn, found", [
    (sum_outside, "operand 0 of pallas_call #0: computed outside the kernel by add"),
    (math_after, "result comes from the kernel: required the pallas_call's output (at most "
                 "layout ops after it); found computed outside the kernel by add"),
    (decoy, "input 1 of pallas_call #0 is never read"),
    (constant_operand, "operand 0 of pallas_call #0: a constant"),
    (two_kernels, "pallas_call reached: required exactly 1"),
    (no_add_in_kernel, "[FAIL] kernel computes add"),
    (honest_only_when_traced, "never calls pl.pallas_call"),
])
def test_work_outside_the_kernel_fails_and_says_what_was_found(fn, found):
    with pytest.raises(course.CheckFailed) as e:
        course.check("add", fn)
    assert found in str(e.value), str(e.value)


def test_outside_flops_are_counted_against_the_task():
    def matmul_outside(a, b, bm, bk, bn):
        product = jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
        return _call(_copy, product, product)

    with pytest.raises(course.CheckFailed, match=r"compute outside kernels: required <= "
                       r"[\d,]+ FLOPs \(1/10 of the task's\); found [\d,]+ FLOPs "
                       r"\(dot_general\)"):
        course.check("matmul", matmul_outside)


def test_a_kernel_the_course_ships_is_not_the_learners():
    from kernelsim import examples  # kernelsim's own tiled add: right values, right grid

    with pytest.raises(course.CheckFailed) as e:
        course.check("tiled_add", lambda x, y, block: examples.add(x, y, block, interpret=True))
    assert "[FAIL] kernels are your own: required kernel bodies written in your notebook; " \
           "found pallas_call #0 runs a kernel of the course's own code" in str(e.value), \
        str(e.value)


def _body(kernel, *shapes):
    args = [jnp.zeros(s) for s in shapes]
    (body,) = calling.kernel_bodies(jax.make_jaxpr(lambda *a: _call(kernel, a[0], *a))(*args))
    return body


def test_a_fingerprint_is_the_body_up_to_renaming_and_numbers():

    def scaled(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...] * 2.0) + y_ref[...]

    def renamed(a, b, out):  # other names, another constant, another shape
        t = a[...] * 3.0
        out[...] = jnp.exp(t) + b[...]

    def other_op(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...] * 2.0) - y_ref[...]

    same = fingerprint.fingerprint(_body(scaled, (8, 128), (8, 128)))
    assert fingerprint.fingerprint(_body(renamed, (16, 256), (16, 256))) == same
    assert fingerprint.fingerprint(_body(other_op, (8, 128), (8, 128))) != same


def test_a_fingerprint_keeps_which_axes_a_body_contracts_and_reduces():
    """Issue 36: erasing every digit of the parameters made ``a @ b.T`` lesson 5's ``a @ b``
    (a dot's dimension numbers are axes, not sizes), and a sum over rows one over columns."""

    def product(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...])

    def product_with_b_transposed(a_ref, b_ref, o_ref):
        o_ref[...] = jax.lax.dot_general(a_ref[...], b_ref[...], (((1,), (1,)), ((), ())))

    def row_sums(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.sum(y_ref[...], axis=0, keepdims=True)

    def column_sums(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.sum(y_ref[...], axis=1, keepdims=True)

    square = ((128, 128), (128, 128))
    assert fingerprint.fingerprint(_body(product, *square)) != \
        fingerprint.fingerprint(_body(product_with_b_transposed, *square))
    assert fingerprint.fingerprint(_body(row_sums, *square)) != \
        fingerprint.fingerprint(_body(column_sums, *square))
    # sizes still do not count: the same contraction on other shapes is the same body
    assert fingerprint.fingerprint(_body(product_with_b_transposed, *square)) == \
        fingerprint.fingerprint(_body(product_with_b_transposed, (256, 256), (256, 256)))


def test_the_work_facts_name_host_callbacks_and_floating_prefetch():
    from grader.facts import work

    def add(x, y):
        s = jax.pure_callback(lambda a, b: a + b, jax.ShapeDtypeStruct(x.shape, x.dtype), x, y)
        return _call(_add, x, s, y)

    facts = work.facts(jax.make_jaxpr(add)(jnp.zeros((8, 128)), jnp.zeros((8, 128))))
    assert facts["callbacks"] == ["pure_callback"]
    assert facts["calls"][0]["operands"][0]["floating"] is True
    assert facts["calls"][0]["dma"] is None


def test_the_work_facts_say_where_a_body_reads_its_refs():
    """``branch_only_reads``: inputs read only inside a ``pl.when`` (nested in a loop or not);
    a read in a loop's body or a ``run_scoped`` is a read at every step. ``outputs_read``: an
    output summed into. ``scratch``: each scratch ref's dtype and shape, read or not."""
    from jax.experimental.pallas import tpu as pltpu

    from grader.facts import work

    def kernel(when_ref, looped_ref, scoped_ref, either_ref, o_ref, acc_ref, unused_ref):
        def step(i, carry):
            @pl.when(i == 1)
            def _():
                acc_ref[...] += when_ref[...]

            return carry + looped_ref[...]

        def scoped(tmp_ref):
            tmp_ref[...] = scoped_ref[...]
            acc_ref[...] += tmp_ref[...]

        pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32))

        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] += either_ref[...]

        # a bound known only at run time: a while loop
        o_ref[...] += jax.lax.fori_loop(0, pl.program_id(0) + 2, step, either_ref[...]) + \
            acc_ref[...]

    def fn(*xs):
        return pl.pallas_call(
            kernel, grid=(2,), out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.VMEM((4, 128), jnp.int32)],
            interpret=True)(*xs)

    x = jnp.zeros((8, 128), jnp.float32)
    (call,) = work.facts(jax.make_jaxpr(fn)(x, x, x, x))["calls"]
    assert call["branch_only_reads"] == [0]  # either_ref is read outside its pl.when too
    assert call["outputs_read"] == [0]
    assert call["scratch"] == [{"dtype": "float32", "shape": [8, 128], "read": True},
                               {"dtype": "int32", "shape": [4, 128], "read": False}]
    assert call["dot_types"] == []
