"""Does the kernel do the work? Facts about a learner's function, read from its jaxpr.

``run_case`` traces the learner's function once (``jax.make_jaxpr``), executes that very
program for the values and kernelsim's trace, and hands the program here. ``facts`` follows the
data through it:

- where each output comes from: a kernel, or a computation outside any kernel, an
  input or a constant (layout operations -- reshape, transpose, slice, pad, casts -- pass the
  origin through; anything else is a computation);
- where each operand of each kernel comes from, the same way (a decoy ``zeros`` is a
  constant; ``x * 2`` fed in is a computation outside the kernel);
- the FLOPs computed outside kernels (a while loop's per iteration, as its trip count is
  unknown), and the host callbacks carrying data anywhere in the program;
- per kernel call (``pallas_call``, or the ``mpmd_map`` a Mosaic GPU ``plgpu.kernel`` binds
  inside a ``custom_vmap_call``): the primitives its kernel uses (nested loops and branches
  included), which of its inputs the kernel body never touches, whether floating-point data
  went into each operand (a scalar-prefetch operand must hold indices, not a result), where
  its kernel body was defined (the course's own code, ``grader/``, ``kernelsim/``,
  ``lessons/``; or a Pallas op JAX ships), the body's fingerprint up to renaming
  (``grader.facts.fingerprint``, compared with ``grader.tasks.shipped``), and, for a body that
  starts its own DMAs, their order over the whole run (``dma_order``: overlap, buffers, copy sizes,
  in-place safety, waits, grid semantics); its dots' operand and result dtypes, its scratch refs
  (dtype, shape, read or not), the outputs it reads back and the inputs it reads only inside a
  ``pl.when`` branch (``ref_reads``), for rules of a task's own (a quantized matmul's int8 dot
  and int32 accumulator).

A program whose DMA order shows it would block forever (a wait no copy signals; copies that
cross the steps of a "parallel" grid) is not executed: ``run_traced`` reports that as the
case's error at once, instead of a hung case running into its cell's time limit. A program
of Mosaic GPU kernels is traced by ``kernelsim.gpu`` instead (``grader.facts.gpu_facts``).

The grader judges these (``grader.verdict.verdict`` with ``grader.tasks`` rules); nothing here
imports ``jax._src``: only a jaxpr's public attributes (``eqns``, ``invars``, ``params``) are read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental.pallas import ops
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Literal, jaxpr_as_fun, jaxprs_in_params
from jax.tree_util import tree_unflatten

import kernelsim
from grader.calling import (
    COURSE_CODE,
    KERNEL_CALLS,
    LAYOUT,
    TRANSPARENT,
    Traced,
    eqns,
    kernel_body,
    open_jaxpr,
    trace_case,
)
from grader.facts import gpu_facts
from grader.facts.dma_order import dma_order, would_hang
from grader.facts.fingerprint import fingerprint

# precedence when several origins meet in one layout operation (pad(kernel out, 0.0): kernel)
_RANK = {"computed": 3, "kernel": 2, "input": 1, "constant": 0}
def _jax_ops() -> str:
    return os.path.realpath(os.path.dirname(ops.__file__)) + os.sep


# the Pallas ops JAX ships (jax.experimental.pallas.ops: flash attention, matmul, softmax, ...)
JAX_OPS = _jax_ops()


@dataclass(frozen=True)
class Origin:
    """Where a value comes from: ``kind`` in computed/kernel/input/constant; ``by`` the
    primitive that computed it (computed) or the kernel call, "pallas_call #N" or
    "plgpu.kernel #N" (kernel)."""

    kind: str
    by: str = ""

    def __str__(self) -> str:
        if self.kind == "computed":
            return f"computed outside the kernel by {self.by}"
        if self.kind == "kernel":
            return self.by
        return {"input": "the function's inputs", "constant": "a constant"}[self.kind]


CONSTANT = Origin("constant")


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
    return {eqn.primitive.name for eqn in eqns(jaxpr)}


def _scoped(jaxpr: Any) -> Any:
    """The body a kernel's author wrote: ``plgpu.kernel`` wraps it in a ``run_scoped`` (its
    scratch); any other body is itself."""
    j = open_jaxpr(jaxpr)
    if len(j.eqns) == 1 and j.eqns[0].primitive.name == "run_scoped":
        return open_jaxpr(j.eqns[0].params["jaxpr"])
    return j


def _used(jaxpr: Any) -> set[int]:
    """ids of the variables some equation of ``jaxpr`` reads (nested jaxprs take theirs as
    operands, so the top level sees every use; a ``run_scoped`` takes the refs its body closes
    over, read or not: those its body reads)."""
    j = open_jaxpr(jaxpr)
    used = {id(v) for v in j.outvars if not isinstance(v, Literal)}
    for eqn in j.eqns:
        inner = open_jaxpr(eqn.params["jaxpr"]) if eqn.primitive.name == "run_scoped" else None
        if inner is not None and len(inner.constvars) == len(eqn.invars):
            read = _used(inner)
            used |= {id(v) for v, c in zip(eqn.invars, inner.constvars, strict=True)
                     if id(c) in read}
        else:
            used |= {id(v) for v in eqn.invars if not isinstance(v, Literal)}
    return used


def kernel_file(kernel: Any) -> str:
    """The file a kernel body was defined in, from its jaxpr's debug info ("name at file:line";
    '' when it names none)."""
    where = (getattr(_scoped(kernel).debug_info, "func_src_info",
                     None) or "").rpartition(" at ")[2]
    return where.rpartition(":")[0]


def _precision_name(precision: Any) -> str:
    """A dot_general's ``precision`` parameter in words: "default" (None or DEFAULT for both
    operands), else the precision (or algorithm) JAX records."""
    if precision is None:
        return "default"
    names = {str(getattr(p, "name", p)).lower() for p in
             (precision if isinstance(precision, tuple) else (precision,))}
    return "default" if names == {"default"} else "/".join(sorted(names))


def dot_precisions(kernel: Any) -> list[str]:
    """Every dot_general of a kernel body whose precision a TPU gets wrong, in words:
    16-bit operands at a precision above the default, which Mosaic refuses to compile ("Bad lhs
    type" for highest, measured on a TPU v5e, jax 0.10.2; the MXU multiplies bfloat16
    natively), and float32 operands below "highest", which a TPU multiplies in one bfloat16
    pass and a GPU in TF32 (0.178 off float64 where "highest" was 7.6e-6 off, on that chip)."""
    found = []
    for e in eqns(kernel):
        if e.primitive.name != "dot_general":
            continue
        dtypes = {str(v.aval.dtype) for v in e.invars[:2]}
        precision = _precision_name(e.params.get("precision"))
        if dtypes & {"bfloat16", "float16"} and precision != "default":
            found.append(f"a {'x'.join(sorted(dtypes))} dot at precision {precision}: Mosaic "
                         "refuses it on a TPU; pass no precision (a 16-bit product is exact) "
                         "and preferred_element_type=jnp.float32")
        elif dtypes == {"float32"} and precision != "highest":
            found.append(f"a float32 dot at precision {precision}: a TPU multiplies it in one "
                         "bfloat16 pass, a GPU in TF32; pass precision=jax.lax.Precision.HIGHEST")
    return found


def strided_refs(kernel: Any) -> list[str]:
    """Every strided ref read or write of a kernel body (``pl.ds(start, size, stride=k)``,
    k > 1) that Mosaic cannot lower, in words. Mosaic lowers a strided load or store only of
    32-bit data (layout inference: "Strided load with non 32-bit data"), from a ref whose last
    dim is exactly 128 lanes and not strided ("The last dim size is not 128 in original base
    memref"; jaxlib/mosaic/dialect/tpu/transforms/apply_vector_layout.cc). A TPU v5e refused
    both forms (pool_rows, jax 0.10.2); TPU interpret mode runs them."""
    found = []
    for e in eqns(kernel):
        if e.primitive.name not in ("get", "swap"):
            continue
        tree = e.params["tree"]
        transforms = tree_unflatten(tree, e.invars[len(e.invars) - tree.num_leaves:])
        strides = [(k, s.stride) for t in transforms
                   for k, s in enumerate(getattr(t, "indices", ()))
                   if getattr(s, "stride", 1) > 1]
        if not strides:
            continue
        ref = e.invars[0].aval
        bits, shape = 8 * np.dtype(ref.dtype).itemsize, tuple(ref.shape)
        why = [f"{ref.dtype} is not 32-bit"] if bits != 32 else []
        if shape[-1] != 128:
            why.append(f"its last dim is {shape[-1]}, not 128")
        if any(k == len(shape) - 1 for k, _ in strides):
            why.append("the stride is on the last dim")
        if why:
            access = "read" if e.primitive.name == "get" else "write"
            found.append(f"a strided {access} (stride {strides[0][1]}) of a "
                         f"{'x'.join(map(str, shape))} {ref.dtype} ref: " + "; ".join(why))
    return list(dict.fromkeys(found))  # a loop's reads alike, said once


def dot_types(kernel: Any) -> list[str]:
    """Every dot_general of a kernel body as its operand and result dtypes, "int8 x int8 ->
    int32": which of the MXU's paths it asks for (an int8 path takes int8 on both sides and
    accumulates in int32; ``jax._src.tpu_info.TpuInfo.is_matmul_supported``)."""
    return list(dict.fromkeys(
        f"{e.invars[0].aval.dtype} x {e.invars[1].aval.dtype} -> {e.outvars[0].aval.dtype}"
        for e in eqns(kernel) if e.primitive.name == "dot_general"))


REF_READS = frozenset({"get", "addupdate"})  # what reads a ref's values (``swap`` writes them)


def _handed_on(eqn: Any) -> list[tuple[Any, list, list | None]]:
    """Each jaxpr nested in ``eqn``, its variables and the operands of ``eqn`` they receive, in
    order: a ``while``'s condition takes its own constants and the carry, a ``run_scoped`` body
    closes over the operands (its constvars), any other (branches, loop bodies, calls) takes
    the last of them as its invars; operands None where they do not line up."""
    if eqn.primitive.name == "while":
        cond, body = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        cond_jaxpr, body_jaxpr = (open_jaxpr(eqn.params[k]) for k in ("cond_jaxpr", "body_jaxpr"))
        return [(cond_jaxpr, cond_jaxpr.invars, eqn.invars[:cond] + eqn.invars[cond + body:]),
                (body_jaxpr, body_jaxpr.invars, eqn.invars[cond:])]
    found = []
    for sub in jaxprs_in_params(eqn.params):
        inner = open_jaxpr(sub)
        variables = inner.constvars if eqn.primitive.name == "run_scoped" else inner.invars
        operands = list(eqn.invars[len(eqn.invars) - len(variables):])
        lined_up = len(variables) == len(eqn.invars) if eqn.primitive.name == "run_scoped" \
            else len(variables) <= len(eqn.invars)
        found.append((inner, list(variables), operands if lined_up else None))
    return found


def ref_reads(jaxpr: Any, refs: dict[int, int], branches: bool = True) -> set[int]:
    """Which of ``refs`` (id of a ref variable of ``jaxpr`` -> its number) some ``get`` or
    ``addupdate`` reads, nested jaxprs followed; with ``branches`` False a ``cond``'s branches
    (``pl.when``'s) are not: the refs read at every grid step. A ref handed to a nested jaxpr
    whose variables do not line up with the operands counts as read."""
    found: set[int] = set()
    for eqn in open_jaxpr(jaxpr).eqns:
        name = eqn.primitive.name
        if name in REF_READS:
            found |= {refs[id(eqn.invars[0])]} if id(eqn.invars[0]) in refs else set()
        elif name != "cond" or branches:
            for inner, variables, operands in _handed_on(eqn):
                if operands is None:
                    found |= {refs[id(v)] for v in eqn.invars if id(v) in refs}
                    continue
                passed = {id(v): refs[id(o)] for v, o in zip(variables, operands, strict=True)
                          if id(o) in refs}
                if passed:
                    found |= ref_reads(inner, passed, branches)
    return found


def _call_facts(eqn: Any, number: int, operand_origins: list[tuple[Origin, bool]]) -> dict:
    kernel = kernel_body(eqn)
    if eqn.primitive.name == "pallas_call":
        gm = eqn.params["grid_mapping"]
        n_idx, n_in = int(gm.num_index_operands), int(gm.num_inputs)
    else:  # mpmd_map: no scalar prefetch; the inputs' refs come first
        n_idx, n_in = 0, len(eqn.invars)
    refs, used = open_jaxpr(kernel).invars, _used(kernel)
    # a pallas_call's body takes its refs as scalar prefetch, inputs, outputs, then scratch
    n_out = int(gm.num_outputs) if eqn.primitive.name == "pallas_call" else 0
    first_scratch = n_idx + n_in + n_out if eqn.primitive.name == "pallas_call" else len(refs)
    numbered = {id(v): k for k, v in enumerate(refs)}
    read, every_step = ref_reads(kernel, numbered), ref_reads(kernel, numbered, branches=False)
    source = os.path.realpath(kernel_file(kernel)) if kernel_file(kernel) else ""
    return {"number": number,
            "course_kernel": source.startswith(COURSE_CODE),
            "jax_kernel": source.startswith(JAX_OPS),
            "fingerprint": fingerprint(kernel),
            "primitives": sorted(primitives(kernel)),
            "operands": [{"role": "scalar_prefetch" if i < n_idx else "input",
                          "from": str(o), "kind": o.kind, "floating": f}
                         for i, (o, f) in enumerate(operand_origins[:n_idx + n_in])],
            "unread": [i - n_idx for i in range(n_idx, n_idx + n_in)
                       if i < len(refs) and id(refs[i]) not in used],
            "dma": dma_order(eqn.params) if eqn.primitive.name == "pallas_call" else None,
            "dot_precisions": dot_precisions(kernel),
            "strided_refs": strided_refs(kernel),
            "dot_types": dot_types(kernel),
            "scratch": [{"dtype": str(v.aval.dtype), "shape": list(v.aval.shape),
                         "read": k in read} for k, v in enumerate(refs) if k >= first_scratch],
            "outputs_read": [k - n_idx - n_in for k in sorted(read)
                             if n_idx + n_in <= k < first_scratch],
            "branch_only_reads": [k - n_idx for k in sorted(read - every_step)
                                  if n_idx <= k < n_idx + n_in]}


def _floating(v: Any) -> bool:
    dtype = getattr(getattr(v, "aval", None), "dtype", None)
    return dtype is not None and np.issubdtype(np.dtype(dtype), np.inexact)


# layout operations that XLA runs as a pass over a whole array (read it, write the new one):
# before or after a kernel they cost HBM traffic the kernel's own blocks never show
# (``matmul_tuned`` with ``b.T`` made by XLA). Left out: reshapes and slices, which XLA folds
# into an address, and copies, concatenations and pads, which autodiff adds and XLA removes
# (a custom_vjp's solution of rms_norm has them)
MOVES = frozenset({"transpose", "rev"})


def _nbytes(v: Any) -> int:
    aval = getattr(v, "aval", None)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    return 0 if shape is None or dtype is None else math.prod(shape) * np.dtype(dtype).itemsize


class _Walk:
    """Follows a program's data: per value its ``Origin`` and whether floating point data
    went into it (an integer index computed from array values carries a result, not an
    index)."""

    def __init__(self):
        self.calls: list[dict] = []
        self.outside_flops = 0
        self.outside_moved_bytes = 0  # HBM bytes read and written by ``MOVES`` outside kernels
        self.outside_while_flops = 0
        self.outside_ops: set[str] = set()

    def run(self, jaxpr: Any, origins: list[Origin], reps: int = 1,
            floats: list[bool] | None = None) -> list[tuple[Origin, bool]]:
        j = open_jaxpr(jaxpr)
        floats = floats or [_floating(v) for v in j.invars]
        env: dict[int, tuple[Origin, bool]] = {
            id(v): (o, f) for v, o, f in zip(j.invars, origins, floats, strict=True)}
        for v in getattr(j, "constvars", ()):
            env[id(v)] = (CONSTANT, _floating(v))

        def origin(v) -> tuple[Origin, bool]:
            if isinstance(v, Literal):
                return CONSTANT, False
            return env.get(id(v), (CONSTANT, False))

        for eqn in j.eqns:
            name = eqn.primitive.name
            ins = [origin(v) for v in eqn.invars]
            fed = any(f for _, f in ins)
            subs = list(jaxprs_in_params(eqn.params))
            if name in KERNEL_CALLS:
                number = len(self.calls)
                self.calls.append(_call_facts(eqn, number, ins))
                launch = "pallas_call" if name == "pallas_call" else "plgpu.kernel"
                outs = [Origin("kernel", f"{launch} #{number}")] * len(eqn.outvars)
            elif (name in TRANSPARENT or name == "shard_map") and len(subs) == 1 and \
                    len(open_jaxpr(subs[0]).invars) == len(ins):
                # a shard_map's body (assignment 13's kernels) runs once on each device of
                # its mesh, on that device's shard: what flows in and out is the body's
                devices = eqn.params["mesh"].size if name == "shard_map" else 1
                found = self.run(subs[0], [o for o, _ in ins], reps * devices,
                                 [f for _, f in ins])
                for v, of in zip(eqn.outvars, found, strict=True):
                    env[id(v)] = of
                continue
            elif name in LAYOUT:
                outs = [max((o for o, _ in ins), key=lambda o: _RANK[o.kind],
                            default=CONSTANT)] * len(eqn.outvars)
                if name in MOVES and outs and outs[0].kind != "constant":
                    self.outside_moved_bytes += reps * sum(
                        _nbytes(v) for v in (*eqn.invars, *eqn.outvars)
                        if not isinstance(v, Literal))
                    self.outside_ops.add(name)
            else:
                if subs:  # loops and branches: count what their bodies compute
                    times = int(eqn.params.get("length", 1)) if name == "scan" else 1
                    before = self.outside_flops
                    for sub in subs:
                        inner = open_jaxpr(sub).invars
                        self.run(sub, [Origin("computed", name)] * len(inner),
                                 reps * times, [fed or _floating(v) for v in inner])
                    if name == "while":  # runs an unknown number of times
                        self.outside_while_flops += self.outside_flops - before
                else:
                    self.outside_flops += reps * eqn_flops(eqn)
                self.outside_ops.add(name)
                outs = [Origin("computed", name)] * len(eqn.outvars)
            for v, o in zip(eqn.outvars, outs, strict=True):
                env[id(v)] = (o, fed or _floating(v))
        return [origin(v) for v in j.outvars]


CALLBACKS = frozenset({"pure_callback", "io_callback", "debug_callback"})


def host_callbacks(jaxpr: Any) -> list[str]:
    """Host callbacks anywhere in a program (kernel bodies included) that carry array data:
    ``jax.pure_callback``, ``io_callback``, and ``jax.debug.callback`` with an array operand
    (``jax.debug.print`` and ``pl.debug_print`` are not callbacks of this kind)."""
    return [eqn.primitive.name for eqn in eqns(jaxpr) if eqn.primitive.name in CALLBACKS and (
        eqn.primitive.name != "debug_callback" or any(
            getattr(getattr(v, "aval", None), "shape", ()) for v in eqn.invars))]


def facts(jaxpr: Any) -> dict:
    """What the program computes where; JSON-ready (``verdict.work_from_dict`` reads it)."""
    walk = _Walk()
    outs = walk.run(jaxpr, [Origin("input")] * len(open_jaxpr(jaxpr).invars))
    return {"outputs": [{"from": str(o), "kind": o.kind} for o, _ in outs],
            "calls": walk.calls, "outside_flops": walk.outside_flops,
            "outside_moved_bytes": walk.outside_moved_bytes,
            "outside_while_flops": walk.outside_while_flops,
            "outside_ops": sorted(walk.outside_ops), "callbacks": host_callbacks(jaxpr)}


def flops(jaxpr: Any) -> int:
    """All FLOPs of a program (a task's reference): kernels count as outside here."""
    walk = _Walk()
    walk.run(jaxpr, [Origin("input")] * len(open_jaxpr(jaxpr).invars))
    return walk.outside_flops


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


def run_traced(t: Traced) -> CaseRun:
    """Execute a traced program for the values and kernelsim's trace, and read the work facts
    from it: what is judged all comes from this one program."""
    if t.error is not None:
        return CaseRun(error=t.error)
    try:
        work, gpu = facts(t.program), kernelsim.gpu.kernels_in(t.program)
        hang = would_hang(work) or gpu_facts.would_hang(gpu, work)
        if hang:  # stopped before it runs: a hung case would cost the time limit
            return CaseRun(error=hang, work=work)
        execute = jaxpr_as_fun(t.program)
        if gpu:  # Mosaic GPU kernels: kernelsim.gpu's model of them
            outs = execute(*t.traced)
            run = CaseRun(trace=gpu_facts.trace(gpu), summary=gpu_facts.summary(gpu), work=work)
        else:
            try:
                outs, trace = kernelsim.run(execute, *t.traced, interpret=None)
                run = CaseRun(trace=trace.to_dict(), summary=trace.summary(), work=work)
            except kernelsim.TraceError as e:  # no kernel: the values are still judged
                outs, run = execute(*t.traced), CaseRun(trace_error=str(e))
        run.output = np.asarray(jax.device_get(outs[0] if len(outs) == 1 else tuple(outs)))
    except Exception as e:  # noqa: BLE001 - the learner's error is the verdict
        settle_after_failure()
        return CaseRun(error=error_text(e))
    return run


def settle_after_failure() -> None:
    """After a run that raised: let the failed program finish on its other devices (in TPU
    interpret mode each device's kernel is a callback, whose failure would otherwise surface
    in the next case's run) and reset interpret mode's simulated memory, which it keeps after
    a failure for debugging, so that the next case starts clean."""
    try:
        jax.effects_barrier()
    except Exception:  # noqa: BLE001 - the failure already reported
        pass
    pltpu.reset_tpu_interpret_mode_state()


def error_text(e: Exception) -> str:
    """A case's error from what executing it raised; a race TPU interpret mode's detector
    reports, as the accesses it names without the interpreter's traceback and clocks."""
    text = f"{type(e).__name__}: {e}"
    race = text.find("RACE DETECTED")
    if race < 0:
        return text
    lines = [x.strip() for x in text[race:].splitlines()
             if x.strip() and not x.strip().startswith("clock:")]
    return "RaceDetected: " + "; ".join(lines[1:3]) + " (RACE DETECTED)"


def run_case(task: Any, fn: Any, arrays: list, params: dict) -> CaseRun:
    """Trace ``fn`` once on the case into a program; execute that very program for the values
    and kernelsim's trace, and read the work facts from it. Nothing the function does
    differently when traced can differ between what is judged: it is the same run."""
    return run_traced(trace_case(task, fn, arrays, params))
