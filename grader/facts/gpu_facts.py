"""What a Mosaic GPU kernel moves and waits for, as the verdict reads it.

kernelsim's TPU trace has no model of a ``plgpu.kernel`` (it receives global-memory refs and
moves what its body says); ``kernelsim.gpu`` walks one CTA's body instead. ``trace`` turns its
kernels into the facts the structural rules judge (``grader.verdict.verdict.GpuKernelFacts``), in
the trace's place (``grader.facts.work.run_traced``): per kernel, which refs its TMA copies read
and write, the copies into shared memory that no barrier wait consumes, the TMA stores that no
``commit_smem`` precedes or no ``wait_smem_to_gmem`` follows, and the plain loads and stores
between global memory and registers that bypass the TMA; its WGMMAs, how many each
accumulator adds up before it starts again from zero, the operands they read transposed, and the
operand layouts the Mosaic GPU lowering would refuse. Counts are one CTA's (CTA 0), each
warpgroup's events in its own program order. ``would_hang`` stops a program before it runs
when a kernel waits on a barrier nothing signals (GPU interpret mode would wait forever, as a
GPU does), as ``grader.facts.dma_order.would_hang`` does for a TPU kernel's DMAs.
"""

from __future__ import annotations

from typing import Any


def _before(events: list, e: Any, kind: str, since: int = -1) -> bool:
    """Whether ``e``'s warpgroup issued a ``kind`` event before ``e`` (and after ``since``)."""
    return any(x.kind == kind and x.warpgroup == e.warpgroup and since < x.order < e.order
               for x in events)


def _unwaited(events: list) -> int:
    """TMA copies into shared memory that no barrier wait on their barrier follows (in the
    copying warpgroup after the copy, or in any other: a consumer waits on a producer's
    copies). Copies may share a barrier and one wait (a pipeline step's operands)."""
    return sum(not any(w.kind == "barrier_wait" and w.barrier == e.barrier and e.barrier and (
        w.warpgroup != e.warpgroup or w.order > e.order) for w in events)
        for e in events if e.kind == "tma_load")


def _accumulations(events: list) -> list[int]:
    """The WGMMAs each accumulator adds up between its starts (allocated, or stored to), in
    each warpgroup's program order: a K loop that keeps its accumulator gives one run of K
    steps, one that starts it again at every step K runs of 1."""
    runs = []
    for wg in sorted({e.warpgroup for e in events}):
        wgmmas = [e for e in events if e.kind == "wgmma" and e.warpgroup == wg]
        runs += [e.accumulation for i, e in enumerate(wgmmas)
                 if i + 1 == len(wgmmas) or wgmmas[i + 1].accumulation <= e.accumulation]
    return runs


