"""bench/on_device.py on the CPU: it reads the notebooks as jupytext does, runs each in a process
of its own, records cells, kernels and checks in the JSON the TPU pass is judged by, and goes on
after a failing cell, a dead process, a core halt or a notebook past its time limit."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "on_device.py"
SUMMARY_KEYS = {"lessons", "lessons_passed", "kernels", "kernels_compiled", "fallbacks_declared",
                "fallbacks_undeclared", "checks", "checks_passed", "core_halts"}


def _load():
    spec = importlib.util.spec_from_file_location("on_device", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


on_device = _load()


@pytest.mark.parametrize("path", sorted(ROOT.glob("lessons/[0-9][0-9]-*.py"))
                         + sorted(ROOT.glob("exercises/source/*/*.py")), ids=lambda p: p.stem)
def test_code_cells_are_jupytexts(path: Path):
    jupytext = pytest.importorskip("jupytext")
    expected = [c.source for c in jupytext.read(path).cells
                if c.cell_type == "code" and c.source.strip()]
    assert on_device.code_cells(path.read_text()) == expected


def test_a_lesson_and_an_assignment_recorded(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path),
                           "02-first-kernel", "01_first_kernel"], cwd=ROOT, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "on_device.json").read_text())
    assert {"commit", "jax", "libtpu", "chip", "summary"} <= set(record)
    assert record["chip"] == "cpu" and record["jax"]
    summary = record["summary"]
    assert SUMMARY_KEYS <= set(summary) and all(type(v) is int for v in summary.values())
    lesson, assignment = record["notebooks"]
    assert (lesson["kind"], assignment["kind"]) == ("lesson", "exercise")
    assert lesson["passed"] and lesson["cells_run"] == lesson["cells"] > 0
    assert [k["kernel"] for k in lesson["kernels"]] == ["add", "scaled_add"]
    assert all(k["ran"] == "interpreted" and k["passed"] and k["kernel_ms"] > 0
               for k in lesson["kernels"])
    checks = assignment["checks"]
    assert {(c["task"], c["hidden"]) for c in checks} == {
        (t, h) for t in ("add", "elementwise", "leaky_relu") for h in (False, True)}
    assert all(c["passed"] and c["ran"] == ["interpret"] for c in checks)
    assert summary["lessons"] == summary["lessons_passed"] == 1
    assert summary["checks"] == summary["checks_passed"] == 6
    assert summary["kernels"] == 2 and summary["kernels_compiled"] == 0
    assert summary["fallbacks_undeclared"] == summary["core_halts"] == 0
    assert "02-first-kernel" in done.stdout and (tmp_path / "on_device_logs").is_dir()


def _notebook(tmp_path: Path, *cells: str) -> Path:
    path = tmp_path / "nb.py"
    path.write_text("".join(f"# %%\n{c}\n\n# %% [markdown]\n# text\n\n" for c in cells))
    return path


def _run(tmp_path: Path, *cells: str, timeout: int = 60) -> dict:
    return on_device.run_notebook("nb", _notebook(tmp_path, *cells), False, timeout,
                                  tmp_path / "logs", "cpu")


def test_a_failing_cell_is_recorded_and_the_next_one_runs(tmp_path):
    run = _run(tmp_path, "x = 1", "raise ValueError('wrong block')", "x + 1")
    assert (run["cells"], run["cells_run"], run["passed"]) == (3, 3, False)
    assert run["error_cells"] == [{"cell": 1, "error": "ValueError: wrong block"}]
    assert not run["core_halt"] and not run["timed_out"]


def test_a_cell_needing_a_newer_jax_and_the_cells_that_use_its_names_pass(tmp_path):
    """A TPU runtime's jax 0.10.2 lacks APIs the pinned release has: the cell that asks for one
    says which release it needs, a later cell that reads a name it left undefined is counted
    with it, and any other error, a NameError included, still fails the notebook."""
    needs = ("from kernelsim.backend import newer_api\nimport types\n"
             "params = newer_api(types.SimpleNamespace(__name__='m'), 'GoneParams')()")
    run = _run(tmp_path, needs, "print(params)", "x = 2")
    assert run["passed"] and run["cells_needing_newer_jax"] == 2, run["error_cells"]
    assert run["error_cells"][1]["error"].startswith("NeedsNewerJax: uses params")
    other = _run(tmp_path, needs, "print(undefined_elsewhere)")
    assert not other["passed"] and other["cells_needing_newer_jax"] == 1


def test_bound_names():
    assert on_device.bound_names("import a.b as c, d.e\nfrom f import g\nx, (y, z) = 1, (2, 3)\n"
                                 "def h(): w = 1\nclass K: pass\nfor i in []: pass") == {
        "c", "d", "g", "x", "y", "z", "h", "K", "i"}


def test_a_core_halt_ends_the_notebook_and_is_recorded(tmp_path):
    halt = ("raise RuntimeError('INTERNAL: Core halted unexpectedly: E0200: "
            "RuntimeUnexpectedCoreHalt')")
    run = _run(tmp_path, "x = 1", halt, "x + 1")
    assert run["core_halt"] and not run["passed"] and run["cells_run"] == 2
    # a process that dies of it, having printed it, is recorded the same way
    died = _run(tmp_path, "import os, sys\nprint('The program continuator has halted "
                "unexpectedly', file=sys.stderr, flush=True)\nos._exit(134)")
    assert died["core_halt"] and died["returncode"] == 134 and died["cells_run"] == 0
    assert on_device.summarise([run, died], "tpu")["core_halts"] == 2


def test_a_notebook_past_its_time_limit_is_stopped(tmp_path):
    run = _run(tmp_path, "import time\ntime.sleep(60)", "x = 1", timeout=2)
    assert run["timed_out"] and not run["passed"] and run["cells_run"] == 0


def test_fallbacks_count_only_on_an_accelerator():
    kernel = {"ran": "fell back", "declared": None, "passed": True, "error": None}
    declared = {**kernel, "declared": "GPU only"}
    # a kernel whose JAX lacks what it needs never ran: no fallback (lesson 16 on jax 0.10.2)
    never_ran = {**kernel, "ran": "interpreted", "passed": False,
                 "error": "NeedsNewerJax: jax.experimental.pallas.mosaic_gpu.InterpretGPUParams"}
    runs = [{"kind": "lesson", "passed": False, "core_halt": False, "timed_out": False,
             "kernels": [kernel, declared, {**kernel, "ran": "compiled"}, never_ran],
             "checks": []}]
    tpu = on_device.summarise(runs, "tpu")
    assert (tpu["fallbacks_declared"], tpu["fallbacks_undeclared"]) == (1, 1)
    assert tpu["kernels"] == 4 and tpu["kernels_compiled"] == 1
    cpu = on_device.summarise(runs, "cpu")
    assert cpu["fallbacks_declared"] == cpu["fallbacks_undeclared"] == 0


def test_a_check_for_more_devices_than_the_chip_has_is_a_declared_fallback():
    """Assignment 13's ring of four runs on CPU devices beside a single TPU chip."""
    check = {"task": "ring_reduce_scatter", "hidden": False, "passed": True, "error": None,
             "target": "tpu", "ran": ["TPU interpret"], "devices": 4, "devices_here": 1}
    assert on_device._check_row(check, "tpu")["declared"] == "a task for 4 devices, 1 here"
    assert on_device._check_row({**check, "devices_here": 4}, "tpu")["declared"] is None
    assert on_device._check_row({**check, "devices": 1}, "tpu")["declared"] is None


