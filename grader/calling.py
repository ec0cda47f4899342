"""How a check calls the learner's function, and the helpers the exercise notebooks import.

This is the part of the grader that the notebook's process of the grader's run
(``grader.jail.replay``, in the jail) needs: ``trace_case`` traces the learner's function on one
case's shapes through the task's ``invoke`` (named in the job, looked up in ``INVOKES``), and
the exercise notebooks' setup cells import ``traced_as_tpu``, ``absmax_scale`` and
``softmax_rows`` from here. It holds no case, reference output, rule or count: the tasks
(``grader.tasks``), their references, block searches and byte counts, the verdict and the
work facts stay outside the jail's view of ``grader/`` (``grader.jail.trusted.notebook_view``),
and a task names its ``invoke`` from here (``Task.invoke``).
"""

from __future__ import annotations

import functools
import numbers
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import errors as jax_errors
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as _pltriton  # noqa: F401 - see below
from jax.extend.core import jaxprs_in_params

import kernelsim
from grader import integrity
from kernelsim.backend import choose, gpu_interpret

# The pallas.triton import above loads JAX's Triton lowering with the grader's modules, not
# the first time a check lowers a kernel for a GPU (``lowered_for_gpu``).

# the course's own code, whose kernels (kernelsim's examples, the tasks' helpers) a submission
# may not hand in as its own, and which a prediction may not call
COURSE_CODE = tuple(
    os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir, d)) + os.sep
    for d in ("grader", "kernelsim", "lessons"))


# ----------------------------------------------------------------------------- tracing a case
# a function that only works eagerly (np.asarray of an argument, Python branching on values)
TRACING_ERRORS = (jax_errors.TracerArrayConversionError, jax_errors.ConcretizationTypeError,
                  jax_errors.TracerBoolConversionError, jax_errors.TracerIntegerConversionError)
TRACED = ("your function is traced once per case, as jax.jit traces it: compute on its array "
          "arguments with jax.numpy and pl.pallas_call (NumPy only on host inputs such as a "
          "block mask)")
# The learner's function is traced at JAX's default matmul precision, as it runs on their
# machine: a dot's precision is the kernel's own (a process-wide "highest" made every bfloat16
# dot of a kernel one that Mosaic refuses to compile, "Bad lhs type" on a TPU v5e). Which
# precisions a TPU gets right is a rule of the checker's (``grader.facts.work.dot_precisions``).


@dataclass
class Traced:
    """The learner's function traced on one case: the program and its traced arguments, or the
    error tracing raised (``error``)."""

    program: Any = None
    traced: list | None = None
    error: str | None = None


@dataclass(frozen=True)
class Call:
    """How a task calls the learner's function: its ``invoke`` (a name in ``INVOKES``; None:
    ``fn(*arrays, **params)``) and how many trailing inputs are host (NumPy) arrays. What the
    notebook's process knows of a task (``grader.tasks.Task.calling`` makes it)."""

    invoke: str | None = None
    host_inputs: int = 0

    def call(self, fn: Callable, arrays: list, params: dict) -> Any:
        if self.invoke is None:
            return fn(*arrays, **params)
        return INVOKES[self.invoke](fn, arrays, params)


def trace_case(task: Any, fn: Any, arrays: list, params: dict) -> Traced:
    """Trace ``fn`` once on the case into a program (``jax.make_jaxpr``), at JAX's default
    matmul precision: the only step that runs the learner's Python. ``task`` (a ``Call``
    or a ``grader.tasks.Task``) says how; its ``host_inputs`` trailing arrays reach the
    function as NumPy arrays (host planning); the others are traced."""
    split = len(arrays) - task.host_inputs
    traced, host = list(arrays[:split]), [np.asarray(a) for a in arrays[split:]]
    try:
        program = jax.make_jaxpr(lambda *a: task.call(fn, [*a, *host], params))(*traced)
    except TRACING_ERRORS as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Traced(error=f"{type(e).__name__}: {first} -- {TRACED}")
    except Exception as e:  # noqa: BLE001 - the learner's error is the verdict
        return Traced(error=f"{type(e).__name__}: {e}")
    return Traced(program, traced)


# ----------------------------------------------------------------------------- the invokes
# assignment 01: the learner's factory makes an elementwise kernel from one of these
OPS: dict[str, Callable] = {
    "mul": lambda a, b: a * b,
    "max": jnp.maximum,
    "axpy": lambda a, b: 2 * a + b,
    "sub": lambda a, b: a - b,
}


