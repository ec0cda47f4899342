"""The kernel body, interpreted step by step: the refs it reads and writes, and its DMAs as
events in time.

``interpret_body`` runs a kernel jaxpr at every grid step on numpy values, computing only what
``kernelsim.body.needs`` marks, and reports each ref access (an ``AccessLog``) and, in body
order, each DMA it starts (``start``) and each wait on a DMA semaphore (``wait``), as plain
data. A wait completes the oldest DMA still in flight on the same semaphore, as the TPU's DMA
semaphores count completed copies in the order they were issued on one engine queue; a DMA
that is never waited on keeps ``wait_step = None``.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import jax
import numpy as np

from kernelsim.access import Access, AccessLog
from kernelsim.adapter import Literal, consts_of, memory_space, open_jaxpr, scan_operands
from kernelsim.body import scalar_code
from kernelsim.body.needs import (
    DMA_EFFECTS,
    IGNORED,
    REF_EFFECTS,
    REF_WRITES,
    BodyNeeds,
    body_needs,
    has_body_dma,
    has_ref_effect,
    is_ref,
    pure_call_body,
    pure_slice,
    ref_array,
)
from kernelsim.body.scalar_code import ScalarRun
from kernelsim.body.selection import Selection, select
from kernelsim.errors import TraceError
from kernelsim.jaxpr import lax_numpy
from kernelsim.jaxpr.nesting import CALL_PRIMITIVES, called_jaxpr, sub_jaxprs
from kernelsim.jaxpr.numpy_eval import NUMPY_BUDGET, literal, numpy_eqn
from kernelsim.model import BodyCopy, KernelCall, MemorySpace, MeshDevice, Operand, Slice


class DmaLedger:
    """The body DMAs of one kernel call, matched to the waits that complete them."""

    def __init__(self) -> None:
        self.copies: list[BodyCopy] = []
        self._in_flight: dict[str, deque[int]] = {}

    def start(self, step: int, pos: int, src: str, dst: str, src_space: MemorySpace,
              dst_space: MemorySpace, nbytes: int, src_slice: Slice | None,
              dst_slice: Slice | None, semaphore: str, src_device: int | None = None,
              dst_device: int | None = None) -> None:
        """A DMA started at grid step ``step``, body event ``pos`` of that step, from the
        memory of device ``src_device`` into that of ``dst_device`` (None: not in a mesh)."""
        self._in_flight.setdefault(semaphore, deque()).append(len(self.copies))
        self.copies.append(BodyCopy(step, src, dst, src_space, dst_space, nbytes, src_slice,
                                    dst_slice, semaphore, pos, src_device=src_device,
                                    dst_device=dst_device))

    def wait(self, step: int, pos: int, semaphore: str) -> None:
        """A wait on ``semaphore`` at ``step``/``pos``: completes its oldest DMA in flight."""
        queue = self._in_flight.get(semaphore)
        if queue:
            k = queue.popleft()
            self.copies[k] = dataclasses.replace(self.copies[k], wait_step=step, wait_pos=pos)


class _Ref:
    """A ref while the body is interpreted: its name, memory space and contents (numpy)."""

    __slots__ = ("name", "space", "data")

    def __init__(self, name: str, space: MemorySpace, data: np.ndarray):
        self.name, self.space, self.data = name, space, data


_IDENTITY = ("multiple_of", "pjit_dce", "optimization_barrier")


_SKIP = object()  # a value no recorded fact depends on: never computed
_UNKNOWN = object()  # an input whose value the caller did not give


class _Interpreter:
    """Runs a kernel jaxpr on concrete values, recording ref reads and writes (if ``record``)
    and every DMA the body starts. Only what ``BodyNeeds`` marks is computed, in numpy where
    ``lax_numpy`` can (JAX otherwise)."""

    def __init__(self, grid: tuple[int, ...], sink: list, needs: BodyNeeds, record: bool,
                 grid_names: tuple | None = None, device: MeshDevice | None = None):
        self.grid, self.sink, self.needs, self.recording = grid, sink, needs, record
        self.grid_names = tuple(grid_names or ())
        self.device = device
        self.dmas = DmaLedger()
        self._plans: dict[tuple, list] = {}
        self._runs: dict[int, bool] = {}  # jaxpr id -> some eqn of it is wanted
        self._planned: list = []
        self.step, self.grid_index, self.order, self.scoped, self.dma_pos = 0, (), 0, 0, 0

    @property
    def copies(self) -> list[BodyCopy]:
        return self.dmas.copies

    def _dma_end(self, end: Any, what: str) -> tuple[_Ref, Selection]:
        """The ref of one end of a DMA (a ref or a view of one) and what it selects."""
        ref, transforms = (end, ()) if isinstance(end, _Ref) else (end.ref, end.transforms)
        if not isinstance(ref, _Ref):
            raise TraceError(f"a DMA {what} kernelsim cannot follow ({type(ref).__name__})")
        return ref, select(ref.data.shape, tuple(transforms), ref.data.itemsize)

    def _semaphore(self, sem: Any) -> str:
        """A DMA semaphore's name: ``name``, or ``name[i, ...]`` for one of an array."""
        ref, sel = self._dma_end(sem, "semaphore")
        if sel.size != 1 or ref.data.ndim == 0:
            return ref.name
        index = (tuple(start for start, _, _ in sel.box) if sel.box is not None
                 else np.unravel_index(int(sel.ids.reshape(-1)[0]), ref.data.shape))
        return f"{ref.name}[{', '.join(str(int(i)) for i in index)}]"

    def dma_wait(self, eqn: Any, vals: list) -> None:
        """A wait for a DMA's write (``.wait()``/``wait_recv``); a wait for its read is not
        the copy's completion and is not recorded."""
        if eqn.params.get("is_wait_send"):
            return
        _, _, sem, *_ = jax.tree_util.tree_unflatten(eqn.params["tree"], vals)
        self.dmas.wait(self.step, self.dma_pos, self._semaphore(sem))
        self.dma_pos += 1

    def _target(self, eqn: Any, device_id: Any) -> int | None:
        """The device a DMA writes: its ``device_id`` (a remote copy) or this one."""
        if device_id is None:
            return None if self.device is None else self.device.id
        if self.device is None:
            raise TraceError("a remote copy (make_async_remote_copy) outside jax.shard_map: "
                             "kernelsim knows the devices only from the shard_map's mesh")
        target = jax.tree_util.tree_map(lambda v: int(np.asarray(v)), device_id)
        if getattr(eqn.params.get("device_id_type"), "value", None) == "logical":
            return int(target)
        try:
            return self.device.target(target)
        except (KeyError, ValueError) as e:
            raise TraceError(f"a remote copy's device_id {target!r}: {e}") from None

    def dma(self, eqn: Any, vals: list) -> None:
        src, dst, dst_sem, _, device_id = jax.tree_util.tree_unflatten(eqn.params["tree"], vals)
        src_ref, src_sel = self._dma_end(src, "source")
        dst_ref, dst_sel = self._dma_end(dst, "destination")
        self.dmas.start(self.step, self.dma_pos, src_ref.name, dst_ref.name, src_ref.space,
                        dst_ref.space, src_sel.nbytes, src_sel.box, dst_sel.box,
                        self._semaphore(dst_sem), None if self.device is None
                        else self.device.id, self._target(eqn, device_id))
        self.dma_pos += 1
        dst_var = [v for v in eqn.invars if is_ref(v)][1]
        if not self.needs.contents(dst_var):
            return
        if not (src_sel.exact and dst_sel.exact):
            raise TraceError("a value kernelsim needs is copied by a DMA through a ref bitcast "
                             "(kernelsim follows such DMAs' sizes, not their data)")
        src_ids, dst_ids = src_sel.ids, dst_sel.ids
        if src_ids.size == dst_ids.size:
            flat = dst_ref.data.reshape(-1)
            data = src_ref.data.reshape(-1)[src_ids.reshape(-1)].astype(flat.dtype)
            if eqn.params.get("add"):
                data = data + flat[dst_ids.reshape(-1)]
            flat[dst_ids.reshape(-1)] = data

    def masked(self, eqn: Any, vals: list) -> Any:
        """``pl.load``/``pl.store``/``pltpu.store`` with a mask (``masked_load``,
        ``masked_swap``): only the elements the mask keeps are read or written."""
        swap = eqn.primitive.name == "masked_swap"
        ref, transforms, a, b = eqn.params["args_tree"].unflatten(vals)
        value, mask, other = (a, b, None) if swap else (None, a, b)
        reads = self.needs.value(eqn.outvars[0])
        writes = swap and self.needs.contents(eqn.invars[0])
        if not (self.recording or reads or writes):
            return _SKIP
        sel = select(ref.data.shape, self._computed(eqn, list(transforms)), ref.data.itemsize)
        ids, box = sel.ids, sel.box
        if (reads or writes) and not sel.exact:
            raise TraceError("a value kernelsim needs is read or written through a ref "
                             "bitcast (kernelsim follows such accesses' places, not data)")
        keep = None if mask is None else np.broadcast_to(
            np.asarray(self._computed(eqn, [mask])[0], bool), ids.shape)
        touched, box = (ids, box) if keep is None else (ids[keep], None)
        if not swap:
            self.record_points(ref, "read", touched, box)
        out = _SKIP
        if reads:
            out = ref.data.reshape(-1)[ids].reshape(eqn.outvars[0].aval.shape)
            if not swap and keep is not None and other is not None:
                out = np.where(keep, out, np.asarray(self._computed(eqn, [other])[0]))
        if swap:
            if writes:
                new = np.broadcast_to(np.asarray(self._computed(eqn, [value])[0],
                                                 ref.data.dtype), ids.shape)
                ref.data.reshape(-1)[touched] = new if keep is None else new[keep]
            self.record_points(ref, "write", touched, box)
        return out

    def record(self, ref: _Ref, kind: str, sel: Selection) -> None:
        """A read or write of what ``sel`` selects of ``ref``, if accesses are recorded."""
        if self.recording:
            self.record_points(ref, kind, None if sel.box is not None else sel.ids, sel.box)

    def record_points(self, ref: _Ref, kind: str, ids: np.ndarray | None,
                      box: tuple | None) -> None:
        """A read or write of ``box`` of ``ref``, or (``box`` None) of flat indices ``ids``."""
        if not self.recording:
            return
        points = None
        if box is None:
            points = np.stack(np.unravel_index(np.unique(ids.reshape(-1)), ref.data.shape),
                              axis=1).astype(np.int64) if ref.data.ndim else np.zeros((1, 0),
                                                                                       np.int64)
        self.sink.append(Access(self.step, self.order, ref.name, kind, ref.data.shape, box,
                                points))
        self.order += 1

    def run(self, jaxpr: Any, consts: list, args: list,
            out_needed: tuple[bool, ...] | None = None) -> list:
        """``jaxpr``'s outputs on ``args`` (``_SKIP`` for those never computed). With
        ``out_needed``, ``jaxpr`` is a pure call's body and only what those outputs depend on
        runs; else what ``BodyNeeds`` and recording ask for."""
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        get = env.get
        for item in self._plan(jaxpr, out_needed):
            if isinstance(item, ScalarRun):
                try:
                    env.update(zip(item.outputs, item.fn(*[get(v, _SKIP) for v in item.inputs]),
                                   strict=True))
                except TypeError:  # int(_SKIP): an operand that was never computed
                    raise AssertionError("kernelsim: an operand of scalar arithmetic that a "
                                         "recorded fact depends on was not computed") from None
                continue
            eqn, ins, multiple, call = item
            vals = [get(v, _SKIP) if c is None else c for v, c in ins]
            if call is None:
                outs = self.eqn(eqn, vals)
            else:  # a pure call: (its body, which of its results are needed)
                body, needed = call
                outs = self.run(open_jaxpr(body), consts_of(body), vals, needed)
            if multiple:
                env.update(zip(eqn.outvars, outs, strict=True))
            else:
                env[eqn.outvars[0]] = outs if call is None else outs[0]
        return [literal(v) if isinstance(v, Literal) else get(v, _SKIP) for v in jaxpr.outvars]

    def _plan(self, jaxpr: Any, out_needed: tuple[bool, ...] | None) -> list:
        """What ``run`` does with ``jaxpr``, decided once per jaxpr (and needed outputs)
        rather than at every grid step and loop iteration: the eqns to run, each with its
        operands (a var, or a literal's value), whether it has several results and, for a
        pure call, its body and needed results -- except that each run of consecutive scalar
        integer eqns is one compiled ``ScalarRun``. (A pipeline's inner loop runs thousands
        of times per call: deciding this per execution was a tenth of the interpretation,
        and one numpy call per scalar eqn most of the rest.)"""
        key = (id(jaxpr), out_needed)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        if out_needed is None:
            wanted = [eqn for eqn in jaxpr.eqns if self._wanted(eqn)]
        else:
            evaluated, _ = pure_slice(jaxpr, out_needed)
            wanted = [eqn for eqn in jaxpr.eqns if id(eqn) in evaluated]
        last_read: dict[Any, int] = {}
        for k, eqn in enumerate(wanted):
            last_read.update((v, k) for v in eqn.invars if not isinstance(v, Literal))
        last_read.update((v, len(wanted)) for v in jaxpr.outvars if not isinstance(v, Literal))
        plan, k = [], 0
        while k < len(wanted):
            end = k
            while end < len(wanted) and scalar_code.compiles(wanted[end]):
                end += 1
            if end > k:
                plan.append(scalar_code.compile_run(
                    wanted[k:end], lambda v, end=end: last_read.get(v, -1) >= end))
                k = end
                continue
            eqn = wanted[k]
            call = None
            if (body := pure_call_body(eqn)) is not None:  # inside a pure body, all of it
                call = (body, tuple(self.needs.value(v) for v in eqn.outvars)
                        if out_needed is None else (True,) * len(eqn.outvars))
            plan.append((eqn, [(v, literal(v)) if isinstance(v, Literal) else (v, None)
                               for v in eqn.invars], eqn.primitive.multiple_results, call))
            k += 1
        self._plans[key] = plan
        self._planned.append(jaxpr)  # kept alive, so its id is not reused
        return plan

    def _wanted(self, eqn: Any) -> bool:
        """The eqn has a needed result, starts or waits for a DMA, or contains something that
        does; or it touches a ref, if accesses are recorded, else it writes a ref whose
        contents are needed."""
        if any(self.needs.value(v) for v in eqn.outvars):
            return True
        name = eqn.primitive.name
        if self.recording:
            return (any(is_ref(v) for v in eqn.invars) or name in REF_EFFECTS
                    or any(has_ref_effect(j) for j, _ in sub_jaxprs(eqn)))
        if name in DMA_EFFECTS:
            return True
        if name in REF_WRITES:
            return self.needs.contents(eqn.invars[0])
        # A branch or loop runs for what its predicate decides (``BodyNeeds._decides``). (Its
        # body may still hold wanted eqns when jaxprs are shared: JAX caches a fori_loop's
        # condition, so one loop's needs show in all of its kind.)
        decider = (eqn.invars[0] if name == "cond" else
                   open_jaxpr(eqn.params["cond_jaxpr"]).outvars[0] if name == "while" else None)
        if decider is not None and not isinstance(decider, Literal):
            return self.needs.value(decider)
        return any(self._runs_wanted(j) for j, _ in sub_jaxprs(eqn))

    def _runs_wanted(self, jaxpr: Any) -> bool:
        """Some eqn of ``jaxpr`` is wanted (decided once per jaxpr)."""
        wanted = self._runs.get(id(jaxpr))
        if wanted is None:
            wanted = self._runs[id(jaxpr)] = any(self._wanted(e) for e in jaxpr.eqns)
            self._planned.append(jaxpr)  # kept alive, so its id is not reused
        return wanted

    def _computed(self, eqn: Any, vals: list) -> list:
        """``vals`` of a needed eqn (each one was marked needed, so each was computed)."""
        if any(v is _SKIP for v in vals):
            raise AssertionError(f"kernelsim: an operand of {eqn.primitive.name!r} that a "
                                 "recorded fact depends on was not computed")
        return vals

    def eqn(self, eqn: Any, vals: list) -> Any:
        name, p = eqn.primitive.name, eqn.params
        if name == "dma_start":
            self.dma(eqn, self._computed(eqn, vals))
            return []
        if name == "dma_wait":
            self.dma_wait(eqn, self._computed(eqn, vals))
            return []
        if name == "semaphore_read":
            return np.int32(0)
        if name in ("get", "swap", "addupdate"):
            ref = vals[0]
            nval = 0 if name == "get" else 1
            reads = name != "addupdate" and self.needs.value(eqn.outvars[0])
            writes = name != "get" and self.needs.contents(eqn.invars[0])
            if not (self.recording or reads or writes):
                return [] if name == "addupdate" else _SKIP
            transforms = jax.tree_util.tree_unflatten(
                p["tree"], self._computed(eqn, vals[1 + nval:]))
            sel = select(ref.data.shape, transforms, ref.data.itemsize)
            if (reads or writes) and not sel.exact:
                raise TraceError("a value kernelsim needs is read or written through a ref "
                                 "bitcast (kernelsim follows such accesses' places, not data)")
            if name in ("get", "addupdate"):
                self.record(ref, "read", sel)
            out = _SKIP
            if reads:
                out = _read(ref.data, sel).reshape(eqn.outvars[0].aval.shape)
            if name != "get":
                if writes:
                    _write(ref.data, sel, np.asarray(self._computed(eqn, vals[1:2])[0],
                                                     ref.data.dtype), add=name == "addupdate")
                self.record(ref, "write", sel)
            return [] if name == "addupdate" else out
        if name in ("masked_load", "masked_swap"):
            return self.masked(eqn, vals)
        if name == "program_id":
            return np.int32(self.grid_index[p["axis"]])
        if name == "num_programs":
            return np.int32(self.grid[p["axis"]])
        if name == "axis_index" and p["axis_name"] in self.grid_names:  # a named grid / mesh
            return np.int32(self.grid_index[self.grid_names.index(p["axis_name"])])
        if name == "axis_index" and self.device and p["axis_name"] in self.device.axes:
            return np.int32(self.device.coords[self.device.axes.index(p["axis_name"])])
        if name == "cond":
            branches = p["branches"]
            index = int(self._computed(eqn, vals[:1])[0])
            b = branches[min(max(index, 0), len(branches) - 1)]  # HLO clamps the index
            return self.run(open_jaxpr(b), consts_of(b), vals[1:])
        if name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cc, bc, carry = vals[:cn], vals[cn:cn + bn], vals[cn + bn:]
            cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
            while bool(self._computed(eqn, self.run(open_jaxpr(cj), consts_of(cj), cc + carry))[0]):
                carry = self.run(open_jaxpr(bj), consts_of(bj), bc + carry)
            return carry
        if name == "scan":
            length, body = p["length"], p["jaxpr"]
            consts, carry, xs = scan_operands(p, vals)
            ncarry = len(carry)
            ys = []
            order = range(length - 1, -1, -1) if p["reverse"] else range(length)
            for i in order:
                step_xs = [x if x is _SKIP else x[i] for x in xs]
                out = self.run(open_jaxpr(body), consts_of(body), consts + carry + step_xs)
                carry, y = out[:ncarry], out[ncarry:]
                ys.append(y)
            if p["reverse"]:
                ys.reverse()
            stacked = []
            for k, v in enumerate(eqn.outvars[ncarry:]):
                if not self.needs.value(v):
                    stacked.append(_SKIP)
                elif ys:
                    stacked.append(np.stack([np.asarray(y[k]) for y in ys]))
                else:
                    stacked.append(np.zeros(v.aval.shape, v.aval.dtype))
            return carry + stacked
        if name == "run_scoped":
            inner = p["jaxpr"]
            refs = []
            for v in inner.invars:
                refs.append(_Ref(f"scoped{self.scoped}", memory_space(v.aval),
                                 ref_array(v.aval)))
                self.scoped += 1
            return self.run(inner, vals, refs)
        if name in _IDENTITY:
            return vals if eqn.primitive.multiple_results else vals[0]
        if name in IGNORED:
            return []
        if name in CALL_PRIMITIVES:
            sub = called_jaxpr(p)
            if sub is not None:
                return self.run(open_jaxpr(sub), consts_of(sub), vals)
        if any(isinstance(v, _Ref) for v in vals):
            raise TraceError(
                f"access recording does not support {name!r} on refs (supported: ref reads "
                "and writes, pl.when/cond, fori_loop/while, scan, run_scoped)")
        vals = self._computed(eqn, vals)
        try:
            outs = numpy_eqn(eqn, [np.asarray(v) for v in vals], [NUMPY_BUDGET])
        except lax_numpy.Unsupported:
            outs = eqn.primitive.bind(*vals, **p)
            outs = [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else [outs])]
        return outs if eqn.primitive.multiple_results else outs[0]


