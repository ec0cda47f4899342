"""The chip's device time of a call: the project's one timing method.

A kernel's time is what the device spends on it, not what Python spends asking for it. So
``device_time`` runs the call many times inside ONE jitted ``fori_loop`` and divides: each
iteration's arguments pass through ``lax.optimization_barrier`` together with the previous
iteration's result, a data dependence XLA cannot see through, so it can neither hoist the
loop-invariant call out of the loop nor merge the calls into one. A loop of ``2 k`` calls
minus a loop of ``k`` calls, divided by ``k``, cancels the one dispatch and sync both loops pay;
the median of ``repeats`` such differences is kept. ``k`` is chosen so that ``k`` calls take
about ``TARGET_LOOP_S``.

Beside it, ``dispatched_time`` is what a Python loop of separately dispatched calls costs per
call: the device time plus the host's dispatch of a separately jitted call (about 0.12-0.17 ms
on the TPU v5e, ``bench/README.md``), which hides any kernel shorter than that. It is reported,
named for what it is, never used to rank kernels.

``kernelsim.run(..., measure=True)`` and ``kernelsim --measure`` time each captured
pallas_call with ``measure_call``; the bench scripts and lesson 7's timing cell call
``time_call``. Where no accelerator is
present the ``Measurement`` says so instead of a time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernelsim import adapter

REPEATS = 10           # differences of two loops timed; the median is kept
DISPATCHED_CALLS = 5   # calls dispatched one by one from Python per round of dispatched_time
TARGET_LOOP_S = 0.02   # seconds one loop of k calls should take (k is chosen for it)
MIN_LOOP_CALLS = 4     # k at least this, however long one call is
MAX_LOOP_CALLS = 4096  # and at most this, however short


class CallTime(NamedTuple):
    """One call's time, seconds per call.

    device_s: the device's time (``device_time``: calls inside one jitted loop).
    dispatched_s: per call when each call is dispatched separately from Python and the last
        one synced (``dispatched_time``): device time plus the host's dispatch.
    loop_calls: k, the calls in the shorter of the two loops ``device_time`` subtracts.
    """

    device_s: float
    dispatched_s: float
    loop_calls: int


@dataclass(frozen=True)
class Measurement:
    """One call timed on the device, or why it was not.

    seconds: the device time per call (``device_time``); None when not timed.
    dispatched_seconds: per call when dispatched one by one from Python (device time plus host
        dispatch, ``dispatched_time``); None when not timed.
    device: what was timed on (JAX's ``device_kind``, e.g. "TPU v5 lite"), "" when nothing was.
    repeats: the loop differences whose median ``seconds`` is.
    loop_calls: k, the calls in the shorter loop of each difference (0 when not timed).
    note: why there is no time (no accelerator, a kernel inside a ``shard_map``, the compiler's
        refusal), a sentence that follows "not measured: "; "" when timed.
    """

    seconds: float | None
    dispatched_seconds: float | None
    device: str
    repeats: int
    loop_calls: int
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "dispatched_seconds": self.dispatched_seconds,
                "device": self.device, "repeats": self.repeats,
                "loop_calls": self.loop_calls, "note": self.note}


def looped(fn: Callable) -> Callable:
    """``fn`` called ``count`` times inside one jitted loop, ``run(count, *args)``; returns the
    last call's result. Each iteration's arguments and the previous result go through one
    ``optimization_barrier``, so XLA must run every call (no hoisting, no merging)."""

    def run(count, *args):
        shapes = jax.eval_shape(fn, *args)
        first = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def body(_, carry):
            operands, _ = carry
            return jax.lax.optimization_barrier((operands, fn(*operands)))

        return jax.lax.fori_loop(0, count, body, (args, first))[1]

    return jax.jit(run)


def _loop_seconds(run: Callable, count: int, args: tuple) -> float:
    start = time.perf_counter()
    jax.block_until_ready(run(count, *args))
    return time.perf_counter() - start


def device_time(fn: Callable, args: tuple, repeats: int = REPEATS) -> tuple[float, int]:
    """(device seconds per call of ``fn(*args)``, k): the median over ``repeats`` of (a loop of
    2 k calls - a loop of k calls) / k, after a warm-up that compiles the loop and picks k."""
    run = looped(fn)
    count = MIN_LOOP_CALLS
    for _ in range(2):  # warm-up and calibration: the second pass sees the first's k
        per_call = _loop_seconds(run, count, args) / count
        count = min(MAX_LOOP_CALLS, max(MIN_LOOP_CALLS, math.ceil(TARGET_LOOP_S / per_call)))
    differences = []
    for _ in range(repeats):
        short = _loop_seconds(run, count, args)
        long = _loop_seconds(run, 2 * count, args)
        differences.append((long - short) / count)
    # a difference can come out at or below 0 only when noise swamps a tiny kernel
    return max(statistics.median(differences), 1e-9), count


def dispatched_time(fn: Callable, args: tuple, repeats: int = REPEATS,
                    calls: int = DISPATCHED_CALLS) -> float:
    """Seconds per call of ``calls`` calls dispatched one by one from Python, then synced:
    device time plus the host's dispatch of each separately jitted call; median of
    ``repeats`` rounds, after a warm-up."""
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = jitted(*args)
        jax.block_until_ready(out)
        rounds.append((time.perf_counter() - start) / calls)
    return statistics.median(rounds)


def time_call(fn: Callable, args: tuple, repeats: int = REPEATS) -> CallTime:
    """``fn(*args)``'s device time (``device_time``) and, beside it, its dispatched time."""
    device_s, loop_calls = device_time(fn, args, repeats)
    return CallTime(device_s, dispatched_time(fn, args, repeats), loop_calls)


def accelerator() -> str | None:
    """The device kind of JAX's default backend when it is a TPU or GPU, else None."""
    if jax.default_backend() not in ("tpu", "gpu"):
        return None
    return jax.devices()[0].device_kind


def no_accelerator(repeats: int = REPEATS) -> Measurement:
    """What ``measure=True`` records where JAX has no TPU or GPU."""
    return Measurement(None, None, "", repeats, 0,
                       f"no accelerator is present (JAX's backend is "
                       f"{jax.default_backend()}); run on a TPU to time the kernel")


def measure_call(args: tuple, params: dict[str, Any], interpret: Any = False,
                 repeats: int = REPEATS) -> Measurement:
    """Time one captured kernel call (its arguments and pallas_call params) compiled alone
    with ``time_call``. ``interpret``: the setting it runs with (False: compiled for the
    device; True runs the interpreter, which times the host, not a chip). A call the
    compiler refuses is a Measurement whose note is the compiler's first line."""
    device = jax.devices()[0].device_kind
    try:
        timed = time_call(lambda *a: adapter.execute(a, params, interpret), args, repeats)
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the call's result
        first = " / ".join(str(e).splitlines()[:2])[:300]
        return Measurement(None, None, device, repeats, 0,
                           f"compiling it alone failed ({type(e).__name__}: {first})")
    return Measurement(timed.device_s, timed.dispatched_s, device, repeats, timed.loop_calls)
