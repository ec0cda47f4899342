"""Assignment 15 (Mosaic GPU): the instructor's predictions and kernel pass every case; planted
wrong ones fail on the case or the rule that tells them apart, judged as the grader judges
(``course.check``); the grader's answers, kernelsim's counts, equal what the Mosaic GPU
lowering allocates; and ``grader.facts.work`` sees a ``plgpu.kernel`` as a kernel call.

The planted answers are the mistakes the tasks are about: shared memory without the lowering's
rounding to 1024 bytes or without the barriers, a pipeline's slots rounded one by one (they are
one allocation), an accumulator counted in bytes rather than registers, and a matmul's copies
counted as if each operand were read once. The planted kernels read an input not
staged by TMA (global memory into registers), leave a copy unwaited, compute outside the
kernel, or are plain JAX. The planted WGMMA matmuls start their accumulator again at every K
step, hand B to the WGMMA transposed, tile their tiles without swizzling them or swizzle B by its
own row, or never wait for B's copy.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import gradertools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernelsim
from grader import calling, tasks
from grader.facts import gpu_facts, work
from grader.learner import course
from grader.tasks import a15_mosaic_gpu as a15
from grader.verdict import verdict

ASSIGNMENT = "15_mosaic_gpu"
REPO = Path(__file__).resolve().parents[3]
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


@pytest.fixture(scope="module")
def solutions() -> dict:
    """The setup and solution cells of the instructor notebook, run in one namespace."""
    return gradertools.run(ASSIGNMENT)


def test_the_assignment_has_its_tasks():
    assert TASKS == ["predict_staging_smem", "predict_pipeline_smem",
                     "predict_accumulator_registers", "predict_matmul_tma_bytes",
                     "rms_norm_mgpu", "wgmma_matmul"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_reference_solution_passes(solutions, task, hidden):
    course.check(task, solutions[task], hidden=hidden, quiet=True)


def _fails(task: str, fn, case: str, hidden: bool) -> None:
    with pytest.raises(course.CheckFailed) as err:
        course.check(task, fn, hidden=hidden, quiet=True)
    assert f"wrong values for case {case}" in str(err.value), str(err.value)


def test_shared_memory_without_rounding_fails_hidden():
    unrounded = lambda rows, cols, itemsize: rows * cols * itemsize + 8  # noqa: E731
    course.check("predict_staging_smem", unrounded, quiet=True)  # 32 KiB: already rounded
    _fails("predict_staging_smem", unrounded, "h0", hidden=True)


def test_shared_memory_without_the_barrier_fails_visible():
    _fails("predict_staging_smem", lambda rows, cols, itemsize: rows * cols * itemsize,
           "v0", hidden=False)


def test_slots_rounded_one_by_one_fail_on_small_tiles():
    def per_slot(tm, tn, stages, itemsize):
        tile = -(-tm * tn * itemsize // 1024) * 1024
        return (stages + 1) * tile + 8 * stages

    course.check("predict_pipeline_smem", per_slot, quiet=True)
    _fails("predict_pipeline_smem", per_slot, "h2", hidden=True)


def test_accumulator_in_bytes_fails():
    _fails("predict_accumulator_registers", lambda tm, tn: tm * tn * 4 // 128, "v0",
           hidden=False)


def test_matmul_operands_read_once_fail():
    once = lambda m, n, k, tm, tn, tk, itemsize: (m * k + k * n) * itemsize  # noqa: E731
    _fails("predict_matmul_tma_bytes", once, "v0", hidden=False)


def _lowering_smem(fn, *shapes) -> int:
    with mgpu_core.artificial_shared_memory_limit(0), pytest.raises(ValueError) as err:
        jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    return int(re.search(r"smem_bytes=(\d+)", str(err.value)).group(1))


@pytest.mark.parametrize("rows,cols,itemsize", [(64, 128, 4), (64, 100, 4), (128, 256, 2)])
def test_staging_answer_is_the_lowerings_allocation(monkeypatch, rows, cols, itemsize):
    """The grader's answer (kernelsim on the task's kernel) equals the lowering's count."""
    seen = []
    monkeypatch.setattr(a15, "_analyse", lambda kernel, *shapes: seen.append(
        (kernel, shapes)) or a15.kernelsim.gpu.analyse(kernel, *shapes)[0])
    answer = a15.staging_smem_bytes(rows, cols, itemsize)
    (kernel, shapes), = seen
    assert answer == _lowering_smem(kernel, *shapes)


