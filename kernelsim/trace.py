"""kernelsim's entry points: ``trace`` and ``run`` build a ``Trace`` (model -> schedule -> cost).

``trace`` traces the user's function to a jaxpr and finds every pallas_call in it; of the code
around the kernels it computes only what a schedule needs (scalar-prefetch values, dynamic grid
bounds, loop trip counts and branch predicates). Index maps are evaluated; a kernel body is
interpreted only as far as its DMAs (or, with ``record_access``, its ref accesses) need -- their
indices, sizes and predicates, never the block arithmetic. A value that depends on an *earlier
pallas_call's output* (a prefetch operand, a DMA size) is computed from zeros there; use ``run``
for those. ``pl.kernel`` / ``pl.core_map`` kernels are analysed as the pallas_call they run as
(one grid step per TensorCore). A kernel inside ``jax.shard_map`` is analysed once per device
of the mesh (``CallTrace.call.device``), its remote copies as body DMAs between devices. A
function that cannot be traced to a jaxpr (Python control flow on array values) is run op by
op instead, with each pallas_call replaced by zeros.
``run`` executes the function from the same jaxpr (the code between kernels compiled, each
kernel run as it asks or in interpret mode) and analyses each call as it is made; only a
function that cannot be traced to a jaxpr runs op by op under ``jax.disable_jit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelsim import adapter, backend, timing
from kernelsim.body import steps
from kernelsim.check import lowering
from kernelsim.chips import DEFAULT_CHIP, GPU_DEVICE_KIND, TPU_DEVICE_KIND, Chip, get_chip
from kernelsim.cost.estimate import compute
from kernelsim.cost.lint import lint
from kernelsim.cost.schedule import Model, build
from kernelsim.errors import TraceError
from kernelsim.find import call_model, calls, index_maps
from kernelsim.trace_data import CallTrace, TraceData
from kernelsim.views import report, viewer


@dataclass
class Trace(TraceData):
    """The pallas_calls one function reached, in program order, under one model and chip, with
    its views: a text summary, figures and the interactive viewer (``kernelsim/views/``)."""

    def summary(self, steps: int = 0) -> str:
        """A text table per call; with ``steps`` > 0 also its first and last ``steps`` steps."""
        return report.summary(self, steps)

    def __str__(self) -> str:
        return self.summary()

    # Views (kernelsim/views/): they are handed this Trace and draw it. matplotlib loads on the
    # first figure: a second that ``import kernelsim`` does not spend.

    def figure(self, step: int, call: int = 0, **kw: Any):
        """A matplotlib Figure of one grid step: HBM arrays, on-chip buffers, SMEM, grid."""
        from kernelsim.views import figure  # matplotlib: on the first figure

        return figure.step_figure(self, step, call, **kw)

    def heatmap(self, call: int = 0, counts: bool = True):
        """A Figure: per operand, how many times each block was copied."""
        from kernelsim.views import figure  # matplotlib: on the first figure

        return figure.heatmap(self, call, counts)

    def timeline(self, call: int = 0):
        """A Figure: bytes per step by operand, cumulative traffic and the roofline bar."""
        from kernelsim.views import figure  # matplotlib: on the first figure

        return figure.timeline(self, call)

    def access_figure(self, step: int, operand: str, call: int = 0):
        """A Figure: which elements of ``operand``'s block ``step`` read and wrote, in order."""
        from kernelsim.views import figure  # matplotlib: on the first figure

        return figure.access_figure(self, step, operand, call)

    def show(self, call: int = 0):
        """The interactive viewer of call ``call``: an anywidget in a notebook front end
        (model and chip switches recompute in the kernel), the standalone HTML viewer where
        nothing renders widgets (nbconvert, the site build). Steps count from 0."""
        return viewer.show(self, call)

    def to_html(self, path: Any = None, call: int = 0, fragment: bool = False,
                max_bytes: int = 1_000_000) -> str:
        """The standalone viewer (both models, every chip, data and module inline, no
        network); written to ``path`` if given, always returned. Above ``max_bytes`` it keeps
        an even sample of the steps and says "showing N of M steps".

        fragment: a ``<div>`` with its own inline module, to embed in another page.
        """
        return viewer.to_html(self, path, call, fragment, max_bytes)


