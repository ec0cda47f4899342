"""Assignment 11, Pallas on GPU: a row sum and a matmul written GPU-safe, and a prediction of
the HBM bytes kernelsim's GPU model counts.

GPU-safe, as lesson 11 teaches it: the programs of a grid run concurrently on a GPU, so each
output block is written by exactly one grid step (no block revisited), the reduction is a
``lax.fori_loop`` inside the program, and the kernel passes JAX's GPU lowering of
``pallas_call`` (Triton, in the pinned release).

How the lowering is graded: ``calling.lowered_for_gpu`` calls the learner's function as every task
does (the values, kernelsim's trace and the work facts come from that call), then asks
``kernelsim.gpu_lowering_error`` about the same function with ``interpret=False``: JAX's real
Triton lowering, run on this machine (no GPU; nothing executes). A refusal is raised as the
function's error, so the verdict names it. The learner's functions take ``interpret=`` for
this. An interpreted ``pallas_call`` lowers on any platform, so before asking, the wrapper
checks that every ``pallas_call`` the compiled variant reaches has ``interpret=False``. It also
refuses a float32 ``jnp.dot`` below HIGHEST precision in a kernel: interpret mode computes it in
float32, but the Triton lowering turns DEFAULT into TF32, which a GPU would miss the
tolerance with.

Lowering is not compiling: Triton's PTX compilation happens on a GPU. The cases keep each
loop step's tiles small (at most 40 KiB of A and B chunks) so that the instructor's solutions
also fit a GPU's shared memory when Triton pipelines the loop.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from grader import calling
from grader.tasks.a04_memory_spaces import prediction_structure
from grader.tasks.core import (
    Rule,
    as_f32,
    block_is,
    cdiv,
    make_case,
    matmul_reference,
    operands_with_role,
    register_task,
    single_call,
)

A11 = "11_gpu"
LOOP = ("scan", "while")  # what a lax.fori_loop becomes in a kernel's jaxpr


def _one_write_per_block(call, out_blocks: int) -> Rule:
    """Each output block written by exactly one grid step: as many steps as output blocks,
    and every step writes its block back (none keeps it for the next step). With every value
    right, every block was written, so no two steps share one."""
    outs = operands_with_role(call, "output")
    writebacks = outs[0].writebacks if outs else -1
    steps = math.prod(call.grid)
    return Rule("each output block written by exactly one grid step",
                f"{out_blocks} grid steps, each writing its own block ({out_blocks} writebacks;"
                " GPU programs run concurrently, so a revisited block races)",
                f"{steps} grid steps, {writebacks} writebacks",
                steps == writebacks == out_blocks)


# ----------------------------------------------------------------------------- task 1: row sums
def _row_sums_rules(call, case, rules, inputs):
    (m, _), bm = case.arrays["x"], case.params["bm"]
    rules.append(Rule("grid", f"({cdiv(m, bm)},): one program per row block, no K axis",
                      str(tuple(call.grid)), tuple(call.grid) == (cdiv(m, bm),)))
    rules.append(block_is(call, "output", 0, (bm, 1), "output"))
    rules.append(_one_write_per_block(call, cdiv(m, bm)))


register_task(
    id="gpu_row_sums", assignment=A11, target="gpu",
    title="Row sums, GPU-safe: the K loop inside the program",
    kernel_ops=(("reduce_sum",), LOOP),
    reference=lambda x, bm, bk: jnp.sum(as_f32(x), axis=1, keepdims=True).astype(x.dtype),
    invoke=calling.lowered_for_gpu,
    tolerance="reduction",
    cases=(
        # K = 384 is not a power of two: the (16, 384) band must be loaded in 128-wide chunks
        make_case("v0", 110, "float32", {"x": (64, 384)}, bm=16, bk=128),
        # visible: long all-positive bfloat16 rows, twice h4's length, so that a bfloat16
        # running total's roundings outgrow the tolerance (at h4's length some seeds pass)
        make_case("v1", 1106, "bfloat16", {"x": (16, 8192)}, values="positive", bm=16, bk=256),
        make_case("h0", 1101, "bfloat16", {"x": (40, 512)}, True, bm=16, bk=256),
        make_case("h1", 1102, "float32", {"x": (32, 1024)}, True, "positive", bm=32, bk=128),
        make_case("h2", 1103, "float32", {"x": (16, 128)}, True, bm=16, bk=128),
        make_case("h3", 1104, "float32", {"x": (48, 640)}, True, bm=8, bk=128),
        # long all-positive bfloat16 rows: a running total kept in bfloat16 fails it
        make_case("h4", 1105, "bfloat16", {"x": (16, 4096)}, True, "positive", bm=16, bk=256),
    ),
    structure=single_call(_row_sums_rules),
)


# ----------------------------------------------------------------------------- task 2: matmul
def _matmul_rules(call, case, rules, inputs):
    (m, _), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bn = case.params["bm"], case.params["bn"]
    grid = (cdiv(m, bm), cdiv(n, bn))
    rules.append(Rule("grid", f"{grid}: one program per output block, no K axis",
                      str(tuple(call.grid)), tuple(call.grid) == grid))
    rules.append(block_is(call, "output", 0, (bm, bn), "output"))
    rules.append(_one_write_per_block(call, math.prod(grid)))


# the kernel body task 2's text gives: lesson 11 ships it (``matmul_gpu_safe_kernel``), and the
# task's own work is the GPU grid and bands around it
GPU_MATMUL_BODY = """def add_chunk(c, acc):
    ks = pl.ds(c * bk, bk)  # chunk c of K: columns of a's band, rows of b's
    product = jnp.dot(a_ref[:, ks], b_ref[ks, :], precision=precision,
                      preferred_element_type=jnp.float32)
    return acc + product