def test_chip_names():
    assert on_device.chip_name("tpu", "TPU v5 lite") == "tpu-v5e"
    assert on_device.chip_name("tpu", "TPU v6 lite") == "tpu-v6e"
    assert on_device.chip_name("cpu", "cpu") == "cpu"
    assert on_device.chip_name("gpu", "NVIDIA H200") == "gpu-nvidia-h200"


def _commit(rev: str) -> str:
    found = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True,
                           text=True)
    if found.returncode:
        pytest.skip(f"no commit {rev} in this checkout (a shallow clone)")
    return found.stdout.strip()


def test_merge_keeps_a_rerun_and_names_what_changed_since(tmp_path):
    """A notebook rerun after a fix replaces its first run; each notebook keeps its commit and
    the course files changed between it and the record's (the newest) commit."""
    old, new = _commit("HEAD~3"), _commit("HEAD")
    base = {"jax": "0.10.2", "libtpu": "0.0.42.1", "chip": "tpu-v5e", "backend": "tpu",
            "when": "t"}
    run = {"kind": "lesson", "core_halt": False, "timed_out": False, "kernels": [],
           "checks": []}
    first, rerun = tmp_path / "first.json", tmp_path / "rerun.json"
    first.write_text(json.dumps({**base, "commit": old, "notebooks": [
        {**run, "notebook": "01", "passed": True}, {**run, "notebook": "02", "passed": False}]}))
    rerun.write_text(json.dumps({**base, "commit": new, "notebooks": [
        {**run, "notebook": "02", "passed": True}]}))
    merged = on_device.merge([rerun, first])
    assert merged["commit"] == new
    assert merged["summary"]["lessons"] == merged["summary"]["lessons_passed"] == 2
    one, two = merged["notebooks"]
    assert (one["commit"], two["commit"], two["changed_since_run"]) == (old, new, [])
    changed = subprocess.run(["git", "diff", "--name-only", old, new, "--",
                              *on_device.COURSE_CODE], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert one["changed_since_run"] == sorted(changed)


def test_merge_joins_disjoint_runs(tmp_path):
    base = {"commit": _commit("HEAD"), "jax": "0.10.2", "libtpu": "0.0.42.1",
            "chip": "tpu-v5e", "backend": "tpu", "when": "t"}
    run = {"kind": "lesson", "passed": True, "core_halt": False, "timed_out": False,
           "kernels": [], "checks": []}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**base, "notebooks": [{**run, "notebook": "01"}]}))
    b.write_text(json.dumps({**base, "notebooks": [{**run, "notebook": "02"}]}))
    merged = on_device.merge([a, b])
    assert merged["summary"]["lessons"] == merged["summary"]["lessons_passed"] == 2
    b.write_text(json.dumps({**base, "jax": "0.12.0.1", "notebooks": []}))
    with pytest.raises(SystemExit, match="jax"):
        on_device.merge([a, b])
