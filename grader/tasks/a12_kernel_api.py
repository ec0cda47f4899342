"""Assignment 12, the kernel API of today (lesson 13): copies a kernel writes itself with
``pltpu.async_copy``/``sync_copy`` and semaphores from ``pl.run_scoped``, and a pipeline split
between two TensorCores. TPU-only kernels, every case graded in TPU interpret mode with its
race detector on (``calling.with_race_detector``).

Both tasks are graded through a ``pl.pallas_call`` with ``pl.ANY`` operands, the form whose
body is the same as a ``pl.kernel`` body: the grader's work facts (``grader/facts/work.py``) read
``pallas_call`` equations, and a ``pl.kernel`` (an ``mpmd_map``) would count as computed
outside any kernel.

- ``softmax_in_parts``: a row softmax with ``x`` copied into one VMEM buffer in ``parts``
  copies that are all in flight at once, each part computed after its own wait, the result
  copied out. Rules from kernelsim's trace: no grid, ``x`` and the output left in HBM and
  moved once by the body's copies, and one scratch operand (the buffer: the semaphores come
  from ``pl.run_scoped``). The trace's facts hold no count or order of a body's copies, so
  "in ``parts`` copies, all in flight" is the task's instruction, not a rule; the race
  detector fails a part computed before its copy is waited on.
- ``matmul_bias_relu_cores``: ``relu(a @ b + bias)`` by an ``emit_pipeline`` inside a
  ``pallas_call`` whose one grid axis, as large as the chip has TensorCores
  (``kernelsim.backend.tensorcores``: 1 on a TPU v5e, where an axis of 2 failed to compile; 2
  in interpret mode), is ``"core_parallel"``; the pipeline takes its share with
  ``core_axis=0``. Rules: that grid and semantics, every operand in HBM, the output
  written exactly once (two cores each computing everything write it twice) and the reads
  within the tiled matmul's (each core re-reading everything reads twice as much).
"""

from __future__ import annotations

import jax.numpy as jnp

from grader import calling
from grader.calling import softmax_rows
from grader.tasks.core import (
    Rule,
    as_f32,
    grid_is,
    make_case,
    nbytes_of,
    operands_with_role,
    register_task,
    single_call,
    total_budget,
)
from kernelsim import backend

A12 = "12_kernel_api"


def _left_in_hbm(call, role: str) -> list[Rule]:
    """Every operand of ``role`` in ``pl.ANY``: no pipeline fetch or write-back."""
    ops = operands_with_role(call, role)
    moved = [f"{o.name}: {o.fetches} fetches, {o.writebacks} write-backs" for o in ops
             if o.fetches or o.writebacks or o.memory_space not in ("any", "hbm")]
    return [Rule(f"{role}s left in HBM (memory_space=pl.ANY)", "no pipeline copies of them",
                 "; ".join(moved) or "none", bool(ops) and not moved)]


# ----------------------------------------------------------------------------- task 1: parts
def _softmax_reference(x, parts):
    return softmax_rows(x).astype(x.dtype)


def _softmax_rules(call, case, rules, inputs):
    m, n = case.arrays["x"]
    nbytes = nbytes_of((m, n), case.dtype)
    rules.append(grid_is(call, ()))
    rules.extend(_left_in_hbm(call, "input"))
    rules.extend(_left_in_hbm(call, "output"))
    rules.extend(total_budget(call, read=nbytes, write=nbytes))
    scratch = [o for o in call.operands if o.role == "scratch"]
    rules.append(Rule("scratch_shapes", "one VMEM buffer (the semaphores come from "
                      "pl.run_scoped)", ", ".join(f"{o.name} in {o.memory_space}"
                                                   for o in scratch) or "none",
                      len(scratch) == 1 and scratch[0].memory_space == "vmem"))


register_task(
    id="softmax_in_parts", assignment=A12,
    title="Row softmax with the input copied in parts, all copies in flight at once",
    kernel_ops=(("exp",), ("reduce_max",)),
    reference=_softmax_reference,
    invoke=calling.with_race_detector,
    tolerance="reduction",
    cases=(
        make_case("v0", 120, "float32", {"x": (64, 256)}, parts=2),
        make_case("h0", 1201, "float32", {"x": (64, 128)}, True, parts=4),
        make_case("h1", 1202, "bfloat16", {"x": (64, 256)}, True, parts=2),
        make_case("h2", 1203, "float32", {"x": (32, 384)}, True, values="large", parts=4),
        make_case("h3", 1204, "float32", {"x": (16, 128)}, True, parts=1),
    ),
    structure=single_call(_softmax_rules),
)


# ----------------------------------------------------------------------------- task 2: cores
def _mm_reference(a, b, bias, bm, bk, bn):
    out = jnp.dot(as_f32(a), as_f32(b), precision="highest") + as_f32(bias)
    return jnp.maximum(out, 0.0).astype(a.dtype)


def _mm_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bn = case.params["bm"], case.params["bn"]
    cores = backend.tensorcores()  # where the kernel runs: the chip's, or 2 interpreted
    rules.append(Rule("grid", f"({cores},): one index per TensorCore "
                      "(kernelsim.backend.tensorcores())", str(tuple(call.grid)),
                      tuple(call.grid) == (cores,)))
    sem = call.dimension_semantics
    rules.append(Rule("dimension_semantics", str(("core_parallel",)), str(sem),
                      sem == ("core_parallel",)))
    rules.extend(_left_in_hbm(call, "input"))
    rules.extend(_left_in_hbm(call, "output"))
    # the tiled matmul's reads (lesson 4): a once per column block, b once per row block, the
    # bias at most once per row block; split between the cores, not done twice
    read = (nbytes_of((m, k), case.dtype) * (n // bn) + nbytes_of((k, n), case.dtype) * (m // bm)
            + nbytes_of((1, n), case.dtype) * (m // bm))
    rules.extend(total_budget(call, read=read, write=nbytes_of((m, n), case.dtype)))


register_task(
    id="matmul_bias_relu_cores", assignment=A12,
    title="relu(a @ b + bias) with its pipeline split between two TensorCores",
    kernel_ops=(("dot_general",), ("max",)),
    reference=_mm_reference,
    invoke=calling.pipeline,
    tolerance="reduction",
    cases=(
        make_case("v0", 121, "float32", {"a": (256, 256), "b": (256, 256), "bias": (1, 256)},
                  bm=128, bk=128, bn=128),
        # three row blocks: the split falls on the column axis
        make_case("h0", 1211, "float32", {"a": (384, 256), "b": (256, 256), "bias": (1, 256)},
                  True, bm=128, bk=128, bn=128),
        make_case("h1", 1212, "bfloat16", {"a": (256, 512), "b": (512, 384), "bias": (1, 384)},
                  True, bm=64, bk=256, bn=128),
        # no parallel axis the two cores divide: the larger one is split unevenly
        make_case("h2", 1213, "float32", {"a": (384, 256), "b": (256, 384), "bias": (1, 384)},
                  True, bm=128, bk=128, bn=128),
    ),
    structure=single_call(_mm_rules),
)