@pytest.mark.parametrize("tm,tn,stages,itemsize", [(64, 128, 3, 4), (128, 64, 4, 2)])
def test_pipeline_answer_is_the_lowerings_allocation(monkeypatch, tm, tn, stages, itemsize):
    seen = []
    monkeypatch.setattr(a15, "_analyse", lambda kernel, *shapes: seen.append(
        (kernel, shapes)) or a15.kernelsim.gpu.analyse(kernel, *shapes)[0])
    answer = a15.pipeline_smem_bytes(tm, tn, stages, itemsize)
    (kernel, shapes), = seen
    assert answer == _lowering_smem(kernel, *shapes)
    assert jnp.dtype(shapes[0].dtype).itemsize == itemsize


# ----------------------------------------------------------------- task 5: the kernel
def _rms_kernel(x, w, interpret, *, load_w=True, wait_w=True, scale=None):
    """A band-per-CTA RMS norm, varied the ways a learner's may go wrong."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(m // 64,), grid_names=("band",),
        scratch_types=dict(x_smem=plgpu.SMEM((64, n), x.dtype), w_smem=plgpu.SMEM((n,), w.dtype),
                           x_bar=plgpu.Barrier(), w_bar=plgpu.Barrier()),
        interpret=interpret)
    def kernel(x_gmem, w_gmem, o_gmem, x_smem, w_smem, x_bar, w_bar):
        band = pl.ds(jax.lax.axis_index("band") * 64, 64)
        plgpu.copy_gmem_to_smem(x_gmem.at[band], x_smem, x_bar)
        if load_w:
            plgpu.copy_gmem_to_smem(w_gmem, w_smem, w_bar)
        plgpu.barrier_wait(x_bar)
        if load_w and wait_w:
            plgpu.barrier_wait(w_bar)
        rows = x_smem[...].astype(jnp.float32)
        weights = (w_smem[...] if load_w else w_gmem[...]).astype(jnp.float32)
        ms = jnp.mean(rows * rows, axis=1, keepdims=True)
        x_smem[...] = (rows * jax.lax.rsqrt(ms + a15.RMS_EPS) * weights).astype(x.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[band])
        plgpu.wait_smem_to_gmem(0)

    return kernel(x if scale is None else x * scale, w)


def _rule_fails(fn, rule: str) -> None:
    with pytest.raises(course.CheckFailed) as err:
        course.check("rms_norm_mgpu", fn, quiet=True)
    assert f"[FAIL] {rule}" in str(err.value), str(err.value)


def test_the_variant_kernel_passes():
    """The planted kernels below differ from this one in one thing each."""
    course.check("rms_norm_mgpu", _rms_kernel, quiet=True)


def test_weights_read_from_global_memory_fail_the_tma_rules():
    fn = functools.partial(_rms_kernel, load_w=False)
    _rule_fails(fn, "inputs staged by TMA")
    _rule_fails(fn, "global memory only through the TMA")


def test_a_copy_never_waited_on_fails():
    _rule_fails(functools.partial(_rms_kernel, wait_w=False), "every TMA copy waited on")


def test_work_outside_the_kernel_fails():
    """x * 1.0 fed in is computed outside: the kernel's input is not the function's."""
    _rule_fails(functools.partial(_rms_kernel, scale=1.0),
                "kernel inputs are your function's inputs")


def test_plain_jax_fails():
    with pytest.raises(course.CheckFailed) as err:
        course.check("rms_norm_mgpu", lambda x, w, interpret: a15.rms_norm_reference(x, w),
                     quiet=True)
    assert "never calls plgpu.kernel" in str(err.value), str(err.value)


def test_grader_work_sees_a_plgpu_kernel(solutions):
    """plgpu.kernel binds mpmd_map inside custom_vmap_call: the work facts follow the data
    through both, and name the body's inputs, its source and its primitives."""
    x = jnp.ones((128, 256), jnp.float32)
    w = jnp.ones((256,), jnp.float32)
    fn = functools.partial(solutions["rms_norm_mgpu"], interpret=plgpu.InterpretGPUParams())
    facts = work.facts(jax.make_jaxpr(fn)(x, w))
    assert facts["outputs"] == [{"from": "plgpu.kernel #0", "kind": "kernel"}]
    (call,) = facts["calls"]
    assert [o["kind"] for o in call["operands"]] == ["input", "input"]
    assert call["unread"] == [] and not call["course_kernel"] and call["dma"] is None
    assert {"copy_gmem_to_smem", "barrier_wait", "copy_smem_to_gmem"} <= set(call["primitives"])
    assert facts["outside_flops"] == 0
    (body,) = calling.kernel_bodies(jax.make_jaxpr(fn)(x, w))
    assert work.kernel_file(body).startswith("mosaic_gpu.py")  # the notebook, not JAX's wrapper


