"""``kernelsim.run(..., measure=True)``: the chip's time beside the estimate, per call.

The chip is not in CI: on the CPU, measuring says that no accelerator is present; the timing
itself (``timing.time_call``: device time from calls inside one jitted loop, shared with
bench/tpu_perf.py) and a call timed alone
(``timing.measure_call``) are checked interpreted; the summary and the viewer's data are
checked on a trace given a measured value."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

import kernelsim
from kernelsim import adapter, examples, timing
from kernelsim.find import calls
from kernelsim.views import viewer as v
from kernelsim.views.report import seconds

X = jnp.ones((256, 256), jnp.float32)


@pytest.fixture(scope="module")
def measured_trace():
    """A 2x2x2 matmul's trace, as a TPU would have timed it: 1.5 ms on a "TPU v5 lite"."""
    _, t = kernelsim.run(examples.matmul, X, X)
    t.calls[0].measured = timing.Measurement(1.5e-3, 1.6e-3, "TPU v5 lite", 10, 40)
    return t


def test_without_an_accelerator_measure_says_so_in_the_trace_and_summary():
    out, t = kernelsim.run(examples.matmul, X, X, measure=True)
    assert jnp.allclose(out, X @ X)
    (ct,) = t.calls
    assert ct.measured.seconds is None and ct.measured_over_estimated is None
    assert "no accelerator is present" in ct.measured.note
    assert ct.to_dict()["measured"]["note"] == ct.measured.note
    assert "not measured: no accelerator is present (JAX's backend is cpu)" in t.summary()
    shown = v.viewer_data(t)["calls"][0]["measured"]
    assert shown["seconds"] is None and "no accelerator" in shown["note"]


def test_not_asked_leaves_no_measurement():
    _, t = kernelsim.run(examples.matmul, X, X)
    assert t.calls[0].measured is None and "measured" not in t.summary()
    assert v.viewer_data(t)["calls"][0]["measured"] is None


def test_summary_shows_measured_beside_estimated(measured_trace):
    ct = measured_trace.calls[0]
    ratio = 1.5e-3 / ct.estimated_seconds
    assert ct.measured_over_estimated == pytest.approx(ratio)
    line = next(x for x in measured_trace.summary().splitlines() if x.startswith("measured"))
    estimate = seconds(ct.estimated_seconds)
    assert line == (f"measured 1.5 ms on TPU v5 lite · estimated {estimate} on tpu-v5e "
                    f"({ratio:.2f}x the estimate); device time, 40 calls in one jitted loop, "
                    "median of 10; dispatched one by one from Python 1.6 ms per call")
    assert ct.to_dict()["measured"]["seconds"] == 1.5e-3
    assert ct.to_dict()["measured_over_estimated"] == pytest.approx(ratio)


def test_viewer_data_carries_the_trace_s_numbers(measured_trace):
    shown = v.viewer_data(measured_trace)["calls"][0]["measured"]
    ct = measured_trace.calls[0]
    assert shown == {"seconds": 1.5e-3, "device": "TPU v5 lite", "note": "", "repeats": 10,
                     "loop_calls": 40, "dispatched_seconds": 1.6e-3,
                     "estimate_s": ct.estimated_seconds, "chip": "tpu-v5e",
                     "ratio": ct.measured_over_estimated}
    page = measured_trace.to_html()
    assert '"measured":{"seconds":0.0015' in page and "measuredLine" in page


def _while_body_text(compiled: str) -> str:
    """The text of the computation the compiled module's (one) while loop runs as its body."""
    body = re.search(r"while\(.*body=%?([\w.\-]+)", compiled).group(1)
    start = re.search(rf"^%?{re.escape(body)} .*{{$", compiled, re.M).start()
    return compiled[start:compiled.index("\n}", start)]


def _tanh_of_product(a, b):
    return jnp.tanh(a @ b)


def test_the_loop_keeps_every_call_inside_it():
    """XLA hoists a call whose arguments do not change out of a plain fori_loop (the control
    here); ``looped``'s barrier keeps the call in the loop's body, so k calls cost k calls."""
    def plain(count, a, b):
        return jax.lax.fori_loop(0, count, lambda i, c: _tanh_of_product(a, b), jnp.zeros_like(a))

    hoisted = jax.jit(plain).lower(3, X, X).compile().as_text()
    assert "tanh" not in _while_body_text(hoisted)
    kept = timing.looped(_tanh_of_product).lower(3, X, X).compile().as_text()
    assert "tanh" in _while_body_text(kept)


def test_the_loop_runs_the_call_count_times_and_returns_its_result():
    runs = []

    def fn(x):
        jax.debug.callback(lambda: runs.append(1))
        return x + 1

    out = timing.looped(fn)(7, jnp.ones(4))
    jax.effects_barrier()
    assert len(runs) == 7 and jnp.array_equal(out, jnp.full(4, 2.0))


def test_time_call_gives_device_time_and_dispatched_time_apart():
    timed = timing.time_call(_tanh_of_product, (X, X), repeats=2)
    assert timed.device_s > 0 and timed.dispatched_s > 0
    assert timing.MIN_LOOP_CALLS <= timed.loop_calls <= timing.MAX_LOOP_CALLS


def test_a_call_timed_alone_runs_its_own_kernel():
    """``measure_call``'s mechanism (the captured call jitted alone), interpreted here; on a
    TPU ``run`` passes interpret=False."""
    _, (captured,) = calls.run_calls(examples.matmul, (X, X), "TPU v5e",
                                    lambda a, p: adapter.execute(a, p, True))
    m = timing.measure_call(captured.args, captured.params, interpret=True, repeats=1)
    assert m.seconds > 0 and m.note == "" and m.device == jax.devices()[0].device_kind


def test_a_call_that_fails_alone_is_a_note_not_an_exception():
    _, (captured,) = calls.run_calls(examples.matmul, (X, X), "TPU v5e",
                                    lambda a, p: adapter.execute(a, p, True))
    m = timing.measure_call(captured.args[:1], captured.params, interpret=True, repeats=1)
    assert m.seconds is None and m.note.startswith("compiling it alone failed")


def test_measurement_fields_are_the_dict_keys():
    m = timing.Measurement(1.0, 2.0, "d", 1, 1)
    assert set(m.to_dict()) == {f.name for f in dataclasses.fields(m)}