def analyse(captured: list[adapter.Captured], model: Model, chip: Chip, strict: bool,
            record_access: bool = False) -> Trace:
    """Model, schedule, cost and lint every captured call."""
    traced = []
    for c in captured:
        call = call_model.to_model(c.args, c.params)
        call.device = c.device
        accesses = None
        if record_access or steps.needs_body_interpretation(c.params):
            accesses, call.body_copies = steps.interpret_body(c.params, call, c.args,
                                                             record=record_access)
        schedule = build(call, model)
        cost = compute(schedule, chip)
        warnings = call.notes + lint(call, schedule, cost, chip)
        if strict and warnings:
            raise TraceError(f"pallas_call {call.name!r}: " + " | ".join(warnings))
        traced.append(CallTrace(call, schedule, cost, warnings,
                                index_maps.prefetch_reads(c.params, call),
                                accesses if record_access else None))
    return Trace(model, chip, traced)


def resolve(model: str, chip: str | None) -> tuple[Model, Chip]:
    """The model name checked and the chip it names (its default when ``chip`` is None)."""
    if model not in ("tpu", "gpu"):
        raise TraceError(f"unknown model {model!r}: choose 'tpu' or 'gpu'")
    try:
        return model, get_chip(chip or DEFAULT_CHIP[model])  # type: ignore[return-value]
    except KeyError as e:
        raise TraceError(str(e.args[0])) from None


def _no_call(fn: Callable) -> TraceError:
    return TraceError(
        f"{getattr(fn, '__name__', fn)!r} reached no pallas_call: kernelsim analyses "
        "functions that call jax.experimental.pallas.pallas_call (directly or inside "
        "jit, vmap, scan, cond, custom_vjp or shard_map).")


def collect(fn: Callable, args: tuple, execute: Callable[[tuple, dict], Any],
            chip: Chip, mapped: calls.MappedRunner | None = None
            ) -> tuple[Any, list[adapter.Captured]]:
    """Run ``fn(*args)``; each pallas_call is modelled, then ``execute``d; a ``shard_map``
    around kernels runs whole, as ``mapped`` says (``calls.MappedRunner``).

    The function runs from its jaxpr (``calls.run_calls``: kernel bodies traced as the program
    traces them, the code between kernels compiled); only a function that cannot be traced to
    a jaxpr (Python control flow on array values) runs op by op under ``jax.disable_jit``.
    """
    try:
        out, captured = calls.run_calls(fn, args, TPU_DEVICE_KIND.get(chip.name, "TPU v5e"),
                                       execute, mapped)
    except calls.NeedsExecution:
        pass
    else:
        if not captured:
            raise _no_call(fn)
        return out, captured
    return _capture_eagerly(fn, args, execute)


def _capture_eagerly(fn: Callable, args: tuple, execute: Callable[[tuple, dict], Any]):
    """Run ``fn(*args)`` op by op; each pallas_call is modelled, then ``execute``d."""
    captured: list[adapter.Captured] = []

    def handler(call_args: tuple, params: dict) -> Any:
        captured.append(adapter.Captured(call_args, params))
        return execute(call_args, params)

    with adapter.capturing(handler):
        out = fn(*args)
    if not captured:
        raise _no_call(fn)
    return out, captured


def trace(fn: Callable, *args: Any, model: str = "tpu", chip: str | None = None,
          strict: bool = False, record_access: bool = False) -> Trace:
    """Analyse every pallas_call ``fn(*args)`` reaches, without running any kernel body.

    model: ``"tpu"`` (sequential grid, unchanged input blocks skipped) or ``"gpu"`` (one
        program per grid point, each loading its blocks; re-reads by programs running
        alongside come from L2, see ``kernelsim.cost.estimate``). chip: a name in
        ``kernelsim.chips.CHIPS``.
    strict: raise ``TraceError`` instead of collecting warnings.
    record_access: also interpret each kernel body at every grid step and record its ref
        reads and writes (``CallTrace.accesses``, see ``kernelsim.access``). Indices come from
        the real scalar-prefetch values and, where they read block data (an index stored in
        an SMEM block), from the real input blocks; the block arithmetic is not evaluated.
        Costs one interpretation of the body's index arithmetic per step.
    """
    model_, chip_ = resolve(model, chip)
    try:
        captured = calls.find_calls(fn, args, TPU_DEVICE_KIND.get(chip_.name, "TPU v5e"),
                                   bodies=record_access)
    except calls.NeedsExecution:
        _, captured = _capture_eagerly(fn, args, lambda a, p: calls.zeros_for(p))
    if not captured:
        raise _no_call(fn)
    return analyse(captured, model_, chip_, strict, record_access)


