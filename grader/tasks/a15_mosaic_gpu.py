"""Assignment 15, Mosaic GPU: predict what a Mosaic GPU kernel allocates and moves -- the shared
memory of a TMA staging tile and its barrier, of an ``emit_pipeline``'s stages, the registers of
a WGMMA accumulator, and the bytes a WGMMA matmul's TMA copies read -- then run kernelsim.

Every answer is graded against ``kernelsim.gpu`` on a kernel of the shape the task describes
(built here, traced, never run). kernelsim's shared-memory count is the Mosaic GPU lowering's
own (``tests/kernelsim/test_gpu_model.py`` compares the two on the course's kernels and JAX's
bundled ops).

Task 5 is a kernel the learner writes with ``plgpu.kernel``: an RMS norm that stages its tiles
by TMA. It runs in GPU interpret mode on a CPU (``calling.mosaic_gpu_here``), graded on values
against plain JAX on every case and on structure through ``kernelsim.gpu``'s model of one CTA
(``grader.facts.gpu_facts``): both inputs reach shared memory by TMA copies that a barrier wait
consumes, the result leaves by a committed and awaited TMA copy, and nothing moves between
global memory and registers past the TMA. (GPU interpret mode completes a copy at once, so
reading a tile before its wait still gives right values: the wait is judged by structure.)

Task 6 is a tiled WGMMA matmul the learner writes: one CTA per output tile, A and B tiles
staged by TMA at every K step, ``plgpu.wgmma`` into one accumulator held across the K loop, the
result sent back through shared memory. Besides its values (GPU interpret mode, bfloat16: a
float32 WGMMA needs a K-major B), ``kernelsim.gpu``'s model of CTA 0 must show one WGMMA per K
step added onto one accumulator, B read as it is stored, tile layouts the Mosaic GPU
lowering accepts (GPU interpret mode does not check them) and shared memory within a CTA's
227 KiB.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from grader import calling
from grader.tasks.a04_memory_spaces import prediction_structure
from grader.tasks.core import Rule, make_case, matmul_reference, register_task, with_zero_row
from kernelsim.chips import get_chip

A15 = "15_mosaic_gpu"
DTYPES = {2: jnp.bfloat16, 4: jnp.float32}
WARPGROUP_THREADS = 128
PIPELINE_STEPS = 8  # the pipelines here are at least this long: emit_pipeline keeps every stage


def _plgpu():
    """Mosaic GPU's Pallas API, imported when a task here builds a kernel: about half a second
    of every checker's start, which only a job of this assignment needs
    (``grader.jail.checker.Checker``)."""
    from jax.experimental.pallas import mosaic_gpu

    return mosaic_gpu


def _analyse(kernel, *shapes):
    (k,) = kernelsim.gpu.analyse(kernel, *shapes)
    return k


def _answer(value: int) -> np.ndarray:
    return np.full((1, 1), value, np.int32)


# ----------------------------------------------------------------- task 1: a staged tile
def staging_smem_bytes(rows, cols, itemsize) -> int:
    """Shared memory per CTA of a kernel that stages one ``(rows, cols)`` tile by TMA onto one
    barrier, waits, and sends it back (lesson 16's ``scale_rows``)."""
    plgpu = _plgpu()
    dtype = DTYPES[itemsize]

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((rows, cols), dtype),
                       scratch_types=dict(tile=plgpu.SMEM((rows, cols), dtype),
                                          landed=plgpu.Barrier()))
    def kernel(x_gmem, o_gmem, tile, landed):
        plgpu.copy_gmem_to_smem(x_gmem, tile, landed)
        plgpu.barrier_wait(landed)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(tile, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return _analyse(kernel, jax.ShapeDtypeStruct((rows, cols), dtype)).smem_bytes


register_task(
    id="predict_staging_smem", assignment=A15,
    title="Predict the shared memory of a TMA-staged tile and its barrier",
    reference=lambda **p: _answer(staging_smem_bytes(**p)),
    invoke=calling.prediction, own_kernels=False,
    cases=(
        make_case("v0", 0, "float32", {}, rows=64, cols=128, itemsize=4),
        # a tile that is not a whole number of KiB: the lowering rounds it up
        make_case("h0", 0, "float32", {}, True, rows=8, cols=40, itemsize=2),
        make_case("h1", 0, "float32", {}, True, rows=128, cols=256, itemsize=2),
        make_case("h2", 0, "float32", {}, True, rows=64, cols=100, itemsize=4),
    ),
    structure=prediction_structure,
)


# ----------------------------------------------------------------- task 2: pipeline stages
def pipeline_smem_bytes(tm, tn, stages, itemsize) -> int:
    """Shared memory per CTA of lesson 16's ``fold_tiles``: an ``emit_pipeline`` over
    ``(tm, tn)`` tiles with ``stages`` concurrent steps, and one ``(tm, tn)`` output tile."""
    plgpu = _plgpu()
    dtype = DTYPES[itemsize]
    n = tn * PIPELINE_STEPS

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((tm, tn), dtype),
                       scratch_types=dict(o_smem=plgpu.SMEM((tm, tn), dtype)))
    def kernel(x_gmem, o_gmem, o_smem):
        def step(_, x_smem, total):
            return total + x_smem[...]

        o_smem[...] = plgpu.emit_pipeline(
            step, grid=(PIPELINE_STEPS,), max_concurrent_steps=stages,
            in_specs=[plgpu.BlockSpec((tm, tn), lambda j: (0, j))],
            init_carry=jnp.zeros((tm, tn), dtype))(x_gmem)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return _analyse(kernel, jax.ShapeDtypeStruct((tm, n), dtype)).smem_bytes


