"""Assignment 08, manual DMA: lesson 5's ``pl.ANY`` operands, async copies and DMA semaphores,
and the same pipeline built by ``pltpu.emit_pipeline``. TPU-only kernels, every case graded in
TPU interpret mode with its race detector on (``calling.with_race_detector``).

All three tasks compute the same thing, ``absmax_scale``: every row divided by its largest
absolute value (the first step of int8 absmax quantisation), with ``x`` left in HBM.

- ``absmax_dma``: the input is copied by hand, chunk by chunk across the grid steps, into two
  VMEM buffers; the output is an ordinary pipelined block. Rules from kernelsim's trace: ``x``
  gets no pipeline fetch (it is in ``pl.ANY``), the kernel's own DMAs read each of its bytes
  exactly once (so a short last chunk must be copied short, not re-read), and the on-chip
  footprint is exactly two chunk buffers (one cannot overlap the next copy with this chunk's
  work) plus the output's pipeline buffers (two; one when the grid has a single step, as
  Mosaic allocates it).
- ``absmax_pipeline``: the same with ``pltpu.emit_pipeline`` inside a one-step kernel; both
  operands in HBM, the nested pipeline's DMAs read and write each byte once, no scratch of the
  learner's own.
- ``absmax_in_place`` ("find the bug"): a fully manual kernel that scales each chunk in its
  VMEM buffer and copies it back; the shipped version starts the next copy into the buffer an
  earlier write-back copy is still reading. Its values are right in both of TPU interpret
  mode's DMA orders; only the race detector reports it.

The skill each task states is graded from the order of the kernel's own DMAs
(``grader.facts.dma_order.dma_order``, which follows the body over its grid and loops:
``pipelined`` below): the next chunk's copy starts before this chunk's compute (at every
compute but the last a copy into VMEM is in flight), two buffers, copies of the chunk size the
case asks for and as many as there are chunks, no copy into a buffer whose write-back is still
reading it, every start waited, and copies that cross grid steps only on an "arbitrary" grid.
"""

from __future__ import annotations

from grader import calling
from grader.calling import absmax_scale
from grader.tasks.core import (
    Rule,
    block_is,
    cdiv,
    grid_is,
    make_case,
    nbytes_of,
    operands_with_role,
    register_task,
    single_call,
    total_budget,
)

A8 = "08_manual_dma"


def _reference(x, chunk):
    return absmax_scale(x).astype(x.dtype)


# ----------------------------------------------------------------------------- shared rules
def _x_left_in_hbm(call, nbytes: int) -> list[Rule]:
    """x in ``pl.ANY``: no pipeline fetch, and the kernel's own DMAs read each byte once."""
    ops = operands_with_role(call, "input")
    if not ops:
        return [Rule("x left in HBM", "input 0 in pl.ANY", "no input operand", False)]
    x = ops[0]
    return [Rule("x left in HBM (memory_space=pl.ANY)", "no pipeline fetches of x",
                 f"{x.fetches} block fetches", x.fetches == 0),
            Rule("x HBM reads (the kernel's DMAs)", f"exactly {nbytes:,} B: each byte once",
                 f"{x.hbm_read_bytes:,} B", x.hbm_read_bytes == nbytes)]


def _output_left_in_hbm(call, nbytes: int) -> list[Rule]:
    """The output in ``pl.ANY``: no pipeline write-back, the kernel's DMAs write it once."""
    ops = operands_with_role(call, "output")
    if not ops:
        return [Rule("output left in HBM", "output 0 in pl.ANY", "no output operand", False)]
    out = ops[0]
    return [Rule("output left in HBM (memory_space=pl.ANY)", "no pipeline write-backs",
                 f"{out.writebacks} write-backs", out.writebacks == 0),
            Rule("output HBM writes (the kernel's DMAs)", f"exactly {nbytes:,} B: each byte "
                 "once", f"{out.hbm_write_bytes:,} B", out.hbm_write_bytes == nbytes)]


