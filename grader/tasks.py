"""The graded tasks of the course: inputs, plain-JAX references, tolerances and structural rules.

One ``Task`` per graded exercise. Its ``cases`` fix every input by shape, dtype and seed; the
``visible`` cases are the ones a learner sees, the ``hidden`` ones (other shapes, non-divisible
edges, bfloat16, more seeds) only run at grading. ``pallas-course refs`` evaluates ``reference``
on every case and stores inputs and expected output under ``exercises/refs/`` (see
``grader.refs``); the notebooks' test cells call ``grader.course.check`` which compares against
those files, never against this module's references directly.

The structural rule of a task reads a ``kernelsim`` trace of the learner's function on one case
and returns ``Rule`` results: what was required, what was found.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Tolerances, in one table: (rtol, atol) per kind of task and dtype. An element passes when
# |got - expected| <= atol + rtol * |expected|. Every reference computes in float32 and rounds
# once to the output dtype; one ulp is 2**-24 (6e-8) relative in float32, 2**-8 (3.9e-3) in
# bfloat16.
TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    # the kernel performs the reference's own IEEE operations: float32 results are equal;
    # bfloat16 may differ by the one rounding of an intermediate a kernel keeps in float32
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
    # without the max subtracted); "positive" U[0, 1) (long sums grow: bfloat16 accumulation
    # loses them); "skewed" group sizes (empty groups, one group with almost every row)
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
    # how the learner's function is called: invoke(fn, arrays, params) -> output
    invoke: Callable[[Callable, list, dict], Any] | None = None
    # trailing inputs the function gets as NumPy arrays to plan with on the host (a block
    # mask, group sizes); the others are traced, and the program they give is what runs
    host_inputs: int = 0
    # what the kernel body must compute: per group, one of these primitives
    kernel_ops: tuple[tuple[str, ...], ...] = ()

    def inputs(self, case: Case) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(case.seed)
        if self.make is not None:
            return self.make(rng, case)
        return {k: _values(rng, s, case) for k, s in case.arrays.items()}

    def call(self, fn: Callable, arrays: list, params: dict) -> Any:
        if self.invoke is not None:
            return self.invoke(fn, arrays, params)
        return fn(*arrays, **params)

    def expected(self, case: Case, inputs: dict[str, np.ndarray]) -> np.ndarray:
        args = [jnp.asarray(v) for v in inputs.values()]
        out = self.reference(*args, **case.params)
        return np.asarray(jax.device_get(out))


def _dtype(name: str):
    return jnp.bfloat16 if name == "bfloat16" else np.dtype(name)


def _normal(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape, dtype=np.float32).astype(_dtype(dtype)))


def _values(rng: np.random.Generator, shape, case: Case) -> np.ndarray:
    """An input drawn as ``case.values`` says (see ``Case``)."""
    if case.values == "large":
        return np.asarray((30 * rng.standard_normal(shape, dtype=np.float32) + 60)
                          .astype(_dtype(case.dtype)))
    if case.values == "positive":
        return np.asarray(rng.random(shape, dtype=np.float32).astype(_dtype(case.dtype)))
    return _normal(rng, shape, case.dtype)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _f32(x):
    return x.astype(jnp.float32)


# ----------------------------------------------------------------------------- structural rules
def calls_at_least(t, n: int = 1) -> Rule:
    k = len(t.calls)
    return Rule("pallas_call reached", f">= {n}", str(k), k >= n)


def calls_exactly(t, n: int) -> Rule:
    k = len(t.calls)
    return Rule("number of pallas_calls", f"exactly {n} (one fused kernel)", str(k), k == n)


def _ops(call, role: str):
    return [o for o in call.operands if o.role == role]


def grid_is(call, grid: tuple[int, ...]) -> Rule:
    return Rule("grid", str(tuple(grid)), str(tuple(call.grid)), tuple(call.grid) == tuple(grid))


def grid_rank(call, rank: int) -> Rule:
    g = tuple(call.grid)
    return Rule("grid rank", str(rank), f"{len(g)} (grid {g})", len(g) == rank)


def block_is(call, role: str, index: int, block: tuple[int, ...] | None, label: str) -> Rule:
    ops = _ops(call, role)
    if index >= len(ops):
        return Rule(f"{label} block shape", str(block), f"no {role} operand #{index}", False)
    found = ops[index].block_shape
    found_t = None if found is None else tuple(found)
    req = None if block is None else tuple(block)
    return Rule(f"{label} block shape", str(req), str(found_t), found_t == req)


def role_count(call, role: str, at_least: int, label: str) -> Rule:
    k = len(_ops(call, role))
    return Rule(label, f">= {at_least} {role} operand(s)", str(k), k >= at_least)


def read_budget(call, role: str, index: int, budget: int, label: str) -> Rule:
    ops = _ops(call, role)
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


def _nbytes(shape, dtype: str) -> int:
    return int(math.prod(shape)) * np.dtype(_dtype(dtype)).itemsize


def _only_call(rules: list[Rule], t) -> Any:
    k = len(t.calls)
    rules.append(Rule("pallas_call reached", "exactly 1 (every call is judged; the task "
                      "takes one kernel)", str(k), k == 1))
    return t.calls[0] if t.calls else None


def _struct(fn: Callable[..., None]):
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
        from grader import work

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
           for i, (role, f) in enumerate(c.operands) if role == "input" and f.kind != "input"]
    rules.append(Rule("kernel inputs are your function's inputs", "the arguments (at most "
                      "layout ops before the call)", "; ".join(fed) or "they are", not fed))
    budget = max(reference_flops(task, case, inputs), out_elements) // OUTSIDE_SHARE
    ops = f" ({', '.join(w.outside_ops)})" if w.outside_ops else ""
    rules.append(Rule("compute outside kernels", f"<= {budget:,} FLOPs (1/{OUTSIDE_SHARE} of "
                      "the task's)", f"{w.outside_flops:,} FLOPs{ops}",
                      w.outside_flops <= budget))
    used = sorted(set().union(*(c.primitives for c in w.calls)))
    for group in task.kernel_ops:
        rules.append(Rule(f"kernel computes {' or '.join(group)}", "in the kernel body",
                          ", ".join(p for p in used if p not in ("get", "swap")) or "nothing",
                          any(set(group) & c.primitives for c in w.calls)))
    unread = [f"input {i} of pallas_call #{c.number}" for c in w.calls for i in c.unread]
    rules.append(Rule("every kernel input is read", "each input's ref used in the kernel body",
                      "; ".join(f"{u} is never read" for u in unread) or "all are", not unread))
    return rules


# ----------------------------------------------------------------------------- 01 first kernel
A1 = "01_first_kernel"
OPS: dict[str, Callable] = {
    "mul": lambda a, b: a * b,
    "max": jnp.maximum,
    "axpy": lambda a, b: 2 * a + b,
    "sub": lambda a, b: a - b,
}


def _invoke_elementwise(factory, arrays, params):
    return factory(OPS[params["op"]])(*arrays)


def _whole_array(call, case, rules, inputs):
    rules.append(Rule("grid", "() (one kernel instance, whole arrays)", str(tuple(call.grid)),
                      tuple(call.grid) == ()))


def _c(name, seed, dtype, arrays, hidden=False, values="normal", **params):
    return Case(name, seed, dtype, arrays, params, hidden, values)


TASKS: list[Task] = []


def _task(**kw) -> Task:
    t = Task(**kw)
    TASKS.append(t)
    return t


_task(
    id="add", assignment=A1, title="Add two arrays in one kernel",
    kernel_ops=(("add",),),
    reference=lambda x, y: x + y,
    cases=(
        _c("v0", 0, "float32", {"x": (8, 128), "y": (8, 128)}),
        _c("h0", 101, "float32", {"x": (16, 256), "y": (16, 256)}, True),
        _c("h1", 102, "float32", {"x": (5, 7), "y": (5, 7)}, True),
        _c("h2", 103, "bfloat16", {"x": (8, 128), "y": (8, 128)}, True),
    ),
    structure=_struct(_whole_array),
)
_task(
    id="elementwise", assignment=A1, title="A kernel factory for elementwise ops",
    kernel_ops=(("mul", "max", "add", "sub"),),
    reference=lambda x, y, op: OPS[op](x, y),
    invoke=_invoke_elementwise,
    cases=(
        _c("v0", 1, "float32", {"x": (8, 128), "y": (8, 128)}, op="mul"),
        _c("h0", 111, "float32", {"x": (8, 128), "y": (8, 128)}, True, op="max"),
        _c("h1", 112, "bfloat16", {"x": (16, 128), "y": (16, 128)}, True, op="axpy"),
        _c("h2", 113, "float32", {"x": (3, 5), "y": (3, 5)}, True, op="sub"),
    ),
    structure=_struct(_whole_array),
)
_task(
    id="leaky_relu", assignment=A1, title="Leaky ReLU with a slope",
    kernel_ops=(("mul",),),
    reference=lambda x, slope: jnp.where(x >= 0, x, (slope * x).astype(x.dtype)),
    cases=(
        _c("v0", 2, "float32", {"x": (8, 128)}, slope=0.1),
        _c("h0", 121, "float32", {"x": (24, 256)}, True, slope=0.25),
        _c("h1", 122, "bfloat16", {"x": (8, 128)}, True, slope=0.01),
        _c("h2", 123, "float32", {"x": (7, 9)}, True, slope=0.5),
    ),
    structure=_struct(_whole_array),
)


# ----------------------------------------------------------------------------- 02 tiling
A2 = "02_tiling"


def _tiled_add_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn))))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(block_is(call, "output", 0, (bm, bn), "output"))


def _row_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (cdiv(m, bm),)))
    rules.append(block_is(call, "input", 0, (bm, n), "x"))


_task(
    id="tiled_add", assignment=A2, title="Tiled add for any block size",
    kernel_ops=(("add",),),
    reference=lambda x, y, block: x + y,
    cases=(
        _c("v0", 3, "float32", {"x": (32, 256), "y": (32, 256)}, block=(8, 128)),
        _c("h0", 131, "float32", {"x": (37, 300), "y": (37, 300)}, True, block=(8, 128)),
        _c("h1", 132, "bfloat16", {"x": (64, 512), "y": (64, 512)}, True, block=(16, 256)),
        _c("h2", 133, "float32", {"x": (20, 130), "y": (20, 130)}, True, block=(16, 128)),
    ),
    structure=_struct(_tiled_add_rules),
)
_task(
    id="row_sum", assignment=A2, title="Row sums, one block of rows per step",
    kernel_ops=(("reduce_sum",),),
    reference=lambda x, bm: jnp.sum(_f32(x), axis=1, keepdims=True).astype(x.dtype),
    tolerance="reduction",
    cases=(
        _c("v0", 4, "float32", {"x": (32, 128)}, bm=8),
        _c("h0", 141, "float32", {"x": (37, 200)}, True, bm=16),
        _c("h1", 142, "bfloat16", {"x": (64, 256)}, True, bm=32),
        _c("h2", 143, "float32", {"x": (8, 64)}, True, bm=8),
    ),
    structure=_struct(_row_rules),
)
_task(
    id="row_softmax", assignment=A2, title="Row softmax",
    kernel_ops=(("exp",),),
    reference=lambda x, bm: jax.nn.softmax(_f32(x), axis=-1).astype(x.dtype),
    tolerance="reduction",
    cases=(
        _c("v0", 5, "float32", {"x": (16, 128)}, bm=8),
        _c("h0", 151, "float32", {"x": (37, 100)}, True, bm=16),
        _c("h1", 152, "bfloat16", {"x": (32, 256)}, True, bm=8),
        _c("h2", 153, "float32", {"x": (64, 128)}, True, bm=32),
        _c("h3", 154, "float32", {"x": (16, 256)}, True, values="large", bm=8),
    ),
    structure=_struct(_row_rules),
)


# ----------------------------------------------------------------------------- 03 index maps
A3 = "03_index_maps"


def _transpose_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_rank(call, 2))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(block_is(call, "output", 0, (bn, bm), "output"))
    rules.append(read_budget(call, "input", 0, _nbytes((m, n), case.dtype), "x (each block once)"))


def _bias_rules(call, case, rules, inputs):
    (_, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_rank(call, 2))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(block_is(call, "input", 1, (1, bn), "bias"))
    rules.append(read_budget(call, "input", 1, _nbytes((1, n), case.dtype),
                             "bias (each bias block fetched once: order the grid for it)"))


def _sym_rules(call, case, rules, inputs):
    (n, _), b = case.arrays["x"], case.params["b"]
    rules.append(grid_is(call, (cdiv(n, b), cdiv(n, b))))
    rules.append(role_count(call, "input", 2, "x passed twice (two index maps)"))
    rules.append(block_is(call, "input", 0, (b, b), "first x"))
    rules.append(block_is(call, "input", 1, (b, b), "second x"))


def _make_bias(rng, case):
    m, n = case.arrays["x"]
    return {"x": _normal(rng, (m, n), case.dtype), "bias": _normal(rng, (1, n), case.dtype)}


_task(
    id="transpose", assignment=A3, title="Transpose through the index map",
    kernel_ops=(("transpose",),),
    reference=lambda x, block: x.T,
    cases=(
        _c("v0", 6, "float32", {"x": (16, 256)}, block=(8, 128)),
        _c("h0", 161, "float32", {"x": (40, 300)}, True, block=(16, 128)),
        _c("h1", 162, "bfloat16", {"x": (128, 256)}, True, block=(128, 128)),
        _c("h2", 163, "float32", {"x": (24, 16)}, True, block=(8, 8)),
    ),
    structure=_struct(_transpose_rules),
)
_task(
    id="add_bias", assignment=A3, title="Add a row bias, fetching each bias block once",
    kernel_ops=(("add",),),
    reference=lambda x, bias, block: x + bias,
    make=_make_bias,
    cases=(
        _c("v0", 7, "float32", {"x": (32, 256)}, block=(8, 128)),
        _c("h0", 171, "float32", {"x": (37, 300)}, True, block=(16, 128)),
        _c("h1", 172, "bfloat16", {"x": (64, 512)}, True, block=(16, 128)),
        _c("h2", 173, "float32", {"x": (16, 128)}, True, block=(8, 128)),
    ),
    structure=_struct(_bias_rules),
)
_task(
    id="symmetrize", assignment=A3, title="x + x.T with two index maps on one array",
    kernel_ops=(("add",), ("transpose",)),
    reference=lambda x, b: x + x.T,
    cases=(
        _c("v0", 8, "float32", {"x": (32, 32)}, b=16),
        _c("h0", 181, "float32", {"x": (37, 37)}, True, b=16),
        _c("h1", 182, "bfloat16", {"x": (64, 64)}, True, b=32),
        _c("h2", 183, "float32", {"x": (48, 48)}, True, b=8),
    ),
    structure=_struct(_sym_rules),
)


# ----------------------------------------------------------------------------- 04 memory spaces
A4 = "04_memory_spaces"


def _matmul_ref(a, b, *_, **__):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _mm_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk, bn = case.params["bm"], case.params["bk"], case.params["bn"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn), k // bk)))
    rules.append(role_count(call, "scratch", 1, "VMEM accumulator"))
    rules.append(read_budget(call, "input", 0, cdiv(n, bn) * _nbytes((m, k), case.dtype),
                             f"A (at most N/bn = {cdiv(n, bn)} times)"))
    rules.append(read_budget(call, "input", 1, cdiv(m, bm) * _nbytes((k, n), case.dtype),
                             f"B (at most M/bm = {cdiv(m, bm)} times)"))
    rules.extend(total_budget(call, None, _nbytes((m, n), case.dtype)))


def _mm_bias_rules(call, case, rules, inputs):
    _mm_rules(call, case, rules, inputs)
    rules.append(role_count(call, "input", 3, "bias as a kernel input (fused epilogue)"))


def _make_mm(rng, case, bias=False):
    out = {k: _values(rng, s, case) for k, s in case.arrays.items()}
    if bias:
        out["bias"] = _normal(rng, (1, case.arrays["b"][1]), case.dtype)
    return out


def _sum_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn))))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(read_budget(call, "input", 0, _nbytes((m, n), case.dtype), "x (read once)"))
    outs = _ops(call, "output")
    wb = outs[0].writebacks if outs else -1
    rules.append(Rule("output writebacks", "1 (the (1, 1) result stays on chip)", str(wb),
                      wb == 1))


_mm = dict(bm=16, bk=32, bn=64)
_task(
    id="matmul", assignment=A4, title="Matmul with a VMEM accumulator",
    kernel_ops=(("dot_general",),),
    reference=_matmul_ref, tolerance="reduction",
    cases=(
        _c("v0", 9, "float32", {"a": (32, 64), "b": (64, 128)}, **_mm),
        _c("h0", 191, "float32", {"a": (40, 96), "b": (96, 200)}, True, **_mm),
        _c("h1", 192, "bfloat16", {"a": (64, 128), "b": (128, 256)}, True,
           bm=32, bk=64, bn=128),
        _c("h2", 193, "float32", {"a": (16, 32), "b": (32, 64)}, True, bm=16, bk=16, bn=32),
        _c("h3", 194, "bfloat16", {"a": (64, 1024), "b": (1024, 128)}, True, values="positive",
           bm=32, bk=64, bn=128),
    ),
    structure=_struct(_mm_rules),
)
_task(
    id="matmul_bias_relu", assignment=A4, title="Fused bias + ReLU epilogue",
    kernel_ops=(("dot_general",), ("max",)),
    reference=lambda a, b, bias, **_: jnp.maximum(
        jnp.dot(a, b, preferred_element_type=jnp.float32) + _f32(bias), 0).astype(a.dtype),
    tolerance="reduction",
    make=lambda rng, case: _make_mm(rng, case, bias=True),
    cases=(
        _c("v0", 10, "float32", {"a": (32, 64), "b": (64, 128)}, **_mm),
        _c("h0", 201, "float32", {"a": (40, 96), "b": (96, 200)}, True, **_mm),
        _c("h1", 202, "bfloat16", {"a": (64, 128), "b": (128, 256)}, True,
           bm=32, bk=64, bn=128),
        _c("h2", 203, "float32", {"a": (48, 64), "b": (64, 64)}, True, bm=16, bk=64, bn=32),
    ),
    structure=_struct(_mm_bias_rules),
)
_task(
    id="sum_all", assignment=A4, title="Sum of all elements into one resident output block",
    kernel_ops=(("reduce_sum",),),
    reference=lambda x, block: jnp.sum(_f32(x)).reshape(1, 1),
    tolerance="reduction",
    cases=(
        _c("v0", 11, "float32", {"x": (32, 256)}, block=(8, 128)),
        _c("h0", 211, "float32", {"x": (37, 300)}, True, block=(16, 128)),
        _c("h1", 212, "bfloat16", {"x": (64, 256)}, True, block=(32, 128)),
        _c("h2", 213, "float32", {"x": (20, 130)}, True, block=(8, 128)),
    ),
    structure=_struct(_sum_rules),
)


# ----------------------------------------------------------------------------- 05 scalar prefetch
A5 = "05_scalar_prefetch"


def _make_gather(rng, case):
    v, d = case.arrays["table"]
    (n,) = case.arrays["ids"]
    ids = rng.integers(0, v, size=n).astype(np.int32)
    if n > 2:
        ids[1] = ids[0]  # a repeated id: the pipeline can skip the fetch
    return {"table": _normal(rng, (v, d), case.dtype), "ids": ids}


def _gather_rules(call, case, rules, inputs):
    (_, d), (n,) = case.arrays["table"], case.arrays["ids"]
    rules.append(role_count(call, "scalar_prefetch", 1, "scalar prefetch (ids in SMEM)"))
    rules.append(grid_is(call, (n,)))
    rules.append(block_is(call, "input", 0, (1, d), "table"))
    rules.append(read_budget(call, "input", 0, n * _nbytes((1, d), case.dtype),
                             "table (one row per id, never the whole table)"))


def _make_bsmm(rng, case):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk = case.params["bm"], case.params["bk"]
    mask = rng.random((m // bm, k // bk)) < 0.5
    mask[0, :] = False  # a row of blocks with no non-zero block
    mask[-1, -1] = True
    a = _normal(rng, (m, k), case.dtype)
    full = np.kron(mask, np.ones((bm, bk), bool))
    a = np.where(full, a, np.zeros_like(a))
    return {"a": a, "b": _normal(rng, (k, n), case.dtype), "block_mask": mask.astype(np.int32)}


def _bsmm_rules(call, case, rules, inputs):
    _, (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk, bn = case.params["bm"], case.params["bk"], case.params["bn"]
    mask = np.asarray(inputs["block_mask"])
    rules.append(role_count(call, "scalar_prefetch", 1, "scalar prefetch (block indices)"))
    per_row = np.maximum(mask.sum(axis=1), 1)
    budget = int(per_row.sum()) * cdiv(n, bn) * _nbytes((bm, bk), case.dtype)
    rules.append(read_budget(call, "input", 0, budget,
                             f"A (only its {int(mask.sum())} non-zero blocks, per column block)"))


def _invoke_bsmm(fn, arrays, params):
    a, b, mask = arrays
    p = {k: v for k, v in params.items() if not k.startswith("_")}
    return fn(a, b, np.asarray(mask), **p)


def _bsmm_ref(a, b, block_mask, **_):
    return _matmul_ref(a, b)


def _make_gmm(rng, case):
    (m, k), (g, _, n) = case.arrays["x"], case.arrays["w"]
    bm = case.params["bm"]
    blocks = m // bm
    if case.values == "skewed":  # one group takes almost every block; most groups are empty
        sizes = np.zeros(g, np.int64)
        sizes[g // 2], sizes[-1] = 1, 1
        sizes[0] = blocks - sizes.sum()
        sizes *= bm
    else:
        cuts = np.sort(rng.choice(np.arange(1, blocks), size=g - 1, replace=False))
        sizes = np.diff(np.concatenate([[0], cuts, [blocks]])) * bm
    return {"x": _normal(rng, (m, k), case.dtype), "w": _normal(rng, (g, k, n), case.dtype),
            "group_sizes": sizes.astype(np.int32)}


def _gmm_ref(x, w, group_sizes, **_):
    gid = np.repeat(np.arange(w.shape[0]), np.asarray(group_sizes))
    return jnp.einsum("mk,mkn->mn", _f32(x), _f32(w[gid]),
                      preferred_element_type=jnp.float32).astype(x.dtype)


def _gmm_rules(call, case, rules, inputs):
    (m, k), (_, _, n) = case.arrays["x"], case.arrays["w"]
    bm, bn = case.params["bm"], case.params["bn"]
    rules.append(role_count(call, "scalar_prefetch", 1, "scalar prefetch (group of each block)"))
    rules.append(grid_is(call, (m // bm, cdiv(n, bn))))
    rules.append(read_budget(call, "input", 1, (m // bm) * _nbytes((k, n), case.dtype),
                             "w (only the block's own group, never all groups)"))


def _invoke_gmm(fn, arrays, params):
    x, w, sizes = arrays
    return fn(x, w, np.asarray(sizes), **params)


_task(
    id="gather_rows", assignment=A5, title="Embedding gather with scalar prefetch",
    reference=lambda table, ids: table[ids],
    make=_make_gather,
    cases=(
        _c("v0", 12, "float32", {"table": (32, 128), "ids": (8,)}),
        _c("h0", 221, "float32", {"table": (100, 256), "ids": (37,)}, True),
        _c("h1", 222, "bfloat16", {"table": (64, 128), "ids": (16,)}, True),
        _c("h2", 223, "float32", {"table": (8, 128), "ids": (3,)}, True),
    ),
    structure=_struct(_gather_rules),
)
_task(
    id="block_sparse_matmul", assignment=A5, title="Block-sparse matmul",
    kernel_ops=(("dot_general",),), host_inputs=1,
    reference=_bsmm_ref, tolerance="reduction", make=_make_bsmm, invoke=_invoke_bsmm,
    cases=(
        _c("v0", 13, "float32", {"a": (64, 128), "b": (128, 128), "block_mask": (4, 4)},
           bm=16, bk=32, bn=64),
        _c("h0", 231, "float32", {"a": (64, 128), "b": (128, 200), "block_mask": (4, 4)},
           True, bm=16, bk=32, bn=64),
        _c("h1", 232, "bfloat16", {"a": (128, 256), "b": (256, 128), "block_mask": (4, 4)},
           True, bm=32, bk=64, bn=128),
        _c("h2", 233, "float32", {"a": (96, 96), "b": (96, 64), "block_mask": (6, 3)},
           True, bm=16, bk=32, bn=32),
    ),
    structure=_struct(_bsmm_rules),
)
_task(
    id="grouped_matmul", assignment=A5, title="Grouped matmul (one weight per group of rows)",
    kernel_ops=(("dot_general",),), host_inputs=1,
    reference=_gmm_ref, tolerance="reduction", make=_make_gmm, invoke=_invoke_gmm,
    cases=(
        # more groups than row blocks, some empty: reading every group's weights cannot fit
        _c("v0", 14, "float32", {"x": (64, 32), "w": (6, 32, 128), "group_sizes": (6,)},
           values="skewed", bm=16, bn=128),
        _c("h0", 241, "float32", {"x": (128, 64), "w": (4, 64, 200), "group_sizes": (4,)},
           True, bm=16, bn=64),
        _c("h1", 242, "bfloat16", {"x": (64, 64), "w": (2, 64, 128), "group_sizes": (2,)},
           True, bm=16, bn=128),
        _c("h2", 243, "float32", {"x": (96, 32), "w": (5, 32, 64), "group_sizes": (5,)},
           True, bm=8, bn=32),
        _c("h3", 244, "float32", {"x": (128, 64), "w": (8, 64, 128), "group_sizes": (8,)},
           True, values="skewed", bm=16, bn=64),
    ),
    structure=_struct(_gmm_rules),
)


# ----------------------------------------------------------------------------- 06 performance
A6 = "06_performance"


def _fused_rules_all(t, case, inputs) -> list[Rule]:
    rules = [calls_exactly(t, 1)]
    if t.calls:
        shape = case.arrays["x"]
        b = _nbytes(shape, case.dtype)
        rules.extend(total_budget(t.calls[0], 3 * b, b))
    return rules


def _tuned_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    ideal = _nbytes((m, k), case.dtype) + _nbytes((k, n), case.dtype)
    rules.extend(total_budget(call, 4 * ideal, _nbytes((m, n), case.dtype)))
    limit = 16 * 2**20
    rules.append(Rule("on-chip peak", f"<= {limit:,} B (v5e scoped VMEM)",
                      f"{call.onchip_peak_bytes:,} B", call.onchip_peak_bytes <= limit))


def _ln_ref(x, gamma, beta, bm):
    xf = _f32(x)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    return ((xf - mu) * jax.lax.rsqrt(var + 1e-5) * _f32(gamma) + _f32(beta)).astype(x.dtype)


def _make_ln(rng, case):
    m, n = case.arrays["x"]
    return {"x": _normal(rng, (m, n), case.dtype), "gamma": _normal(rng, (1, n), case.dtype),
            "beta": _normal(rng, (1, n), case.dtype)}


def _ln_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (cdiv(m, bm),)))
    b = _nbytes((m, n), case.dtype)
    rules.append(read_budget(call, "input", 0, b, "x (one pass)"))
    rules.append(read_budget(call, "input", 1, _nbytes((1, n), case.dtype), "gamma (once)"))
    rules.append(read_budget(call, "input", 2, _nbytes((1, n), case.dtype), "beta (once)"))
    rules.extend(total_budget(call, None, b))


_task(
    id="fused_add_relu_mul", assignment=A6, title="relu(x + y) * z in one pass over HBM",
    kernel_ops=(("add",), ("max",), ("mul",)),
    reference=lambda x, y, z: (jnp.maximum(x + y, 0) * z).astype(x.dtype),
    tolerance="exact",
    cases=(
        _c("v0", 15, "float32", {"x": (64, 256), "y": (64, 256), "z": (64, 256)}),
        _c("h0", 251, "float32", {"x": (100, 200), "y": (100, 200), "z": (100, 200)}, True),
        _c("h1", 252, "bfloat16", {"x": (64, 256), "y": (64, 256), "z": (64, 256)}, True),
        _c("h2", 253, "float32", {"x": (8, 128), "y": (8, 128), "z": (8, 128)}, True),
    ),
    structure=_fused_rules_all,
)
_task(
    id="matmul_tuned", assignment=A6, title="Choose matmul blocks within a traffic budget",
    kernel_ops=(("dot_general",),),
    reference=_matmul_ref, tolerance="reduction",
    cases=(
        _c("v0", 16, "float32", {"a": (256, 128), "b": (128, 256)}),
        _c("h0", 261, "float32", {"a": (384, 128), "b": (128, 256)}, True),
        _c("h1", 262, "bfloat16", {"a": (256, 256), "b": (256, 256)}, True),
        _c("h2", 263, "float32", {"a": (128, 128), "b": (128, 384)}, True),
    ),
    structure=_struct(_tuned_rules),
)
_task(
    id="layernorm", assignment=A6, title="LayerNorm in one pass",
    kernel_ops=(("reduce_sum",), ("rsqrt", "sqrt")),
    reference=_ln_ref, tolerance="reduction", make=_make_ln,
    cases=(
        _c("v0", 17, "float32", {"x": (32, 256)}, bm=8),
        _c("h0", 271, "float32", {"x": (37, 384)}, True, bm=16),
        _c("h1", 272, "bfloat16", {"x": (64, 256)}, True, bm=32),
        _c("h2", 273, "float32", {"x": (16, 128)}, True, bm=16),
    ),
    structure=_struct(_ln_rules),
)


# ----------------------------------------------------------------------------- 07 flash attention
A7 = "07_flash_attention"


def _scores_ref(q, k, bq, bk):
    d = q.shape[-1]
    return (jnp.dot(q, k.T, preferred_element_type=jnp.float32) / math.sqrt(d)).astype(q.dtype)


def _attn_ref(q, k, v, bq, bk, causal=False):
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape
        s = jnp.where(jnp.arange(lq)[:, None] >= jnp.arange(lk)[None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.dot(p, _f32(v)).astype(q.dtype)


def _scores_rules(call, case, rules, inputs):
    (lq, _), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk = case.params["bq"], case.params["bk"]
    rules.append(grid_is(call, (cdiv(lq, bq), cdiv(lk, bk))))
    rules.append(block_is(call, "output", 0, (bq, bk), "scores"))


def _flash_rules(call, case, rules, inputs, causal=False):
    (lq, d), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk = case.params["bq"], case.params["bk"]
    rules.append(grid_is(call, (cdiv(lq, bq), lk // bk)))
    rules.extend(total_budget(call, None, _nbytes((lq, d), case.dtype)))
    if causal:
        needed = sum(min(lk // bk, cdiv(min(lq, (i + 1) * bq), bk)) for i in range(cdiv(lq, bq)))
        budget = needed * _nbytes((bk, d), case.dtype)
        label = f"k (only the {needed} blocks at or below the diagonal)"
    else:
        budget = cdiv(lq, bq) * _nbytes((lk, d), case.dtype)
        label = f"k (once per query block, {cdiv(lq, bq)} times)"
    rules.append(read_budget(call, "input", 1, budget, label))
    rules.append(Rule("no (Lq, Lk) scores in HBM", f"writes <= {_nbytes((lq, d), case.dtype):,} B",
                      f"{call.hbm_write_bytes:,} B",
                      call.hbm_write_bytes <= _nbytes((lq, d), case.dtype)))


_qkv = lambda lq, lk, d: {"q": (lq, d), "k": (lk, d), "v": (lk, d)}  # noqa: E731
_task(
    id="attention_scores", assignment=A7, title="Tiled scaled scores q @ k.T / sqrt(d)",
    kernel_ops=(("dot_general",),),
    reference=_scores_ref, tolerance="reduction",
    cases=(
        _c("v0", 18, "float32", {"q": (32, 64), "k": (64, 64)}, bq=16, bk=32),
        _c("h0", 281, "float32", {"q": (40, 64), "k": (100, 64)}, True, bq=16, bk=32),
        _c("h1", 282, "bfloat16", {"q": (64, 128), "k": (64, 128)}, True, bq=32, bk=32),
        _c("h2", 283, "float32", {"q": (16, 32), "k": (48, 32)}, True, bq=8, bk=16),
    ),
    structure=_struct(_scores_rules),
)
_task(
    id="flash_attention", assignment=A7, title="Flash-attention forward (online softmax)",
    kernel_ops=(("dot_general",), ("exp",)),
    reference=_attn_ref, tolerance="attention",
    cases=(
        _c("v0", 19, "float32", _qkv(32, 128, 64), bq=16, bk=32),
        _c("h0", 291, "float32", _qkv(40, 128, 64), True, bq=16, bk=32),
        _c("h1", 292, "bfloat16", _qkv(64, 128, 128), True, bq=32, bk=64),
        _c("h2", 293, "float32", _qkv(16, 48, 32), True, bq=8, bk=16),
        _c("h3", 294, "float32", _qkv(32, 128, 64), True, values="large", bq=16, bk=32),
    ),
    structure=_struct(_flash_rules),
)
_task(
    id="causal_flash_attention", assignment=A7, title="Causal flash attention, skipping blocks",
    kernel_ops=(("dot_general",), ("exp",)),
    reference=lambda q, k, v, bq, bk: _attn_ref(q, k, v, bq, bk, causal=True),
    tolerance="attention",
    cases=(
        _c("v0", 20, "float32", _qkv(64, 64, 64), bq=16, bk=16),
        _c("h0", 301, "float32", _qkv(96, 96, 64), True, bq=32, bk=16),
        _c("h1", 302, "bfloat16", _qkv(128, 128, 128), True, bq=32, bk=32),
        _c("h2", 303, "float32", _qkv(48, 48, 32), True, bq=16, bk=16),
        _c("h3", 304, "float32", _qkv(64, 64, 64), True, values="large", bq=16, bk=16),
    ),
    structure=_struct(lambda call, case, rules, inputs: _flash_rules(call, case, rules, inputs,
                                                                   causal=True)),
)

BY_ID: dict[str, Task] = {t.id: t for t in TASKS}
ASSIGNMENTS: list[str] = sorted({t.assignment for t in TASKS})
assert len(BY_ID) == len(TASKS), "duplicate task ids"


def get(task_id: str) -> Task:
    try:
        return BY_ID[task_id]
    except KeyError:
        raise KeyError(f"unknown task {task_id!r}; known tasks: {', '.join(BY_ID)}") from None
