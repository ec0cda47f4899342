"""Assignment 08 (manual DMA): the instructor's kernels pass, lower for TPU on every case, and
plausible wrong answers fail with a message that says what is wrong.

The kernels come from the notebook source itself (setup, ``*_buggy`` and ``*_solution`` cells);
planted mistakes are made by editing that source, so what is tested is what learners get.
"""

from __future__ import annotations

import functools

import gradertools
import jax
import jax.numpy as jnp
import jupytext
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from test_exercise_content import key_hints

import kernelsim
from grader import tasks
from grader.calling import RACE_CLOCK_SIZE, absmax_scale, traced_as_tpu
from grader.learner import course
from grader.verdict import refs, verdict

pytestmark = pytest.mark.interpret

ASSIGNMENT = "08_manual_dma"
NOTEBOOK = gradertools.notebook(ASSIGNMENT)
TASKS = [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT]


def _run_cells(**settings) -> dict:
    """The setup, buggy and solution cells executed into one namespace (``settings`` replace
    setup's names, e.g. ``TPU_INTERPRET=False`` to compile)."""
    return gradertools.run(ASSIGNMENT, ("_buggy", "_solution"), **settings)


@pytest.fixture(scope="module")
def notebook() -> dict:
    return _run_cells()


def _planted(notebook: dict, cell: str, *edits: tuple[str, str], name: str | None = None):
    """The function that cell ``cell`` defines, with each ``(old, new)`` edit made to its
    source (each ``old`` must be there)."""
    source = gradertools.cells(ASSIGNMENT)[cell]
    for old, new in edits:
        assert old in source, (cell, old)
        source = source.replace(old, new)
    namespace = dict(notebook)
    exec(compile(source, f"planted {cell}", "exec"), namespace)
    return namespace[name or cell.removesuffix("_solution")]


def _fails(task: str, fn, expected: str, hidden: bool = False) -> str:
    with pytest.raises(course.CheckFailed) as failed:
        course.check(task, fn, hidden=hidden, quiet=True)
    message = str(failed.value)
    assert expected in message, message
    return message


def test_every_task_has_a_solution_and_tests():
    cells = gradertools.cells(ASSIGNMENT)
    assert TASKS == ["absmax_dma", "absmax_pipeline", "absmax_in_place"]
    for task in TASKS:
        assert {f"{task}_solution", f"{task}_visible", f"{task}_hidden"} <= set(cells), task
    assert "absmax_in_place_buggy" in cells


@pytest.mark.parametrize("task", TASKS)
def test_the_reference_solution_passes(task, notebook):
    course.check(task, notebook[task], quiet=True)
    course.check(task, notebook[task], hidden=True, quiet=True)


def test_every_solution_case_lowers_for_tpu():
    """JAX's TPU lowering accepts every solution on every case's shapes and dtype (manual
    DMAs across grid steps, a short last copy, the nested pipeline): the notebook's cells run
    again with kernels set to compile."""
    compiled = _run_cells(TPU_INTERPRET=False)
    for task in TASKS:
        for case in tasks.get(task).cases:
            (shape,) = case.arrays.values()
            dtype = jnp.bfloat16 if case.dtype == "bfloat16" else jnp.float32
            fn = functools.partial(compiled[task], **case.params)
            error = kernelsim.tpu_lowering_error(fn, jax.ShapeDtypeStruct(shape, dtype))
            assert error is None, (task, case.name, error)


def test_the_grader_runs_every_task_with_the_race_detector(notebook):
    seen = []

    def records_interpret(x, chunk, interpret=None):
        seen.append(interpret)
        return notebook["absmax_dma"](x, chunk, interpret=interpret)

    course.check("absmax_dma", records_interpret, quiet=True)
    assert seen and all(p.detect_races and p.vector_clock_size == RACE_CLOCK_SIZE
                        for p in seen), seen
    assert {tasks.get(t).invoke is not None for t in TASKS} == {True}


# ------------------------------------------------------------------ task 1: double buffering
def test_a_short_last_chunk_is_copied_short(notebook):
    """kernelsim counts the kernel's own copies: the visible case's three chunks move 16, 16
    and 8 rows, x.nbytes in all, and the pipeline fetches nothing of x."""
    x = jnp.zeros((40, 256), jnp.float32)
    call = kernelsim.trace(functools.partial(notebook["absmax_dma"], chunk=16), x).calls[0]
    assert [c.bytes for c in call.call.body_copies] == [16 * 256 * 4] * 2 + [8 * 256 * 4]
    assert call.operand("x_hbm").fetches == 0
    assert call.operand("x_hbm").hbm_read_bytes == x.nbytes