def _region(data: np.ndarray, sel: Selection) -> np.ndarray | None:
    """The view of ``data`` that ``sel`` selects, when it is one strided box (else None)."""
    if sel.box is None:
        return None
    return data[tuple(slice(start, start + size * stride, stride)
                      for start, size, stride in sel.box)]


def _read(data: np.ndarray, sel: Selection) -> np.ndarray:
    """A copy of what ``sel`` selects of ``data``: a box, or a flat array of ``sel.ids``."""
    region = _region(data, sel)
    return data.reshape(-1)[sel.ids] if region is None else region.copy()


def _write(data: np.ndarray, sel: Selection, value: np.ndarray, add: bool = False) -> None:
    """Store ``value`` (shaped as the selection, or broadcast to it) where ``sel`` points, or
    add it to what is there."""
    region = _region(data, sel)
    if region is not None and value.size == region.size:
        value = value.reshape(region.shape)
        region[...] = region + value if add else value
        return
    flat, ids = data.reshape(-1), sel.ids
    value = np.broadcast_to(value, ids.shape)
    flat[ids] = flat[ids] + value if add else value


def _block_of(value: np.ndarray, op: Operand, step: int, shape: tuple[int, ...]) -> np.ndarray:
    """The block of input ``value`` that ``op``'s index map selects at ``step``, shaped as the
    kernel's ref (``shape``); the part outside the array is zeros."""
    block = np.zeros(tuple(d.size for d in op.block_dims), value.dtype)
    src, dst = [], []
    for dim, index, extent in zip(op.block_dims, op.block_indices[step], op.shape, strict=True):
        start = int(dim.start(np.int64(index)))
        lo, hi = max(start, 0), min(start + dim.size, extent)
        src.append(slice(lo, max(hi, lo)))
        dst.append(slice(lo - start, lo - start + max(hi - lo, 0)))
    block[tuple(dst)] = value[tuple(src)]
    return block.reshape(shape)


