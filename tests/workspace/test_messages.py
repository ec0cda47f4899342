"""Messages a learner acts on: each hint of grader.verdict.messages.HINTS is triggered by the
real error (JAX, Mosaic's TPU lowering or kernelsim) and shows up in course.check's failure;
parameters print as Python literals; wrong values come with a map of the wrong blocks; a
structural failure shows the learner's traffic; a failing check's traceback in a notebook has
no grader frame."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import nbformat
import pytest
from jax.experimental import pallas as pl

import kernelsim
from grader.learner import course, selfcheck
from grader.verdict import messages

REPO = Path(__file__).resolve().parents[2]


def _copy(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _tiled(kernel=_copy, spec_block=None, index_map=lambda i, j: (i, j), out_dtype=None,
           interpret=True, out_block=None):
    """A tiled_add(x, y, block) built from the given parts (the right answer by default)."""
    def tiled_add(x, y, block):
        bm, bn = block
        spec = pl.BlockSpec(spec_block or (bm, bn), index_map)
        return pl.pallas_call(
            kernel, grid=(pl.cdiv(x.shape[0], bm), pl.cdiv(x.shape[1], bn)),
            in_specs=[spec, spec], out_specs=pl.BlockSpec(out_block or (bm, bn), index_map),
            out_shape=jax.ShapeDtypeStruct(x.shape, out_dtype or x.dtype),
            interpret=interpret)(x, y)
    return tiled_add


def _add(kernel=_copy, interpret=True):
    def add(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=interpret)(x, y)
    return add


def _failure(task: str, fn) -> str:
    with pytest.raises(course.CheckFailed) as err:
        course.check(task, fn)
    return str(err.value)


def _reads_output(x_ref, y_ref, o_ref):
    o_ref[...] = o_ref[...] + x_ref[...] + y_ref[...]


def _half(x_ref, y_ref, o_ref):
    o_ref[...] = (x_ref[...] + y_ref[...]) * 0.5


def _store_row(x_ref, y_ref, o_ref):
    o_ref[...] = (x_ref[...] + y_ref[...]).sum(axis=0)


def _one_ref(x_ref):
    pass


def _mosaic_tiling_error() -> str:
    """The real error of Mosaic's TPU lowering (run here on a CPU through jax.export)."""
    x = jnp.zeros((32, 256), jnp.float32)
    f = _tiled(spec_block=(4, 128), interpret=False, out_block=(4, 128))
    with pytest.raises(Exception) as err:
        jax.export.export(jax.jit(lambda a, b: f(a, b, (4, 128))), platforms=["tpu"])(x, x)
    return str(err.value)


def _kernelsim_tiling_error() -> str:
    x = jnp.zeros((32, 256), jnp.float32)
    with pytest.raises(kernelsim.TraceError) as err:
        kernelsim.trace(lambda a, b: _tiled()(a, b, (4, 128)), x, x, strict=True)
    return str(err.value)


def _copies_twice_before_a_wait(x, w, interpret):
    """An RMS-norm-shaped Mosaic GPU kernel whose barrier completes twice before its one wait:
    the first copy is never waited for."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # a second: this trigger only

    @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       scratch_types=dict(x_smem=plgpu.SMEM(x.shape, x.dtype),
                                          landed=plgpu.Barrier()),
                       interpret=interpret)
    def kernel(x_gmem, w_gmem, o_gmem, x_smem, landed):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, landed)
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, landed)
        plgpu.barrier_wait(landed)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return kernel(x, w)


def _reads_before_the_copy_lands(x, y):
    """An add whose kernel reads its own copy's destination before waiting for it, run in TPU
    interpret mode with the race detector on: one device suffices for a race."""
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_hbm, y_ref, o_ref, landed, sem):
        copy = pltpu.make_async_copy(x_hbm, landed, sem)
        copy.start()
        o_ref[...] = landed[...] + y_ref[...]
        copy.wait()

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.VMEM)],
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        interpret=pltpu.InterpretParams(detect_races=True))(x, y)


def _reads_at_a_negative_index(x, y):
    """An add whose kernel reads the row block ``rem(0 - 1, 2)`` of a scratch copy of ``x``, in
    TPU interpret mode: ``jax.lax.rem`` keeps the sign, so the block is -1 (a ring's
    ``(me - step - 1) mod N``, assignment 13's hint warns of it)."""
    from jax.experimental.pallas import tpu as pltpu

    rows = x.shape[0] // 2

    def kernel(x_ref, y_ref, o_ref, copy):
        copy[...] = x_ref[...]
        block = jax.lax.rem(pl.program_id(0) - 1, 2)
        o_ref[pl.ds(0, rows), :] = copy[pl.ds(block * rows, rows), :] + y_ref[pl.ds(0, rows), :]
        o_ref[pl.ds(rows, rows), :] = x_ref[pl.ds(rows, rows), :] + y_ref[pl.ds(rows, rows), :]

    return pl.pallas_call(
        kernel, grid=(1,), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype)],
        interpret=pltpu.InterpretParams())(x, y)