def _footprint(call, nbytes: int, what: str) -> Rule:
    return Rule("on-chip buffers", f"{nbytes:,} B: {what}", f"{call.onchip_peak_bytes:,} B",
                call.onchip_peak_bytes == nbytes)


def _scratch(call) -> list:
    return [o for o in call.operands if o.role == "scratch"]


def pipelined(order, case, buffers: int = 2, out: bool = False) -> list[Rule]:
    """The kernel's own DMAs stream ``x`` in ``chunk``-row copies through ``buffers`` VMEM
    buffers (two: double buffering): rules on ``verdict.DmaOrder``. ``out``: the output is
    copied out by DMAs as well."""
    (m, n), chunk = case.arrays["x"], case.params["chunk"]
    chunks = cdiv(m, chunk)
    if order is None:
        return [Rule("copies by hand", "the kernel starts its own DMAs", "none", False)]
    rules = []
    for label, copies, wanted in (("into VMEM", order.copies_in, True),
                                  ("out of VMEM", order.copies_out, out)):
        if not wanted:
            continue
        size = chunk * n
        rules.append(Rule(f"copies {label}: the chunk size", f"{chunks} copies of at most "
                          f"({chunk}, {n}) = {size:,} elements, one per chunk",
                          f"{copies.count} copies of "
                          f"{', '.join(f'{e:,}' for e in copies.elements) or 'nothing'} "
                          "elements", copies.count == chunks and bool(copies.elements)
                          and max(copies.elements) == size))
        need = min(buffers, chunks)
        kind = {2: " (double buffering)", 3: " (triple buffering)"}.get(need, "")
        rules.append(Rule(f"copies {label}: buffers", f"{need} VMEM buffers{kind}",
                          f"{copies.buffers}", copies.buffers == need))
    rules.append(Rule("overlap: the next chunk's copy starts before this chunk's compute",
                      f"a copy into VMEM in flight at {order.computes - 1} of the "
                      f"{order.computes} compute steps (all but the last)",
                      f"at {order.overlapped}", order.computes > 0
                      and order.overlapped >= order.computes - 1))
    rules.append(Rule("in-place safety", "no copy into a buffer while a copy out of it is "
                      "still in flight", f"{order.unsafe} such copies" if order.unsafe
                      else "none", not order.unsafe))
    rules.append(Rule("every copy waited", "each start waited exactly once",
                      f"{order.never_waited} never waited, {order.waits_unmatched} waits "
                      "without a start" if order.never_waited or order.waits_unmatched
                      else "they are", not (order.never_waited or order.waits_unmatched)))
    parallel = [s for s in order.semantics if s != "arbitrary"]
    rules.append(Rule("grid semantics", "\"arbitrary\" where copies cross grid steps (the "
                      "steps run in order, on one core)",
                      f"copies cross steps on a {'/'.join(order.semantics)} grid"
                      if order.crosses_steps else "copies stay within a step",
                      not (order.crosses_steps and parallel)))
    if not order.followed:
        rules.append(Rule("DMA order followed", "the whole run", "cut short", False))
    return rules


# ----------------------------------------------------------------------------- task 1: by hand
def _dma_rules(call, case, rules, inputs):
    (m, n), chunk = case.arrays["x"], case.params["chunk"]
    chunk_bytes = nbytes_of((chunk, n), case.dtype)
    rules.append(grid_is(call, (cdiv(m, chunk),)))
    rules.extend(_x_left_in_hbm(call, nbytes_of((m, n), case.dtype)))
    rules.append(block_is(call, "output", 0, (chunk, n), "output"))
    rules.extend(total_budget(call, None, nbytes_of((m, n), case.dtype)))
    # the output block moves with the grid, so it gets two buffers; with one step it never
    # moves and Mosaic gives it one (kernelsim mirrors that)
    out_buffers = 2 if cdiv(m, chunk) > 1 else 1
    rules.append(_footprint(call, (2 + out_buffers) * chunk_bytes,
                            f"two ({chunk}, {n}) chunk buffers of scratch for x, and the output "
                            f"block's {out_buffers} pipeline buffer(s)"))