def elementwise(factory, arrays, params):
    return factory(OPS[params["op"]])(*arrays)


class CourseCodeCalled(Exception):
    """A prediction called the course's own code (the grader's byte counts, kernelsim)."""


@integrity.may_profile
def predict_unaided(fn, params: dict):
    """``fn(**params)``, watched: every Python function it calls, however deep, is checked
    against the course's own code (``grader/``, ``kernelsim/``, ``lessons/``), so that a
    prediction "from the sizes alone" cannot ask kernelsim or the grader for the answer. A
    prediction that removes the watch (``sys.setprofile``) is refused as well."""
    called: list[str] = []

    def watch(frame, event, arg):
        if event == "call" and len(called) < 3:
            path = os.path.realpath(frame.f_code.co_filename)
            if path.startswith(COURSE_CODE):
                called.append(f"{frame.f_code.co_qualname} ({os.path.basename(path)})")

    before = sys.getprofile()
    sys.setprofile(watch)
    try:
        predicted = fn(**params)
    finally:
        watched = sys.getprofile() is watch
        sys.setprofile(before)
    if called or not watched:
        raise CourseCodeCalled(
            "your prediction must be computed from the sizes by your own code; it called "
            + (", ".join(called) if called else "sys.setprofile (the grader watches what a "
               "prediction calls)") + ": count the bytes yourself, then compare with kernelsim "
            "in a cell of its own")
    return predicted


def prediction(fn, arrays, params):
    """Call the learner's predictor with the case's sizes (``predict_unaided``); a one-step
    kernel writes its answer out (so the answer is judged like any task's output: value
    against kernelsim's count)."""
    predicted = predict_unaided(fn, params)
    if isinstance(predicted, bool) or not isinstance(predicted, numbers.Integral):
        raise TypeError(f"return a Python int (a number of bytes), not "
                        f"{type(predicted).__name__}: compute it from the sizes, not with jnp")
    answer = int(predicted)

    def write_answer(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, answer, jnp.int32)

    return pl.pallas_call(write_answer, out_shape=jax.ShapeDtypeStruct((1, 1), jnp.int32),
                          interpret=choose().interpret)()


def with_host_last(fn, arrays, params):
    """Assignment 05: the last input (a block mask, group sizes) as a NumPy array, and the
    params without the private ones (``_density``)."""
    *traced, host = arrays
    p = {k: v for k, v in params.items() if not k.startswith("_")}
    return fn(*traced, np.asarray(host), **p)


# TPU interpret mode's race detector keeps a vector clock per core and shares the remaining
# entries among DMAs: each DMA draws one at random from [cores, vector_clock_size)
# (jax/_src/pallas/mosaic/interpret/shared_memory.py:918-940). At the default size, twice the
# cores, every DMA draws the same entry, which orders any two DMAs and hides a race between
# them (a copy into a buffer that another copy is still reading). With more entries such a
# race is missed only when both DMAs draw the same one (1 in RACE_CLOCK_SIZE - 1), never
# reported when there is none.
RACE_CLOCK_SIZE = 64


def with_race_detector(fn: Callable, arrays: list, params: dict) -> Any:
    """Call ``fn`` with ``interpret=`` TPU interpret mode and its race detector where kernels
    are interpreted; compiled (on a TPU) with the learner's own setting."""
    if choose(tpu_features=True).interpret is False:
        return fn(*arrays, **params)
    return fn(*arrays, **params, interpret=pltpu.InterpretParams(
        detect_races=True, vector_clock_size=RACE_CLOCK_SIZE))


# The TPU that emit_pipeline is traced for where there is none (kernelsim's default chip).
TRACED_TPU = jax.sharding.AbstractDevice("TPU v5e", 1, "tpu")


def absmax_scale(rows):
    """Each row of ``rows`` divided by its largest absolute value, in float32."""
    rows = rows.astype(jnp.float32)
    return rows / jnp.max(jnp.abs(rows), axis=1, keepdims=True)