def test_an_unread_input_is_named():
    """An input the kernel body never reads (here w, read neither by TMA nor directly)."""

    def ignores_w(x, w, interpret):
        @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                           interpret=interpret)
        def kernel(x_gmem, w_gmem, o_gmem):
            o_gmem[...] = x_gmem[...]

        return kernel(x, w)

    x, w = jnp.ones((64, 128)), jnp.ones((128,))
    facts = work.facts(jax.make_jaxpr(functools.partial(ignores_w, interpret=None))(x, w))
    assert facts["calls"][0]["unread"] == [1]


def test_the_solution_lowers_for_cuda(solutions):
    """The instructor's kernel is one an H100/H200 compiles (its layouts given): nothing
    runs here; JAX's Mosaic GPU lowering accepts it."""
    x = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((256,), jnp.bfloat16)
    fn = functools.partial(solutions["rms_norm_mgpu"], interpret=None)
    jax.jit(fn).trace(x, w).lower(lowering_platforms=("cuda",))


def test_the_solution_matches_plain_jax(solutions):
    x = jax.random.normal(jax.random.key(0), (192, 128), jnp.float32) * 3 + 1
    w = jax.random.normal(jax.random.key(1), (128,), jnp.float32)
    got = solutions["rms_norm_mgpu"](x, w, interpret=plgpu.InterpretGPUParams())
    np.testing.assert_allclose(got, a15.rms_norm_reference(x, w), rtol=1e-5, atol=1e-5)


def test_the_verdict_reads_gpu_facts_and_refuses_garbage():
    """The checker's answer carries each Mosaic GPU kernel's facts (grader.facts.gpu_facts); the
    trusted verdict reads them strictly, as it reads kernelsim's TPU trace."""
    x = jnp.ones((128, 256), jnp.float32)
    w = jnp.ones((256,), jnp.float32)
    program = jax.make_jaxpr(functools.partial(_rms_kernel, interpret=None))(x, w)
    trace = gpu_facts.trace(kernelsim.gpu.kernels_in(program))
    (k,) = verdict.facts_from_dict(trace).gpu
    assert (k.grid, k.tma_sources, k.tma_targets, k.unwaited_loads) == \
        ((2,), ("in0", "in1"), ("out0",), 0)
    # the (64, 256) and (256,) float32 tiles, the row mean's reduction scratch, 2 barriers
    assert k.smem_bytes == 64 * 256 * 4 + 1024 + kernelsim.gpu.REDUCTION_SCRATCH_BYTES + 2 * 8
    for bad in ({"tma_loads": "2"}, {"tma_sources": "in0"}, {"complete": 1},
                {"wgmmas": "4"}, {"accumulations": 4}, {"wgmma_layout_problems": [1]}):
        broken = {"calls": [], "gpu_kernels": [{**trace["gpu_kernels"][0], **bad}]}
        with pytest.raises(ValueError):
            verdict.facts_from_dict(broken)


def _waits_for_nothing(x, w, interpret):
    """Waits on w's barrier, but w's copy completes on x's: GPU interpret mode, like a GPU,
    would wait forever."""
    m, n = x.shape

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_types=dict(x_smem=plgpu.SMEM((m, n), x.dtype), x_bar=plgpu.Barrier(),
                           w_bar=plgpu.Barrier()),
        interpret=interpret)
    def kernel(x_gmem, w_gmem, o_gmem, x_smem, x_bar, w_bar):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, x_bar)
        plgpu.barrier_wait(w_bar)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return kernel(x, w)


def test_a_wait_nothing_signals_is_an_error_not_a_hang(monkeypatch):
    """Stopped before it runs (``grader.facts.gpu_facts.would_hang``), as a hung case would cost
    its cell's time limit; the message says what to do. (Were it run, this test would say so
    rather than hang.)"""
    def never(*_):
        raise AssertionError("the program was executed")

    monkeypatch.setattr(work, "jaxpr_as_fun", never)
    x, w = np.ones((64, 128), np.float32), np.ones((128,), np.float32)
    traced = calling.trace_case(tasks.get("rms_norm_mgpu"), _waits_for_nothing, [x, w], {})
    run = work.run_traced(traced)
    assert run.error.startswith("BarrierWouldHang: plgpu.kernel kernel waits on barrier"), \
        run.error
    assert "pass the barrier to the plgpu.copy_gmem_to_smem" in run.error