# --------------------------------------------------------------------------- task 2: emit_pipeline
def _pipeline_rules(call, case, rules, inputs):
    (m, n) = case.arrays["x"]
    nbytes = nbytes_of((m, n), case.dtype)
    rules.append(grid_is(call, ()))
    rules.extend(_x_left_in_hbm(call, nbytes))
    rules.extend(_output_left_in_hbm(call, nbytes))
    scratch = _scratch(call)
    rules.append(Rule("scratch_shapes", "none: emit_pipeline allocates its own buffers and "
                      "semaphores", f"{len(scratch)} scratch operand(s)", not scratch))


# ----------------------------------------------------------------------------- task 3: in place
def _in_place_rules(call, case, rules, inputs):
    (m, n), chunk = case.arrays["x"], case.params["chunk"]
    nbytes = nbytes_of((m, n), case.dtype)
    rules.append(grid_is(call, ()))
    rules.extend(_x_left_in_hbm(call, nbytes))
    rules.extend(_output_left_in_hbm(call, nbytes))
    rules.append(_footprint(call, 2 * nbytes_of((chunk, n), case.dtype),
                            f"two ({chunk}, {n}) chunk buffers, each scaled in place"))


register_task(
    id="absmax_dma", assignment=A8,
    title="Double buffering by hand: x in HBM, two VMEM buffers, DMAs across grid steps",
    kernel_ops=(("reduce_max",),),
    reference=_reference,
    invoke=calling.with_race_detector, dma_rules=pipelined,
    cases=(
        # three chunks, the last one short (8 rows)
        make_case("v0", 80, "float32", {"x": (40, 256)}, chunk=16),
        make_case("h0", 801, "float32", {"x": (64, 128)}, True, chunk=16),
        # a short last chunk of 16 bfloat16 rows (one packed tile)
        make_case("h1", 802, "bfloat16", {"x": (80, 256)}, True, chunk=32),
        # one chunk: no next copy to start
        make_case("h2", 803, "float32", {"x": (16, 384)}, True, chunk=16),
        # five chunks, an odd count, the last one short
        make_case("h3", 804, "float32", {"x": (72, 128)}, True, chunk=16),
    ),
    structure=single_call(_dma_rules),
)
register_task(
    id="absmax_pipeline", assignment=A8,
    title="The same pipeline with pltpu.emit_pipeline inside the kernel",
    kernel_ops=(("reduce_max",),),
    reference=_reference,
    invoke=calling.pipeline,
    dma_rules=lambda order, case: pipelined(order, case, out=True),
    cases=(
        make_case("v0", 81, "float32", {"x": (40, 256)}, chunk=16),
        make_case("h0", 811, "float32", {"x": (64, 128)}, True, chunk=16),
        make_case("h1", 812, "bfloat16", {"x": (80, 256)}, True, chunk=32),
        make_case("h2", 813, "float32", {"x": (16, 384)}, True, chunk=16),
    ),
    structure=single_call(_pipeline_rules),
)
register_task(
    id="absmax_in_place", assignment=A8,
    title="Find the bug: a copy into a buffer its write-back is still reading",
    kernel_ops=(("reduce_max",),),
    reference=_reference,
    invoke=calling.with_race_detector,
    dma_rules=lambda order, case: pipelined(order, case, out=True),
    cases=(
        # every case has at least five chunks: the race is at chunks 1 .. n-2, and each of
        # them is a separate chance for the detector (see calling.RACE_CLOCK_SIZE)
        make_case("v0", 82, "float32", {"x": (96, 256)}, chunk=16),
        make_case("h0", 821, "float32", {"x": (40, 128)}, True, chunk=8),
        make_case("h1", 822, "bfloat16", {"x": (160, 256)}, True, chunk=32),
        make_case("h2", 823, "float32", {"x": (128, 384)}, True, chunk=16),
    ),
    structure=single_call(_in_place_rules),
)