SEP = "\n----\n"
# hint name -> how a learner runs into it; every hint of the table must be here
TRIGGERS = {
    "interpret-on-cpu": lambda: _failure("add", _add(interpret=False)),
    "tiling-8-128": lambda: _mosaic_tiling_error() + SEP + _kernelsim_tiling_error(),
    "block-prescribed": lambda: _failure(
        "tiled_add", lambda x, y, block: _tiled()(x, y, (16, 128))),  # required (8, 128)
    "element-offsets": lambda: _failure("tiled_add", _tiled(index_map=lambda i, j: (i * 8, j))),
    "block-rank": lambda: _failure("tiled_add", _tiled(spec_block=(128,),
                                                       index_map=lambda i, j: (j,))),
    "index-map-arity": lambda: _failure("tiled_add", _tiled(index_map=lambda i, j: (i,))),
    "out-shape-dtype": lambda: _failure("tiled_add", _tiled(kernel=_half, out_dtype=jnp.int32)),
    "store-shape": lambda: _failure("tiled_add", _tiled(kernel=_store_row)),
    "reads-output": lambda: _failure("add", _add(kernel=_reads_output)),
    "kernel-arity": lambda: _failure("add", _add(kernel=_one_ref)),
    "barrier-unobserved": lambda: _failure("rms_norm_mgpu", _copies_twice_before_a_wait),
    "race": lambda: _failure("add", _reads_before_the_copy_lands),
    "negative-index": lambda: _failure("add", _reads_at_a_negative_index),
}


def test_a_race_is_told_in_the_message_alone(caplog):
    """JAX logs each failing io_callback's traceback, some 150 lines on stderr for assignment
    13's racy ring, which a notebook showed above the check's few lines (issue 50): the check
    keeps them out of the log (pytest's caplog holds what would have reached stderr), and its
    message still names the race."""
    text = TRIGGERS["race"]()
    assert "RACE DETECTED" in text
    assert [r.getMessage() for r in caplog.records if r.name == "jax._src.callback"] == []


def test_every_hint_has_a_trigger():
    assert set(TRIGGERS) == {h.name for h in messages.HINTS}


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_hint_for_the_real_error(name):
    text = TRIGGERS[name]()
    hint = next(h.text for h in messages.HINTS if h.name == name)
    if name == "tiling-8-128":  # two real sources of the same rule, both must match
        for part in text.split(SEP):
            assert messages.hints_for(part) == [hint], part
    else:
        assert f"Hint: {hint}" in text, text


def test_a_block_mosaic_rejects_fails_and_the_message_names_rule_operand_and_nearest_block():
    """Assignment 6 task 1 lets the learner choose the blocks: (4, 100) would not lower on TPU."""
    def fused_add_relu_mul(x, y, z):
        def kernel(x_ref, y_ref, z_ref, o_ref):
            o_ref[...] = jnp.maximum(x_ref[...] + y_ref[...], 0) * z_ref[...]

        spec = pl.BlockSpec((4, 100), lambda i, j: (i, j))
        return pl.pallas_call(kernel, grid=(pl.cdiv(x.shape[0], 4), pl.cdiv(x.shape[1], 100)),
                              in_specs=[spec] * 3, out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x, y, z)

    text = _failure("fused_add_relu_mul", fused_add_relu_mul)
    rule = next(x for x in text.splitlines() if x.strip().startswith("[FAIL]"))
    assert "(8, 128) tiling rule" in rule and "operand 'x_ref'" in rule, rule
    assert "Nearest legal block: (8, 128)" in rule and "y_ref, z_ref, o_ref" in rule, rule
    hint = next(h.text for h in messages.HINTS if h.name == "tiling-8-128")
    assert f"Hint: {hint}" in text


def test_params_print_as_python_literals():
    text = _failure("tiled_add", _tiled(index_map=lambda i, j: (i * 8, j)))
    assert "y(32, 256); block=(8, 128))" in text, text
    assert "__tuple__" not in text


def test_wrong_values_show_which_blocks_are_wrong():
    def one_bad_block(x_ref, y_ref, o_ref):
        i, j = pl.program_id(0), pl.program_id(1)
        bad = jnp.logical_and(i == 2, j == 1).astype(x_ref.dtype)
        o_ref[...] = x_ref[...] + y_ref[...] + bad

    text = _failure("tiled_add", _tiled(kernel=one_bad_block))
    assert "wrong output blocks (X) of the 4 x 2 grid of (8, 128) blocks: 1 of 8" in text, text
    assert "\n  . .\n  . .\n  . X\n  . .\n" in text + "\n", text


def test_structural_failure_shows_the_learners_traffic():
    def whole(x, y, block):  # right values, but one block: the grid rule fails
        return _add()(x, y)

    text = _failure("tiled_add", whole)
    assert "[FAIL]" in text, text
    assert "your call of `_copy` (grid ()): HBM read 65,536 B" in text, text
    assert re.search(r"input +x_ref +block \(32, 256\): 1 fetch\(es\)", text), text


