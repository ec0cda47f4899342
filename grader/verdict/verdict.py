"""The verdict of one ``course.check``, decided from data alone.

Inputs: the learner's outputs per case (arrays), the errors their function raised, and the
kernelsim trace of their function as ``Trace.to_dict()`` produced it. Nothing here runs learner
code, so the same functions serve ``pallas-course check`` on a learner's machine (everything in
one process) and grading, where the outputs and the trace come out of the grader's jailed run
of the notebook over its answer channel and the references never go in (``grader.jail.trusted``).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grader import tasks as _tasks
from grader.verdict import messages as _messages
from grader.verdict.remote_copies import RemoteCopy, mesh_device, remote_copies
from kernelsim.cost.lint import BLOCK_SHAPE_REJECTED, DEPENDENT_PREFETCH_READ, rule_of


@dataclass(frozen=True)
class OperandFacts:
    """One operand of a traced pallas_call: what the structural rules read (bytes, counts,
    its shape and memory space)."""

    name: str
    role: str
    block_shape: tuple[int | None, ...] | None
    fetches: int
    writebacks: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    shape: tuple[int, ...]  # the whole array's
    memory_space: str  # one of MEMORY_SPACES: where the block (or the array) lives


MEMORY_SPACES = ("vmem", "smem", "hbm", "any", "semaphore")  # kernelsim.model.MemorySpace



@dataclass(frozen=True)
class CallFacts:
    """One traced pallas_call: grid, operands, HBM traffic (bytes) and on-chip peak (bytes)."""

    name: str
    grid: tuple[int, ...]
    dimension_semantics: tuple[str, ...]  # one per grid axis, as kernelsim names them
    operands: tuple[OperandFacts, ...]
    hbm_read_bytes: int
    hbm_write_bytes: int
    onchip_peak_bytes: int
    # kernelsim's block-shape warnings: why Mosaic's TPU lowering would reject a block
    block_shape_problems: tuple[str, ...]
    # kernelsim's warnings of index maps that read scalar prefetch at a prefetched index,
    # which halted a TPU v5e's core
    dependent_prefetch_reads: tuple[str, ...] = ()
    # kernelsim's time estimate on its default TPU from the kernel's own FLOPs (seconds): a
    # pl.CostEstimate in the learner's call cannot change it
    own_estimated_seconds: float = 0.0
    # inside a ``jax.shard_map``: the device this call runs on (its ``MeshDevice.id``) and
    # the copies it starts into other devices' memory; None and none outside a mesh
    device: int | None = None
    remote_copies: tuple[RemoteCopy, ...] = ()
    # the FLOPs kernelsim counts in the kernel body over every step, and the call's own
    # pl.CostEstimate as (flops, bytes_accessed, transcendentals), None when it gives none
    own_flops: int = 0
    cost_estimate: tuple[int, int, int] | None = None
    # the pl.CostEstimate's remote_bytes_transferred (bytes the call says it sends to other
    # devices), None when the call gives no estimate
    cost_estimate_remote_bytes: int | None = None


@dataclass(frozen=True)
class GpuKernelFacts:
    """One Mosaic GPU kernel (``plgpu.kernel``) as ``kernelsim.gpu`` models one CTA of it
    (``grader.facts.gpu_facts``): its launch and shared memory (bytes per CTA), its TMA copies
    into shared memory (how many, the kernel refs they read: "in0", "in1", ...) and out of it (to
    "out0", ...), the copies into shared memory no barrier wait consumes, the TMA stores no
    ``commit_smem`` precedes or no ``wait_smem_to_gmem`` follows, the plain loads and
    stores of global memory (into registers, past the TMA), its WGMMAs: how many, how many each
    accumulator adds up between its starts, the operands ("a", "b") read transposed, and what
    the lowering would refuse in their layouts."""

    name: str
    grid: tuple[int, ...]
    warpgroups: int
    smem_bytes: int
    barriers: int
    tma_loads: int
    tma_sources: tuple[str, ...]
    tma_stores: int
    tma_targets: tuple[str, ...]
    unwaited_loads: int
    uncommitted_stores: int
    unawaited_stores: int
    gmem_loads: int
    gmem_stores: int
    complete: bool  # every event of the CTA was kept (kernelsim.gpu.MAX_EVENTS)
    warnings: tuple[str, ...]
    wgmmas: int
    accumulations: tuple[int, ...]  # WGMMAs each accumulator adds up between its starts
    transposed_operands: tuple[str, ...]
    wgmma_layout_problems: tuple[str, ...]


@dataclass(frozen=True)
class TraceFacts:
    """The pallas_calls a function reached, in program order, and its Mosaic GPU kernels."""

    calls: tuple[CallFacts, ...]
    gpu: tuple[GpuKernelFacts, ...] = ()


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{what} is {type(v).__name__}, not true or false")
    return v


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} is {type(v).__name__}, not an integer")
    return v


def _seconds(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
        raise ValueError(f"{what} is {v!r}, not a number of seconds")
    return float(v)


def _shape(v: Any, what: str, squeezed: bool = False) -> tuple:
    """A shape; with ``squeezed`` entries may be None (a BlockSpec's squeezed dimension)."""
    if not isinstance(v, list | tuple):
        raise ValueError(f"{what} is {type(v).__name__}, not a list")
    return tuple(None if squeezed and x is None else _int(x, what) for x in v)


def _names(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{what} is not a list of names")
    return tuple(v)


def _memory_space(v: Any) -> str:
    if v not in MEMORY_SPACES:
        raise ValueError(f"memory_space is {v!r}, not one of {', '.join(MEMORY_SPACES)}")
    return v


def _gpu_kernel(d: Any) -> GpuKernelFacts:
    if not isinstance(d, dict):
        raise ValueError("a Mosaic GPU kernel's facts are not a mapping")
    counts = {f: _int(d.get(f), f) for f in (
        "warpgroups", "smem_bytes", "barriers", "tma_loads", "tma_stores", "unwaited_loads",
        "uncommitted_stores", "unawaited_stores", "gmem_loads", "gmem_stores", "wgmmas")}
    return GpuKernelFacts(
        accumulations=_shape(d.get("accumulations"), "accumulations"),
        transposed_operands=_names(d.get("transposed_operands"), "transposed_operands"),
        wgmma_layout_problems=_names(d.get("wgmma_layout_problems"), "wgmma_layout_problems"),
        name=str(d.get("name")), grid=_shape(d.get("grid"), "grid"),
        tma_sources=_names(d.get("tma_sources"), "tma_sources"),
        tma_targets=_names(d.get("tma_targets"), "tma_targets"),
        complete=_bool(d.get("complete"), "complete"),
        warnings=_names(d.get("warnings"), "warnings"), **counts)


def _cost_estimate(v: Any) -> tuple[int, int, int] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError("the call's cost estimate is not a mapping")
    return tuple(_int(v.get(f), f) for f in ("flops", "bytes_accessed", "transcendentals"))


def facts_from_dict(d: Any) -> TraceFacts:
    """Read ``Trace.to_dict()`` output, or ``grader.facts.gpu_facts.trace``'s for a program of
    Mosaic GPU kernels; ValueError when it is not what kernelsim or that writes."""
    if not isinstance(d, dict) or not isinstance(d.get("calls"), list):
        raise ValueError("the trace has no list of calls")
    calls = []
    for i, c in enumerate(d["calls"]):
        if not isinstance(c, dict) or not isinstance(c.get("operands"), list):
            raise ValueError(f"call {i} has no list of operands")
        ops = tuple(OperandFacts(
            name=str(o.get("name")), role=str(o.get("role")),
            block_shape=None if o.get("block_shape") is None
            else _shape(o["block_shape"], "block_shape", squeezed=True),
            fetches=_int(o.get("fetches"), "fetches"),
            writebacks=_int(o.get("writebacks"), "writebacks"),
            hbm_read_bytes=_int(o.get("hbm_read_bytes"), "hbm_read_bytes"),
            hbm_write_bytes=_int(o.get("hbm_write_bytes"), "hbm_write_bytes"),
            shape=_shape(o.get("shape"), "shape"),
            memory_space=_memory_space(o.get("memory_space")))
            for o in c["operands"] if isinstance(o, dict))
        calls.append(CallFacts(
            name=str(c.get("name")), grid=_shape(c.get("grid"), "grid"),
            dimension_semantics=_names(c.get("dimension_semantics"), "dimension_semantics"),
            operands=ops,
            hbm_read_bytes=_int(c.get("hbm_read_bytes"), "hbm_read_bytes"),
            hbm_write_bytes=_int(c.get("hbm_write_bytes"), "hbm_write_bytes"),
            onchip_peak_bytes=_int(c.get("onchip_peak_bytes"), "onchip_peak_bytes"),
            block_shape_problems=tuple(w for w in _names(c.get("warnings", []), "warnings")
                                       if BLOCK_SHAPE_REJECTED in w),
            dependent_prefetch_reads=tuple(
                w for w in _names(c.get("warnings", []), "warnings")
                if rule_of(w) == DEPENDENT_PREFETCH_READ),
            own_estimated_seconds=_seconds(c.get("own_estimated_seconds", 0.0),
                                           "own_estimated_seconds"),
            device=mesh_device(c.get("device")),
            remote_copies=remote_copies(c.get("body_dmas", [])),
            own_flops=_int(c.get("own_flops", 0), "own_flops"),
            cost_estimate=_cost_estimate(c.get("cost_estimate")),
            cost_estimate_remote_bytes=None if not isinstance(ce := c.get("cost_estimate"), dict)
            else _int(ce.get("remote_bytes_transferred", 0), "remote_bytes_transferred")))
    gpu = d.get("gpu_kernels", [])
    if not isinstance(gpu, list):
        raise ValueError("the trace's Mosaic GPU kernels are not a list")
    return TraceFacts(tuple(calls), tuple(_gpu_kernel(k) for k in gpu))


@dataclass(frozen=True)
class Flow:
    """Where a value comes from (``grader.facts.work``): ``kind`` kernel, input, constant or
    computed; ``origin`` in words; ``floating``: floating-point data went into it."""

    kind: str
    origin: str
    floating: bool = False


@dataclass(frozen=True)
class Copies:
    """A kernel's DMAs in one direction (into on-chip memory, or out of it): how many, the
    distinct element counts they move, the distinct on-chip buffers (ref and slot) they use."""

    count: int
    elements: tuple[int, ...]
    buffers: int


@dataclass(frozen=True)
class DmaOrder:
    """The DMAs a kernel body starts by hand, in the order it issues them over its whole run
    (``grader.facts.dma_order.dma_order``)."""

    copies_in: Copies
    copies_out: Copies
    computes: int  # compute points of the run
    overlapped: int  # ... at which a copy into on-chip memory is in flight
    unsafe: int  # copies into a buffer a copy out of it is still reading
    crosses_steps: bool  # a copy started at one grid step is waited at another
    never_waited: int
    waits_unmatched: int
    semantics: tuple[str, ...]
    followed: bool  # the whole run was followed (not cut at grader.facts.work.DMA_WALK_LIMIT)


@dataclass(frozen=True)
class Scratch:
    """One scratch ref of a kernel body: its dtype, shape, and whether the body reads it."""

    dtype: str
    shape: tuple[int, ...]
    read: bool


@dataclass(frozen=True)
class KernelWork:
    """One pallas_call as its jaxpr shows it: the kernel body's primitives, where each
    operand comes from (scalar prefetch and inputs, in order), inputs the body never reads,
    whether the body is the course's own code (``grader.calling.COURSE_CODE``) or a Pallas
    op JAX ships (``grader.facts.work.JAX_OPS``), its fingerprint up to renaming
    (``grader.facts.fingerprint``), the order of its DMAs, and what
    ``grader.facts.work`` reads of its body for a task's own rules (``Task.body_rules``):
    its dots' dtypes, its scratch refs, the outputs it reads back, and the inputs it reads only
    inside a ``pl.when`` branch."""

    number: int
    primitives: frozenset[str]
    operands: tuple[tuple[str, Flow], ...]  # (role, flow)
    unread: tuple[int, ...]
    course_kernel: bool
    jax_kernel: bool
    fingerprint: str
    dma: DmaOrder | None
    dot_precisions: tuple[str, ...] = ()  # dots a TPU gets wrong (``work.dot_precisions``)
    strided_refs: tuple[str, ...] = ()  # strided ref accesses Mosaic refuses (work.py)
    dot_types: tuple[str, ...] = ()  # "int8 x int8 -> int32" per kind of dot (work.dot_types)
    scratch: tuple[Scratch, ...] = ()
    outputs_read: tuple[int, ...] = ()  # outputs whose ref the body reads back
    # inputs the body reads only inside a cond's branches (``pl.when``), never at every step
    branch_only_reads: tuple[int, ...] = ()


@dataclass(frozen=True)
class WorkFacts:
    """Where a function's outputs come from, its kernels, the FLOPs it computes outside
    them (those inside while loops per iteration, as their trip count is unknown), the bytes
    its transposes and copies outside them move and the host callbacks carrying data
    (``grader.facts.work.facts``)."""

    outputs: tuple[Flow, ...]
    calls: tuple[KernelWork, ...]
    outside_flops: int
    outside_ops: tuple[str, ...]
    outside_while_flops: int
    callbacks: tuple[str, ...]
    outside_moved_bytes: int  # bytes transposes and copies outside kernels read and write


FLOW_KINDS = ("kernel", "input", "constant", "computed")


def _flow(d: Any) -> Flow:
    if not isinstance(d, dict) or d.get("kind") not in FLOW_KINDS:
        raise ValueError("a data flow is not one of " + ", ".join(FLOW_KINDS))
    return Flow(d["kind"], str(d.get("from")), _bool(d.get("floating", False), "floating"))


def _copies(d: Any) -> Copies:
    if not isinstance(d, dict):
        raise ValueError("DMA copies are not a mapping")
    return Copies(_int(d.get("count"), "count"), _shape(d.get("elements"), "elements"),
                  _int(d.get("buffers"), "buffers"))


def _dma(d: Any) -> DmaOrder | None:
    if d is None:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("copies"), dict):
        raise ValueError("the DMA order has no copies")
    return DmaOrder(
        _copies(d["copies"].get("in")), _copies(d["copies"].get("out")),
        _int(d.get("computes"), "computes"), _int(d.get("overlapped"), "overlapped"),
        _int(d.get("unsafe"), "unsafe"), _bool(d.get("crosses_steps"), "crosses_steps"),
        _int(d.get("never_waited"), "never_waited"),
        _int(d.get("waits_unmatched"), "waits_unmatched"),
        _names(d.get("semantics"), "semantics"), _bool(d.get("followed"), "followed"))


def _list(v: Any, what: str) -> list:
    if not isinstance(v, list):
        raise ValueError(f"{what} is not a list")
    return v


def _scratch(d: Any) -> Scratch:
    if not isinstance(d, dict) or not isinstance(d.get("dtype"), str):
        raise ValueError("a scratch ref's facts are not a mapping with a dtype")
    return Scratch(d["dtype"], _shape(d.get("shape"), "scratch shape"),
                   _bool(d.get("read"), "scratch read"))


def work_from_dict(d: Any) -> WorkFacts:
    """Read ``grader.facts.work.facts`` output; ValueError when it is not what that writes."""
    if not isinstance(d, dict) or not isinstance(d.get("outputs"), list) or \
            not isinstance(d.get("calls"), list):
        raise ValueError("the work facts have no outputs or calls")
    calls = []
    for c in d["calls"]:
        if not isinstance(c, dict) or not isinstance(c.get("operands"), list) or \
                not isinstance(c.get("unread"), list):
            raise ValueError("a kernel's work facts have no operands")
        calls.append(KernelWork(
            _int(c.get("number"), "number"), frozenset(_names(c.get("primitives"), "primitives")),
            tuple((str(o.get("role")) if isinstance(o, dict) else "", _flow(o))
                  for o in c["operands"]),
            tuple(_int(i, "unread") for i in c["unread"]),
            _bool(c.get("course_kernel"), "course_kernel"),
            _bool(c.get("jax_kernel"), "jax_kernel"),
            str(c.get("fingerprint")),
            _dma(c.get("dma")), _names(c.get("dot_precisions", []), "dot_precisions"),
            _names(c.get("strided_refs", []), "strided_refs"),
            _names(c.get("dot_types", []), "dot_types"),
            tuple(_scratch(r) for r in _list(c.get("scratch", []), "scratch")),
            _shape(c.get("outputs_read", []), "outputs_read"),
            _shape(c.get("branch_only_reads", []), "branch_only_reads")))
    return WorkFacts(tuple(_flow(o) for o in d["outputs"]), tuple(calls),
                     _int(d.get("outside_flops"), "outside_flops"),
                     _names(d.get("outside_ops"), "outside_ops"),
                     _int(d.get("outside_while_flops"), "outside_while_flops"),
                     _names(d.get("callbacks"), "callbacks"),
                     _int(d.get("outside_moved_bytes"), "outside_moved_bytes"))


def compare(got: Any, expected: np.ndarray, rtol: float, atol: float,
            block: tuple[int, ...] | None = None) -> str | None:
    """None when ``got`` matches ``expected``; otherwise a message saying where and by how much.

    The bound per element is ``atol + rtol * |expected|``, with the case's ``rtol`` and
    ``atol`` from the manifest (``grader.tasks.TOLERANCES``); NaN never matches.
    """
    try:
        g = np.asarray(got)
    except Exception as e:  # noqa: BLE001 - anything unconvertible is a wrong answer
        return f"the result could not be read as an array ({type(e).__name__}: {e})"
    if g.shape != expected.shape:
        return f"shape {g.shape} but expected {expected.shape}"
    if str(g.dtype) != str(expected.dtype):
        return f"dtype {g.dtype} but expected {expected.dtype} (cast the kernel's output)"
    gf, ef = g.astype(np.float64), expected.astype(np.float64)
    diff = np.abs(gf - ef)
    bad = ~(diff <= atol + rtol * np.abs(ef))  # NaN counts as bad
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"[{', '.join(map(str, idx))}]"
    msg = (f"{nbad} of {bad.size} elements differ; first at {where}: got {gf[idx]:.6g}, "
           f"expected {ef[idx]:.6g} (|diff| {diff[idx]:.3g} > tolerance "
           f"{atol + rtol * abs(ef[idx]):.3g}; rtol {rtol:.3g}, atol {atol:.3g}); "
           f"max |diff| {np.nanmax(np.where(np.isnan(diff), np.inf, diff)):.3g}")
    if block is not None and len(block) == len(idx):
        # a squeezed block dimension (None, pl.Squeezed()) spans one element
        block = tuple(int(b) if isinstance(b, int | np.integer) and b > 0 else 1 for b in block)
        bidx = tuple(i // b for i, b in zip(idx, block, strict=True))
        nblk = tuple(-(-s // b) for s, b in zip(expected.shape, block, strict=True))
        msg += f"; that element lies in output block {bidx} of {nblk} (block shape {block})"
        if any(i == n - 1 and s % b
               for i, n, s, b in zip(bidx, nblk, expected.shape, block, strict=True)):
            msg += " -- a partial edge block: check the blocks that overhang the array"
    if block is not None and (picture := _messages.block_map(bad, block)):
        msg += "\n" + picture
    return msg


def describe(entry: dict) -> str:
    """``case NAME (dtype, seed S: x(shape), ... {params})`` for messages."""
    shapes = ", ".join(f"{k}{tuple(entry['shapes'][k])}" for k in entry["inputs"])
    p = f"; {_messages.literal(entry['params'])}" if entry["params"] else ""
    drawn = entry.get("values", "normal")
    values = "" if drawn == "normal" else f"; {drawn} values"
    return f"case {entry['case']} ({entry['dtype']}, seed {entry['seed']}: {shapes}{p}{values})"


def _out_block(facts: TraceFacts | None) -> tuple[int, ...] | None:
    if not facts or not facts.calls:
        return None
    outs = [o for o in facts.calls[-1].operands if o.role == "output"]
    return outs[0].block_shape if outs else None


@dataclass
class Verdict:
    """passed, or the message of every failure; ``rules`` as the learner sees them (a failed
    check's: those of the case that failed one) and ``checked`` the names of the structural
    rules a passed check evaluated."""

    passed: bool
    message: str = ""
    rules: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CaseResult:
    """What one run of the learner's function did on one case: an output array or the error it
    raised, and the trace and work facts of that same run (None with ``trace_error``: no
    pallas_call was reached)."""

    entry: dict
    inputs: dict[str, np.ndarray]
    expected: np.ndarray
    params: dict
    output: np.ndarray | None = None
    error: str | None = None
    trace: TraceFacts | None = None
    trace_error: str | None = None
    work: WorkFacts | None = None


def case_result(entry: dict, inputs: dict, expected: np.ndarray, params: dict, output: Any,
                error: str | None, trace: Any, trace_error: Any, work: Any) -> CaseResult:
    """A ``CaseResult`` from what one run reported, its trace and work facts as the dicts
    ``grader.facts.work.run_case`` makes; ValueError when they are not."""
    return CaseResult(entry, inputs, expected, params, output, error,
                      None if trace is None else facts_from_dict(trace),
                      None if trace_error is None else str(trace_error),
                      None if work is None else work_from_dict(work))


def first_mismatch(got: Any, expected: np.ndarray, rtol: float, atol: float) -> str | None:
    """``compare`` for a hidden case: None when ``got`` matches; otherwise what the learner's
    own output is at its first wrong element (its index, its value, its shape and dtype), and
    nothing of the expected output, its values, shape or tolerance there."""
    try:
        g = np.asarray(got)
    except Exception as e:  # noqa: BLE001
        return f"the result could not be read as an array ({type(e).__name__})"
    if g.shape != expected.shape:
        return f"your output's shape {g.shape} is not this case's"
    if str(g.dtype) != str(expected.dtype):
        return f"your output's dtype {g.dtype} is not this case's (cast the kernel's output)"
    gf, ef = g.astype(np.float64), expected.astype(np.float64)
    bad = ~(np.abs(gf - ef) <= atol + rtol * np.abs(ef))
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"your output (shape {g.shape}, {g.dtype}) is wrong first at "
            f"[{', '.join(map(str, idx))}], where it holds {gf[idx]:.6g}")


def describe_hidden(entry: dict) -> str:
    """``case NAME (dtype)``: what a hidden case's message may say of it."""
    return f"hidden case {entry['case']} ({entry['dtype']})"


# error types a hidden case's message may name: Python's and JAX's tracing errors (a class the
# learner defines could carry data in its name)
KNOWN_ERRORS = frozenset({name for name, v in vars(builtins).items()
                          if isinstance(v, type) and issubclass(v, BaseException)} | {
    "TracerArrayConversionError", "ConcretizationTypeError", "TracerBoolConversionError",
    "TracerIntegerConversionError", "UnexpectedTracerError", "JaxRuntimeError",
    "XlaRuntimeError"})
HIDDEN_ADVICE = ("hidden cases are not shown; make your function right for every shape and "
                 "dtype the task allows, and check it on the visible cases")


NOT_IMPLEMENTED = "not implemented yet"  # a function that raises NotImplementedError (the stub)


def _value_problem(r: CaseResult, hidden: bool) -> str | None:
    """What is wrong with one case's run before any rule is read: the error it raised, or its
    wrong values; None when its output is right."""
    if r.error is not None:
        if r.error.startswith("NotImplementedError"):
            return NOT_IMPLEMENTED
        if not hidden:
            return f"your function raised on {describe(r.entry)}: {r.error}"
        kind = r.error.partition(":")[0].strip()
        kind = kind if kind in KNOWN_ERRORS else "an exception"
        return f"your function raised {kind} on {describe_hidden(r.entry)}"
    if _tasks.get(r.entry["task"]).output_rules is not None:
        return None  # its values are judged by the task's output rules (``decide``)
    if hidden:
        msg = first_mismatch(r.output, r.expected, r.entry["rtol"], r.entry["atol"])
        return None if msg is None else f"wrong values for {describe_hidden(r.entry)}: {msg}"
    msg = compare(r.output, r.expected, r.entry["rtol"], r.entry["atol"], _out_block(r.trace))
    return None if msg is None else f"wrong values for {describe(r.entry)}: {msg}"


def decide(task_id: str, results: list[CaseResult], hidden: bool = False) -> Verdict:
    """Every case's values, and the structural and work rules on every case's run: passed when
    all hold. The message lists every failure at once, so that a learner who fixes the values
    does not only then meet a rule the same run already broke: the first case whose run raised
    or whose values are wrong, then each failed rule once, under the first case it failed on.
    A function that raises NotImplementedError is said to be not implemented yet, and no more.

    ``hidden``: the cases are hidden ones, whose inputs, expected outputs and anything derived
    from them stay with the grader; the message then names the case, its dtype, and of the
    learner's own output its shape, dtype and first wrong element; of an error only its type;
    of a rule only what it requires by name.
    """
    if not results:
        return Verdict(False, f"{task_id}: no cases were run")
    task = _tasks.get(task_id)
    wrong = next((p for r in results if (p := _value_problem(r, hidden)) is not None), None)
    if wrong == NOT_IMPLEMENTED:
        return Verdict(False, f"{task_id}: {NOT_IMPLEMENTED}")
    failures = [] if wrong is None else [wrong]
    named = describe_hidden if hidden else describe
    first: list = []  # the first judged case's rules
    shown: list = []  # ... of the first case that failed one: what the learner's record keeps
    listed: set[str] = set()  # the failed rules named so far
    no_kernel = False
    for r in results:
        if r.error is not None:  # nothing ran to judge; the first such error is said above
            continue
        if r.trace is None or r.work is None:
            launch = "plgpu.kernel" if task.target == "mosaic_gpu" else "pl.pallas_call"
            if not no_kernel:
                why = "" if hidden else f" ({r.trace_error})"
                failures.append(f"structural check failed: your function never calls "
                                f"{launch}{why}. The answer must be a Pallas kernel.")
                shown = shown or [_tasks.Rule(f"{launch} reached", "exactly 1", "none", False)]
            no_kernel = True
            continue
        case = next(c for c in task.cases if c.name == r.entry["case"])
        rules = task.structure(r.trace, case, r.inputs) + \
            _tasks.work_rules(task, case, r.work, r.inputs, r.expected.size) + \
            _tasks.tpu_block_rule(task, r.trace)
        if task.output_rules is not None:
            rules += task.output_rules(case, r.inputs, r.output)
        first = first or rules
        failed = [x for x in rules if not x.ok and x.what not in listed]
        if failed:
            shown = shown or rules
            listed.update(x.what for x in failed)
            body = "\n  ".join(f"[FAIL] {x.what}" if hidden else str(x) for x in failed)
            failures.append(f"structural check failed on {named(r.entry)}:\n  {body}")
    if failures:
        return Verdict(False, f"{task_id}: " + "\n".join(failures)
                       + (f"\n({HIDDEN_ADVICE})" if hidden else ""),
                       [] if hidden else [str(x) for x in shown or first])
    return Verdict(True, "", [] if hidden else [str(x) for x in first], [x.what for x in first])
