"""A performance task's check shows its speed (issue 51, item 5): on a CPU, kernelsim's estimate
named as one with the chip it models; on a TPU, the learner's device time beside XLA's and JAX's
bundled kernel's, and the estimate. The TPU path runs here with the timer and the accelerator
probe faked at ``grader.learner.speed.report``'s seam; the chip itself is bench/'s."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader.learner import check as pallas_course_check
from grader.learner import selfcheck, speed
from grader.tasks.a06_performance import best_blocks
from kernelsim.timing import CallTime


def matmul_tuned(a, b, vmem_budget):
    """A learner's a @ b.T (b stored (N, K)) in the blocks kernelsim finds fastest."""
    (m, k), n = a.shape, b.shape[0]
    _, (bm, bk, bn), _ = best_blocks(m, k, n, str(a.dtype), vmem_budget)

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jax.lax.dot_general(a_ref[...], b_ref[...], (((1,), (1,)), ((), ())),
                                            preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        interpret=jax.default_backend() != "tpu")(a, b)


def test_on_a_cpu_the_check_says_its_figure_is_an_estimate_and_names_the_chip(capsys):
    record: dict = {}
    selfcheck.check("matmul_tuned", matmul_tuned, False, False, record)
    out = capsys.readouterr().out
    assert record["passed"] and record["speed"]["device"] == ""
    assert record["speed"]["chip"] == "tpu-v5e" and record["speed"]["estimate_s"] > 0
    assert record["speed"]["timed"] == []
    (line,) = record["speed"]["lines"]
    assert "kernelsim's estimate on a tpu-v5e" in line and "This is an estimate" in line
    assert line in out
    # pallas-course check prints the same lines from the check's record
    assert pallas_course_check.speed_lines([{"task": "x"}, record]) == [line]


def fake_timer(times: dict):
    """A ``time_call`` that answers the device time each function was given, in order of the
    calls: the learner's kernel, then each baseline."""
    answers = iter(times)

    def timer(fn, args):
        assert all(isinstance(a, jax.Array) for a in args)
        name = next(answers)
        if times[name] is None:
            raise RuntimeError("Mosaic refused it\nsecond line")
        return CallTime(times[name], times[name] + 1.5e-4, 64)
    return timer


def test_on_a_tpu_the_check_shows_device_times_beside_xla_and_the_estimate(capsys, monkeypatch):
    times = {"your kernel": 2e-6, "XLA's jnp.dot": 3e-6}
    monkeypatch.setattr(speed, "report", functools.partial(
        speed.report, timer=fake_timer(times), accelerator=lambda: "TPU v5 lite"))
    record: dict = {}
    selfcheck.check("matmul_tuned", matmul_tuned, False, False, record)
    lines = record["speed"]["lines"]
    assert record["speed"]["device"] == "TPU v5 lite"
    assert [t["seconds"] for t in record["speed"]["timed"]] == [2e-6, 3e-6]
    assert "device time on this TPU v5 lite" in lines[0]
    assert "your kernel" in lines[1] and "0.0020 ms" in lines[1]
    assert "XLA's jnp.dot" in lines[2] and "0.0030 ms" in lines[2] and "1.50x" in lines[2]
    assert "kernelsim's estimate on a tpu-v5e" in lines[3]
    assert "\n".join(lines) in capsys.readouterr().out


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_is_timed_against_xla_and_the_bundled_kernel(causal):
    """Both baselines compute attention (checked against each other on the interpreter-free
    XLA path), and a baseline that cannot run is reported, not fatal."""
    task = "causal_flash_attention" if causal else "flash_attention"
    q, k, v = (jax.random.normal(jax.random.key(i), (128, 64), jnp.float32) for i in range(3))
    xla, bundled = speed.SPEED_TASKS[task]
    assert "XLA" in xla.name and "bundled" in bundled.name
    s = q @ k.T / 8
    if causal:
        s = jnp.where(jnp.tril(jnp.ones_like(s, bool)), s, -jnp.inf)
    expected = jax.nn.softmax(s, axis=-1) @ v
    assert jnp.allclose(xla.fn(q, k, v), expected, atol=1e-2)
    times = {"your kernel": 5e-6, xla.name: 4e-6, bundled.name: None}
    trace = {"chip": "tpu-v5e", "calls": [{"estimated_seconds": 4e-6},
                                          {"estimated_seconds": 2e-6}]}
    shown = speed.report(task, lambda q, k, v: q, [q, k, v], trace,
                         timer=fake_timer(times), accelerator=lambda: "TPU v5 lite")
    assert shown.estimate_s == pytest.approx(6e-6)
    assert "0.80x its speed" in shown.lines()[2]
    assert "not timed: RuntimeError: Mosaic refused it" in shown.lines()[3]


def test_other_tasks_show_no_speed():
    assert speed.report("layernorm", lambda x: x, [], None) is None