# a fresh interpreter: the checker of one job, and which primitives it knows
CHECKER_OF = """
import sys
from grader.jail import checker
from grader.tasks import a15_mosaic_gpu  # noqa: F401 - the tasks are imported, their API is not
known = checker.Checker({{"cases": {{"{task}/visible": []}}}}, {{}}).known
print("jax.experimental.mosaic.gpu" in sys.modules,
      any(getattr(p, "name", "") == "copy_gmem_to_smem" for p in known.values()))
"""


@pytest.mark.parametrize("task, loaded", [("add", "False False"),
                                          ("rms_norm_mgpu", "True True")])
def test_a_checker_loads_mosaic_gpu_only_for_its_assignment(task, loaded):
    """Mosaic GPU's Pallas API is half a second of a checker's start: only a job of this
    assignment loads it, and then before the primitives its programs hold are read."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", CHECKER_OF.format(task=task)], check=True,
                         capture_output=True, text=True, cwd=REPO).stdout
    assert out.split("\n")[-2] == loaded, out


# ----------------------------------------------------------------- task 6: the WGMMA matmul
def _wgmma_kernel(a, b, tm, tn, tk, interpret, *, reset=False, transpose_b=False,
                  layout="swizzled", wait_b=True):
    """A tiled WGMMA matmul, varied the ways a learner's may go wrong. layout: "swizzled" (A's
    row's swizzle for A and B), "none" (no transforms: the lowering picks them), "unswizzled"
    (tiled only), "untiled" (swizzled only), "b_own" (B swizzled by its own row)."""
    m, k = a.shape
    n = b.shape[1]

    def transforms(row_elems):
        if layout == "none":
            return ()
        swizzle = plgpu.find_swizzle(row_elems * 16)
        tiling = plgpu.TilingTransform((8, swizzle // 2))
        if layout == "unswizzled":
            return (tiling,)
        if layout == "untiled":
            return (plgpu.SwizzleTransform(swizzle),)
        return (tiling, plgpu.SwizzleTransform(swizzle))

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), a.dtype),
        grid=(m // tm, n // tn), grid_names=("m", "n"),
        scratch_types=dict(
            a_smem=plgpu.SMEM((tm, tk), a.dtype, transforms=transforms(tk)),
            b_smem=plgpu.SMEM((tk, tn), b.dtype,
                              transforms=transforms(tn if layout == "b_own" else tk)),
            o_smem=plgpu.SMEM((tm, tn), a.dtype, transforms=transforms(tn)),
            a_bar=plgpu.Barrier(), b_bar=plgpu.Barrier()),
        interpret=interpret)
    def kernel(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, a_bar, b_bar):
        rows = pl.ds(jax.lax.axis_index("m") * tm, tm)
        cols = pl.ds(jax.lax.axis_index("n") * tn, tn)

        def step(s, acc):
            depth = pl.ds(s * tk, tk)
            plgpu.copy_gmem_to_smem(a_gmem.at[rows, depth], a_smem, a_bar)
            plgpu.copy_gmem_to_smem(b_gmem.at[depth, cols], b_smem, b_bar)
            plgpu.barrier_wait(a_bar)
            if wait_b:
                plgpu.barrier_wait(b_bar)
            plgpu.wgmma(acc, a_smem, b_smem.T if transpose_b else b_smem)
            plgpu.wgmma_wait(0)

        def accumulate(acc):
            pl.loop(0, k // tk)(functools.partial(step, acc=acc))
            return acc[...]

        if reset:  # a fresh accumulator per step: only the last step's product is left
            @pl.loop(0, k // tk)
            def _(s):
                def one_step(acc):
                    step(s, acc)
                    o_smem[...] = acc[...].astype(o_smem.dtype)

                pl.run_scoped(one_step, plgpu.ACC((tm, tn), jnp.float32))
        else:
            o_smem[...] = pl.run_scoped(accumulate, plgpu.ACC((tm, tn), jnp.float32)).astype(
                o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[rows, cols])
        plgpu.wait_smem_to_gmem(0)

    return kernel(a, b)


def _wgmma_fails(hidden: bool = False, **variant) -> str:
    with pytest.raises(course.CheckFailed) as err:
        course.check("wgmma_matmul", functools.partial(_wgmma_kernel, **variant), hidden=hidden,
                     quiet=True)
    return str(err.value)


def test_the_wgmma_variant_kernel_passes():
    """The planted matmuls below differ from this one in one thing each."""
    course.check("wgmma_matmul", _wgmma_kernel, quiet=True)


def test_an_accumulator_started_again_at_every_k_step_fails():
    message = _wgmma_fails(reset=True)
    assert "wrong values for case v0" in message, message
    assert "[FAIL] one accumulator across the K loop" in message, message
    assert "found WGMMAs added up between the accumulator's starts: 1, 1, 1, 1" in message


def test_b_handed_to_the_wgmma_transposed_fails():
    message = _wgmma_fails(transpose_b=True)
    assert "wrong values for case v0" in message, message
    assert "[FAIL] B read as it is stored" in message, message
    assert "found plgpu.wgmma reads b transposed" in message, message


def test_tiles_tiled_but_not_swizzled_fail_though_their_values_pass():
    message = _wgmma_fails(layout="unswizzled")
    assert "wrong values" not in message, message
    assert "[FAIL] WGMMA operands in a layout the lowering accepts" in message, message
    assert "a's tile is tiled but not swizzled" in message, message


def test_b_swizzled_by_its_own_row_fails_where_tk_is_narrower():
    """tk = 32 (hidden case h1): A's rows take a 64-byte swizzle, B's (tn = 128) 128 bytes;
    where tk = tn (the visible case) the two agree."""
    message = _wgmma_fails(hidden=True, layout="b_own")
    assert "case h1" in message and "[FAIL] WGMMA operands in a layout" in message, message


def test_a_copy_never_waited_on_fails_with_a_hint():
    """GPU interpret mode stops when B's barrier completes a second time unobserved; the
    message says what to do."""
    message = _wgmma_fails(wait_b=False)
    assert "Barrier completed phase 1, but no threads observed phase 0" in message, message
    assert "Hint: a TMA copy completed on a barrier whose previous copy nobody waited" \
        in message, message


def test_the_wgmma_facts_of_the_solution(solutions):
    """kernelsim.gpu's CTA 0 of the instructor's kernel on case v0: 4 K steps."""
    a = jnp.ones((128, 256), jnp.bfloat16)
    b = jnp.ones((256, 128), jnp.bfloat16)
    fn = functools.partial(solutions["wgmma_matmul"], tm=64, tn=64, tk=64, interpret=None)
    (k,) = verdict.facts_from_dict(gpu_facts.trace(kernelsim.gpu.kernels_in(
        jax.make_jaxpr(fn)(a, b)))).gpu
    assert (k.grid, k.wgmmas, k.accumulations, k.transposed_operands) == ((2, 2), 4, (4,), ())
    assert k.wgmma_layout_problems == () and k.unwaited_loads == 0
    assert k.smem_bytes == 3 * 64 * 64 * 2 + 2 * 8


@pytest.mark.parametrize("m,k,n,tm,tn,tk", [(128, 256, 128, 64, 64, 64),
                                            (128, 128, 256, 64, 128, 32)])
def test_the_wgmma_solution_lowers_for_cuda(solutions, m, k, n, tm, tn, tk):
    """The layouts the rule accepts are the lowering's: the instructor's kernel lowers for an
    H100/H200 at a 128- and a 64-byte swizzle."""
    fn = functools.partial(solutions["wgmma_matmul"], tm=tm, tn=tn, tk=tk, interpret=None)
    jax.jit(fn).trace(jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                      jax.ShapeDtypeStruct((k, n), jnp.bfloat16)).lower(
        lowering_platforms=("cuda",))


@pytest.mark.parametrize("layout, accepted", [("swizzled", True), ("none", True),
                                             ("unswizzled", False), ("untiled", False),
                                             ("b_own", False)])
def test_the_layouts_the_rule_refuses_the_lowering_refuses(layout, accepted):
    """The layout rule against the Mosaic GPU lowering for CUDA itself, at tk = 32 (A's rows
    take a 64-byte swizzle, B's a 128-byte one of their own)."""
    fn = functools.partial(_wgmma_kernel, tm=64, tn=128, tk=32, interpret=None, layout=layout)
    a, b = jnp.zeros((128, 128), jnp.bfloat16), jnp.zeros((128, 256), jnp.bfloat16)
    try:
        (k,) = verdict.facts_from_dict(gpu_facts.trace(kernelsim.gpu.analyse(fn, a, b))).gpu
        assert (not k.wgmma_layout_problems) == accepted, k.wgmma_layout_problems
    except ValueError as err:  # refused by JAX while tracing, before the rule is asked
        assert not accepted and "Swizzle" in str(err), err
    try:
        jax.jit(fn).trace(a, b).lower(lowering_platforms=("cuda",))
        lowered = True
    except (ValueError, AssertionError):  # the lowering's refusals, in its own words
        lowered = False
    assert lowered == accepted