def test_one_buffer_without_overlap_fails_the_footprint(notebook):
    """Copy chunk c at step c and wait for it at once: right values and no race, but only one
    chunk buffer, so nothing overlaps the copy."""
    sequential = _planted(
        notebook, "absmax_dma_solution",
        ("pltpu.VMEM((2, chunk, n), x.dtype)", "pltpu.VMEM((1, chunk, n), x.dtype)"),
        ("slot = i % 2", "slot = 0"),
        ("buf[c % 2]", "buf[0]"),
        ("@pl.when(c == 0)\n        def _first():\n            on_chunk_copy(0, ",
         "@pl.when(c >= 0)\n        def _first():\n            on_chunk_copy(c, "),
        ("@pl.when(c + 1 < n_chunks)", "@pl.when(c < 0)"))
    message = _fails("absmax_dma", sequential, "structural check failed")
    assert "on-chip buffers: required 65,536 B: two (16, 256) chunk buffers" in message, message
    assert "found 49,152 B" in message, message


def test_one_buffer_with_the_next_copy_in_flight_races(notebook):
    one_buffer = _planted(
        notebook, "absmax_dma_solution",
        ("pltpu.VMEM((2, chunk, n), x.dtype)", "pltpu.VMEM((1, chunk, n), x.dtype)"),
        ("slot = i % 2", "slot = 0"), ("buf[c % 2]", "buf[0]"))
    # the detector draws its clock entries at random: when it misses the race, the copy that
    # overwrote the buffer shows in the values, or else the order of the DMAs shows one buffer
    message = _fails("absmax_dma", one_buffer, "absmax_dma: ")
    assert any(text in message for text in (
        "RACE DETECTED", "wrong values for case v0",
        "[FAIL] copies into VMEM: buffers: required 2 VMEM buffers")), message


def test_reading_before_the_wait_races(notebook):
    early_read = _planted(
        notebook, "absmax_dma_solution",
        ("        on_chunk_copy(c, lambda copy: copy.wait())\n"
         "        o_ref[...] = absmax_scale(buf[c % 2]).astype(o_ref.dtype)\n",
         "        o_ref[...] = absmax_scale(buf[c % 2]).astype(o_ref.dtype)\n"
         "        on_chunk_copy(c, lambda copy: copy.wait())\n"))
    _fails("absmax_dma", early_read, "RACE DETECTED")


def test_a_full_size_last_copy_reads_past_the_array(notebook):
    full_last = _planted(notebook, "absmax_dma_solution",
                         ("action(chunk_copy(i, last_rows))", "action(chunk_copy(i, chunk))"))
    _fails("absmax_dma", full_last, "Out-of-bounds read")


def test_a_grid_that_drops_the_short_chunk_gives_wrong_values(notebook):
    floor_grid = _planted(notebook, "absmax_dma_solution",
                          ("n_chunks = pl.cdiv(m, chunk)", "n_chunks = m // chunk"),
                          ("last_rows = m - (n_chunks - 1) * chunk", "last_rows = chunk"))
    _fails("absmax_dma", floor_grid, "wrong values for case v0")