def needs_body_interpretation(params: dict[str, Any]) -> bool:
    """The call's traffic includes DMAs its body starts, so ``interpret_body`` must run."""
    return has_body_dma(params["jaxpr"])


def interpret_body(params: dict[str, Any], call: KernelCall, args: tuple | None = None,
                   record: bool = True) -> tuple[Any, list[BodyCopy]]:
    """Run the kernel body at every grid step: its ``AccessLog`` (empty unless ``record``) and
    the DMAs it starts.

    Only the values that decide indices, DMAs and control flow are computed (``BodyNeeds``).
    Scalar-prefetch refs hold their real values and scratch refs keep their contents from
    step to step. An input whose contents such a value reads (e.g. a DMA size in an SMEM
    block) holds its real block at each step when ``args`` (the call's operands) has it, and
    an HBM/ANY input the whole array; other input and output blocks are zeros.
    """
    jaxpr = params["jaxpr"]
    if open_jaxpr(jaxpr).constvars:
        raise TraceError(f"pallas_call {call.name!r}: kernel jaxpr with constants is not "
                         "supported by kernel-body interpretation")
    if len(jaxpr.invars) != len(call.operands):
        raise TraceError(f"pallas_call {call.name!r}: {len(jaxpr.invars)} kernel refs but "
                         f"{len(call.operands)} operands")
    needs = body_needs(jaxpr, record)
    gm = params["grid_mapping"]
    inputs = (list(args[len(args) - gm.num_inputs:]) if args is not None
              else [_UNKNOWN] * gm.num_inputs)
    refs, blocks, fresh = [], [], []  # blocks: (ref, input value, operand) refilled per step
    for i, (v, op) in enumerate(zip(jaxpr.invars, call.operands, strict=True)):
        if not is_ref(v):  # a scalar a pl.kernel closes over: the kernel gets its value
            value = inputs[i - gm.num_index_operands]
            refs.append(_SKIP if value is _UNKNOWN else np.asarray(value))
            continue
        ref = _Ref(op.name, op.memory_space, ref_array(v.aval))
        refs.append(ref)
        if op.role == "scalar_prefetch":
            ref.data = np.array(op.value, copy=True).reshape(ref.data.shape)
            continue
        value = _UNKNOWN
        if op.role == "input" and needs.contents(v):
            value = inputs[i - gm.num_index_operands]
        if value is not _UNKNOWN and not op.pipelined:  # HBM/ANY: the whole array, kept
            ref.data = np.array(value, copy=True).reshape(ref.data.shape)
        elif value is not _UNKNOWN:
            blocks.append((ref, np.asarray(value), op))
        elif op.role in ("input", "output") and op.pipelined:
            fresh.append(ref)
    sink: list = []
    interp = _Interpreter(call.grid, sink, needs, record, gm.grid_names, call.device)
    for step, point in enumerate(call.grid_indices()):
        for r in fresh:
            r.data.fill(0)
        for r, value, op in blocks:
            r.data = _block_of(value, op, step, r.data.shape)
        interp.step, interp.grid_index, interp.order, interp.scoped, interp.dma_pos = (
            step, tuple(int(g) for g in point), 0, 0, 0)
        with jax.disable_jit():
            interp.run(open_jaxpr(jaxpr), [], refs)
    shapes = {r.name: r.data.shape for r in refs if isinstance(r, _Ref)}
    for a in sink:
        shapes.setdefault(a.operand, a.shape)
    return AccessLog(call.steps, shapes, sink), interp.copies