register_task(
    id="predict_pipeline_smem", assignment=A15,
    title="Predict the shared memory an emit_pipeline's stages take",
    reference=lambda **p: _answer(pipeline_smem_bytes(**p)),
    invoke=calling.prediction, own_kernels=False,
    cases=(
        make_case("v0", 0, "float32", {}, tm=64, tn=128, stages=3, itemsize=4),
        make_case("h0", 0, "float32", {}, True, tm=64, tn=128, stages=1, itemsize=4),
        make_case("h1", 0, "float32", {}, True, tm=128, tn=64, stages=4, itemsize=2),
        # tiles under a KiB: an input's slots are one allocation, rounded up as a whole
        make_case("h2", 0, "float32", {}, True, tm=8, tn=32, stages=2, itemsize=2),
    ),
    structure=prediction_structure,
)


# ----------------------------------------------------------------- task 3: the accumulator
def accumulator_registers(tm, tn) -> int:
    """32-bit registers per thread that one warpgroup's float32 ``plgpu.ACC((tm, tn))``
    takes: the accumulator's bytes (kernelsim's "regs" allocation) over 128 threads."""
    plgpu = _plgpu()

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((tm, tn), jnp.float32))
    def kernel(o_gmem):
        def zero(acc_ref):
            o_gmem[...] = acc_ref[...]

        pl.run_scoped(zero, plgpu.ACC((tm, tn), jnp.float32))

    k = _analyse(kernel)
    acc = sum(a.bytes for a in k.allocations if a.space == "regs")
    return acc // (4 * WARPGROUP_THREADS)


register_task(
    id="predict_accumulator_registers", assignment=A15,
    title="Predict the registers a WGMMA accumulator takes per thread",
    reference=lambda **p: _answer(accumulator_registers(**p)),
    invoke=calling.prediction, own_kernels=False,
    cases=(
        make_case("v0", 0, "float32", {}, tm=128, tn=128),
        make_case("h0", 0, "float32", {}, True, tm=64, tn=64),
        make_case("h1", 0, "float32", {}, True, tm=64, tn=256),
        # more than a thread's 255 registers: why one warpgroup stops at (128, 128)
        make_case("h2", 0, "float32", {}, True, tm=128, tn=256),
    ),
    structure=prediction_structure,
)