def _layout_problems(events: list) -> list[str]:
    """What the Mosaic GPU lowering (its default, warpgroup semantics, whose transform inference
    picks the layout of a tile given none: jax/_src/pallas/mosaic_gpu/core.py:150 and
    primitives.py:2350-2412 in jax 0.12.0.1) refuses in how a WGMMA reads its operands, once per
    problem: a shared-memory tile swizzled but not tiled or tiled but not swizzled, a tiling
    other than (8, swizzle / itemsize), A and B swizzled differently, and a transposed operand
    of other than 16 bits (jax/experimental/mosaic/gpu/wgmma.py:154). Each was refused when
    lowered for CUDA from a CPU, and tiles without transforms accepted; tests/grader/
    test_mosaic_gpu_tasks.py holds the rule to the lowering for tiled-only, swizzled-only and
    differently swizzled tiles and for tiles without transforms."""
    found = []
    for e in events:
        if e.kind != "wgmma":
            continue
        smem = [o for o in e.operands if not o.in_registers]
        for o in smem:
            if bool(o.swizzle) != bool(o.tiling):
                found.append(f"{o.name}'s tile is {'swizzled' if o.swizzle else 'tiled'} but "
                             f"not {'tiled' if o.swizzle else 'swizzled'}: give it both "
                             "plgpu.TilingTransform and plgpu.SwizzleTransform, or neither")
            elif o.swizzle and o.tiling != (fits := (8, o.swizzle // o.itemsize)):
                found.append(f"{o.name}'s tiling {o.tiling} does not fit its {o.swizzle}-byte "
                             f"swizzle: it must be {fits} (8 rows of swizzle / itemsize "
                             "elements)")
            if o.transposed and o.itemsize != 2:
                found.append(f"{o.name} is read transposed, which WGMMA does only for 16-bit "
                             "types")
        swizzles = [o.swizzle for o in smem if o.swizzle]
        if len(swizzles) == 2 and swizzles[0] != swizzles[1]:
            found.append(f"a is swizzled by {swizzles[0]} bytes and b by {swizzles[1]}: "
                         "WGMMA reads both with one swizzle")
    return list(dict.fromkeys(found))


def kernel_facts(k: Any) -> dict:
    """One ``kernelsim.gpu.GpuKernel`` as ``verdict.gpu_from_dict`` reads it (JSON-ready)."""
    events = k.events
    stores = [e for e in events if e.kind == "tma_store"]
    previous = {}  # the order of each warpgroup's last TMA store so far
    uncommitted = 0
    for e in stores:
        uncommitted += not _before(events, e, "commit_smem", previous.get(e.warpgroup, -1))
        previous[e.warpgroup] = e.order
    unawaited = sum(not any(x.kind == "wait_tma_store" and x.warpgroup == e.warpgroup
                            and x.order > e.order for x in events) for e in stores)
    return {
        "name": k.name, "grid": list(k.grid), "warpgroups": k.num_threads,
        "smem_bytes": k.smem_bytes, "barriers": k.barriers,
        "tma_loads": sum(e.kind == "tma_load" for e in events),
        "tma_sources": sorted({e.src for e in events if e.kind == "tma_load"}),
        "tma_stores": len(stores), "tma_targets": sorted({e.dst for e in stores}),
        "unwaited_loads": _unwaited(events), "uncommitted_stores": uncommitted,
        "unawaited_stores": unawaited,
        "gmem_loads": sum(e.kind == "load" for e in events),
        "gmem_stores": sum(e.kind == "store" for e in events),
        "wgmmas": sum(e.kind == "wgmma" for e in events),
        "accumulations": _accumulations(events),
        "transposed_operands": sorted({o.name for e in events for o in e.operands
                                       if o.transposed}),
        "wgmma_layout_problems": _layout_problems(events),
        "complete": not k.events_dropped, "warnings": list(k.warnings)}


# primitives that complete a barrier in a way kernelsim.gpu lists no event for
UNLISTED_SIGNALS = ("tcgen05_mma", "tcgen05_commit_arrive", "barrier_arrive_and_wait")


def _unsignalled(k: Any) -> list[str]:
    """Barriers CTA 0 waits on that nothing in it signals: no TMA copy completes on them, no
    warpgroup arrives."""
    signalled = {e.barrier for e in k.events if e.kind in ("tma_load", "barrier_arrive")}
    return sorted({e.barrier for e in k.events if e.kind == "barrier_wait"} - signalled)


def would_hang(kernels: list, work: dict) -> str | None:
    """Why running these Mosaic GPU kernels would block forever (GPU interpret mode waits as a
    GPU does): a barrier wait that nothing signals. None: as far as the events show, none (and
    whenever a kernel of the program, ``work``'s calls, may signal one unlisted)."""
    if any(set(c["primitives"]) & set(UNLISTED_SIGNALS) for c in work["calls"]):
        return None
    for k in kernels:
        if k.events_dropped or any(e.conditional for e in k.events):
            continue  # a branch kernelsim could not decide may hold the signal
        if names := _unsignalled(k):
            return (f"BarrierWouldHang: plgpu.kernel {k.name} waits on {', '.join(names)}, a "
                    "barrier no copy completes on and no warpgroup arrives at, so it would never "
                    "return: pass the barrier to the plgpu.copy_gmem_to_smem whose tile you wait "
                    "for, or wait only after that copy")
    return None


def trace(kernels: list) -> dict:
    """The trace of a program whose kernels are Mosaic GPU ones: no ``pallas_call``, and each
    ``plgpu.kernel``'s facts (``grader.verdict.verdict.facts_from_dict`` reads it)."""
    return {"calls": [], "gpu_kernels": [kernel_facts(k) for k in kernels]}


def summary(kernels: list) -> str:
    """One line per kernel: its launch, shared memory and one CTA's copies, in words."""
    return "\n".join(
        f"plgpu.kernel {k.name}: grid {tuple(k.grid)}, {k.smem_bytes:,} B of shared memory "
        f"per CTA; CTA 0: {k.count('tma_load')} TMA copies into shared memory, "
        f"{k.count('barrier_wait')} barrier waits, {k.count('tma_store')} TMA copies out; "
        f"launch: {k.gmem_read_bytes:,} B of global-memory reads that miss L2, "
        f"{k.gmem_write_bytes:,} B written"
        for k in kernels)
