"""Assignment 04, memory spaces: its tasks, cases and structural rules."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import kernelsim
from grader import calling
from grader.tasks.core import (
    Case,
    Rule,
    as_f32,
    block_is,
    cdiv,
    drawn_values,
    grid_is,
    make_case,
    matmul_reference,
    nbytes_of,
    normal_array,
    operands_with_role,
    read_budget,
    register_task,
    role_count,
    single_call,
    tiled_matmul_call,
    total_budget,
)

A4 = "04_memory_spaces"


def _mm_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk, bn = case.params["bm"], case.params["bk"], case.params["bn"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn), cdiv(k, bk))))
    rules.append(role_count(call, "scratch", 1, "VMEM accumulator"))
    rules.append(read_budget(call, "input", 0, cdiv(n, bn) * nbytes_of((m, k), case.dtype),
                             f"A (at most N/bn = {cdiv(n, bn)} times)"))
    rules.append(read_budget(call, "input", 1, cdiv(m, bm) * nbytes_of((k, n), case.dtype),
                             f"B (at most M/bm = {cdiv(m, bm)} times)"))
    rules.extend(total_budget(call, None, nbytes_of((m, n), case.dtype)))


def _mm_bias_rules(call, case, rules, inputs):
    _mm_rules(call, case, rules, inputs)
    rules.append(role_count(call, "input", 3, "bias as a kernel input (fused epilogue)"))


def _make_mm_bias(rng, case: Case) -> dict[str, np.ndarray]:
    """a, b and a (1, N) bias. With "positive" a and b (U[0, 1), so a @ b is about K/4 and
    spreads by about sqrt(7K/144)), the bias is -K/4 plus that spread: the results straddle
    zero, so the ReLU clips about half of them and a bias or ReLU applied per K step, or an
    epilogue done after rounding the accumulator to bfloat16, is visibly wrong."""
    out = {k: drawn_values(rng, s, case) for k, s in case.arrays.items()}
    k, n = case.arrays["b"]
    if case.values == "positive":
        centre = -k / 4 + np.sqrt(7 * k / 144) * rng.standard_normal((1, n), dtype=np.float32)
        out["bias"] = np.asarray(centre.astype(out["a"].dtype))
    else:
        out["bias"] = normal_array(rng, (1, n), case.dtype)
    return out


def _sum_rules(call, case, rules, inputs):
    (m, n), (bm, bn) = case.arrays["x"], case.params["block"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn))))
    rules.append(block_is(call, "input", 0, (bm, bn), "x"))
    rules.append(read_budget(call, "input", 0, nbytes_of((m, n), case.dtype), "x (read once)"))
    outs = operands_with_role(call, "output")
    wb = outs[0].writebacks if outs else -1
    rules.append(Rule("output writebacks", "1 (the (1, 1) result stays on chip)", str(wb),
                      wb == 1))


# ----------------------------------------------------------------- predict, then run (matmul)
def matmul_read_bytes(m, k, n, bm, bk, bn, itemsize) -> int:
    """HBM bytes kernelsim counts as read (A and B) by the ``matmul`` the assignment asks for."""
    dtype = {2: jnp.bfloat16, 4: jnp.float32}[itemsize]
    call = tiled_matmul_call(m, k, n, bm, bk, bn, dtype)
    a, b = np.zeros((m, k), dtype), np.zeros((k, n), dtype)
    return int(kernelsim.trace(call, a, b).calls[0].hbm_read_bytes)


def prediction_structure(t, case, inputs) -> list[Rule]:
    k = len(t.calls)
    return [Rule("kernels run", "only the grader's, which writes your answer (predict from the "
                 "sizes; run nothing)", f"{k} pallas_call(s)", k == 1)]


_mm = dict(bm=16, bk=128, bn=128)
register_task(
    id="matmul", assignment=A4, title="Matmul with a VMEM accumulator, for any K",
    kernel_ops=(("dot_general",),),
    reference=matmul_reference, tolerance="reduction",
    cases=(
        make_case("v0", 9, "float32", {"a": (32, 256), "b": (256, 256)}, **_mm),
        # visible: a long all-positive K in bfloat16, which a bfloat16 accumulator loses
        make_case("v1", 195, "bfloat16", {"a": (64, 1024), "b": (1024, 128)}, values="positive",
                  bm=32, bk=128, bn=128),
        # visible: K = 200 in blocks of 128, so the last K step's blocks stick out by 56
        make_case("v2", 196, "float32", {"a": (32, 200), "b": (200, 256)}, **_mm),
        # every dimension ragged: M, N and K (330 = 2 * 128 + 74) overhang their blocks
        make_case("h0", 191, "float32", {"a": (40, 330), "b": (330, 300)}, True, **_mm),
        make_case("h1", 192, "bfloat16", {"a": (64, 256), "b": (256, 256)}, True,
                  bm=32, bk=128, bn=128),
        # K = 140 with bk = 256: a single K step whose blocks are mostly overhang
        make_case("h2", 193, "float32", {"a": (16, 140), "b": (140, 128)}, True, bm=8, bk=256,
                  bn=128),
        make_case("h3", 194, "bfloat16", {"a": (64, 1024), "b": (1024, 128)}, True,
                  values="positive", bm=32, bk=128, bn=128),
    ),
    structure=single_call(_mm_rules),
)
register_task(
    id="predict_matmul_reads", assignment=A4,
    title="Predict the HBM bytes matmul reads, then run kernelsim",
    reference=lambda **p: np.full((1, 1), matmul_read_bytes(**p), np.int32),
    invoke=calling.prediction, own_kernels=False,
    cases=(
        make_case("v0", 0, "float32", {}, m=32, k=256, n=256, bm=16, bk=128, bn=128, itemsize=4),
        # one K step: A's block stays the same across the j steps
        make_case("h0", 0, "float32", {}, True, m=64, k=128, n=512, bm=32, bk=128, bn=128,
                  itemsize=4),
        # one K step and one column block: B is read once
        make_case("h1", 0, "float32", {}, True, m=64, k=256, n=128, bm=16, bk=256, bn=128,
                  itemsize=2),
        # edge blocks: only their in-bounds part moves
        make_case("h2", 0, "float32", {}, True, m=40, k=384, n=300, bm=16, bk=128, bn=128,
                  itemsize=4),
        make_case("h3", 0, "float32", {}, True, m=128, k=512, n=256, bm=64, bk=128, bn=128,
                  itemsize=2),
    ),
    structure=prediction_structure,
)
register_task(
    id="matmul_bias_relu", assignment=A4, title="Fused bias + ReLU epilogue",
    kernel_ops=(("dot_general",), ("max",)),
    reference=lambda a, b, bias, **_: jnp.maximum(
        jnp.dot(a, b, precision="highest", preferred_element_type=jnp.float32) + as_f32(bias),
        0).astype(a.dtype),
    tolerance="reduction",
    make=_make_mm_bias,
    cases=(
        make_case("v0", 10, "float32", {"a": (32, 256), "b": (256, 256)}, **_mm),
        make_case("h0", 201, "float32", {"a": (40, 384), "b": (384, 300)}, True, **_mm),
        make_case("h1", 202, "bfloat16", {"a": (64, 256), "b": (256, 256)}, True,
                  bm=32, bk=128, bn=128),
        make_case("h2", 203, "float32", {"a": (48, 256), "b": (256, 128)}, True, bm=16, bk=256,
                  bn=128),
        # results straddle zero after a long positive K (see _make_mm_bias); bfloat16 only:
        # in float32 the honest rounding of a ~K/4 sum is already near the reduction atol
        make_case("h3", 204, "bfloat16", {"a": (64, 1024), "b": (1024, 256)}, True,
                  values="positive", bm=32, bk=128, bn=128),
    ),
    structure=single_call(_mm_bias_rules),
)
register_task(
    id="sum_all", assignment=A4, title="Sum of all elements into one resident output block",
    kernel_ops=(("reduce_sum",),),
    reference=lambda x, block: jnp.sum(as_f32(x)).reshape(1, 1),
    tolerance="reduction",
    cases=(
        make_case("v0", 11, "float32", {"x": (32, 256)}, block=(8, 128)),
        # visible: the long all-positive bfloat16 sum (h3 below) that a bfloat16 running sum
        # loses
        make_case("v1", 215, "bfloat16", {"x": (12288, 16)}, values="positive", block=(16, 16)),
        make_case("h0", 211, "float32", {"x": (37, 300)}, True, block=(16, 128)),
        make_case("h1", 212, "bfloat16", {"x": (64, 256)}, True, block=(32, 128)),
        make_case("h2", 213, "float32", {"x": (20, 130)}, True, block=(8, 128)),
        # 768 steps of a growing all-positive sum: a bfloat16 running sum stops growing once a
        # block's sum is under half its ulp (a third of the total lost); (16, 16) blocks keep
        # the array small (the last block dim equals the array's, which the TPU accepts)
        make_case("h3", 214, "bfloat16", {"x": (12288, 16)}, True, values="positive",
                  block=(16, 16)),
    ),
    structure=single_call(_sum_rules),
)


# --------------------------------------------------------------------------- a table in SMEM
def _make_affine(rng, case: Case) -> dict[str, np.ndarray]:
    """x as drawn, and the float32 ``(M // bm, 2)`` table: per row block a scale (magnitude in
    [0.5, 2), either sign) and a shift (N(0, 1)), so a table read at the wrong row or column,
    or with scale and shift swapped, is visibly wrong."""
    blocks = case.arrays["table"][0]
    x = drawn_values(rng, case.arrays["x"], case)
    scale = rng.uniform(0.5, 2.0, blocks) * rng.choice((-1.0, 1.0), blocks)
    shift = rng.standard_normal(blocks)
    return {"x": x, "table": np.stack([scale, shift], axis=1).astype(np.float32)}


def _affine_ref(x, table, bm):
    per_row = jnp.repeat(table, bm, axis=0)  # row r takes the entry of its block r // bm
    return (as_f32(x) * per_row[:, :1] + per_row[:, 1:]).astype(x.dtype)


def _affine_rules(call, case, rules, inputs):
    (m, n), bm, table = case.arrays["x"], case.params["bm"], tuple(case.arrays["table"])
    rules.append(grid_is(call, (m // bm,)))
    ins = operands_with_role(call, "input")
    x_at = next((i for i, o in enumerate(ins) if tuple(o.shape) == (m, n)), None)
    t_at = next((i for i, o in enumerate(ins) if tuple(o.shape) == table), None)
    if x_at is None:
        rules.append(Rule("x as a kernel input", f"an input of shape {(m, n)}",
                          f"inputs of shapes {[tuple(o.shape) for o in ins]}", False))
    else:
        rules.append(block_is(call, "input", x_at, (bm, n), "x"))
        rules.append(read_budget(call, "input", x_at, nbytes_of((m, n), case.dtype),
                                 "x (read once)"))
    if t_at is None:
        rules.append(Rule("table as a kernel input", f"an input of shape {table}",
                          f"inputs of shapes {[tuple(o.shape) for o in ins]}", False))
    else:
        space = ins[t_at].memory_space
        rules.append(Rule("table memory space", "smem (pl.BlockSpec(memory_space=pltpu.SMEM)): "
                          "scalars are read from SMEM", f"{space} ({ins[t_at].name})",
                          space == "smem"))
        rules.append(block_is(call, "input", t_at, table, "table (whole)"))
        rules.append(read_budget(call, "input", t_at, nbytes_of(table, "float32"),
                                 "table (copied in once)"))
    rules.extend(total_budget(call, None, nbytes_of((m, n), case.dtype)))


register_task(
    id="affine_row_blocks", assignment=A4,
    title="Per-row-block scale and shift, read as scalars from a table in SMEM",
    kernel_ops=(("mul",),),
    # "exact": the kernel's own multiply and add in float32, rounded once. A compiler that fuses
    # them into one FMA (TPU interpret mode on a CPU does) is off by at most half an ulp of
    # x * scale: under 4.8e-7 while |x * scale| < 16 (at most 8.2 in these cases)
    reference=_affine_ref, make=_make_affine, tolerance="exact",
    cases=(
        make_case("v0", 12, "float32", {"x": (64, 256), "table": (4, 2)}, bm=16),
        make_case("h0", 221, "float32", {"x": (128, 384), "table": (16, 2)}, True, bm=8),
        make_case("h1", 222, "bfloat16", {"x": (64, 256), "table": (4, 2)}, True, bm=16),
        # two big blocks: one table row per 128 rows
        make_case("h2", 223, "float32", {"x": (256, 128), "table": (2, 2)}, True, bm=128),
        make_case("h3", 224, "bfloat16", {"x": (512, 256), "table": (32, 2)}, True, bm=16),
    ),
    structure=single_call(_affine_rules),
)