def test_every_failure_of_a_kernel_shows_in_one_check():
    """Wrong values, a wrong grid and a block Mosaic rejects: one check names all three (issue
    37: the grid and block rules showed only once the values were right)."""
    def tiled_add(x, y, block):
        spec = pl.BlockSpec((16, 100), lambda i, j: (i, j))
        return pl.pallas_call(
            lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., x_ref[...] - y_ref[...]),
            grid=(2, 3), in_specs=[spec, spec], out_specs=spec,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x, y)

    text = _failure("tiled_add", tiled_add)
    assert text.startswith("tiled_add: wrong values for case v0"), text
    assert "[FAIL] grid: required (4, 2); found (2, 3)" in text, text
    assert "[FAIL] block shapes Mosaic accepts (TPU's (8, 128) tiling rule)" in text, text
    assert "Nearest legal block: (16, 128)" in text, text


def test_traffic_and_rules_read_as_english():
    """A kernel function named ``kernel`` (the usual name) is not "your kernel kernel", and a
    kernel with no scalar prefetch (or no dot) is told of no rule about scalar prefetch (or
    dots): a rule that does not apply is not reported."""
    def whole(x, y, block):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] + y_ref[...]
        return _add(kernel)(x, y)

    record = {}
    with pytest.raises(course.CheckFailed) as err:
        selfcheck.check("tiled_add", whole, False, True, record)
    assert "your call of `kernel` (grid ())" in str(err.value), err.value
    assert "kernel kernel" not in str(err.value)
    assert any(r.startswith("[FAIL] grid") for r in record["rules"]), record["rules"]
    for rule in record["rules"]:
        assert "scalar prefetch" not in rule and "dot precision" not in rule, rule


def test_a_passing_check_says_so_in_one_short_line(monkeypatch, capsys):
    """Not one clause per rule that held (issue 37): those are in the check's record."""
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    course.check("tiled_add", _tiled())
    (line,) = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"tiled_add: 1 visible case\(s\) passed and all \d+ structural "
                        r"rules held", line), line


def test_summary_names_each_task_once(monkeypatch, capsys):
    """The summary's line starts with the task id; the check's message, which starts with it
    too, is not shown after it again ("add: add: ...")."""
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    monkeypatch.setattr(course, "_SESSION", {"add": {
        "task": "add", "passed": False, "message": "add: not implemented yet"}})
    course.summary()
    out = capsys.readouterr().out
    assert "FAIL         add: not implemented yet" in out, out


def test_failing_check_traceback_shows_no_grader_frame(tmp_path):
    """A real kernel runs a failing check: the traceback the learner sees names their cell and
    the message, and no file under grader/."""
    import nbclient

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(
            "import jax\nfrom jax.experimental import pallas as pl\n"
            "from grader.learner import course\n"
            "def kernel(x_ref, y_ref, o_ref):\n    o_ref[...] = x_ref[...] - y_ref[...]\n"
            "def add(x, y):\n    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct("
            "x.shape, x.dtype), interpret=True)(x, y)"),
        nbformat.v4.new_code_cell('course.check("add", add)'),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}})
    nbclient.NotebookClient(nb, timeout=120, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    err = next(o for o in nb.cells[1].outputs if o.output_type == "error")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.traceback))
    assert err.ename == "CheckFailed"
    assert "wrong values for case v0" in shown, shown
    assert 'course.check("add", add)' in shown, shown  # the learner's line
    assert "grader/" not in shown and "grader\\" not in shown, shown


def test_feedback_page_shows_the_whole_message(browser, tmp_path):
    """A long failure message, in nbgrader's feedback template with the course's feedback
    preprocessors' CSS, wraps inside the page instead of running off its right edge."""
    import nbgrader
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config, PyFileConfigLoader

    from grader.gradebook.feedback_css import FeedbackCSS

    course = PyFileConfigLoader("nbgrader_config.py", path=str(REPO / "exercises")).load_config()
    assert FeedbackCSS in course.GenerateFeedback.preprocessors
    templates = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    c = Config()  # what nbgrader's GenerateFeedback sets up
    c.HTMLExporter.template_name = "feedback"
    c.HTMLExporter.extra_template_basedirs = [str(templates / "templates")]
    c.HTMLExporter.extra_template_paths = [
        str(templates / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    exporter = HTMLExporter(config=c)
    exporter.register_preprocessor(FeedbackCSS(), enabled=True)
    message = _failure("tiled_add", _tiled(index_map=lambda i, j: (i * 8, j))) + " THE-END"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'course.check("tiled_add", tiled_add)', outputs=[nbformat.v4.new_output(
            "error", ename="CheckFailed", evalue=message,
            traceback=[f"CheckFailed: {message}"])])])
    html, _ = exporter.from_notebook_node(nb, resources={"nbgrader": {
        "notebook": "tiling", "score": 0, "max_score": 1, "late_penalty": 0}})
    page_file = tmp_path / "feedback.html"
    page_file.write_text(html)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(page_file.as_uri())
        widths = page.evaluate("""() => {
            const pre = [...document.querySelectorAll('pre')]
                .find(p => p.textContent.includes('THE-END'));
            return [pre.scrollWidth, pre.clientWidth, document.body.scrollWidth,
                    window.innerWidth];
        }""")
    finally:
        page.close()
    assert widths[0] <= widths[1] and widths[2] <= widths[3], widths
