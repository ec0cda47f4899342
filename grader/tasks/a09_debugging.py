"""Assignment 09, debugging: "find the bug" tasks, their cases and structural rules.

Each task ships a buggy kernel in the notebook; the learner submits the fixed one. Every task
has a visible case that exposes its bug and hidden cases that expose it again on other shapes
(``tests/grader/tasks/test_debugging_tasks.py`` runs the shipped buggy kernels and sees each fail).
The bug in ``pool_rows`` is a block shape only the TPU lowering rejects: interpret mode computes
the right values with it, so a structural rule mirroring that lowering check catches it.
``chunk_sum`` is graded with TPU interpret mode's race detector on, so a fix that still races
fails even where its values happen to be right; it streams through three buffers, so lesson 5's
double-buffered kernel does not solve it.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from grader import calling
from grader.tasks.a08_manual_dma import pipelined
from grader.tasks.core import (
    Rule,
    as_f32,
    block_is,
    cdiv,
    drawn_values,
    grid_is,
    make_case,
    nbytes_of,
    operands_with_role,
    read_budget,
    register_task,
    single_call,
    total_budget,
)

A9 = "09_debugging"
POOL = 4  # pool_rows averages groups of this many consecutive rows


def _writebacks(call, count: int, why: str) -> Rule:
    outs = operands_with_role(call, "output")
    found = outs[0].writebacks if outs else -1
    return Rule("output writebacks", f"{count} ({why})", str(found), found == count)


def _tpu_block_rule(call, role: str, index: int, array: tuple[int, ...], label: str) -> Rule:
    """The TPU lowering's block-shape rule for a 2-D block: the last two dims divisible by 8 and
    128, or equal to the array's (jax/_src/pallas/mosaic/lowering.py:994-1015, which
    kernelsim/cost/lint.py mirrors)."""
    ops = operands_with_role(call, role)
    if index >= len(ops) or ops[index].block_shape is None:
        return Rule(f"{label} block accepted by the TPU lowering", "a 2-D block",
                    f"no blocked {role} operand #{index}", False)
    block = tuple(1 if b is None else b for b in ops[index].block_shape)
    bad = [f"{pos} dim {b} is neither a multiple of {m} nor the array's {a}"
           for b, a, m, pos in ((block[-1], array[-1], 128, "last"),
                                (block[-2], array[-2], 8, "second-to-last"))
           if b != a and b % m]
    return Rule(f"{label} block accepted by the TPU lowering",
                "last two dims multiples of (8, 128) or the array's own",
                f"{block} over {array}" + (": " + "; ".join(bad) if bad else ""), not bad)


def _roll_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (m // bm,)))
    rules.append(block_is(call, "input", 0, (bm, n), "x"))
    rules.append(read_budget(call, "input", 0, nbytes_of((m, n), case.dtype),
                             "x (each block once)"))


def _row_sums_rules(call, case, rules, inputs):
    (m, n), bm, bn = case.arrays["x"], case.params["bm"], case.params["bn"]
    rules.append(grid_is(call, (m // bm, n // bn)))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(read_budget(call, "input", 0, nbytes_of((m, n), case.dtype),
                             "x (each block once)"))
    rules.append(_writebacks(call, m // bm, "each row block's sums stay on chip across j"))


def _column_max_rules(call, case, rules, inputs):
    (m, n), bm = case.arrays["x"], case.params["bm"]
    rules.append(grid_is(call, (cdiv(m, bm),)))
    rules.append(block_is(call, "input", 0, (bm, n), "x"))
    rules.append(read_budget(call, "input", 0, nbytes_of((m, n), case.dtype),
                             "x (each block once)"))
    rules.append(_writebacks(call, 1, "the (1, N) result stays on chip"))


def _pool_rules(call, case, rules, inputs):
    m, n = case.arrays["x"]
    rules.append(_tpu_block_rule(call, "input", 0, (m, n), "x"))
    rules.append(_tpu_block_rule(call, "output", 0, (m // POOL, n), "output"))
    rules.append(read_budget(call, "input", 0, nbytes_of((m, n), case.dtype),
                             "x (each block once)"))
    rules.extend(total_budget(call, None, nbytes_of((m // POOL, n), case.dtype)))


def _chunk_sum_rules(call, case, rules, inputs):
    rules.append(grid_is(call, ()))


def _make_column_max(rng, case):
    """``values="negative"``: every element below -1, so padding masked with 0 wins the max."""
    (shape,) = case.arrays.values()
    if case.values == "negative":
        x = -1 - np.abs(rng.standard_normal(shape, dtype=np.float32))
        return {"x": np.asarray(x.astype(jnp.bfloat16 if case.dtype == "bfloat16"
                                          else case.dtype))}
    return {"x": drawn_values(rng, shape, case)}


def _pool_reference(x):
    m, n = x.shape
    return as_f32(x).reshape(m // POOL, POOL, n).mean(axis=1).astype(x.dtype)


register_task(
    id="roll_rows", assignment=A9, title="Find the bug: a block roll whose index map is wrong",
    given_body="o_ref[...] = x_ref[...]",
    reference=lambda x, bm, shift: jnp.roll(x, shift * bm, axis=0),
    cases=(
        make_case("v0", 90, "float32", {"x": (64, 256)}, bm=16, shift=1),
        make_case("h0", 901, "float32", {"x": (96, 128)}, True, bm=8, shift=5),
        make_case("h1", 902, "bfloat16", {"x": (128, 256)}, True, bm=32, shift=3),
        make_case("h2", 903, "float32", {"x": (24, 384)}, True, bm=8, shift=2),
    ),
    structure=single_call(_roll_rules),
)
register_task(
    id="row_sums", assignment=A9, title="Find the bug: row sums whose accumulator starts "
    "uninitialised",
    kernel_ops=(("reduce_sum",),),
    reference=lambda x, bm, bn: jnp.sum(as_f32(x), axis=1, keepdims=True),
    tolerance="reduction",
    cases=(
        make_case("v0", 91, "float32", {"x": (32, 512)}, bm=8, bn=128),
        make_case("h0", 911, "bfloat16", {"x": (64, 256)}, True, bm=16, bn=128),
        make_case("h1", 912, "float32", {"x": (16, 1024)}, True, "positive", bm=16, bn=256),
        make_case("h2", 913, "float32", {"x": (8, 128)}, True, bm=8, bn=128),
    ),
    structure=single_call(_row_sums_rules),
)
register_task(
    id="column_max", assignment=A9, title="Find the bug: a ragged-edge mask off by one",
    kernel_ops=(("reduce_max",),),
    reference=lambda x, bm: jnp.max(x, axis=0, keepdims=True),
    make=_make_column_max,
    cases=(
        make_case("v0", 92, "float32", {"x": (37, 256)}, bm=8),
        make_case("h0", 921, "float32", {"x": (33, 128)}, True, bm=16),
        make_case("h1", 922, "bfloat16", {"x": (50, 384)}, True, bm=16),
        make_case("h2", 923, "float32", {"x": (21, 128)}, True, "negative", bm=8),
    ),
    structure=single_call(_column_max_rules),
)
register_task(
    id="pool_rows", assignment=A9, title="Find the bug: blocks the TPU lowering rejects",
    kernel_ops=(("add", "reduce_sum"),),
    reference=_pool_reference,
    tolerance="reduction",
    cases=(
        make_case("v0", 93, "float32", {"x": (64, 256)}),
        make_case("h0", 931, "float32", {"x": (40, 128)}, True),
        make_case("h1", 932, "bfloat16", {"x": (128, 384)}, True),
        make_case("h2", 933, "float32", {"x": (16, 200)}, True),
    ),
    structure=single_call(_pool_rules),
)
register_task(
    id="chunk_sum", assignment=A9,
    title="Find the bug: a read that races its DMA in a ring of three buffers",
    kernel_ops=(("add",),),
    reference=lambda x, chunk: jnp.sum(as_f32(x).reshape(-1, chunk, x.shape[1]), axis=0),
    tolerance="reduction",
    # two copies in flight behind the add: three VMEM buffers, not lesson 5's two
    invoke=calling.with_race_detector, dma_rules=functools.partial(pipelined, buffers=3),
    cases=(
        make_case("v0", 94, "float32", {"x": (64, 256)}, chunk=8),
        make_case("h0", 941, "float32", {"x": (128, 128)}, True, chunk=16),
        make_case("h1", 942, "bfloat16", {"x": (64, 256)}, True, chunk=16),
        make_case("h2", 943, "float32", {"x": (8, 128)}, True, chunk=8),
        make_case("h3", 944, "float32", {"x": (32, 128)}, True, chunk=16),
    ),
    structure=single_call(_chunk_sum_rules),
)