def _pipelined_by_blockspec(x, chunk, interpret=None):
    """The right values with x and the output both pipelined by BlockSpecs: no manual DMA."""
    m, n = x.shape

    def kernel(x_ref, o_ref):
        o_ref[...] = absmax_scale(x_ref[...]).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(pl.cdiv(m, chunk),),
        in_specs=[pl.BlockSpec((chunk, n), lambda c: (c, 0))],
        out_specs=pl.BlockSpec((chunk, n), lambda c: (c, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x)


@pytest.mark.parametrize("task", ["absmax_dma", "absmax_pipeline"])
def test_a_blockspec_pipeline_for_x_fails_the_hbm_rule(task):
    message = _fails(task, _pipelined_by_blockspec, "structural check failed")
    assert "x left in HBM (memory_space=pl.ANY): required no pipeline fetches of x; " \
        "found 3 block fetches" in message, message


# ------------------------------------------------------------------ task 2: emit_pipeline
def test_emit_pipeline_needs_a_tpu_to_trace_for(notebook):
    """Without a TPU, tracing emit_pipeline fails on the chip query; ``traced_as_tpu`` names a
    TPU v5e for the trace and the kernel runs in TPU interpret mode."""
    x = jax.random.normal(jax.random.key(0), (40, 256), jnp.float32)
    if jax.default_backend() != "tpu":
        with pytest.raises(ValueError, match="Unsupported TPU device kind"):
            notebook["absmax_pipeline"](x, 16)
    got = traced_as_tpu(notebook["absmax_pipeline"])(x, 16)
    np.testing.assert_array_equal(got, absmax_scale(x))


def test_the_nested_pipeline_copies_each_byte_once_each_way(notebook):
    x = jnp.zeros((40, 256), jnp.float32)
    call = kernelsim.trace(functools.partial(notebook["absmax_pipeline"], chunk=16),
                           x).calls[0]
    routes = sorted((c.src_space, c.dst_space, c.bytes) for c in call.call.body_copies)
    chunk, tail = 16 * 256 * 4, 8 * 256 * 4
    assert routes == sorted([("any", "vmem", chunk)] * 2 + [("any", "vmem", tail)] +
                            [("vmem", "any", chunk)] * 2 + [("vmem", "any", tail)])
    assert (call.hbm_read_bytes, call.hbm_write_bytes) == (x.nbytes, x.nbytes)


def _structure(task: str, case: str, fn) -> list[str]:
    """The failed structural rules of ``task`` on ``case`` for ``fn``'s kernelsim trace."""
    task_ = tasks.get(task)
    c = next(c for c in task_.cases if c.name == case)
    (shape,) = c.arrays.values()
    x = jnp.zeros(shape, jnp.bfloat16 if c.dtype == "bfloat16" else jnp.float32)
    trace = kernelsim.trace(functools.partial(fn, **c.params), x)
    rules = task_.structure(verdict.facts_from_dict(trace.to_dict()), c, {})
    return [str(r) for r in rules if not r.ok]


def test_copies_by_hand_are_not_the_nested_pipeline(notebook):
    """Task 3's kernel is right for task 2 where the chunks divide M, and moves the same
    bytes; the scratch it allocates itself is what tells it from emit_pipeline."""
    failed = _structure("absmax_pipeline", "h0", notebook["absmax_in_place"])
    assert failed == ["[FAIL] scratch_shapes: required none: emit_pipeline allocates its own "
                      "buffers and semaphores; found 3 scratch operand(s)"], failed
    assert _structure("absmax_pipeline", "h0", notebook["absmax_pipeline"]) == []


def test_task_1_is_not_task_2(notebook):
    message = _fails("absmax_pipeline", notebook["absmax_dma"], "structural check failed")
    assert "grid: required (); found (3,)" in message, message


# ------------------------------------------------------------------ task 3: find the bug
def test_the_buggy_kernel_has_right_values_in_both_dma_orders(notebook):
    """Every case: the interpreter's eager and on-wait copies both give the right values, so
    only the race detector can see the bug."""
    refdir = refs.course_root() / "refs"
    entries = [e for e in refs.load_manifest(refdir)["cases"].values()
               if e["task"] == "absmax_in_place"]
    assert len(entries) == 4
    for entry in entries:
        inputs, expected, params = refs.load_case(refdir, entry)
        for mode in ("eager", "on_wait"):
            got = notebook["absmax_in_place_buggy"](
                *map(jnp.asarray, inputs.values()), **params,
                interpret=pltpu.InterpretParams(dma_execution_mode=mode))
            assert verdict.compare(got, expected, entry["rtol"], entry["atol"], None) is None, \
                (entry["case"], mode)


@pytest.mark.parametrize("hidden", [False, True])
def test_the_shipped_buggy_kernel_fails_with_a_race(notebook, hidden):
    message = _fails("absmax_in_place", notebook["absmax_in_place_buggy"], "RACE DETECTED",
                     hidden=hidden)
    assert "_prefetch_next" in message, message


def test_the_default_race_clock_misses_a_race_between_two_copies(notebook):
    """Why the grader widens the detector's vector clocks (core.RACE_CLOCK_SIZE): with the
    default size every DMA shares one clock entry and this race goes unreported."""
    x = jax.random.normal(jax.random.key(0), (96, 256), jnp.float32)
    got = notebook["absmax_in_place_buggy"](
        x, 16, interpret=pltpu.InterpretParams(detect_races=True))
    np.testing.assert_array_equal(got, absmax_scale(x))
    with pytest.raises(Exception, match="RACE DETECTED"):
        notebook["absmax_in_place_buggy"](
            x, 16, interpret=pltpu.InterpretParams(detect_races=True,
                                                   vector_clock_size=RACE_CLOCK_SIZE))
    pltpu.reset_tpu_interpret_mode_state()


def test_the_key_line_hint_points_at_the_two_blocks():
    """Hint 2 names the two ``pl.when`` blocks whose order is the bug (that it does not write
    the fix is tests/grader/tasks/test_exercise_content.py's to check)."""
    key = key_hints(jupytext.read(NOTEBOOK).cells)["absmax_in_place"][1]
    buggy = gradertools.cells(ASSIGNMENT)["absmax_in_place_buggy"]
    for block in ("_prefetch_next", "_previous_written"):
        assert f"def {block}():" in buggy and f"`{block}`" in key, (block, key)


def test_waiting_for_the_copy_out_before_the_next_copy_in_fixes_the_bug(notebook):
    """The buggy kernel with its two blocks swapped passes every case with the race detector."""
    prefetch = ("            @pl.when(c + 1 < n_chunks)\n"
                "            def _prefetch_next():\n"
                "                copy_in(c + 1, 1 - slot).start()\n\n")
    written = ("            @pl.when(c > 0)\n"
               "            def _previous_written():\n"
               "                copy_out(c - 1, 1 - slot).wait()\n\n")
    fixed = _planted(notebook, "absmax_in_place_buggy", (prefetch + written, written + prefetch))
    course.check("absmax_in_place", fixed, hidden=True, quiet=True)


def test_waiting_too_late_still_races(notebook):
    """A plausible half fix: the wait moved below chunk c's own wait, still after the copy in
    of chunk c + 1 has started."""
    written_then_own_wait = ("            @pl.when(c > 0)\n"
                        "            def _previous_written():\n"
                        "                copy_out(c - 1, 1 - slot).wait()\n\n"
                        "            copy_in(c, slot).wait()\n")
    late = _planted(notebook, "absmax_in_place_buggy",
                    (written_then_own_wait, "            copy_in(c, slot).wait()\n\n"
                     "            @pl.when(c > 0)\n"
                     "            def _previous_written():\n"
                     "                copy_out(c - 1, 1 - slot).wait()\n"))
    _fails("absmax_in_place", late, "RACE DETECTED")


# ------------------------------------------------------------------ the skills, from the DMA order
# Each planted answer below gets every value right and has no race the detector reports; what
# it gets wrong is the skill the task states, read from the order of its own DMAs
# (grader.facts.dma_order.dma_order, rules in grader.tasks.a08_manual_dma.pipelined).
OVERLAP = "[FAIL] overlap: the next chunk's copy starts before this chunk's compute"


def test_the_solutions_dma_order_is_double_buffered(notebook):
    """What the rules read off the honest kernels: a copy in flight at every compute but the
    last, two buffers each way, chunk-sized copies, nothing unsafe."""
    from grader.facts import dma_order

    for task, shape, chunk, out in (("absmax_dma", (40, 256), 16, False),
                                    ("absmax_pipeline", (40, 256), 16, True),
                                    ("absmax_in_place", (96, 256), 16, True)):
        fn = traced_as_tpu(notebook[task]) if task == "absmax_pipeline" else notebook[task]
        program = jax.make_jaxpr(lambda x, f=fn, c=chunk: f(x, c))(jnp.zeros(shape))
        (eqn,) = [e for e in program.eqns if e.primitive.name == "pallas_call"]
        order = dma_order.dma_order(eqn.params)
        chunks = -(-shape[0] // chunk)
        assert order["computes"] == chunks and order["overlapped"] == chunks - 1, (task, order)
        assert order["copies"]["in"]["buffers"] == 2 and order["unsafe"] == 0, (task, order)
        assert max(order["copies"]["in"]["elements"]) == chunk * shape[1], (task, order)
        assert (order["copies"]["out"]["count"] == chunks) == out, (task, order)


def test_a_prefetch_issued_after_the_compute_fails_overlap(notebook):
    prefetch = ("        @pl.when(c + 1 < n_chunks)\n"
                "        def _prefetch_next():  # in flight while this step scales chunk c\n"
                "            on_chunk_copy(c + 1, lambda copy: copy.start())\n\n")
    compute = "        o_ref[...] = absmax_scale(buf[c % 2]).astype(o_ref.dtype)\n"
    late = _planted(notebook, "absmax_dma_solution", (prefetch, ""),
                    (compute, compute + "\n" + prefetch))
    message = _fails("absmax_dma", late, OVERLAP)
    assert "a copy into VMEM in flight at 2 of the 3 compute steps (all but the last); " \
        "found at 0" in message, message


def test_an_in_place_race_fixed_by_removing_all_overlap_fails(notebook):
    """The race "fixed" by starting the next copy in only after this chunk is scaled and
    written back: no race, right values, and nothing overlaps."""
    prefetch = ("            @pl.when(c + 1 < n_chunks)\n"
                "            def _prefetch_next():\n"
                "                copy_in(c + 1, 1 - slot).start()\n\n")
    written_back = "            copy_out(c, slot).start()\n"
    serial = _planted(notebook, "absmax_in_place_solution", (prefetch, ""),
                      (written_back, written_back + "            copy_out(c, slot).wait()\n"
                       "\n            @pl.when(c + 1 < n_chunks)\n"
                       "            def _prefetch_next():\n"
                       "                copy_in(c + 1, 1 - slot).start()\n"),
                      ("            @pl.when(c > 0)\n"
                       "            def _previous_written():  # buffer 1 - slot is free only "
                       "once this returns\n"
                       "                copy_out(c - 1, 1 - slot).wait()\n\n", ""),
                      ("        copy_out(n_chunks - 1, (n_chunks - 1) % 2).wait()\n", ""))
    _fails("absmax_in_place", serial, OVERLAP)


def test_the_shipped_race_is_also_seen_in_the_dma_order(notebook):
    """The buggy kernel's copy in starts while the write-back of that buffer is in flight:
    the order shows it whatever the race detector's clocks draw."""
    message = _fails("absmax_in_place", notebook["absmax_in_place_buggy"], "RACE DETECTED")
    del message
    from grader.facts import dma_order

    program = jax.make_jaxpr(lambda x: notebook["absmax_in_place_buggy"](x, 16))(
        jnp.zeros((96, 256)))
    (eqn,) = [e for e in program.eqns if e.primitive.name == "pallas_call"]
    assert dma_order.dma_order(eqn.params)["unsafe"] == 4


def test_a_chunk_sum_without_double_buffering_fails():
    """Assignment 09's chunk_sum "fixed" by copying each chunk and waiting at once, into one
    buffer: the race is gone, and so is the overlap the task asks for."""
    namespace = gradertools.run("09_debugging", ("_solution",))
    source = gradertools.cells("09_debugging")["chunk_sum_solution"]
    for old, new in (("            @pl.when(c + 2 < n_chunks)\n"
                      "            def _prefetch():\n"
                      "                fetch(c + 2).start()",
                      "            fetch(c).start()"),
                     ("        for c in range(min(2, n_chunks)):", "        for c in range(0):"),
                     ("% 3", "% 1")):
        assert old in source, old
        source = source.replace(old, new)
    exec(compile(source, "planted chunk_sum", "exec"), namespace)  # noqa: S102
    with pytest.raises(course.CheckFailed) as failed:
        course.check("chunk_sum", namespace["chunk_sum"], quiet=True)
    message = str(failed.value)
    assert OVERLAP in message and "[FAIL] copies into VMEM: buffers: required 3 VMEM " \
        "buffers (triple buffering); found 1" in message, message


def test_emit_pipeline_over_one_whole_array_block_fails_the_chunk_size(notebook):
    whole = _planted(notebook, "absmax_pipeline_solution",
                     ("rows = pl.BlockSpec((chunk, n), lambda c: (c, 0))",
                      "rows = pl.BlockSpec((m, n), lambda c: (0, 0))"),
                     ("grid=(pl.cdiv(m, chunk),)", "grid=(1,)"))
    message = _fails("absmax_pipeline", whole, "[FAIL] copies into VMEM: the chunk size")
    assert "required 3 copies of at most (16, 256) = 4,096 elements, one per chunk; found 1 " \
        "copies of 10,240 elements" in message, message


def test_wrong_grid_semantics_is_reported_as_such_without_running(notebook):
    """Copies that cross grid steps on a "parallel" grid: the visible case fails at once,
    naming the semantics, instead of hanging in the interpreter."""
    parallel = _planted(notebook, "absmax_dma_solution",
                        ('dimension_semantics=("arbitrary",)', 'dimension_semantics=("parallel",)'))
    message = _fails("absmax_dma", parallel, "DmaWouldHang")
    assert 'mark the grid dimension_semantics=("arbitrary",)' in message, message


def test_a_wait_without_its_start_is_reported_without_running(notebook):
    no_first = _planted(notebook, "absmax_dma_solution",
                        ("            on_chunk_copy(0, lambda copy: copy.start())\n",
                         "            pass\n"))
    _fails("absmax_dma", no_first, "waits 1 time(s) for a DMA that no copy started")
