"""What the check of a performance task says about speed (issue 51, item 5).

On a TPU: the device time of the learner's kernel (``kernelsim.timing.time_call``: calls
inside one jitted loop) beside XLA's for the same computation, JAX's bundled Pallas kernel's
where there is one, and kernelsim's estimate for the chip it models. Without an accelerator:
kernelsim's estimate alone, said to be an estimate, and which chip it models.

The times are shown, never judged: a verdict comes from the trusted grader alone, and a
machine's clock is not part of it. ``report`` takes the timer and the accelerator probe as
arguments, so a CPU test can fake the chip at that seam.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from kernelsim import timing


def _xla_matmul_transposed(a, b):
    return jnp.dot(a, b.T, preferred_element_type=jnp.float32).astype(a.dtype)


def _xla_attention(q, k, v, causal: bool):
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) / q.shape[-1] ** 0.5
    if causal:
        rows, cols = jnp.arange(s.shape[0])[:, None], jnp.arange(s.shape[1])[None, :]
        s = jnp.where(cols <= rows, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(q.dtype)


def _bundled_attention(q, k, v, causal: bool):
    """JAX's bundled TPU flash attention (``jax.experimental.pallas.ops.tpu.flash_attention``)
    on one head, its blocks the largest power of two up to 512 that divides each length."""
    from jax.experimental.pallas.ops.tpu import flash_attention as bundled

    def block(n: int) -> int:
        b = 512
        while n % b:
            b //= 2
        return b

    bq, bk = block(q.shape[0]), block(k.shape[0])
    sizes = bundled.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1)
    out = bundled.flash_attention(q[None, None], k[None, None], v[None, None], causal=causal,
                                  sm_scale=1 / q.shape[-1] ** 0.5, block_sizes=sizes)
    return out[0, 0]


@dataclass(frozen=True)
class Baseline:
    """What a task's kernel is timed against: ``fn(*arrays)`` computes the task's output."""

    name: str
    fn: Callable


def _attention_baselines(causal: bool) -> tuple[Baseline, ...]:
    return (Baseline("XLA (jnp.dot and jax.nn.softmax)",
                     lambda q, k, v: _xla_attention(q, k, v, causal)),
            Baseline("JAX's bundled TPU flash attention",
                     lambda q, k, v: _bundled_attention(q, k, v, causal)))


# the performance tasks whose check shows the chip's time, and what each is timed against
SPEED_TASKS: dict[str, tuple[Baseline, ...]] = {
    "matmul_tuned": (Baseline("XLA's jnp.dot", _xla_matmul_transposed),),
    "flash_attention": _attention_baselines(False),
    "causal_flash_attention": _attention_baselines(True),
}


@dataclass(frozen=True)
class Timed:
    """One kernel's device time per call in seconds, or why it has none (``note``)."""

    name: str
    seconds: float | None
    note: str = ""


@dataclass(frozen=True)
class SpeedReport:
    """A performance task's speed as its check shows it.

    chip: the chip kernelsim's estimate models (its chip table's name, e.g. "tpu-v5e").
    estimate_s: kernelsim's estimate of the learner's kernel calls, seconds (None: no trace).
    device: the accelerator timed on (JAX's device kind), "" when there is none.
    timed: on an accelerator, the learner's kernel first, then each baseline; else empty.
    """

    task: str
    chip: str
    estimate_s: float | None
    device: str
    timed: tuple[Timed, ...] = ()

    def lines(self) -> list[str]:
        estimate = ("no kernelsim estimate (no pallas_call was traced)"
                    if self.estimate_s is None else
                    f"kernelsim's estimate on a {self.chip}: {_ms(self.estimate_s)}")
        if not self.device:
            return [f"{self.task}: speed: {estimate}. This is an estimate: no accelerator is "
                    f"present, so nothing was timed; run the check on a TPU to see the "
                    f"chip's device time beside XLA's."]
        out = [f"{self.task}: device time on this {self.device} (calls inside one jitted "
               f"loop, per call):"]
        mine = self.timed[0].seconds if self.timed else None
        for t in self.timed:
            if t.seconds is None:
                out.append(f"  {t.name:40} not timed: {t.note}")
            elif t is self.timed[0] or mine is None:
                out.append(f"  {t.name:40} {_ms(t.seconds)}")
            else:
                out.append(f"  {t.name:40} {_ms(t.seconds)}  (yours runs at "
                           f"{t.seconds / mine:.2f}x its speed)")
        out.append(f"  {estimate}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"chip": self.chip, "estimate_s": self.estimate_s, "device": self.device,
                "timed": [{"name": t.name, "seconds": t.seconds, "note": t.note}
                          for t in self.timed]}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def trace_estimate(trace: dict | None) -> tuple[str, float | None]:
    """(the chip kernelsim modelled, its estimate summed over the traced calls in seconds)
    from a trace's ``to_dict()``; None for the estimate when nothing was traced."""
    if not trace or not trace.get("calls"):
        return (trace or {}).get("chip", "tpu-v5e"), None
    return trace["chip"], sum(c["estimated_seconds"] for c in trace["calls"])


def report(task_id: str, fn: Callable, arrays: list, trace: dict | None,
           timer: Callable = timing.time_call,
           accelerator: Callable[[], str | None] = timing.accelerator) -> SpeedReport | None:
    """The speed of ``fn(*arrays)`` (the learner's kernel on one case, its parameters bound)
    for a task of ``SPEED_TASKS`` (None for any other task): timed with ``timer`` beside the
    task's baselines where ``accelerator()`` names one, else kernelsim's estimate only."""
    if task_id not in SPEED_TASKS:
        return None
    chip, estimate = trace_estimate(trace)
    device = accelerator() or ""
    if not device:
        return SpeedReport(task_id, chip, estimate, "")
    timed = []
    for name, f in (("your kernel", fn), *((b.name, b.fn) for b in SPEED_TASKS[task_id])):
        try:
            timed.append(Timed(name, timer(f, tuple(arrays)).device_s))
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run here is reported
            first_line = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            timed.append(Timed(name, None, f"{type(e).__name__}: {first_line}"))
    return SpeedReport(task_id, chip, estimate, device, tuple(timed))
