"""The chip's time of a compiled call, measured the way ``bench/tpu_perf.py`` records it.

``time_call`` is the one timing method of the project: a warm-up call (compilation), then
``repeats`` rounds of ``inner`` calls issued back to back and synced once (per call: the
kernel without Python's dispatch) and of one synced call (dispatch included); the medians, in
seconds. ``kernelsim.run(..., measure=True)`` times each captured pallas_call with it
(``measure_call``) and keeps the result on the call's trace (``CallTrace.measured``); where
no accelerator is present the ``Measurement`` says so instead of a time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from kernelsim import adapter

REPEATS = 10  # rounds timed; the median is kept
INNER = 5     # calls issued back to back per round


@dataclass(frozen=True)
class Measurement:
    """One call timed on the device, or why it was not.

    seconds: median over ``repeats`` rounds of ``inner`` calls issued back to back and then
        synced, per call (the kernel without Python's dispatch); None when not timed.
    synced_seconds: median of single calls each synced (dispatch included); None when not
        timed.
    device: what was timed on (JAX's ``device_kind``, e.g. "TPU v5 lite"), "" when nothing was.
    note: why there is no time (no accelerator, a kernel inside a ``shard_map``, the compiler's
        refusal), a sentence that follows "not measured: "; "" when timed.
    """

    seconds: float | None
    synced_seconds: float | None
    device: str
    repeats: int
    inner: int
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "synced_seconds": self.synced_seconds,
                "device": self.device, "repeats": self.repeats, "inner": self.inner,
                "note": self.note}


def time_call(fn: Callable, args: tuple, repeats: int = REPEATS,
              inner: int = INNER) -> tuple[float, float]:
    """(back-to-back seconds per call, synced seconds per call), medians, after a warm-up."""
    jax.block_until_ready(fn(*args))
    back_to_back, synced = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = None
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        back_to_back.append((time.perf_counter() - start) / inner)
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        synced.append(time.perf_counter() - start)
    return statistics.median(back_to_back), statistics.median(synced)


def accelerator() -> str | None:
    """The device kind of JAX's default backend when it is a TPU or GPU, else None."""
    if jax.default_backend() not in ("tpu", "gpu"):
        return None
    return jax.devices()[0].device_kind


def no_accelerator(repeats: int = REPEATS, inner: int = INNER) -> Measurement:
    """What ``measure=True`` records where JAX has no TPU or GPU."""
    return Measurement(None, None, "", repeats, inner,
                       f"no accelerator is present (JAX's backend is "
                       f"{jax.default_backend()}); run on a TPU to time the kernel")


def measure_call(args: tuple, params: dict[str, Any], interpret: Any = False,
                 repeats: int = REPEATS, inner: int = INNER) -> Measurement:
    """Time one captured kernel call (its arguments and pallas_call params) compiled alone
    with ``time_call``. ``interpret``: the setting it runs with (False: compiled for the
    device; True runs the interpreter, which times the host, not a chip). A call the
    compiler refuses is a Measurement whose note is the compiler's first line."""
    device = jax.devices()[0].device_kind
    fn = jax.jit(lambda *a: adapter.execute(a, params, interpret))
    try:
        seconds, synced = time_call(fn, args, repeats, inner)
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the call's result
        first = " / ".join(str(e).splitlines()[:2])[:300]
        return Measurement(None, None, device, repeats, inner,
                           f"compiling it alone failed ({type(e).__name__}: "
                           f"{first})")
    return Measurement(seconds, synced, device, repeats, inner)
