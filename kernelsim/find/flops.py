"""FLOPs of one kernel invocation, counted from the kernel jaxpr."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

from kernelsim.adapter import open_jaxpr
from kernelsim.body.predicates import NotEvaluable, PrefetchRef, StepValues
from kernelsim.jaxpr.nesting import sub_jaxprs
from kernelsim.model import Matmul, StepWork, tile_padded_bytes

_VREG_BYTES = 8 * 128 * 4  # one TPU vector register: 8 sublanes x 128 lanes of 32-bit words


def _vregs(aval: Any) -> int:
    """Vector registers a value of ``aval`` fills as Mosaic lays it out (tile-padded: a
    (512, 1) float32 value fills 64, as (512, 128) would); 0 for a non-array."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    # a PRNG key (jax.random.key in a kernel body) is an extended dtype, no NumPy one: its
    # words are scalars until random_bits draws from it
    if shape is None or dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return 0
    size = tile_padded_bytes(tuple(shape), str(dtype), np.dtype(dtype).itemsize)
    return -(-size // _VREG_BYTES)

# Copies and relabellings, no arithmetic. ``tile`` (jnp.tile, pltpu.repeat) lowers to a
# tpu.concatenate of the same value (jax/_src/pallas/mosaic/lowering.py, _tile_lowering_rule),
# like ``concatenate``: JAX's bundled flash attention repeats its lane-replicated statistics
# this way and does no vector work for it.
_DATA_MOVEMENT = frozenset({
    "get", "swap", "program_id", "num_programs", "broadcast_in_dim", "reshape", "squeeze",
    "expand_dims", "transpose", "convert_element_type", "iota", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p", "select_n", "rev",
    "bitcast_convert_type", "dma_start", "dma_wait", "semaphore_signal", "semaphore_wait",
    "semaphore_read", "gather", "scatter", "device_id", "load", "store", "masked_load",
    "masked_swap", "multiple_of", "pjit_dce", "optimization_barrier", "stop_gradient", "tile",
})


def _is_column(var: Any) -> bool:
    """``var`` is a column: a value of rank 2 or more whose last axis is 1, not a scalar."""
    shape = tuple(getattr(getattr(var, "aval", None), "shape", ()))
    return len(shape) >= 2 and shape[-1] == 1 and int(np.prod(shape, dtype=np.int64)) > 1


def lane_broadcast_vregs(eqn: Any, replicated: set) -> int:
    """The vector registers of the columns ``eqn`` spreads across the lanes, or 0: an operand
    whose last axis is 1 made as wide as a last axis of more than one lane, by
    ``broadcast_in_dim`` or by an elementwise operation's own broadcasting (``s - m`` with
    scores (bq, bkv) and a running max (bq, 1) read from scratch, as an online softmax has),
    unless the column is ``replicated``: a reduction along the lanes leaves its result in
    every lane, and arithmetic on such columns keeps it so. Measured on the TPU v5e, lesson
    8's flash attention took 1.58x the time with (bq, 1) statistics in scratch that it took
    with the same statistics kept as (bq, 128) rows and widened by ``jnp.tile``, a copy of
    whole vregs (bench/recorded/fa_probe-v5e.json). Tile-padded, as ``_vregs``: a (512, 1)
    float32 column is 64."""
    if not eqn.outvars:  # an effect (a debug print): no value
        return 0
    shape = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
    if len(shape) < 2 or shape[-1] == 1:
        return 0
    return sum(_vregs(v.aval) for v in eqn.invars
               if _is_column(v) and len(v.aval.shape) == len(shape) and v not in replicated)


def _keeps_replicated(eqn: Any, replicated: set) -> bool:
    """``eqn``'s column result is in every lane: a reduction along the last axis, a
    relabelling of such a result, or arithmetic whose column operands all are (scalars
    aside)."""
    name = eqn.primitive.name
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        rank = len(getattr(eqn.invars[0].aval, "shape", ()))
        return rank - 1 in tuple(eqn.params.get("axes", ()))
    if name in _RELABELLINGS:  # (bq,) -> (bq, 1): the same values in the same lanes
        return not hasattr(eqn.invars[0], "val") and eqn.invars[0] in replicated
    columns = [v for v in eqn.invars if _is_column(v)]
    return bool(columns) and all(v in replicated for v in columns) and name not in (
        "get", "load", "masked_load", "slice", "dynamic_slice")


_RELABELLINGS = frozenset({"reshape", "broadcast_in_dim", "expand_dims", "squeeze",
                           "convert_element_type", "copy"})


class BodyWork(NamedTuple):
    """What one kernel invocation computes (``count_flops``)."""

    flops: int
    matmuls: tuple[Matmul, ...]
    vector_vregs: int
    lane_broadcast_vregs: int
    scalar_vregs: int = 0  # of vector_vregs, those of 0-d results: index arithmetic
    stored_vregs: int = 0  # arrays stored into refs: no arithmetic, but a step's work


def _is_k_major(var: Any, contract: tuple[int, ...], layouts: dict) -> bool:
    """``var``'s minor dimension where it was loaded is one of ``contract``."""
    rank = len(getattr(var.aval, "shape", ()))
    if rank == 0:
        return True
    loaded = tuple(range(rank))  # a Literal, or a value no transpose relabelled
    source = loaded if hasattr(var, "val") else layouts.get(var, loaded)  # value -> loaded dim
    return any(source[d] == rank - 1 for d in contract)


# Precisions (lax.Precision or DotAlgorithmPreset names) at which the Triton lowering gives a
# float32 dot TF32 inputs: jax/_src/pallas/triton/lowering.py, _TF32_PRECISIONS (DEFAULT, HIGH)
# and the TF32_TF32_F32 preset; no precision at all is DEFAULT.
_TF32_NAMES = frozenset({"DEFAULT", "HIGH", "TF32_TF32_F32"})


def _is_tf32(dtype: str, precision: Any) -> bool:
    if dtype != "float32":
        return False
    if precision is None:
        return True
    names = [getattr(p, "name", str(p)) for p in
             (precision if isinstance(precision, tuple | list) else (precision,))]
    return any(n in _TF32_NAMES for n in names)


def precision_name(precision: Any) -> str:
    """A dot's precision as "DEFAULT", "HIGH" or "HIGHEST": a pair of precisions as the higher
    one; a ``DotAlgorithmPreset`` by the bf16 passes its name says (``..._X6`` or float32
    inputs: HIGHEST; ``..._X3`` or TF32: HIGH; else DEFAULT); none given is DEFAULT."""
    if precision is None:
        return "DEFAULT"
    names = [getattr(p, "name", str(p)) for p in
             (precision if isinstance(precision, tuple | list) else (precision,)) if p is not None]
    rank = {"DEFAULT": 0, "HIGH": 1, "HIGHEST": 2}

    def one(name: str) -> str:
        name = name.upper().removeprefix("PRECISION.")
        if name in rank:
            return name
        if "X6" in name or name.startswith("F32_F32"):
            return "HIGHEST"
        return "HIGH" if "X3" in name or "TF32" in name else "DEFAULT"

    return max((one(n) for n in names), key=rank.__getitem__, default="DEFAULT")


class When(NamedTuple):
    """A ``pl.when`` (any ``cond``) of a body: its eqn and each branch's work."""

    eqn: Any
    branches: tuple[WorkTree, ...]


class WorkTree(NamedTuple):
    """What one invocation of a jaxpr computes: ``own``, its work outside the ``cond`` eqns
    at its top level (loops included, each ``cond`` inside a loop at its most expensive
    branch), and those ``whens``, whose work depends on the branch that runs."""

    own: BodyWork
    whens: tuple[When, ...]


def _add(a: BodyWork, b: BodyWork, times: int = 1) -> BodyWork:
    return BodyWork(a.flops + b.flops * times, a.matmuls + tuple(
        dataclasses.replace(m, flops=m.flops * times) for m in b.matmuls),
        a.vector_vregs + b.vector_vregs * times,
        a.lane_broadcast_vregs + b.lane_broadcast_vregs * times,
        a.scalar_vregs + b.scalar_vregs * times, a.stored_vregs + b.stored_vregs * times)


def most_expensive(tree: WorkTree) -> BodyWork:
    """``tree``'s work with each ``cond`` at its most expensive branch (each field's most;
    every branch's matmuls listed)."""
    work = tree.own
    for when in tree.whens:
        counted = [most_expensive(b) for b in when.branches]
        work = BodyWork(work.flops + max((c.flops for c in counted), default=0),
                        work.matmuls + tuple(m for c in counted for m in c.matmuls),
                        work.vector_vregs + max((c.vector_vregs for c in counted), default=0),
                        work.lane_broadcast_vregs + max(
                            (c.lane_broadcast_vregs for c in counted), default=0),
                        work.scalar_vregs + max((c.scalar_vregs for c in counted), default=0),
                        work.stored_vregs + max((c.stored_vregs for c in counted), default=0))
    return work


def count_flops(jaxpr: Any) -> BodyWork:
    """FLOPs of one kernel invocation with every ``cond`` at its most expensive branch (what
    ``body_work`` finds, summed that way)."""
    return most_expensive(body_work(jaxpr))


def body_work(jaxpr: Any) -> WorkTree:
    """What one invocation of ``jaxpr`` computes: its FLOPs, its matmuls, its vector work:
    the vector registers its arithmetic other than matmuls produces (a reduction: that it
    reads), tile-padded (``_vregs``), the unit of the TPU time model's VPU term; and its
    lane broadcasts (``lane_broadcast_vregs``), a term of their own.

    dot_general: 2 x output elements x contracted size; other arithmetic: one FLOP per output
    element (reductions: per input element); data movement is free. ``cond`` counts its most
    expensive branch inside a loop, ``scan`` its body times its length, ``while`` one
    iteration; a ``cond`` at the top level is one of the tree's ``whens``.
    """
    flops = vregs = broadcasts = scalars = stored = 0
    whens: list[When] = []
    matmuls: list[Matmul] = []
    layouts: dict = {}  # var -> its dimensions' places in the layout it was loaded with
    replicated: set = set()  # columns in every lane (``lane_broadcast_vregs``)
    for eqn in open_jaxpr(jaxpr).eqns:
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn)
        if _keeps_replicated(eqn, replicated):
            replicated.update(eqn.outvars)
        if name == "cond":
            whens.append(When(eqn, tuple(body_work(j) for j, _ in subs)))
            continue
        if subs:
            looped = BodyWork(0, (), 0, 0)
            for j, reps in subs:
                looped = _add(looped, count_flops(j), reps)
            flops, vregs, broadcasts, scalars, stored = (
                flops + looped.flops, vregs + looped.vector_vregs,
                broadcasts + looped.lane_broadcast_vregs, scalars + looped.scalar_vregs,
                stored + looped.stored_vregs)
            matmuls += looped.matmuls
            continue
        if name == "transpose" and not hasattr(eqn.invars[0], "val"):  # (not a Literal)
            (x,) = eqn.invars
            source = layouts.get(x, tuple(range(len(x.aval.shape))))
            layouts[eqn.outvars[0]] = tuple(source[p] for p in eqn.params["permutation"])
        elif (name == "convert_element_type" and not hasattr(eqn.invars[0], "val")
              and eqn.invars[0] in layouts):
            layouts[eqn.outvars[0]] = layouts[eqn.invars[0]]
        if name == "dot_general":
            (lhs_contract, rhs_contract), _ = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars
            k = int(np.prod([lhs.aval.shape[a] for a in lhs_contract], dtype=np.int64))
            out = eqn.outvars[0].aval
            dot = 2 * int(np.prod(out.shape, dtype=np.int64)) * k
            flops += dot
            matmuls.append(Matmul(str(lhs.aval.dtype), dot,
                                  _is_k_major(lhs, tuple(lhs_contract), layouts)
                                  and _is_k_major(rhs, tuple(rhs_contract), layouts),
                                  _is_tf32(str(lhs.aval.dtype), eqn.params.get("precision")),
                                  precision_name(eqn.params.get("precision"))))
        elif name in _DATA_MOVEMENT:
            broadcasts += lane_broadcast_vregs(eqn, replicated) if name == "broadcast_in_dim" \
                else 0
            if name in ("swap", "masked_swap") and getattr(eqn.outvars[0].aval, "shape", ()):
                stored += _vregs(eqn.outvars[0].aval)
        elif name.startswith("reduce_") or name in ("argmax", "argmin", "cumsum", "cumprod",
                                                    "cummax", "cumlogsumexp"):
            flops += int(np.prod(getattr(eqn.invars[0].aval, "shape", ()), dtype=np.int64))
            vregs += _vregs(eqn.invars[0].aval)
        else:
            broadcasts += lane_broadcast_vregs(eqn, replicated)
            for v in eqn.outvars:
                shape = getattr(v.aval, "shape", None)
                if shape is not None and hasattr(v.aval, "dtype"):
                    flops += int(np.prod(shape, dtype=np.int64))
                    vregs += _vregs(v.aval)
                    scalars += _vregs(v.aval) if not shape else 0
    return WorkTree(BodyWork(flops, tuple(matmuls), vregs, broadcasts, scalars, stored),
                    tuple(whens))


