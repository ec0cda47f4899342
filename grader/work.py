"""Does the kernel do the work? Facts about a learner's function, read from its jaxpr.

``run_case`` traces the learner's function once (``jax.make_jaxpr``), executes that very
program for the values and kernelsim's trace, and hands the program here. ``facts`` follows the
data through it:

- where each output comes from: a ``pallas_call``, or a computation outside any kernel, an
  input or a constant (layout operations -- reshape, transpose, slice, pad, casts -- pass the
  origin through; anything else is a computation);
- where each operand of each ``pallas_call`` comes from, the same way (a decoy ``zeros`` is a
  constant; ``x * 2`` fed in is a computation outside the kernel);
- the FLOPs computed outside kernels;
- per ``pallas_call``: the primitives its kernel uses (nested loops and branches included),
  which of its inputs the kernel body never touches, and where its kernel body was defined:
  in the course's own code (``grader/``, ``kernelsim/``: a shipped example or reference
  kernel) or not.

The grader judges these (``grader.verdict`` with ``grader.tasks`` rules); nothing here imports
``jax._src``: only a jaxpr's public attributes (``eqns``, ``invars``, ``params``) are read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from jax import errors as jax_errors
from jax.extend.core import Literal, jaxprs_in_params

# operations that move or reinterpret data without computing on it
LAYOUT = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "slice",
    "dynamic_slice", "concatenate", "stack", "pad", "convert_element_type", "copy", "copy_p",
    "device_put", "rev", "bitcast_convert_type", "optimization_barrier", "stop_gradient"})
# calls whose body is inlined: what flows in and out is the body's
TRANSPARENT = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                         "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint"})
# precedence when several origins meet in one layout operation (pad(kernel out, 0.0): kernel)
_RANK = {"computed": 3, "kernel": 2, "input": 1, "constant": 0}
# the course's own code, whose kernels (kernelsim's examples, the tasks' helpers) a submission
# may not hand in as its own
COURSE_CODE = tuple(os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir, d))
                    + os.sep for d in ("grader", "kernelsim"))


@dataclass(frozen=True)
class Origin:
    """Where a value comes from: ``kind`` in computed/kernel/input/constant; ``by`` the
    primitive that computed it (computed) or the number of the pallas_call (kernel)."""

    kind: str
    by: str = ""

    def __str__(self) -> str:
        if self.kind == "computed":
            return f"computed outside the kernel by {self.by}"
        if self.kind == "kernel":
            return f"pallas_call #{self.by}"
        return {"input": "the function's inputs", "constant": "a constant"}[self.kind]


CONSTANT = Origin("constant")


def _open(j: Any) -> Any:
    """The jaxpr with ``eqns`` (a closed jaxpr keeps it under ``.jaxpr``)."""
    return j if hasattr(j, "eqns") else j.jaxpr


def _elements(v: Any) -> int:
    return math.prod(getattr(getattr(v, "aval", None), "shape", ()) or (1,))


def eqn_flops(eqn: Any) -> int:
    """FLOPs of one computing equation: a matmul 2 x out x K, a reduction one per input
    element, anything else one per output element."""
    name = eqn.primitive.name
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(eqn.invars[0].aval.shape[a] for a in lhs_contract)
        return 2 * _elements(eqn.outvars[0]) * k
    if name.startswith(("reduce_", "arg", "cum")):
        return _elements(eqn.invars[0])
    return sum(_elements(v) for v in eqn.outvars)


def primitives(jaxpr: Any) -> set[str]:
    """Every primitive name in ``jaxpr``, nested jaxprs included."""
    out: set[str] = set()
    for eqn in _open(jaxpr).eqns:
        out.add(eqn.primitive.name)
        for sub in jaxprs_in_params(eqn.params):
            out |= primitives(sub)
    return out


def _used(jaxpr: Any) -> set[int]:
    """ids of the variables some equation of ``jaxpr`` reads (nested jaxprs take theirs as
    operands, so the top level sees every use)."""
    j = _open(jaxpr)
    return {id(v) for eqn in j.eqns for v in eqn.invars if not isinstance(v, Literal)} | \
        {id(v) for v in j.outvars if not isinstance(v, Literal)}


def kernel_file(kernel: Any) -> str:
    """The file a kernel body was defined in, from its jaxpr's debug info ("name at file:line";
    '' when it names none)."""
    where = (getattr(_open(kernel).debug_info, "func_src_info", None) or "").rpartition(" at ")[2]
    return where.rpartition(":")[0]


def _call_facts(eqn: Any, number: int, operand_origins: list[Origin]) -> dict:
    gm = eqn.params["grid_mapping"]
    n_idx, n_in = int(gm.num_index_operands), int(gm.num_inputs)
    kernel = eqn.params["jaxpr"]
    used = _used(kernel)
    refs = _open(kernel).invars
    source = kernel_file(kernel)
    return {"number": number,
            "course_kernel": bool(source) and os.path.realpath(source).startswith(COURSE_CODE),
            "primitives": sorted(primitives(kernel)),
            "operands": [{"role": "scalar_prefetch" if i < n_idx else "input",
                          "from": str(o), "kind": o.kind}
                         for i, o in enumerate(operand_origins[:n_idx + n_in])],
            "unread": [i - n_idx for i in range(n_idx, n_idx + n_in)
                       if i < len(refs) and id(refs[i]) not in used]}


class _Walk:
    def __init__(self):
        self.calls: list[dict] = []
        self.outside_flops = 0
        self.outside_ops: set[str] = set()

    def run(self, jaxpr: Any, origins: list[Origin], reps: int = 1) -> list[Origin]:
        j = _open(jaxpr)
        env: dict[int, Origin] = {id(v): o for v, o in zip(j.invars, origins, strict=True)}
        for v in getattr(j, "constvars", ()):
            env[id(v)] = CONSTANT

        def origin(v) -> Origin:
            return CONSTANT if isinstance(v, Literal) else env.get(id(v), CONSTANT)

        for eqn in j.eqns:
            name = eqn.primitive.name
            ins = [origin(v) for v in eqn.invars]
            subs = list(jaxprs_in_params(eqn.params))
            if name == "pallas_call":
                number = len(self.calls)
                self.calls.append(_call_facts(eqn, number, ins))
                outs = [Origin("kernel", str(number))] * len(eqn.outvars)
            elif name in TRANSPARENT and len(subs) == 1 and \
                    len(_open(subs[0]).invars) == len(ins):
                outs = self.run(subs[0], ins, reps)
            elif name in LAYOUT:
                merged = max(ins, key=lambda o: _RANK[o.kind], default=CONSTANT)
                outs = [merged] * len(eqn.outvars)
            else:
                if subs:  # loops and branches: count what their bodies compute
                    times = int(eqn.params.get("length", 1)) if name == "scan" else 1
                    for sub in subs:
                        self.run(sub, [Origin("computed", name)] * len(_open(sub).invars),
                                 reps * times)
                else:
                    self.outside_flops += reps * eqn_flops(eqn)
                self.outside_ops.add(name)
                outs = [Origin("computed", name)] * len(eqn.outvars)
            for v, o in zip(eqn.outvars, outs, strict=True):
                env[id(v)] = o
        return [origin(v) for v in j.outvars]


def facts(jaxpr: Any) -> dict:
    """What the program computes where; JSON-ready (``verdict.work_from_dict`` reads it)."""
    walk = _Walk()
    outs = walk.run(jaxpr, [Origin("input")] * len(_open(jaxpr).invars))
    return {"outputs": [{"from": str(o), "kind": o.kind} for o in outs],
            "calls": walk.calls, "outside_flops": walk.outside_flops,
            "outside_ops": sorted(walk.outside_ops)}


def flops(jaxpr: Any) -> int:
    """All FLOPs of a program (a task's reference): kernels count as outside here."""
    walk = _Walk()
    walk.run(jaxpr, [Origin("input")] * len(_open(jaxpr).invars))
    return walk.outside_flops


# a function that only works eagerly (np.asarray of an argument, Python branching on values)
TRACING_ERRORS = (jax_errors.TracerArrayConversionError, jax_errors.ConcretizationTypeError,
                  jax_errors.TracerBoolConversionError, jax_errors.TracerIntegerConversionError)
TRACED = ("your function is traced once per case, as jax.jit traces it: compute on its array "
          "arguments with jax.numpy and pl.pallas_call (NumPy only on host inputs such as a "
          "block mask)")


@dataclass
class CaseRun:
    """One run of the learner's function on one case: the output or the error it raised, and
    kernelsim's trace (``to_dict()``) and the work facts of that same run."""

    output: Any = None
    error: str | None = None
    trace: dict | None = None
    summary: str | None = None
    trace_error: str | None = None
    work: dict | None = None


@dataclass
class Traced:
    """The learner's function traced on one case: the program and its traced arguments, or the
    error tracing raised (``error``)."""

    program: Any = None
    traced: list | None = None
    error: str | None = None


# A dot traced without a precision takes this one (lax.canonicalize_precision): float32
# products in float32 on every backend, as the references computed them. At JAX's default a
# GPU multiplies float32 in TF32, XLA's dots (interpret mode's too) and Triton's alike, and a
# right kernel would fail a learner's check on a GPU that the grader's CPU passes. Assignment
# 11, where TF32 is the lesson, judges the default precision itself (grader/tasks/a11_gpu.py).
MATMUL_PRECISION = "highest"


def trace_case(task: Any, fn: Any, arrays: list, params: dict) -> Traced:
    """Trace ``fn`` once on the case into a program (``jax.make_jaxpr``), at
    ``MATMUL_PRECISION``: the only step that runs the learner's Python. ``task.host_inputs``
    trailing arrays reach the function as NumPy arrays (host planning); the others are traced."""
    import jax
    import numpy as np

    split = len(arrays) - task.host_inputs
    traced, host = list(arrays[:split]), [np.asarray(a) for a in arrays[split:]]
    try:
        with jax.default_matmul_precision(MATMUL_PRECISION):
            program = jax.make_jaxpr(lambda *a: task.call(fn, [*a, *host], params))(*traced)
    except TRACING_ERRORS as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Traced(error=f"{type(e).__name__}: {first} -- {TRACED}")
    except Exception as e:  # noqa: BLE001 - the learner's error is the verdict
        return Traced(error=f"{type(e).__name__}: {e}")
    return Traced(program, traced)


def run_traced(t: Traced) -> CaseRun:
    """Execute a traced program for the values and kernelsim's trace, and read the work facts
    from it: what is judged all comes from this one program."""
    import jax
    import numpy as np
    from jax.extend.core import jaxpr_as_fun

    import kernelsim

    if t.error is not None:
        return CaseRun(error=t.error)
    try:
        execute = jaxpr_as_fun(t.program)
        try:
            outs, trace = kernelsim.run(execute, *t.traced, interpret=None)
            run = CaseRun(trace=trace.to_dict(), summary=trace.summary(), work=facts(t.program))
        except kernelsim.TraceError as e:  # no pallas_call: the values are still judged
            outs, run = execute(*t.traced), CaseRun(trace_error=str(e))
        run.output = np.asarray(jax.device_get(outs[0] if len(outs) == 1 else tuple(outs)))
    except Exception as e:  # noqa: BLE001 - the learner's error is the verdict
        return CaseRun(error=f"{type(e).__name__}: {e}")
    return run


def run_case(task: Any, fn: Any, arrays: list, params: dict) -> CaseRun:
    """Trace ``fn`` once on the case into a program; execute that very program for the values
    and kernelsim's trace, and read the work facts from it. Nothing the function does
    differently when traced can differ between what is judged: it is the same run."""
    return run_traced(trace_case(task, fn, arrays, params))