class _MappedWith(calls.MappedRunner):
    """Runs the kernels of a ``shard_map`` with the interpret setting ``run`` chose."""

    def __init__(self, setting: Callable[[dict], Any]) -> None:
        self.setting = setting

    def prepare(self, params: dict) -> dict:
        chosen = self.setting(params)
        return params if chosen is None else {**params, "interpret": chosen}


def run(fn: Callable, *args: Any, model: str = "tpu", chip: str | None = None,
        strict: bool = False, interpret: Any = "auto", measure: bool = False
        ) -> tuple[Any, Trace]:
    """Execute ``fn(*args)`` and analyse its pallas_calls; returns ``(outputs, trace)``.

    interpret: ``"auto"`` compiles on a TPU/GPU backend and interprets on the CPU (the TPU
        interpreter for kernels with manual DMAs or semaphores); ``None`` keeps each call's
        own setting; any other value replaces it (True, ``pltpu.InterpretParams()``, False).
    measure: also time every call compiled on the device, alone, on the arguments it ran with
        (``kernelsim.timing.measure_call``: the device time per call, from calls inside one
        jitted loop, with the per-call time of calls dispatched one by one beside it) and keep
        it beside the estimate (``CallTrace.measured``; the summary and the viewer show both).
        Without an accelerator each call's ``measured`` says that none is present.
    """
    model_, chip_ = resolve(model, chip)

    def setting(params: dict) -> Any:
        if interpret != "auto":
            return interpret
        own = call_model.requested_interpret(params)
        manual = call_model.uses_manual_dma(params)
        return own if own else backend.choose(tpu_features=manual).interpret

    def execute(call_args: tuple, params: dict) -> Any:
        return adapter.execute(call_args, params, setting(params))

    out, captured = collect(fn, args, execute, chip_, _MappedWith(setting))
    traced = analyse(captured, model_, chip_, strict)
    if measure:
        for c, ct in zip(captured, traced.calls, strict=True):
            ct.measured = _measure(c)
    return out, traced


def _measure(c: adapter.Captured) -> timing.Measurement:
    """A captured call timed compiled on the device, or why it is not."""
    if timing.accelerator() is None:
        return timing.no_accelerator()
    if c.device is not None:
        return timing.Measurement(None, None, "", timing.REPEATS, 0,
                                  "a kernel inside a shard_map runs with every device of its "
                                  "mesh; time the whole jitted function with "
                                  "kernelsim.timing.time_call")
    return timing.measure_call(c.args, c.params)


def abstract_tpu(chip: str = "tpu-v5e"):
    """A context manager under which code that asks which TPU it runs on (``emit_pipeline``,
    ``pltpu.get_tpu_info()``, ``pltpu.create_tensorcore_mesh`` without ``num_cores``) is told
    ``chip`` on any host, e.g. to run such a kernel in TPU interpret mode on a CPU. ``trace``,
    ``run`` and ``verify`` do this by themselves where tracing needs it."""
    if chip not in TPU_DEVICE_KIND:
        raise TraceError(f"unknown TPU {chip!r}: choose one of {', '.join(TPU_DEVICE_KIND)}")
    return adapter.on_abstract_tpu(TPU_DEVICE_KIND[chip])


def tpu_lowering_error(fn: Callable, *args: Any, chip: str = "tpu-v5e") -> str | None:
    """What JAX's TPU lowering says about ``fn(*args)`` for ``chip``: its error, or None.

    Runs the real Mosaic lowering on any machine (a CPU is enough; nothing executes), so block
    shapes, memory spaces and buffering modes the TPU compiler front end rejects show up here.
    """
    if chip not in TPU_DEVICE_KIND:
        raise TraceError(f"unknown TPU {chip!r}: choose one of {', '.join(TPU_DEVICE_KIND)}")
    return lowering.tpu_lowering_error(fn, args, TPU_DEVICE_KIND[chip])


def gpu_lowering_error(fn: Callable, *args: Any, chip: str = "h100") -> str | None:
    """What JAX's GPU lowering of ``pallas_call`` (Triton) says about ``fn(*args)``: its error,
    or None.

    Runs the real lowering on any machine (nothing executes), so what Triton's lowering rejects
    (block sizes that are not powers of two, scalar prefetch, TPU memory spaces) shows up here.
    """
    if chip not in GPU_DEVICE_KIND:
        raise TraceError(f"unknown GPU {chip!r}: choose one of {', '.join(GPU_DEVICE_KIND)}")
    return lowering.gpu_lowering_error(fn, args, GPU_DEVICE_KIND[chip])