def traced_as_tpu(fn):
    """``fn``, callable on a machine without a TPU when its kernels use ``pltpu.emit_pipeline``.

    emit_pipeline asks which TPU it targets while it is traced, for the tiling of its copies
    (``jax/_src/pallas/mosaic/pipeline.py:507`` reaches ``jax/_src/tpu_info.py:562``); on a
    CPU there is none. ``jax.sharding.use_abstract_mesh`` with a TPU device names one, as
    ``pltpu.InterpretParams``' docstring says for TPU interpret mode
    (``jax/_src/pallas/mosaic/interpret/params.py:167-172``). Under an abstract mesh a jitted
    computation needs its inputs on a concrete device
    (``jax/_src/interpreters/pxla.py:1049-1055``), so array arguments are put on this
    machine's first device. On a TPU, ``fn`` itself.
    """
    if jax.default_backend() == "tpu":
        return fn
    mesh = jax.sharding.AbstractMesh((1,), ("core",), abstract_device=TRACED_TPU)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        device = jax.devices()[0]
        args = [jax.device_put(a, device) if hasattr(a, "shape") else a for a in args]
        with jax.sharding.use_abstract_mesh(mesh):
            return fn(*args, **kwargs)

    return call


def pipeline(fn, arrays, params):
    """Assignments 08 and 12: through ``traced_as_tpu``, with the race detector."""
    return with_race_detector(traced_as_tpu(fn), arrays, params)


def vjp_rows_stacked(fn, arrays, params):
    """Assignments 10 and 07: every array but the last is a primal input of the learner's
    ``custom_vjp`` function, the last the cotangent of its output. The output and the
    gradients of the inputs, in order, their rows stacked into one array: ``(y, dx, dw)``
    for assignment 10's norm, ``(o, dq, dk, dv)`` for assignment 07's attention (see
    ``grader.tasks.a10_transformations`` and ``grader.tasks.a07_flash_attention``)."""
    *primals, cotangent = arrays
    y, pullback = jax.vjp(lambda *a: fn(*a, **params), *primals)
    # concatenate, not jnp.stack: the pinned release has a `stack` primitive, which
    # grader.facts.work does not count among the layout operations
    return jnp.concatenate([y, *pullback(cotangent)])


def rows_stacked(fn, arrays, params):
    """Assignment 07's backward: the arrays ``fn`` returns (``dq``, ``dk``, ``dv``, each with
    ``d`` columns) as one array, their rows stacked in order (see
    ``grader.tasks.a07_flash_attention``)."""
    # concatenate, not jnp.stack: as in vjp_rows_stacked, and the lengths may differ (Lq, Lk)
    return jnp.concatenate(fn(*arrays, **params))


def open_jaxpr(j: Any) -> Any:
    """The jaxpr with ``eqns`` (a closed jaxpr keeps it under ``.jaxpr``)."""
    return j if hasattr(j, "eqns") else j.jaxpr


class TritonLoweringRefused(Exception):
    """JAX's GPU lowering of ``pallas_call`` (Triton) refuses the learner's kernel."""


class InterpretIgnored(Exception):
    """The learner's function made an interpreted ``pallas_call`` when asked to compile."""


class Tf32OnGpu(Exception):
    """The learner's kernel multiplies float32 at a precision Triton computes in TF32."""


def eqns(program):
    """Every equation of ``program``, nested jaxprs (calls, loops, branches, kernel bodies)
    included, in program order: the one walk over nested jaxprs the grader's readers share."""
    for eqn in open_jaxpr(program).eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from eqns(sub)


# operations that move or reinterpret data without computing on it
LAYOUT = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "slice",
    "dynamic_slice", "concatenate", "stack", "pad", "convert_element_type", "copy", "copy_p",
    "device_put", "rev", "bitcast_convert_type", "optimization_barrier", "stop_gradient"})
# calls whose body is inlined: what flows in and out is the body's
TRANSPARENT = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                         "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint",
                         "custom_vmap_call"})
# the primitives that launch a kernel: ``pl.pallas_call``, and ``mpmd_map``, which
# ``plgpu.kernel`` (and ``pl.kernel``) bind
KERNEL_CALLS = frozenset({"pallas_call", "mpmd_map"})


def kernel_body(eqn: Any) -> Any:
    """The kernel body jaxpr of a ``KERNEL_CALLS`` equation (an ``mpmd_map`` has one per mesh;
    ``plgpu.kernel`` launches one)."""
    return eqn.params["jaxpr"] if eqn.primitive.name == "pallas_call" else \
        eqn.params["jaxprs"][0]


def kernel_bodies(program) -> list:
    """The body of every kernel ``program`` launches, nested ones included, in program order."""
    return [kernel_body(e) for e in eqns(program) if e.primitive.name in KERNEL_CALLS]


