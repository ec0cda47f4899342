"""What a graded task is: inputs, plain-JAX references, tolerances and structural rules.

One ``Task`` per graded exercise. Its ``cases`` fix every input by shape, dtype and seed; the
``visible`` cases are the ones a learner sees, the ``hidden`` ones (other shapes, non-divisible
edges, bfloat16, more seeds) only run at grading. ``pallas-course refs`` evaluates ``reference``
on every case and stores inputs and expected output under ``exercises/refs/`` (see
``grader.verdict.refs``); the notebooks' test cells call ``grader.learner.course.check`` which
compares against those files, never against this module's references directly.

The structural rule of a task reads a ``kernelsim`` trace of the learner's function on one case
and returns ``Rule`` results: what was required, what was found.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader.calling import INVOKES, Call
from grader.devices import devices_of
from grader.facts import work
from grader.tasks import shipped

# Tolerances, in one table: (rtol, atol) per kind of task and dtype. An element passes when
# |got - expected| <= atol + rtol * |expected|. Every reference computes in float32 and rounds
# once to the output dtype; one ulp is 2**-24 (6e-8) relative in float32, 2**-8 (3.9e-3) in
# bfloat16.
TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    # the kernel performs the reference's own IEEE operations: float32 results are equal, or
    # half an ulp apart where a compiler fuses a multiply and an add (an FMA); bfloat16 may
    # differ by the one rounding of an intermediate a kernel keeps in float32
    "exact": {"float32": (1e-6, 1e-6), "bfloat16": (2**-7, 1e-6)},
    # sums in another order (row sums, softmax, layernorm, matmul over K <= 1024): float32
    # partial sums drift by about sqrt(n) ulps, under 1e-4; bfloat16: the float32 result,
    # rounded once, can land one rounding boundary away (2 ulps). Accumulating in bfloat16
    # across grid steps is off by far more on the long all-positive cases (tests/grader/
    # test_tolerance.py), as is a softmax without the max subtracted on the large logits
    "reduction": {"float32": (1e-4, 1e-4), "bfloat16": (2**-7, 1e-3)},
    # attention: the P @ V product takes P rounded to bfloat16 (as FlashAttention does), so an
    # output near zero is off by about 2**-9 of the largest |v|
    "attention": {"float32": (1e-4, 1e-4), "bfloat16": (2**-7, 2**-5)},
    # attention's gradients (assignment 7's backward): p = exp(s - lse) is rebuilt from scores
    # of up to about +-100 in the large cases, where a TPU's float32 matmul (the MXU's passes
    # at precision HIGHEST) leaves s about 1e-6 of itself off; exp carries that into p and the
    # gradients: on a TPU v5e a right backward was 1.25e-4 off at 0.24 (tolerance 1.24e-4,
    # bench/recorded/on_tpu-v5e.json); the planted wrong backwards miss by far more
    # (tests/grader/tasks/test_flash_attention_backward_task.py)
    "attention_backward": {"float32": (1e-3, 1e-3), "bfloat16": (2**-7, 2**-5)},
    # a ring collective's sum (assignment 13): a bfloat16 partial sum is rounded at each of the
    # ring's N - 1 hops, where the reference rounds once: of positive values, whose partial
    # sums are below the total, they land up to N + 1 half ulps (2**-9) of the total apart
    "ring": {"float32": (1e-4, 1e-4), "bfloat16": (2**-6, 1e-3)},
}


@dataclass(frozen=True)
class Case:
    """One input set: ``arrays`` maps argument names (in call order) to shapes."""

    name: str
    seed: int
    dtype: str
    arrays: dict[str, tuple[int, ...]]
    params: dict[str, Any] = field(default_factory=dict)
    hidden: bool = False
    # how the inputs are drawn: "normal" N(0, 1); "large" 30 N(0, 1) + 60 (exp overflows
    # without the max subtracted; attention scales q and k instead, see a07_flash_attention);
    # "positive" U[0, 1) (long sums grow: bfloat16 accumulation loses them); "skewed" group
    # sizes (empty groups, one group with almost every row); "offset" rows of N(0, 1) + 100
    # and "zero_row" (a row of zeros) where a task's epsilon matters
    values: str = "normal"


@dataclass(frozen=True)
class Rule:
    """One structural requirement checked on a kernelsim trace."""

    what: str
    required: str
    found: str
    ok: bool

    def __str__(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"[{mark}] {self.what}: required {self.required}; found {self.found}"


@dataclass(frozen=True)
class Task:
    id: str
    assignment: str
    title: str
    reference: Callable[..., Any]
    cases: tuple[Case, ...]
    structure: Callable[[Any, Case, dict], list[Rule]]
    tolerance: str = "exact"  # a row of TOLERANCES
    make: Callable[[np.random.Generator, Case], dict[str, np.ndarray]] | None = None
    # how the learner's function is called: invoke(fn, arrays, params) -> output, one of
    # grader.calling.INVOKES
    invoke: Callable[[Callable, list, dict], Any] | None = None
    # trailing inputs the function gets as NumPy arrays to plan with on the host (a block
    # mask, group sizes); the others are traced, and the program they give is what runs
    host_inputs: int = 0
    # what the kernel body must compute: per group, one of these primitives
    kernel_ops: tuple[tuple[str, ...], ...] = ()
    # every kernel must be the learner's own, not one of the course's code; False where the
    # task's ``invoke`` runs a kernel of its own (a prediction written out by the grader)
    own_kernels: bool = True
    # the kernel body the task's text gives, verbatim (a line such as
    # ``o_ref[...] = x_ref[...] + y_ref[...]``): where the course ships the same body, it is the
    # one shipped body that passes "kernels are your own" here (``shipped.allowed``); "" for
    # none (the learner writes the whole kernel)
    given_body: str = ""
    # the backend the kernel is written for: "tpu" kernels must have block shapes Mosaic accepts
    target: str = "tpu"
    # what the task's scalar-prefetch operands may hold: indices and metadata, named here
    # (never a result: they must not be computed from floating-point data)
    prefetch: str = "indices and metadata"
    # rules on the order of the kernel's own DMAs (``verdict.DmaOrder``), for tasks that
    # teach manual DMA: (dma order or None, case) -> rules
    dma_rules: Callable[[Any, Case], list[Rule]] | None = None
    # rules on what the kernel bodies compute with (``verdict.KernelWork``: their dots' dtypes,
    # scratch, outputs read back, inputs read only in a ``pl.when`` branch): (the program's
    # kernels, case) -> rules
    body_rules: Callable[[tuple, Case], list[Rule]] | None = None
    # a task whose output no reference fixes (a dropout's mask is the kernel's own random
    # draw) is judged by properties of its output instead of against the stored reference:
    # (case, inputs, the learner's output) -> rules; the reference then only gives the
    # output's shape and dtype
    output_rules: Callable[[Case, dict, np.ndarray], list[Rule]] | None = None

    def inputs(self, case: Case) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(case.seed)
        if self.make is not None:
            return self.make(rng, case)
        return {k: drawn_values(rng, s, case) for k, s in case.arrays.items()}

    def __post_init__(self):
        if self.invoke is not None and INVOKES.get(self.invoke.__name__) is not self.invoke:
            raise ValueError(f"task {self.id}: its invoke must be one of "
                             "grader.calling.INVOKES (the notebook's process of the "
                             "grader's run calls it by name)")

    @property
    def devices(self) -> int:
        """How many devices the checking process must have: more than one for a kernel
        inside a ``jax.shard_map`` (assignment 13's ring of four), which the grader's jailed
        processes and ``pallas-course check`` start with as CPU devices (``grader.devices``)."""
        return devices_of(self.assignment)

    @property
    def calling(self) -> Call:
        """How the learner's function is called, as the notebook's process of the grader's run
        knows it (the job names the invoke)."""
        return Call(None if self.invoke is None else self.invoke.__name__, self.host_inputs)

    def call(self, fn: Callable, arrays: list, params: dict) -> Any:
        return self.calling.call(fn, arrays, params)

    def expected(self, case: Case, inputs: dict[str, np.ndarray]) -> np.ndarray:
        args = [jnp.asarray(v) for v in inputs.values()]
        out = self.reference(*args, **case.params)
        return np.asarray(jax.device_get(out))


def dtype_of(name: str):
    return jnp.bfloat16 if name == "bfloat16" else np.dtype(name)


def normal_array(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape, dtype=np.float32).astype(dtype_of(dtype)))


def drawn_values(rng: np.random.Generator, shape, case: Case) -> np.ndarray:
    """An input drawn as ``case.values`` says (see ``Case``)."""
    if case.values == "large":
        return np.asarray((30 * rng.standard_normal(shape, dtype=np.float32) + 60)
                          .astype(dtype_of(case.dtype)))
    if case.values == "positive":
        return np.asarray(rng.random(shape, dtype=np.float32).astype(dtype_of(case.dtype)))
    return normal_array(rng, shape, case.dtype)


def with_zero_row(name: str) -> Callable[[np.random.Generator, Case], dict[str, np.ndarray]]:
    """A task's ``make``: its inputs drawn as ``drawn_values`` draws them; with
    ``values="zero_row"`` row 1 of input ``name`` is all zeros, where only a norm's epsilon keeps
    the row finite (a mean square of 0 under a reciprocal square root)."""
    def make(rng: np.random.Generator, case: Case) -> dict[str, np.ndarray]:
        out = {k: drawn_values(rng, s, case) for k, s in case.arrays.items()}
        if case.values == "zero_row":
            out[name][1] = 0
        return out
    return make


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def as_f32(x):
    return x.astype(jnp.float32)


# ----------------------------------------------------------------------------- structural rules
def calls_at_least(t, n: int = 1) -> Rule:
    k = len(t.calls)
    return Rule("pallas_call reached", f">= {n}", str(k), k >= n)


def calls_exactly(t, n: int) -> Rule:
    k = len(t.calls)
    return Rule("number of pallas_calls", f"exactly {n} (one fused kernel)", str(k), k == n)


def operands_with_role(call, role: str):
    return [o for o in call.operands if o.role == role]


def grid_is(call, grid: tuple[int, ...]) -> Rule:
    return Rule("grid", str(tuple(grid)), str(tuple(call.grid)), tuple(call.grid) == tuple(grid))


def grid_rank(call, rank: int) -> Rule:
    g = tuple(call.grid)
    return Rule("grid rank", str(rank), f"{len(g)} (grid {g})", len(g) == rank)


def block_is(call, role: str, index: int, block: tuple[int, ...] | None, label: str) -> Rule:
    ops = operands_with_role(call, role)
    if index >= len(ops):
        return Rule(f"{label} block shape", str(block), f"no {role} operand #{index}", False)
    found = ops[index].block_shape
    found_t = None if found is None else tuple(found)
    req = None if block is None else tuple(block)
    return Rule(f"{label} block shape", str(req), str(found_t), found_t == req)


def role_count(call, role: str, at_least: int, label: str) -> Rule:
    k = len(operands_with_role(call, role))
    return Rule(label, f">= {at_least} {role} operand(s)", str(k), k >= at_least)


def read_budget(call, role: str, index: int, budget: int, label: str) -> Rule:
    ops = operands_with_role(call, role)
    if index >= len(ops):
        return Rule(f"{label} HBM reads", f"<= {budget:,} B", f"no {role} operand #{index}", False)
    got = ops[index].hbm_read_bytes
    return Rule(f"{label} HBM reads", f"<= {budget:,} B", f"{got:,} B ({ops[index].fetches} "
                f"block fetches)", got <= budget)


def total_budget(call, read: int | None, write: int | None) -> list[Rule]:
    out = []
    if read is not None:
        out.append(Rule("HBM read traffic", f"<= {read:,} B", f"{call.hbm_read_bytes:,} B",
                        call.hbm_read_bytes <= read))
    if write is not None:
        out.append(Rule("HBM write traffic", f"<= {write:,} B", f"{call.hbm_write_bytes:,} B",
                        call.hbm_write_bytes <= write))
    return out


def nbytes_of(shape, dtype: str) -> int:
    return int(math.prod(shape)) * np.dtype(dtype_of(dtype)).itemsize


def _only_call(rules: list[Rule], t) -> Any:
    k = len(t.calls)
    rules.append(Rule("pallas_call reached", "exactly 1 (every call is judged; the task "
                      "takes one kernel)", str(k), k == 1))
    return t.calls[0] if t.calls else None


def single_call(fn: Callable[..., None]):
    """Wrap a per-call rule builder: check there is one pallas_call, then run ``fn`` on it."""

    def structure(t, case: Case, inputs: dict) -> list[Rule]:
        rules: list[Rule] = []
        call = _only_call(rules, t)
        if call is not None:
            fn(call, case, rules, inputs)
        return rules

    return structure


# ----------------------------------------------------------------------------- the kernel's work
OUTSIDE_SHARE = 10  # compute outside kernels: at most 1/OUTSIDE_SHARE of the task's FLOPs
_REFERENCE_FLOPS: dict[tuple[str, str], int] = {}


def reference_flops(task: Task, case: Case, inputs: dict) -> int:
    """FLOPs of the task's plain-JAX reference on ``case`` (cached)."""
    key = (task.id, case.name)
    if key not in _REFERENCE_FLOPS:
        arrays = [jnp.asarray(v) for v in inputs.values()]
        split = len(arrays) - task.host_inputs
        host = [np.asarray(v) for v in arrays[split:]]
        program = jax.make_jaxpr(
            lambda *a: task.reference(*a, *host, **case.params))(*arrays[:split])
        _REFERENCE_FLOPS[key] = work.flops(program)
    return _REFERENCE_FLOPS[key]


def work_rules(task: Task, case: Case, w, inputs: dict, out_elements: int) -> list[Rule]:
    """The kernel does the work: ``w`` is ``verdict.WorkFacts`` of the learner's run."""
    rules = [Rule("result comes from the kernel", "the pallas_call's output (at most layout "
                  "ops after it)", "; ".join(f.origin for f in w.outputs) or "no output",
                  bool(w.outputs) and all(f.kind == "kernel" for f in w.outputs))]
    fed = [f"operand {i} of pallas_call #{c.number}: {f.origin}" for c in w.calls
           for i, (role, f) in enumerate(c.operands)
           if role == "input" and f.kind not in ("input", "kernel")]
    rules.append(Rule("kernel inputs are your function's inputs", "the arguments or an "
                      "earlier kernel's outputs (at most layout ops between)",
                      "; ".join(fed) or "they are", not fed))
    budget = max(reference_flops(task, case, inputs), out_elements) // OUTSIDE_SHARE
    ops = f" ({', '.join(w.outside_ops)})" if w.outside_ops else ""
    looped = (f"; and a while loop computing {w.outside_while_flops:,} FLOPs per iteration, "
              "an unknown number of times" if w.outside_while_flops else "")
    rules.append(Rule("compute outside kernels", f"<= {budget:,} FLOPs (1/{OUTSIDE_SHARE} of "
                      "the task's)", f"{w.outside_flops:,} FLOPs{ops}{looped}",
                      w.outside_flops <= budget and not w.outside_while_flops))
    moved_budget = sum(np.asarray(v).nbytes for v in inputs.values()) // OUTSIDE_SHARE
    rules += applicable(Rule(
        "data moved outside kernels", f"<= {moved_budget:,} B (1/{OUTSIDE_SHARE} of the "
        "inputs' bytes): a transpose or copy in XLA is a whole pass over HBM; let the "
        "kernel's index maps or its dot read the layout it is given",
        f"{w.outside_moved_bytes:,} B", w.outside_moved_bytes <= moved_budget),
        applies=bool(w.outside_moved_bytes))
    used = sorted(set().union(*(c.primitives for c in w.calls)))
    for group in task.kernel_ops:
        rules.append(Rule(f"kernel computes {' or '.join(group)}", "in the kernel body",
                          ", ".join(p for p in used if p not in ("get", "swap")) or "nothing",
                          any(set(group) & c.primitives for c in w.calls)))
    unread = [f"input {i} of pallas_call #{c.number}" for c in w.calls for i in c.unread]
    rules.append(Rule("every kernel input is read", "each input's ref used in the kernel body",
                      "; ".join(f"{u} is never read" for u in unread) or "all are", not unread))
    rules.append(Rule("no host callbacks", "every value computed by JAX (no jax.pure_callback, "
                      "io_callback or jax.debug.callback carrying arrays)",
                      ", ".join(w.callbacks) or "none", not w.callbacks))
    results = [f"scalar-prefetch operand {i} of pallas_call #{c.number}: {f.origin}, from "
               "floating-point data" for c in w.calls
               for i, (role, f) in enumerate(c.operands)
               if role == "scalar_prefetch" and f.floating]
    prefetched = any(role == "scalar_prefetch" for c in w.calls for role, _ in c.operands)
    rules += applicable(Rule("scalar prefetch carries indices", f"{task.prefetch}, computed "
                             "from integer data (a result computed outside the kernel is not "
                             "an index)", "; ".join(results) or "it does", not results),
                        prefetched)
    if task.target == "tpu":  # a GPU task's float32 dots: calling.lowered_for_gpu (TF32)
        dots = [f"pallas_call #{c.number}: {d}" for c in w.calls for d in c.dot_precisions]
        rules += applicable(Rule("dot precision right on a TPU", "float32 dots at HIGHEST, "
                                 "16-bit dots at the default (with "
                                 "preferred_element_type=jnp.float32)",
                                 "; ".join(dots) or "they are", not dots),
                            any("dot_general" in c.primitives for c in w.calls))
        strided = [f"pallas_call #{c.number}: {r}" for c in w.calls for r in c.strided_refs]
        # the work facts name only the strided accesses Mosaic refuses: said when there is one
        rules += applicable(Rule(
            "strided ref reads Mosaic lowers (rule strided_load)", "a pl.ds(..., stride=k) read "
            "or write only of 32-bit data in a ref exactly 128 lanes wide; otherwise read the "
            "whole block, convert it to float32 and select rows with a mask (jnp.where on a "
            "jax.lax.broadcasted_iota)",
            "; ".join(f"{r}, which Mosaic refuses to compile" for r in strided) or "they are",
            not strided), applies=False)
    if task.own_kernels:
        rules.append(own_kernels(w, task.id))
    if task.dma_rules is not None:
        rules.extend(task.dma_rules(next((c.dma for c in w.calls if c.dma), None), case))
    if task.body_rules is not None:
        rules.extend(task.body_rules(w.calls, case))
    return rules


def tpu_block_rule(task: Task, facts: Any) -> list[Rule]:
    """For a kernel meant for TPU, from kernelsim's lint: every block shape Mosaic's lowering
    would accept (the (8, 128) tiling rule and its 1-D and HBM variants; the message names the
    operand, the rule and the nearest legal block), and no index map that reads scalar prefetch
    at an index read from scalar prefetch (which halted a TPU v5e's core)."""
    if task.target != "tpu":
        return []
    problems = [p for c in facts.calls for p in c.block_shape_problems]
    found = problems[0] if problems else "all accepted"
    others = [m[1] for p in problems[1:] if (m := re.match(r"operand '([^']+)'", p))]
    if others:
        found += f" The same for {', '.join(others)}."
    dependent = [w.split("] ", 1)[1].split(". On a TPU", 1)[0] for c in facts.calls
                 for w in c.dependent_prefetch_reads]
    prefetched = any(o.role == "scalar_prefetch" for c in facts.calls for o in c.operands)
    return [Rule("block shapes Mosaic accepts (TPU's (8, 128) tiling rule)",
                 "the last two block dims multiples of (8, 128) or the array's own", found,
                 not problems),
            *applicable(Rule(
                "output index maps read scalar prefetch at the step's own index (rule "
                "dependent_prefetch_read)", "an output's index map reads a scalar-prefetch "
                "array at an index computed from the grid alone: look a table up before the "
                "call (e.g. pages = page_indices[jnp.arange(S), positions // page_size]) and "
                "prefetch the result",
                "; ".join(f"{d}, which halted a TPU v5e core" for d in dependent) or "they do",
                not dependent), prefetched)]


def applicable(rule: Rule, applies: bool) -> list[Rule]:
    """``rule`` where the learner's kernel has what it is about (``applies``: scalar prefetch,
    a dot), else none: a kernel without scalar prefetch is not told that its scalar prefetch
    carries indices. A rule that failed is always kept, so this decides no check."""
    return [rule] if applies or not rule.ok else []


def own_kernels(w, task_id: str) -> Rule:
    """No kernel body is the course's own or a Pallas op JAX ships: by the file it was defined
    in, or by its fingerprint (``grader.tasks.shipped``), which re-created, pasted or renamed
    source keeps, at any size; but the body ``task_id``'s text gives (``Task.given_body``)."""
    found = []
    for c in w.calls:
        where = shipped.known().get(c.fingerprint)
        if c.course_kernel:
            found.append(f"pallas_call #{c.number} runs a kernel of the course's own code "
                         "(grader/, kernelsim/, lessons/)")
        elif c.jax_kernel:
            found.append(f"pallas_call #{c.number} runs a Pallas op JAX ships "
                         "(jax.experimental.pallas.ops)")
        elif where and c.fingerprint not in shipped.allowed(task_id):
            found.append(f"pallas_call #{c.number}'s kernel body is the one {where} ships, "
                         "up to renaming: write the body yourself")
    return Rule("kernels are your own", "kernel bodies written in your notebook",
                "; ".join(found) or "they are", not found)


def make_case(name, seed, dtype, arrays, hidden=False, values="normal", **params):
    return Case(name, seed, dtype, arrays, params, hidden, values)


TASKS: list[Task] = []


def register_task(**kw) -> Task:
    t = Task(**kw)
    TASKS.append(t)
    return t


def matmul_reference(a, b, *_, **__):
    return jnp.dot(a, b, precision="highest", preferred_element_type=jnp.float32).astype(a.dtype)


def matmul_transposed_reference(a, b, *_, **__):
    """``a @ b.T`` for ``b`` stored ``(N, K)``, accumulated in float32, rounded once."""
    return jnp.dot(a, b.T, precision="highest",
                   preferred_element_type=jnp.float32).astype(a.dtype)


def tiled_matmul_call(m: int, k: int, n: int, bm: int, bk: int, bn: int, dtype,
                      weight_transposed: bool = False):
    """The tiled matmul of lesson 7 and assignment 4 for ``(m, k) @ (k, n)`` with blocks ``(bm,
    bk, bn)``, as a callable of ``(a, b)``: grid ``(cdiv(m, bm), cdiv(n, bn), k // bk)``, K
    innermost, a float32 ``(bm, bn)`` VMEM accumulator. ``weight_transposed``: ``b`` is stored
    ``(n, k)`` and the product is ``a @ b.T`` (a06's task), its blocks ``(bn, bk)``. The grader
    traces it with kernelsim for the traffic and on-chip footprint of those blocks (a04's
    prediction, a06's best blocks); it never runs here."""
    b_dim = 1 if weight_transposed else 0  # the dimension of b's block that runs along K
    precision = jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        # at the precision the course's kernels pass (HIGHEST for float32, as the learner's
        # do), which kernelsim prices by its MXU passes
        acc_ref[...] += jax.lax.dot_general(a_ref[...], b_ref[...], (((1,), (b_dim,)), ((), ())),
                                            precision=precision,
                                            preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    b_spec = (pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)) if weight_transposed
              else pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)))
    return pl.pallas_call(
        kernel,
        grid=(cdiv(m, bm), cdiv(n, bn), k // bk),  # the output block stays on chip along K
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), b_spec],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