# ----------------------------------------------------------------- task 4: the matmul's copies
def matmul_tma_read_bytes(m, n, k, tm, tn, tk, itemsize) -> int:
    """Global-memory bytes the TMA copies of lesson 16's WGMMA matmul read in the whole
    launch: one CTA per ``(tm, tn)`` output tile, an ``emit_pipeline`` over K copying an A and
    a B tile per step (every copy counted, whether L2 or HBM serves it)."""
    plgpu = _plgpu()
    dtype = DTYPES[itemsize]

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), dtype),
                       grid=(m // tm, n // tn), grid_names=("m", "n"))
    def kernel(a_gmem, b_gmem, o_gmem):
        i, j = jax.lax.axis_index("m"), jax.lax.axis_index("n")

        def step(_, a_smem, b_smem):
            pass  # the copies are the question; what the step computes is not

        plgpu.emit_pipeline(
            step, grid=(k // tk,), max_concurrent_steps=2,
            in_specs=[plgpu.BlockSpec((tm, tk), lambda kk: (i, kk)),
                      plgpu.BlockSpec((tk, tn), lambda kk: (kk, j))])(a_gmem, b_gmem)

    return _analyse(kernel, jax.ShapeDtypeStruct((m, k), dtype),
                    jax.ShapeDtypeStruct((k, n), dtype)).gmem_load_bytes


register_task(
    id="predict_matmul_tma_bytes", assignment=A15,
    title="Predict the bytes a WGMMA matmul's TMA copies read",
    reference=lambda **p: _answer(matmul_tma_read_bytes(**p)),
    invoke=calling.prediction, own_kernels=False,
    cases=(
        make_case("v0", 0, "float32", {}, m=512, n=512, k=512, tm=128, tn=128, tk=64, itemsize=2),
        # one CTA: each operand read once
        make_case("h0", 0, "float32", {}, True, m=128, n=128, k=1024, tm=128, tn=128, tk=64,
                  itemsize=2),
        make_case("h1", 0, "float32", {}, True, m=1024, n=256, k=256, tm=64, tn=256, tk=64,
                  itemsize=2),
        make_case("h2", 0, "float32", {}, True, m=2048, n=2048, k=512, tm=128, tn=128, tk=32,
                  itemsize=4),
    ),
    structure=prediction_structure,
)


# ----------------------------------------------------------------- task 5: a kernel of your own
RMS_EPS = 1e-6


def rms_norm_reference(x, w):
    """Each row of ``x`` over its root mean square (plus ``RMS_EPS``), times ``w``; in float32,
    rounded once to ``x``'s dtype."""
    rows = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(rows * rows, axis=1, keepdims=True) + RMS_EPS)
    return (rows * scale * w.astype(jnp.float32)).astype(x.dtype)


def staged_by_tma(t, case, inputs) -> list[Rule]:
    """One Mosaic GPU kernel whose inputs reach shared memory by TMA copies that a barrier
    wait consumes, whose result leaves by a TMA copy after ``commit_smem`` and before
    ``wait_smem_to_gmem``, with no plain load or store of global memory (kernelsim.gpu's
    model of one CTA)."""
    rules = [Rule("Mosaic GPU kernel launched", "exactly 1 plgpu.kernel (and no pallas_call)",
                  f"{len(t.gpu)} plgpu.kernel, {len(t.calls)} pallas_call",
                  len(t.gpu) == 1 and not t.calls)]
    if len(t.gpu) != 1:
        return rules
    return rules + tma_rules(t.gpu[0], inputs)


def tma_rules(k, inputs) -> list[Rule]:
    """``staged_by_tma``'s rules on one kernel's facts (``verdict.GpuKernelFacts``)."""
    wanted = [f"in{i}" for i in range(len(inputs))]
    missing = [f"{name} ({ref})" for name, ref in zip(inputs, wanted, strict=True)
               if ref not in k.tma_sources]
    return [
        Rule("inputs staged by TMA", "a plgpu.copy_gmem_to_smem of every input",
             f"{k.tma_loads} TMA copies in; " + (f"none of {', '.join(missing)}" if missing
                                                 else "every input copied"), not missing),
        Rule("every TMA copy waited on", "a plgpu.barrier_wait on each copy's barrier",
             f"{k.unwaited_loads} of {k.tma_loads} copies never waited on",
             k.tma_loads > 0 and not k.unwaited_loads),
        Rule("result sent back by TMA", "plgpu.copy_smem_to_gmem of the output, after "
             "plgpu.commit_smem, then plgpu.wait_smem_to_gmem",
             f"{k.tma_stores} TMA copies out to {', '.join(k.tma_targets) or 'nothing'}; "
             f"{k.uncommitted_stores} without commit_smem before, {k.unawaited_stores} "
             "without a wait after",
             "out0" in k.tma_targets and not k.uncommitted_stores and not k.unawaited_stores),
        Rule("global memory only through the TMA", "no plain loads or stores of a global "
             "ref (x_gmem[...]) in the kernel", f"{k.gmem_loads} loads, {k.gmem_stores} stores",
             not k.gmem_loads and not k.gmem_stores),
    ]


register_task(
    id="rms_norm_mgpu", assignment=A15,
    title="RMS norm in a Mosaic GPU kernel: TMA copies, barriers, TMA back",
    reference=rms_norm_reference, tolerance="reduction", target="mosaic_gpu",
    invoke=calling.mosaic_gpu_here, make=with_zero_row("x"),
    cases=(
        make_case("v0", 15, "float32", {"x": (128, 256), "w": (256,)}),
        make_case("h0", 16, "float32", {"x": (64, 128), "w": (128,)}, True),
        make_case("h1", 17, "bfloat16", {"x": (256, 256), "w": (256,)}, True),
        # rows far from zero mean: the mean of squares, not the variance
        make_case("h2", 18, "float32", {"x": (192, 128), "w": (128,)}, True, values="large"),
        # an all-zero row: only RMS_EPS keeps it finite
        make_case("h3", 19, "float32", {"x": (128, 128), "w": (128,)}, True, values="zero_row"),
    ),
    structure=staged_by_tma,
)


# ----------------------------------------------------------------- task 6: a WGMMA matmul
SMEM_PER_CTA = get_chip("h100").vmem_bytes  # 227 KiB, an H100's and H200's


def wgmma_structure(t, case, inputs) -> list[Rule]:
    """``staged_by_tma``'s rules, and from kernelsim.gpu's model of CTA 0: one CTA per
    ``(tm, tn)`` output tile, one WGMMA per K step all added onto one accumulator, B read as
    it is stored (``(K, N)``: no transpose), operand layouts the lowering accepts, shared memory
    within a CTA's."""
    rules = staged_by_tma(t, case, inputs)
    if len(t.gpu) != 1:
        return rules
    (k,) = t.gpu
    (m, depth), n = inputs["a"].shape, inputs["b"].shape[1]
    tm, tn, tk = case.params["tm"], case.params["tn"], case.params["tk"]
    tiles, steps = (m // tm) * (n // tn), depth // tk
    runs = ", ".join(map(str, k.accumulations)) or "none"
    return rules + [
        Rule("one CTA per output tile", f"a grid of {tiles} CTAs, one per ({tm}, {tn}) tile of "
             "the output", f"grid {tuple(k.grid)}", math.prod(k.grid) == tiles),
        Rule("one WGMMA per K step", f"{steps} plgpu.wgmma per CTA (K / tk = {depth} / {tk})",
             f"{k.wgmmas} in CTA 0", k.wgmmas == steps),
        Rule("one accumulator across the K loop", f"all {steps} WGMMAs of a CTA added onto one "
             "plgpu.ACC, allocated once, before the loop (a pl.run_scoped or an acc_ref[...] = "
             "inside the loop starts it from zero again and keeps only the last step's product)",
             f"WGMMAs added up between the accumulator's starts: {runs}",
             tuple(k.accumulations) == (steps,)),
        Rule("B read as it is stored", "b is (K, N) here: its (tk, tn) tile goes to plgpu.wgmma "
             "as it is (b_smem.T would tell the tensor cores that B is stored (N, K))",
             "plgpu.wgmma reads " + (" and ".join(k.transposed_operands) + " transposed"
                                     if k.transposed_operands else "every operand as stored"),
             "b" not in k.transposed_operands),
        Rule("WGMMA operands in a layout the lowering accepts", "each tile in shared memory "
             "either without transforms (the Mosaic GPU lowering then picks them) or with "
             "plgpu.TilingTransform((8, swizzle // itemsize)) and "
             "plgpu.SwizzleTransform(swizzle), one swizzle for A and B (GPU interpret mode "
             "does not check it; the lowering for a GPU refuses anything else)",
             "; ".join(k.wgmma_layout_problems) or "they are", not k.wgmma_layout_problems),
        Rule("shared memory within a CTA's", f"<= {SMEM_PER_CTA:,} B per CTA (227 KiB)",
             f"{k.smem_bytes:,} B", k.smem_bytes <= SMEM_PER_CTA),
    ]


register_task(
    id="wgmma_matmul", assignment=A15,
    title="A tiled WGMMA matmul: TMA copies, plgpu.wgmma into one accumulator, TMA back",
    reference=matmul_reference, tolerance="reduction", target="mosaic_gpu",
    invoke=calling.mosaic_gpu_here,
    cases=(
        make_case("v0", 20, "bfloat16", {"a": (128, 256), "b": (256, 128)}, tm=64, tn=64, tk=64),
        # one CTA, a long K loop
        make_case("h0", 21, "bfloat16", {"a": (64, 512), "b": (512, 64)}, True,
                  tm=64, tn=64, tk=64),
        # tk = 32: rows of 64 bytes, a 64-byte swizzle that B's tile must share
        make_case("h1", 22, "bfloat16", {"a": (128, 128), "b": (128, 256)}, True,
                  tm=64, tn=128, tk=32),
        # (128, 128) tiles and all-positive inputs: sums that grow along K
        make_case("h2", 23, "bfloat16", {"a": (256, 256), "b": (256, 128)}, True,
                  values="positive", tm=128, tn=128, tk=128),
    ),
    structure=wgmma_structure,
)