acc = jax.lax.fori_loop(0, k // bk, add_chunk, jnp.zeros((bm, bn), jnp.float32))
o_ref[...] = acc.astype(o_ref.dtype)"""
register_task(
    id="gpu_matmul", assignment=A11, target="gpu",
    given_body=GPU_MATMUL_BODY,
    title="Matmul, GPU-safe: one program per output block",
    kernel_ops=(("dot_general",), LOOP),
    reference=matmul_reference,
    invoke=calling.lowered_for_gpu,
    tolerance="reduction",
    cases=(
        # K = 384: the (bm, K) band of A cannot be loaded whole (not a power of two)
        make_case("v0", 111, "float32", {"a": (64, 384), "b": (384, 128)}, bm=32, bn=128, bk=64),
        # visible: a long all-positive K in bfloat16, which a bfloat16 accumulator loses
        make_case("v1", 1115, "bfloat16", {"a": (32, 1024), "b": (1024, 128)}, values="positive",
                  bm=32, bn=128, bk=128),
        make_case("h0", 1111, "bfloat16", {"a": (64, 256), "b": (256, 256)}, True,
                  bm=32, bn=128, bk=128),
        # edge blocks in M (40 = 2·16 + 8) and several column blocks
        make_case("h1", 1112, "float32", {"a": (40, 384), "b": (384, 384)}, True,
                  bm=16, bn=128, bk=32),
        # a long all-positive K: a bfloat16 accumulator would fail it
        make_case("h2", 1113, "bfloat16", {"a": (32, 1024), "b": (1024, 128)}, True, "positive",
                  bm=32, bn=128, bk=128),
        make_case("h3", 1114, "float32", {"a": (128, 512), "b": (512, 256)}, True,
                  bm=64, bn=128, bk=32),
    ),
    structure=single_call(_matmul_rules),
)


# ----------------------------------------------------------------- task 3: predict, then run
def _gpu_matmul_blockspecs(m, k, n, bm, bn, dtype):
    """The pallas_call that task ``gpu_matmul`` asks for, as far as traffic goes: its grid and
    BlockSpecs. kernelsim only evaluates index maps, so the body (a placeholder) never runs."""

    def placeholder(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

    # one program per output block; A's row band and B's column band for each
    return pl.pallas_call(
        placeholder,
        grid=(cdiv(m, bm), cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), dtype),
    )


def gpu_matmul_read_bytes(m, k, n, bm, bn, itemsize) -> int:
    """Bytes of A and B that kernelsim's GPU model has ``gpu_matmul``'s programs load from
    global memory, every program its own bands: the HBM reads plus the re-reads it counts as
    served by L2 (``CallCost.l2_hit_bytes``)."""
    dtype = {2: jnp.bfloat16, 4: jnp.float32}[itemsize]
    call = _gpu_matmul_blockspecs(m, k, n, bm, bn, dtype)
    a, b = np.zeros((m, k), dtype), np.zeros((k, n), dtype)
    cost = kernelsim.trace(call, a, b, model="gpu", chip="h100").calls[0].cost
    return int(cost.hbm_read_bytes + cost.l2_hit_bytes)


register_task(
    id="predict_gpu_reads", assignment=A11, target="gpu",
    title="Predict the bytes the GPU model has gpu_matmul's programs load, then run kernelsim",
    reference=lambda **p: np.full((1, 1), gpu_matmul_read_bytes(**p), np.int32),
    invoke=calling.prediction, own_kernels=False,
    cases=(
        make_case("v0", 0, "float32", {}, m=64, k=384, n=128, bm=32, bn=128, itemsize=4),
        # several column blocks: A's band is read once per column block
        make_case("h0", 0, "float32", {}, True, m=128, k=512, n=512, bm=64, bn=128, itemsize=4),
        # edge blocks: only their in-bounds part is read
        make_case("h1", 0, "float32", {}, True, m=40, k=384, n=384, bm=16, bn=256, itemsize=4),
        make_case("h2", 0, "float32", {}, True, m=256, k=256, n=256, bm=32, bn=128, itemsize=2),
        # a single program: each operand read once
        make_case("h3", 0, "float32", {}, True, m=64, k=1024, n=128, bm=64, bn=128, itemsize=2),
    ),
    structure=prediction_structure,
)
