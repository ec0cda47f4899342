"""``_course.check`` never lets a fallback read as a pass: a kernel asked to compile that the
backend rejects is rerun in interpret mode, and the check prints FALLBACK, the compiler's error,
and whether the kernel declared that it cannot compile here (``cannot_compile``). The CPU
stands in for an accelerator: nothing compiles for it, so ``interpret=False`` falls back.

Lesson 9's deliberate interpreter errors run in a process of their own
(``_course.in_fresh_process``): on a TPU, an error inside TPU interpret mode stayed with the
lesson's process and failed every later interpreted kernel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
sys.path.insert(0, str(LESSONS_DIR.parent / "bench"))
import on_device  # noqa: E402 - bench/ is no package


def double(x, *, interpret):
    def kernel(x_ref, o_ref):
        o_ref[...] = 2.0 * x_ref[...]

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x)


@pytest.mark.parametrize("declared", [None, "a kernel for another chip"])
def test_a_fallback_is_printed_and_recorded(course, capsys, monkeypatch, tmp_path, declared):
    record = tmp_path / "kernels.jsonl"
    monkeypatch.setenv(course.RECORD_ENV, str(record))
    x = jnp.ones((8, 128), jnp.float32)
    course.check("00-test", "double", double, lambda a: 2.0 * a, (x,),
                 course.Execution(False, "compiled"), rtol=0, atol=0,
                 cannot_compile=declared and {"cpu": declared})
    out = capsys.readouterr()
    assert "FALLBACK to interpret mode: compiling for CPU failed" in out.err
    assert (f"declared: {declared}" if declared else "UNDECLARED") in out.err
    assert "this kernel ran: FELL BACK, interpret mode on CPU" in out.out
    (line,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert line["fell_back"] and not line["compiled"] and line["passed"]
    assert line["declared"] == declared and line["compile_error"]


def test_a_wrong_kernel_is_recorded_before_it_raises(course, monkeypatch, tmp_path):
    record = tmp_path / "kernels.jsonl"
    monkeypatch.setenv(course.RECORD_ENV, str(record))
    x = jnp.ones((8, 128), jnp.float32)
    with pytest.raises(AssertionError):
        course.check("00-test", "double", double, lambda a: 3.0 * a, (x,),
                     course.Execution(True, "interpret mode"), rtol=0, atol=0)
    (line,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert not line["passed"] and "AssertionError" in line["error"]


@pytest.mark.slow
def test_lesson_9_provokes_no_interpreter_error_in_its_own_process(course, monkeypatch):
    """Every cell of lesson 9 runs, and the lesson's process never had to reset TPU interpret
    mode (which it does only after an error inside it): the errors happened elsewhere."""
    from jax.experimental.pallas import tpu as pltpu

    resets = []
    monkeypatch.setattr(pltpu, "reset_tpu_interpret_mode_state", lambda: resets.append(1))
    monkeypatch.chdir(LESSONS_DIR)
    path = LESSONS_DIR / "09-debugging.py"
    namespace = {"__name__": "__main__"}
    for i, source in enumerate(on_device.code_cells(path.read_text())):
        on_device.run_cell(source, namespace, f"<{path.name} cell {i}>")
    assert resets == []


def copy_by_kernel(x, *, interpret):
    """pl.kernel on a one-core TensorCore mesh: the body copies HBM to HBM (lesson 13)."""
    from jax.experimental.pallas import tpu as pltpu

    mesh = (pltpu.TensorCoreMesh(axis_name="core", num_cores=1)
            if hasattr(pltpu, "TensorCoreMesh")
            else pltpu.create_tensorcore_mesh("core", num_cores=1))
    return pl.kernel(lambda x_hbm, o_hbm: pltpu.sync_copy(x_hbm, o_hbm),
                     out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
                     interpret=interpret)(x)


def test_an_interpreted_pl_kernel_does_not_lower_for_a_tpu():
    """Why interpreted kernels run on the host on a TPU: lowered for a TPU, pl.kernel ignores
    ``interpret=`` and Mosaic gets the interpreter's callbacks (the TPU v5e's error for lesson
    13's two-core matmul and race check, jax 0.10.2)."""
    from jax.experimental.pallas import tpu as pltpu

    device = jax.sharding.AbstractDevice("TPU v5e", 1, "tpu")
    x = jnp.ones((8, 128), jnp.float32)
    fn = jax.jit(lambda a: copy_by_kernel(a, interpret=pltpu.InterpretParams()))
    with jax.sharding.use_abstract_mesh(
            jax.sharding.AbstractMesh((1,), ("chip",), abstract_device=device)):
        with pytest.raises(ValueError, match="tokens_out"):
            fn.trace(x).lower(lowering_platforms=("tpu",))
    assert float(fn(x).sum()) == 8 * 128  # lowered for the CPU, the same call is interpreted


def test_on_a_tpu_an_interpreted_kernel_runs_on_the_host(course, monkeypatch):
    """``check`` runs every kernel it interprets on a TPU machine on its CPU device
    (``_course.on_host``); a compiled one stays on the chip."""
    from jax.experimental.pallas import tpu as pltpu

    placed = []

    def noting_where(x, *, interpret):
        placed.append(jax.config.jax_default_device)
        return copy_by_kernel(x, interpret=interpret)

    monkeypatch.setattr(course, "platform", lambda: "tpu")
    x = jnp.ones((8, 128), jnp.float32)
    course.check("00-test", "copy", noting_where, lambda a: a, (x,),
                 course.Execution(pltpu.InterpretParams(), "TPU interpret mode"), rtol=0, atol=0)
    assert placed == [jax.devices("cpu")[0]]


def test_lesson_13_traces_for_a_named_tpu_on_a_tpu_machines_host(course, monkeypatch):
    """On a TPU machine, interpret mode runs on its CPU (``on_host``); emit_pipeline then asks
    the default device which TPU it is ("Unsupported TPU device kind: cpu" on the v5e), so
    lesson 13 names one there too, and only a kernel that runs on the chip asks the chip."""
    import contextlib
    from types import SimpleNamespace

    lesson13 = course.definitions("13-kernel-api", "traced_for_tpu")
    devices = jax.devices
    monkeypatch.setattr(jax, "devices", lambda *backend: devices(*backend) if backend
                        else [SimpleNamespace(platform="tpu")])
    assert isinstance(lesson13.traced_for_tpu(), contextlib.nullcontext)  # on the chip
    with course.on_host():
        assert not isinstance(lesson13.traced_for_tpu(), contextlib.nullcontext)