def _ieee_float32(precision) -> bool:
    """Whether the Triton lowering multiplies float32 at ``precision`` in IEEE float32: only
    at HIGHEST for both operands (or the F32_F32_F32 algorithm); DEFAULT and HIGH are TF32
    (jax/_src/pallas/triton/lowering.py, ``_TF32_PRECISIONS`` and the dot_general rule)."""
    return precision in ((lax.Precision.HIGHEST, lax.Precision.HIGHEST),
                         lax.DotAlgorithmPreset.F32_F32_F32)


def _tf32_dots(program) -> int:
    """How many float32 dot_generals inside the kernels of ``program`` a GPU computes in TF32."""
    kernels = [e.params["jaxpr"] for e in eqns(program) if e.primitive.name == "pallas_call"]
    return sum(1 for kernel in kernels for e in eqns(kernel)
               if e.primitive.name == "dot_general"
               and e.invars[0].aval.dtype == jnp.float32
               and not _ieee_float32(e.params["precision"]))


def lowered_for_gpu(fn, arrays, params):
    """``fn(*arrays, **params)``, after checking that ``fn`` with ``interpret=False`` passes
    JAX's Triton lowering of ``pallas_call``."""
    out = fn(*arrays, **params)
    compiled = functools.partial(fn, **params, interpret=False)
    program = jax.make_jaxpr(compiled)(*arrays)
    if any(e.params["interpret"] is not False for e in eqns(program)
           if e.primitive.name == "pallas_call"):
        raise InterpretIgnored(
            "called with interpret=False, your function still made an interpreted "
            "pallas_call: pass its interpret argument on to pl.pallas_call(interpret=...), so "
            "that the grader can lower your kernel for a GPU")
    if _tf32_dots(program):
        raise Tf32OnGpu(
            "your kernel multiplies float32 at the default precision, which the Triton "
            "lowering computes in TF32 (10 mantissa bits) on a GPU, far outside this task's "
            "tolerance: pass precision=jax.lax.Precision.HIGHEST to jnp.dot")
    error = kernelsim.gpu_lowering_error(compiled, *arrays, chip="h100")
    if error is not None:
        first = error.splitlines()[0][:400]
        if first.rstrip(": ") == "AssertionError":
            # pallas_call.py asserts that the compiler parameters' type has a GPU rule; TPU
            # parameters only get a clearer ValueError once a TPU lowering has loaded theirs
            first += ("(no GPU lowering rule for this pallas_call's compiler_params: "
                      "pltpu.CompilerParams and plgpu.CompilerParams have none)")
        raise TritonLoweringRefused(
            "JAX's GPU lowering of pallas_call (Triton, what a GPU compiles) refuses your "
            f"kernel: {first} (lesson 11 lists what it refuses)")
    return out


def softmax_rows(x):
    """Softmax along axis 1, in float32 (assignment 12's plain-JAX reference, shown in its
    notebook)."""
    return jax.nn.softmax(x.astype(jnp.float32), axis=1)


def mosaic_gpu_here(fn: Callable, arrays: list, params: dict) -> Any:
    """Assignment 15: ``fn(*arrays, **params, interpret=...)`` with the Mosaic GPU kernels
    compiled on a GPU and run in GPU interpret mode anywhere else (``plgpu.kernel``'s
    ``interpret``)."""
    return fn(*arrays, **params, interpret=gpu_interpret())


def dropout_draws(fn: Callable, arrays: list, params: dict) -> Any:
    """Assignment 07's dropout: ``fn(q, k, v, seed, **params)`` returns the attention output
    and the keep mask its kernel drew; called again with the case's other seed for a second
    mask. One float32 vector: the output, its mask and the other seed's mask, each flattened
    (the task's output rules take it apart). A second call with the same seed is not made: a
    JAX function of its inputs gives the same bits for the same seed by construction."""
    q, k, v, seed, other_seed = arrays
    out, keep = fn(q, k, v, seed, **params)
    _, keep_other = fn(q, k, v, other_seed, **params)
    return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in (out, keep, keep_other)])


# every invoke a task may name (``Task.invoke``), by the name the job carries
INVOKES: dict[str, Callable[[Callable, list, dict], Any]] = {
    f.__name__: f for f in (elementwise, prediction, with_host_last, with_race_detector,
                            pipeline, vjp_rows_stacked, rows_stacked, lowered_for_gpu,
                            mosaic_gpu_here, dropout_draws)}