def step_work(tree: WorkTree, jaxpr: Any, grid: tuple[int, ...], grid_indices: np.ndarray,
              prefetch: dict[Any, np.ndarray]) -> StepWork | None:
    """The work of each grid step of a kernel whose body is ``jaxpr`` (its ``body_work``
    ``tree``), each ``pl.when`` at the branch its predicate takes at that step
    (``kernelsim.body.predicates``; ``prefetch``: the body's scalar-prefetch ref invars and
    their values). A predicate that is not a function of the step alone counts its most
    expensive branch at every step, and ``StepWork.unevaluated`` says why. None when the body
    has no ``pl.when``: its work is the same at every step."""
    steps = len(grid_indices)
    unevaluated: list[str] = []
    evaluated = False

    def counts(work: BodyWork) -> tuple[int, ...]:
        """flops, vector vregs, lane broadcasts, and the array work (matmul FLOPs, vregs of
        arrays made or stored, broadcasts: what makes a step one that works)."""
        return (work.flops, work.vector_vregs, work.lane_broadcast_vregs,
                sum(m.flops for m in work.matmuls) + work.vector_vregs - work.scalar_vregs
                + work.lane_broadcast_vregs + work.stored_vregs)

    def per_step(tree: WorkTree, values: StepValues) -> list[np.ndarray]:
        nonlocal evaluated
        out = [np.full(steps, n, np.int64) for n in counts(tree.own)]
        for when in tree.whens:
            try:
                index = values.branch_index(when.eqn)
            except NotEvaluable as e:
                unevaluated.append(f"a pl.when whose predicate kernelsim cannot evaluate per "
                                   f"grid step ({e}): its most expensive branch is counted "
                                   "at every step")
                most = most_expensive(WorkTree(BodyWork(0, (), 0, 0), (when,)))
                out = [o + n for o, n in zip(out, counts(most), strict=True)]
                continue
            evaluated = True
            for b, branch in enumerate(when.branches):
                taken = index == b
                if taken.any():
                    inner = per_step(branch, values.inner(when.eqn.params["branches"][b],
                                                          list(when.eqn.invars[1:])))
                    out = [o + np.where(taken, i, 0) for o, i in zip(out, inner, strict=True)]
        return out

    if not tree.whens:
        return None
    values = StepValues(jaxpr, grid_indices, grid,
                        {v: PrefetchRef(data) for v, data in prefetch.items()})
    flops, vregs, broadcasts, array_work = per_step(tree, values)
    if not evaluated:  # the same at every step: the schedule's guess stands (cost.estimate)
        return StepWork(None, None, None, None, tuple(unevaluated))
    return StepWork(flops, vregs, broadcasts, array_work > 0, tuple(unevaluated))
