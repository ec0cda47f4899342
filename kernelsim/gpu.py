"""kernelsim's Mosaic GPU model: a ``plgpu.kernel`` as one CTA's program of TMA copies, barrier
waits and WGMMAs, and its shared-memory footprint as the lowering allocates it.

A Mosaic GPU kernel has no BlockSpec pipeline for kernelsim's TPU-shaped schedule to replay:
the kernel receives global-memory refs, and what moves is what its body does: TMA copies
global -> shared memory (``plgpu.copy_gmem_to_smem``, and the ones ``plgpu.emit_pipeline``
issues) that complete on a barrier, barrier waits, WGMMAs reading shared memory into an
accumulator in registers, TMA copies shared -> global memory, and plain loads and stores of
global memory into registers. ``analyse`` finds every kernel a function launches (in its
jaxpr: no kernel runs) and walks one CTA's body in program order, evaluating the scalar
arithmetic that loop trip counts, slot indices and branch predicates need (the CTA's own grid
coordinates included) and nothing else. A WGMMA's event also says how it reads each operand
(the swizzle and tiling its shared-memory ref is read through, a transpose, or registers) and
how many WGMMAs its accumulator has summed since it was allocated or stored to.

Shared-memory footprint: the rules of the Mosaic GPU lowering's resource estimate
(``_estimate_resources`` in jax/_src/pallas/mosaic_gpu/lowering.py, jax 0.12.0.1), rule for
rule: a ``run_scoped`` holds the sum of its SMEM allocations, each rounded up to 1024 bytes
(``SMEM_ALIGNMENT``), plus the most its body holds at once; sequential scopes reuse the space
(the maximum); a reduction reserves ``CompilerParams.reduction_scratch_bytes``; barriers take
8 bytes each (``MBARRIER_BYTES``), counted as the lowering counts them. The total is the
``smem_bytes`` the lowering checks against the 227 KiB a block may use.

One hazard is checked: a TMA copy that refills a pipeline slot which a WGMMA may still be
reading -- one that an explicit ``plgpu.wgmma_wait(n)`` with ``n > 0`` left in flight (the
race behind wrong values of the course's pipelined matmul on an H200; GPU interpret mode runs
WGMMA synchronously and cannot show it). WGMMAs with no wait after them are not judged: how
the lowering orders those is not modelled.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from kernelsim import adapter
from kernelsim.backend import NeedsNewerJax
from kernelsim.chips import Chip, get_chip
from kernelsim.cost.l2 import read_key, wave_read_bytes
from kernelsim.errors import TraceError
from kernelsim.mosaic_gpu.kernel_data import Allocation, GpuEvent, GpuKernelData, WgmmaOperand
from kernelsim.mosaic_gpu.refs import (
    UNKNOWN,
    Ref,
    ref_name,
    slot_index,
    smem_layout,
    transformed_shape,
)
from kernelsim.views import viewer

SMEM_ALIGNMENT = 1024  # jax/_src/pallas/mosaic_gpu/core.py
MBARRIER_BYTES = 8  # jax/experimental/mosaic/gpu/utils.py
REDUCTION_SCRATCH_BYTES = 128 * 4 * 4  # plgpu.CompilerParams' default
MAX_EVENTS = 20_000  # one CTA's events kept; later ones are counted, not listed


@dataclass
class GpuKernel(GpuKernelData):
    """One Mosaic GPU kernel: its launch, one CTA's events and the whole launch's totals
    (``GpuKernelData``), with its viewer."""

    def show(self):
        """The interactive viewer of this kernel (global / shared memory / registers lanes,
        each warpgroup's events in program order): an anywidget in a notebook front end,
        the standalone HTML viewer elsewhere (nbconvert, the site build)."""
        return viewer.show_gpu(self)

    def to_html(self, path: Any = None, fragment: bool = False) -> str:
        """The standalone viewer (data and module inline, no network); written to ``path``
        if given, always returned. fragment: a ``<div>`` to embed in another page."""
        return viewer.gpu_to_html(self, path, fragment)


# ---------------------------------------------------------------------------------------------
# Reading the jaxpr (public jax.make_jaxpr output; primitives by name)


def _sub_jaxprs(eqn) -> list:
    """The jaxprs an equation's parameters hold (open jaxprs; closed ones unwrapped)."""
    found = []
    for value in eqn.params.values():
        for v in value if isinstance(value, tuple | list) else (value,):
            if hasattr(v, "eqns"):
                found.append(v)
            elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
                found.append(v.jaxpr)
    return found


def _find_kernels(jaxpr) -> list:
    """Every ``mpmd_map`` equation on a GPU mesh (what ``plgpu.kernel`` binds; ``pl.kernel`` on a
    TPU mesh binds it too), in program order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "mpmd_map" and hasattr(eqn.params["meshes"][0], "grid_names"):
            found.append(eqn)
        else:
            for sub in _sub_jaxprs(eqn):
                found += _find_kernels(sub)
    return found


def _is_barrier(aval) -> bool:
    return "barrier" in type(getattr(aval, "dtype", None)).__name__.lower()


def _space(aval) -> str:
    return str(getattr(aval, "memory_space", "")).lower()


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def _barrier_key(aval) -> tuple:
    d = aval.dtype
    return (type(d).__name__, getattr(d, "num_arrivals", 1), math.prod(aval.shape),
            getattr(d, "orders_tensor_core", False), str(getattr(d, "collective_axes", "")))


# ---------------------------------------------------------------------------------------------
# Shared-memory footprint: the lowering's resource estimate, rule for rule


def _align(n: int) -> int:
    return -(-n // SMEM_ALIGNMENT) * SMEM_ALIGNMENT


_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}


def _resources(jaxpr, reduction_bytes: int) -> tuple[int, Counter]:
    """(SMEM bytes, barriers) the body holds at its peak: sequential equations reuse space."""
    smem, barriers = 0, Counter()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "run_scoped":
            inner = eqn.params["jaxpr"]
            here, held = 0, Counter()
            for v in inner.invars:
                if _is_barrier(v.aval):
                    held[_barrier_key(v.aval)] += 1
                elif _space(v.aval) == "smem":
                    here += _align(_nbytes(v.aval.shape, v.aval.dtype))
            body_smem, body_barriers = _resources(inner, reduction_bytes)
            rule = (_align(here + body_smem), held + body_barriers)
        elif name in _REDUCTIONS:
            rule = (_align(reduction_bytes), Counter())
        elif subs := _sub_jaxprs(eqn):
            rule = (0, Counter())
            for sub in subs:  # cond's branches, a loop's body and condition: the maximum
                s, b = _resources(sub, reduction_bytes)
                rule = (max(rule[0], s), rule[1] | b)
        else:
            continue
        smem, barriers = max(smem, rule[0]), barriers | rule[1]
    return smem, barriers


def _barrier_count(barriers: Counter) -> int:
    return sum(key[2] * n for key, n in barriers.items())


# ---------------------------------------------------------------------------------------------
# One CTA's events: the body walked in program order, scalar arithmetic evaluated


_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "max": max, "min": min, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
           "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "and": lambda a, b: a & b, "or": lambda a, b: a | b,
           "rem": lambda a, b: int(math.fmod(a, b)), "div": lambda a, b: int(a / b)}


class _Walker:
    def __init__(self, coords: dict[str, int], thread_axis: str | None, warpgroup: int):
        self.coords = coords
        self.thread_axis = thread_axis
        self.warpgroup = warpgroup
        self.events: list[GpuEvent] = []
        self.allocations: list[Allocation] = []
        self.named: dict[int, int] = {}  # id of an allocation's variable -> its number
        self.dropped = 0
        self.order = 0
        self.loops = 0  # loops entered so far, for numbering them
        self.loop = -1  # the innermost loop being walked
        self.totals = Counter()
        # shared-memory (buffer, slot)s each WGMMA reads, oldest first: issued since the last
        # wgmma_wait (pending), and those an explicit wgmma_wait(n > 0) left in flight
        self.pending: list[set[tuple[str, int]]] = []
        self.inflight: list[set[tuple[str, int]]] = []
        self.hazards: list[str] = []
        # per accumulator, the WGMMAs added onto it since it was allocated or stored to
        self.accumulated: Counter = Counter()
        self.reads: list[tuple[tuple, int]] = []  # global reads, for kernelsim.cost.l2

    # values -------------------------------------------------------------------------------

    def read(self, env, v):
        if hasattr(v, "val"):  # a Literal
            return v.val if np.ndim(v.val) == 0 else UNKNOWN
        return env.get(v, UNKNOWN)

    def emit(self, kind, step, conditional, **kw):
        self.totals[kind + ":bytes"] += kw.get("bytes", 0)
        self.totals[kind + ":flops"] += kw.get("flops", 0)
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self.events.append(GpuEvent(self.order, self.warpgroup, kind, step, self.loop,
                                    conditional=conditional, **kw))
        self.order += 1

    # the walk -----------------------------------------------------------------------------

    def run(self, jaxpr, args, step=(), conditional=False, consts=()):
        env = dict(zip(jaxpr.invars, args, strict=True))
        env.update(zip(getattr(jaxpr, "constvars", ()), consts, strict=False))
        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, env, step, conditional)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            for v, o in zip(eqn.outvars, outs, strict=False):
                env[v] = o
        return [self.read(env, v) for v in jaxpr.outvars]

    def eqn(self, eqn, env, step, conditional):
        name = eqn.primitive.name
        ins = [self.read(env, v) for v in eqn.invars]
        unknown = [UNKNOWN] * len(eqn.outvars)
        p = eqn.params
        if name == "axis_index":
            axis = p["axis_name"]
            axis = axis[0] if isinstance(axis, tuple) and len(axis) == 1 else axis
            return self.warpgroup if axis == self.thread_axis else self.coords.get(axis, 0)
        if name in _BINARY and len(ins) == 2 and UNKNOWN not in ins:
            return _BINARY[name](*(int(x) for x in ins))
        if name == "convert_element_type" and ins[0] is not UNKNOWN:
            return int(ins[0])
        if name == "not" and ins[0] is not UNKNOWN:
            return ~int(ins[0]) if not isinstance(ins[0], bool) else not ins[0]
        if name == "select_n" and UNKNOWN not in ins:
            return ins[1 + int(ins[0])]
        if name == "run_scoped":
            inner = p["jaxpr"]
            refs = [self.allocate(v) for v in inner.invars]
            self.run(inner, refs, step, conditional, consts=ins)  # it closes over ``ins``
            return unknown if eqn.primitive.multiple_results else UNKNOWN
        if name == "scan":
            return self.scan(eqn, ins, step, conditional)
        if name == "while":
            return self.while_(eqn, ins, step, conditional)
        if name == "cond":
            branches = p["branches"]
            index = ins[0]
            known = index is not UNKNOWN
            branch = branches[min(int(index), len(branches) - 1)] if known else branches[-1]
            return self.run(branch.jaxpr, ins[1:], step, conditional or not known)
        if name in ("copy_gmem_to_smem", "copy_smem_to_gmem"):
            self.copy(eqn, ins, step, conditional)
        elif name in ("barrier_wait", "barrier_arrive"):
            self.emit(name, step, conditional, barrier=ref_name(ins[0]))
        elif name in ("wgmma", "wgmma_ref"):
            self.wgmma(eqn, ins, step, conditional)
        elif name == "wgmma_wait":
            n, issued = p.get("n", 0), self.inflight + self.pending
            self.inflight, self.pending = (issued[len(issued) - n:] if n else []), []
            self.emit("wgmma_wait", step, conditional)
        elif name == "wgmma_accumulator_deref":  # reading the accumulator waits for all
            self.inflight, self.pending = [], []
        elif name == "wgmma_accumulator_store":  # acc_ref[...] = value starts it again
            self.accumulated[ref_name(ins[0])] = 0
        elif name == "commit_smem":
            self.emit("commit_smem", step, conditional)
        elif name == "wait_smem_to_gmem":
            self.emit("wait_tma_store", step, conditional)
        elif name in ("get", "swap") and isinstance(ins[0], Ref) and ins[0].space == "gmem":
            out_aval = eqn.outvars[0].aval
            kind = "load" if name == "get" else "store"
            if kind == "load":
                self.reads.append(((ins[0].name, str(p.get("tree")), read_key(ins[1:], UNKNOWN)),
                                   _nbytes(out_aval.shape, out_aval.dtype)))
            self.emit(kind, step, conditional, bytes=_nbytes(out_aval.shape, out_aval.dtype),
                      **({"src": ins[0].name} if kind == "load" else {"dst": ins[0].name}))
        elif (subs := _sub_jaxprs(eqn)) and len(subs) == 1 and \
                len(subs[0].invars) == len(ins):  # jit, custom_jvp/vjp, run_state
            outs = self.run(subs[0], ins, step, conditional)
            return outs if eqn.primitive.multiple_results else outs[0]
        return unknown if eqn.primitive.multiple_results else UNKNOWN

    def allocate(self, var) -> Ref:
        """A ``run_scoped`` allocation's ref, one name per variable in every warpgroup's walk."""
        aval, index = var.aval, self.named.setdefault(id(var), len(self.named))
        if _is_barrier(aval):
            ref = Ref(f"barrier{index}", "barrier", tuple(aval.shape), "barrier")
            nbytes = math.prod(aval.shape) * MBARRIER_BYTES
        else:
            space = _space(aval) or "smem"
            ref = Ref(f"{space}{index}", space, tuple(aval.shape), aval.dtype)
            nbytes = _nbytes(aval.shape, aval.dtype)
            nbytes = _align(nbytes) if space == "smem" else nbytes
            self.accumulated[ref.name] = 0  # a WGMMA accumulator starts fresh here
        if not any(a.name == ref.name for a in self.allocations) and self.warpgroup == 0:
            self.allocations.append(Allocation(ref.name, ref.space, ref.shape,
                                               str(ref.dtype), nbytes))
        return ref

    def scan(self, eqn, ins, step, conditional):
        p = eqn.params
        if "num_consts" in p:  # jax <= 0.11
            nc, ncarry = p["num_consts"], p["num_carry"]
        else:  # jax 0.12: a flat tree groups the operands as (consts, carry, xs)
            groups = p["ft_in"].update(list(range(len(ins)))).unpack()
            nc, ncarry = len(list(groups[0])), len(list(groups[1]))
        consts, carry = ins[:nc], ins[nc:nc + ncarry]
        xs = [UNKNOWN] * (len(ins) - nc - ncarry)
        outer, self.loop, self.loops = self.loop, self.loops, self.loops + 1
        for i in range(p["length"]):
            outs = self.run(p["jaxpr"].jaxpr, consts + carry + xs, step + (i,), conditional)
            carry = outs[:ncarry]
        self.loop = outer
        return carry + [UNKNOWN] * (len(eqn.outvars) - ncarry)

    def while_(self, eqn, ins, step, conditional, cap: int = 1 << 16):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = ins[:cn], ins[cn:cn + bn], ins[cn + bn:]
        outer, self.loop, self.loops = self.loop, self.loops, self.loops + 1
        try:
            return self._iterate(p, cconsts, bconsts, carry, step, conditional, cap)
        finally:
            self.loop = outer

    def _iterate(self, p, cconsts, bconsts, carry, step, conditional, cap):
        for i in range(cap):
            (go,) = self.run(p["cond_jaxpr"].jaxpr, cconsts + carry, step, conditional)
            if go is UNKNOWN:  # one iteration, marked: the trip count depends on data
                return self.run(p["body_jaxpr"].jaxpr, bconsts + carry, step + (i,), True)
            if not go:
                break
            carry = self.run(p["body_jaxpr"].jaxpr, bconsts + carry, step + (i,), conditional)
        return carry

    def copy(self, eqn, ins, step, conditional):
        p = eqn.params
        load = eqn.primitive.name == "copy_gmem_to_smem"
        src, dst = ins[0], ins[1]
        rest = ins[2 + (load and p.get("has_barrier", False)):]
        n_src = p["src_transforms_treedef"].num_leaves
        n_dst = p["dst_transforms_treedef"].num_leaves
        # bytes from the global-memory side: its slice carries no shared-memory tiling
        gmem, tree, leaves = ((src, p["src_transforms_treedef"], rest[:n_src]) if load else
                              (dst, p["dst_transforms_treedef"], rest[n_src:n_src + n_dst]))
        nbytes = (_nbytes(transformed_shape(gmem, tree, leaves), gmem.dtype)
                  if isinstance(gmem, Ref) else 0)
        if load:
            slot = slot_index(dst, p["dst_transforms_treedef"], rest[n_src:n_src + n_dst])
            if slot is not None and any((dst.name, slot) in group for group in self.inflight):
                self.hazards.append(
                    f"loop {self.loop} step {step[-1] if step else '-'}: a TMA copy refills "
                    f"{dst.name} slot {slot} while a WGMMA issued earlier may still read it "
                    "(a wgmma_wait(n > 0) left it in flight): refill one step later "
                    "(plgpu.BlockSpec(..., delay_release=1)) or wait for it (wgmma_wait(0))")
            self.reads.append(((ref_name(src), str(tree), read_key(leaves, UNKNOWN)), nbytes))
            barrier = ref_name(ins[2]) if p.get("has_barrier") else ""
            self.emit("tma_load", step, conditional, src=ref_name(src), dst=ref_name(dst),
                      barrier=barrier, bytes=nbytes)
        else:
            self.emit("tma_store", step, conditional, src=ref_name(src), dst=ref_name(dst),
                      bytes=nbytes)

    def wgmma(self, eqn, ins, step, conditional):
        p = eqn.params
        acc, a = eqn.invars[0].aval, eqn.invars[1].aval
        m, n = acc.shape[-2], acc.shape[-1]
        shape = tuple(a.shape)
        trees = [p.get(f"{x}_transforms_tree") for x in ("acc", "a", "b")]
        if trees[1] is not None:  # a is a slice of a shared-memory allocation
            skip = 3 + (trees[0].num_leaves if trees[0] is not None else 0)
            shape = transformed_shape(Ref("a", "smem", shape, a.dtype), trees[1],
                                       ins[skip:skip + trees[1].num_leaves])
        k = math.prod(shape) // m  # a tiled SMEM ref keeps its (m, k) elements, not its shape
        reads, operands = set(), []
        skip = 3
        for name, var, ref, tree in zip("ab", eqn.invars[1:3], ins[1:3], trees[1:], strict=True):
            n_leaves = tree.num_leaves if tree is not None else 0
            if trees[0] is not None and skip == 3:
                skip += trees[0].num_leaves
            leaves = ins[skip:skip + n_leaves]
            slot = slot_index(ref, tree, leaves)
            if slot is not None:
                reads.add((ref.name, slot))
            swizzle, tiling, transposed = smem_layout(tree, leaves)
            operands.append(WgmmaOperand(name, not isinstance(ref, Ref), swizzle, tiling,
                                         transposed, np.dtype(var.aval.dtype).itemsize))
            skip += n_leaves
        self.pending.append(reads)
        acc_name = ref_name(ins[0])
        self.accumulated[acc_name] += 1
        self.emit("wgmma", step, conditional, flops=2 * m * n * k, operands=tuple(operands),
                  accumulation=self.accumulated[acc_name])


# ---------------------------------------------------------------------------------------------
# Entry point


def analyse(fn: Callable, *args: Any, chip: str = "h100",
            cta: tuple[int, ...] | None = None) -> list[GpuKernel]:
    """Every Mosaic GPU kernel (``plgpu.kernel``) ``fn(*args)`` launches, modelled on ``chip``.

    Nothing executes: ``fn`` is traced to a jaxpr. cta: the grid coordinates of the CTA whose
    events are listed (default: the first CTA).
    """
    if not adapter.models_mosaic_gpu():
        raise NeedsNewerJax(
            "kernelsim.gpu models Mosaic GPU kernels as the releases with GPU interpret mode "
            f"lower them; JAX {adapter.RUNNING_JAX} is older: this needs a newer release, such "
            f"as JAX {adapter.SUPPORTED_JAX[-1]}")
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), args)
    kernels = kernels_in(jax.make_jaxpr(fn)(*shapes), chip=chip, cta=cta)
    if not kernels:
        raise TraceError(f"{getattr(fn, '__name__', fn)!r} launches no Mosaic GPU kernel "
                         "(plgpu.kernel)")
    return kernels


def kernels_in(program, chip: str = "h100", cta: tuple[int, ...] | None = None
               ) -> list[GpuKernel]:
    """``analyse`` on a program already traced (``jax.make_jaxpr``'s, open or closed): every
    Mosaic GPU kernel it launches, in program order ([] when none)."""
    jaxpr = program if hasattr(program, "eqns") else program.jaxpr
    return [_kernel(eqn, get_chip(chip), cta) for eqn in _find_kernels(jaxpr)]


def _kernel(eqn, chip: Chip, cta) -> GpuKernel:
    p = eqn.params
    mesh, jaxpr = p["meshes"][0], p["jaxprs"][0]
    grid = tuple(getattr(mesh, "grid", ()) or ())
    names = tuple(getattr(mesh, "grid_names", ()) or ())
    cluster_names = tuple(getattr(mesh, "cluster_names", ()) or ())
    threads = getattr(mesh, "num_threads", None) or 1
    coords = dict(zip(names, cta or (0,) * len(grid), strict=False))
    coords.update({n: 0 for n in cluster_names})
    params = p.get("compiler_params")
    reduction = getattr(params, "reduction_scratch_bytes", None) or REDUCTION_SCRATCH_BYTES
    smem, barriers = _resources(jaxpr, reduction)
    n_barriers = _barrier_count(barriers)
    smem_total = smem + n_barriers * MBARRIER_BYTES
    io = [Ref(f"in{i}" if i < len(jaxpr.invars) - len(p["out_avals"]) else
               f"out{i - (len(jaxpr.invars) - len(p['out_avals']))}", "gmem",
               tuple(v.aval.shape), v.aval.dtype) for i, v in enumerate(jaxpr.invars)]
    walkers = _walk(jaxpr, io, coords, mesh, threads)
    events, allocations, dropped, totals, hazards = [], [], 0, Counter(), []
    for walker in walkers:
        events += walker.events
        allocations = allocations or walker.allocations
        dropped += walker.dropped
        totals += walker.totals
        hazards += walker.hazards
    ctas = math.prod(grid) * max(1, math.prod(getattr(mesh, "cluster", ()) or ()))
    read = round(ctas * wave_read_bytes(
        [r for w in walkers for r in w.reads],
        lambda moved: [r for w in _walk(jaxpr, io, moved, mesh, threads) for r in w.reads],
        names, grid, coords, chip.sms, {r.name: _nbytes(r.shape, r.dtype) for r in io}))
    write = ctas * (totals["tma_store:bytes"] + totals["store:bytes"])
    flops = ctas * totals["wgmma:flops"]
    warnings = hazards[:1] + ([f"... and {len(hazards) - 1} more such refills"]
                              if len(hazards) > 1 else [])
    if smem_total > chip.vmem_bytes:
        warnings.append(f"shared memory {smem_total:,} B per CTA exceeds {chip.name}'s "
                        f"{chip.vmem_bytes:,} B: fewer pipeline stages or smaller tiles.")
    return GpuKernel(p.get("name") or "kernel", grid, names, threads, tuple(cta or (0,) *
                     len(grid)), allocations, smem_total, n_barriers, events, dropped, read,
                     write, flops, flops / chip.flops_per_second(("bfloat16",)),
                     (read + write) / chip.estimate_bytes_per_second, warnings, chip.name,
                     ctas * (totals["tma_load:bytes"] + totals["load:bytes"]))


def _walk(jaxpr, io, coords, mesh, threads) -> list[_Walker]:
    """One CTA's walk, one walker per warpgroup."""
    walkers = [_Walker(coords, getattr(mesh, "thread_name", None), wg) for wg in range(threads)]
    for walker in walkers:
        walker.run(jaxpr, io)
    return walkers
