"""Execute every lesson and every assignment's instructor notebook on the present accelerator,
and record per kernel whether it compiled, fell back to interpret mode (and why), and its time.

Each notebook (``lessons/NN-*.py``; ``exercises/source/*/*.py``, the instructor's version with
solutions and hidden tests) runs in a fresh Python process of its own, one after another (one
process at a time can hold a TPU), with a time limit per notebook. Its cells run in that
process itself, in one namespace, in order: no Jupyter kernel and no socket (a TPU machine may
allow none), and no jupytext (the percent format is read here). A failing cell is recorded
and the next one runs, as *Run All* does in JupyterLab for a check that fails.

What is recorded, per notebook: every code cell's error; a lesson's kernels, from
``lessons/_course.py:check`` (``$PALLAS_COURSE_RECORD``): compiled, fell back (the compiler's
error, and the kernel's declared reason if it has one), or interpreted as its ``Execution``
asks, with median seconds for kernel and plain-JAX reference; an assignment's checks
(``grader.learner.course.check``, wrapped here): task, hidden or visible, passed, the error, and
how its kernels were asked to run (``interpret=`` of ``pl.pallas_call``, ``pl.kernel`` and
``plgpu.kernel``). A TPU core halt (E0200 ``RuntimeUnexpectedCoreHalt``) ends that notebook's
process; it is recorded as ``core_halt`` and the run goes on with the next notebook.

On an accelerator, a kernel that runs interpreted is a *fallback*. It is declared when the
kernel says why it cannot compile here (``_course.check(..., cannot_compile={backend: why})``),
when its ``Execution`` asks for interpret mode (the lesson's own choice, its label the reason),
or, for an assignment's check, when the task is written for another backend
(``grader.tasks``' ``target``) or for more devices than the accelerator has (``Task.devices``:
assignment 13's ring of four, on CPU devices beside one chip). An undeclared fallback is a
failure. A lesson passes when every cell ran without error, but for cells that say they need
a newer JAX release (``kernelsim.backend.newer_api``, or a name such a cell left undefined;
counted in ``cells_needing_newer_jax``; a check that says so: ``checks_needing_newer_jax``).
On a CPU nothing compiles and nothing is a fallback: everything runs interpreted (the run
then checks the notebooks and this script, not the chip).

Writes JSON (``bench/results/on_device.json``; with ``--record``,
``bench/recorded/on_<chip>.json``; ``--out DIR`` puts it, and each notebook's output log, in
DIR) and prints a table. ``--merge A.json B.json`` joins the records of runs over disjoint
notebooks (e.g. lessons and exercises run as two commands) into one. Exit status 0 when every
notebook passed.

``--visible-only`` skips the hidden checks (recorded as ``hidden_checks``: false), running what a
learner's JAX runs of an assignment: its solutions and visible checks. Hidden checks run where
grading does, on the course's pinned JAX; on a chip, run them all.

Usage: python bench/on_device.py [--only lessons|exercises] [--timeout S] [--jobs N]
                                 [--visible-only] [--record] [--out DIR] [STEM ...]
       python bench/on_device.py --merge A.json B.json [--record] [--out DIR]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's grader, as the notebooks it runs import

from grader.devices import cpu_devices_env, devices_of  # noqa: E402 - after the path

LESSONS = ROOT / "lessons"
EXERCISES = ROOT / "exercises" / "source"
RESULTS = ROOT / "bench" / "results"
RECORDED = ROOT / "bench" / "recorded"
RECORD_ENV = "PALLAS_COURSE_RECORD"  # the name lessons/_course.py reads
TIMEOUT_S = 600  # per notebook; the slowest lesson takes ~3 minutes interpreted on 2 CPU cores
# What a TPU core halt prints (libtpu 0.0.42.1 on a v5e): the first error, then the dead
# runtime's message at every later call.
CORE_HALT_MARKS = ("RuntimeUnexpectedCoreHalt", "Core halted unexpectedly",
                   "program continuator has halted")
# Triton's refusal of a block whose size is not a power of two. Hidden cases hold such shapes
# on purpose (a whole (5, 7) array, ragged rows); grading runs them on the CPU
# (grader/jail/sandbox.py sets JAX_PLATFORMS=cpu), so on a GPU this is expected.
TRITON_SHAPE_REFUSAL = "Pallas Triton lowering currently requires"
NEEDS_NEWER_JAX = "NeedsNewerJax:"  # a cell's error naming the JAX release it needs


# ---- reading a jupytext percent notebook ---------------------------------------------------

def code_cells(text: str) -> list[str]:
    """The code cells of a jupytext percent-format file, in order: the lines after each
    ``# %%`` marker that has no ``[markdown]``/``[md]``/``[raw]`` tag, blank lines at either end
    removed. The YAML header (``# ---`` ... ``# ---``) and markdown cells are comments."""
    cells: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(("# %%", "#%%")):
            tag = line.lstrip("#% ").split(" ", 1)[0]
            current = None if tag in ("[markdown]", "[md]", "[raw]") else []
            if current is not None:
                cells.append(current)
        elif current is not None:
            current.append(line)
    stripped = ["\n".join(c).strip("\n") for c in cells]
    return [c for c in stripped if c.strip()]


def bound_names(source: str) -> set[str]:
    """The names a cell binds at its top level: assignments, imports, functions, classes."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            names |= {n.id for n in ast.walk(node)
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


# ---- the notebook's own process ------------------------------------------------------------

def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def _show(value: Any) -> None:
    """What a notebook does with a cell's last value: render it (a figure to PNG, a viewer to
    HTML), so the rendering's errors are the cell's, and print the plain text."""
    if value is None:
        return
    if hasattr(value, "_repr_mimebundle_"):
        value._repr_mimebundle_()
    elif hasattr(value, "savefig"):
        import io

        value.savefig(io.BytesIO(), format="png")
    elif hasattr(value, "_repr_html_"):
        value._repr_html_()
    print(repr(value)[:2000])


def run_cell(source: str, namespace: dict, filename: str) -> None:
    """Execute ``source`` in ``namespace``; a last expression is shown as a notebook shows it."""
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - the course's own notebook
    if last is not None:
        _show(eval(compile(ast.Expression(last.value), filename, "eval"), namespace))  # noqa: S307


def _mode(interpret: Any) -> str:
    """How a kernel was asked to run, from its ``interpret=`` argument."""
    if interpret is None or interpret is False:
        return "compiled"
    if interpret is True:
        return "interpret"
    return "GPU interpret" if "GPU" in type(interpret).__name__ else "TPU interpret"


def _probe_checks(checks: Path, visible_only: bool = False) -> None:
    """Wrap the kernel entry points and ``course.check`` so that every check of an exercise
    notebook appends one line to ``checks``: task, hidden, passed, error, and how each kernel
    it made was asked to run; with ``visible_only``, a hidden check returns at once, unrun
    and unrecorded."""
    import jax
    from jax.experimental import pallas as pl

    from grader import tasks
    from grader.learner import course

    modes: list[str] = []

    def noting(entry):
        def call(*args, **kwargs):
            modes.append(_mode(kwargs.get("interpret")))
            return entry(*args, **kwargs)
        return call

    pl.pallas_call = noting(pl.pallas_call)
    if hasattr(pl, "kernel"):
        pl.kernel = noting(pl.kernel)
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError:  # a jaxlib without Mosaic GPU: no plgpu.kernel to note
        plgpu = None
    if plgpu is not None and hasattr(plgpu, "kernel"):
        plgpu.kernel = noting(plgpu.kernel)
    check = course.check

    def recording_check(task_id, fn, hidden=False, **kwargs):
        if hidden and visible_only:
            return
        modes.clear()
        task = tasks.BY_ID.get(task_id)
        target = task.target if task is not None else "tpu"
        # a check on a ring of devices (assignment 13) falls back to CPU devices where the
        # accelerator has fewer
        record = {"task": task_id, "hidden": hidden, "passed": False, "error": None,
                  "target": "gpu" if target.endswith("gpu") else "tpu",
                  "devices": task.devices if task is not None else 1,
                  "devices_here": jax.device_count()}
        try:
            check(task_id, fn, hidden=hidden, **kwargs)
            record["passed"] = True
        except BaseException as err:
            record["error"] = _one_line(err)
            raise
        finally:
            record["ran"] = sorted(set(modes))
            _append(checks, record)

    course.check = recording_check


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    halt = next((line for line in text.splitlines() if any(m in line for m in CORE_HALT_MARKS)),
                None)
    first = halt or (text.splitlines()[0] if text else "")
    return f"{type(err).__name__}: {first[:300]}"


def execute(path: Path, exercise: bool, work: Path, visible_only: bool = False) -> int:
    """Run the notebook's code cells here, in order, recording into ``work``: ``cells.jsonl``
    (one line per cell), ``kernels.jsonl`` (lessons' checks), ``checks.jsonl`` (exercises')."""
    os.environ[RECORD_ENV] = str(work / "kernels.jsonl")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.chdir(path.parent)  # as Jupyter starts a kernel: beside the notebook
    sys.path[:0] = [str(path.parent), str(ROOT)]
    cells = code_cells(path.read_text(encoding="utf-8"))
    _append(work / "cells.jsonl", {"cells": len(cells)})
    if exercise:
        _probe_checks(work / "checks.jsonl", visible_only)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    unbound: set[str] = set()  # names a cell that needs a newer JAX stopped before binding
    for i, source in enumerate(cells):
        start, error = time.perf_counter(), None
        try:
            run_cell(source, namespace, f"<{path.name} cell {i}>")
        except Exception as err:  # noqa: BLE001 - record it and run the next cell
            error = _one_line(err)
            traceback.print_exc()
            if error.startswith(NEEDS_NEWER_JAX):
                unbound |= bound_names(source) - namespace.keys()
            elif isinstance(err, NameError) and err.name in unbound:
                error = f"{NEEDS_NEWER_JAX} uses {err.name}, which a cell needing a newer " \
                        f"JAX did not define ({error})"
                unbound |= bound_names(source) - namespace.keys()
        finally:
            if "matplotlib.pyplot" in sys.modules:
                sys.modules["matplotlib.pyplot"].close("all")
        _append(work / "cells.jsonl", {"cell": i, "seconds": round(time.perf_counter() - start,
                                                                    2), "error": error})
        if error and any(m in error for m in CORE_HALT_MARKS):
            _append(work / "cells.jsonl", {"core_halt": i})
            return 3  # the chip is gone for this process: the next cells would only repeat it
    _append(work / "cells.jsonl", {"done": True})
    return 0


# ---- the driver ----------------------------------------------------------------------------

def notebooks(only: str | None, stems: list[str]) -> list[tuple[str, Path, bool]]:
    """(name, path, is_exercise) of every notebook to run, lessons first."""
    found = []
    if only != "exercises":
        found += [(p.stem, p, False) for p in sorted(LESSONS.glob("[0-9][0-9]-*.py"))]
    if only != "lessons":
        found += [(p.parent.name, p, True) for p in sorted(EXERCISES.glob("*/*.py"))
                  if p.stem == p.parent.name[3:]]
    if stems:
        found = [n for n in found if n[0] in stems or n[0][:2] in stems]
    return found


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _kernel_row(r: dict) -> dict:
    ran = "compiled" if r["compiled"] else "fell back" if r["fell_back"] else "interpreted"
    return {"kernel": r["kernel"], "ran": ran, "label": r["label"], "passed": r["passed"],
            "declared": r.get("declared"), "compile_error": r.get("compile_error"),
            "error": r.get("error"),
            "kernel_ms": None if r.get("kernel_seconds") is None else
            round(1e3 * r["kernel_seconds"], 3),
            "reference_ms": None if r.get("reference_seconds") is None else
            round(1e3 * r["reference_seconds"], 3)}


def _check_row(r: dict, backend: str) -> dict:
    interpreted = [m for m in r["ran"] if m != "compiled"]
    fallback = backend != "cpu" and bool(interpreted)
    too_few = r.get("devices", 1) > r.get("devices_here", 1)
    return {**r, "fallback": fallback,
            "declared": (f"a task for {r['target'].upper()}" if fallback and
                         r["target"] != backend else
                         f"a task for {r['devices']} devices, {r['devices_here']} here"
                         if fallback and too_few else None),
            "refused_by_triton": backend == "gpu" and r["hidden"] and
            TRITON_SHAPE_REFUSAL in (r["error"] or ""),
            "needs_newer_jax": (r["error"] or "").startswith(NEEDS_NEWER_JAX)}


def run_notebook(name: str, path: Path, exercise: bool, timeout: int, logs: Path,
                 backend: str, visible_only: bool = False) -> dict:
    """Run one notebook in a fresh process and read back what it recorded."""
    work = logs / f".{name}"
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*.jsonl"):
        old.unlink()
    log = logs / f"{name}.log"
    start, timed_out = time.perf_counter(), False
    # an assignment whose checks run on a ring of devices gets them as CPU devices before the
    # child imports JAX (its notebook's own flag would come after the probes import it)
    env = cpu_devices_env(os.environ, devices_of(name) if exercise else 1)
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", str(path), "--work", str(work)]
            + (["--exercise"] if exercise else [])
            + (["--visible-only"] if visible_only else []),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(child.pid, signal.SIGKILL)  # the notebook's process and any it started
            code = child.wait()
    seconds = round(time.perf_counter() - start, 1)
    cells = _lines(work / "cells.jsonl")
    tail = log.read_text(errors="replace")[-20000:]
    n_cells = next((c["cells"] for c in cells if "cells" in c), 0)
    ran = [c for c in cells if "cell" in c]
    done = any(c.get("done") for c in cells)
    halted = any("core_halt" in c for c in cells) or any(m in tail for m in CORE_HALT_MARKS)
    kernels = [_kernel_row(r) for r in _lines(work / "kernels.jsonl")]
    checks = [_check_row(r, backend) for r in _lines(work / "checks.jsonl")]
    error_cells = [{"cell": c["cell"], "error": c["error"]} for c in ran if c["error"]]
    # a cell that says it needs a newer JAX (lessons/_course.py:newer_api) fails as it should
    newer = [c for c in error_cells if c["error"].startswith(NEEDS_NEWER_JAX)]
    undeclared = [k for k in kernels if k["ran"] == "fell back" and not k["declared"]] + \
        [c for c in checks if c["fallback"] and not c["declared"]]
    passed = done and code == 0 and len(error_cells) == len(newer) and not undeclared and \
        all(c["passed"] or c["refused_by_triton"] or c["needs_newer_jax"] for c in checks)
    result = {"notebook": name, "kind": "exercise" if exercise else "lesson",
              "path": os.path.relpath(path, ROOT), "passed": passed, "seconds": seconds,
              "returncode": code, "timed_out": timed_out, "core_halt": halted,
              "cells": n_cells, "cells_run": len(ran), "error_cells": error_cells,
              "cells_needing_newer_jax": len(newer),
              "kernels": kernels, "checks": checks}
    if not passed:  # where it stopped, in the notebook's own words
        result["log_tail"] = tail[-3000:]
    return result


def summarise(runs: list[dict], backend: str) -> dict[str, int]:
    """The counts of the record's ``summary`` (all integers)."""
    lessons = [r for r in runs if r["kind"] == "lesson"]
    exercises = [r for r in runs if r["kind"] == "exercise"]
    kernels = [k for r in runs for k in r["kernels"]]
    checks = [c for r in runs for c in r["checks"]]
    # every kernel that ran interpreted on an accelerator: a lesson's, or a check's
    # (a kernel that never ran, as this JAX lacks what it needs, fell back to nothing)
    fallbacks = [k for k in kernels if k["ran"] != "compiled" and not
                 (k["error"] or "").startswith(NEEDS_NEWER_JAX)] if backend != "cpu" else []
    fallbacks += [c for c in checks if c["fallback"]]
    return {
        "lessons": len(lessons), "lessons_passed": sum(r["passed"] for r in lessons),
        "exercises": len(exercises), "exercises_passed": sum(r["passed"] for r in exercises),
        "kernels": len(kernels), "kernels_compiled": sum(k["ran"] == "compiled" for k in kernels),
        "fallbacks_declared": sum(bool(f["declared"]) for f in fallbacks),
        "fallbacks_undeclared": sum(not f["declared"] for f in fallbacks),
        "checks": len(checks), "checks_passed": sum(c["passed"] for c in checks),
        "checks_needing_newer_jax": sum(c["needs_newer_jax"] for c in checks),
        "core_halts": sum(r["core_halt"] for r in runs),
        "timeouts": sum(r["timed_out"] for r in runs)}


def machine() -> dict:
    """JAX, libtpu and the chip, asked in a child process (which exits: this one never holds
    the chip)."""
    probe = ("import json, jax, jaxlib\n"
             "from importlib.metadata import version\n"
             "libtpu = None\n"
             "for name in ('libtpu', 'libtpu-nightly'):\n"
             "    try:\n        libtpu = libtpu or version(name)\n"
             "    except Exception:\n        pass\n"
             "d = jax.devices()\n"
             "print(json.dumps({'jax': jax.__version__, 'jaxlib': jaxlib.__version__,"
             " 'libtpu': libtpu, 'backend': jax.default_backend(),"
             " 'device_kind': d[0].device_kind, 'devices': len(d)}))\n")
    facts = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                      text=True, check=True).stdout.splitlines()[-1])
    return {**facts, "chip": chip_name(facts["backend"], facts["device_kind"]),
            "python": sys.version.split()[0]}


def git_commit() -> tuple[str | None, bool]:
    """(HEAD's commit, whether tracked files differ from it); (None, False) outside a git
    checkout (a copy of the tree on another machine: pass ``--commit``)."""
    def git(*words: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(ROOT), *words], capture_output=True,
                                  text=True)
        except FileNotFoundError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    return commit or None, bool(commit and git("status", "--porcelain", "--untracked-files=no"))


def chip_name(backend: str, device_kind: str) -> str:
    """A short name for the record's file: ``tpu-v5e`` for "TPU v5 lite", ``cpu`` on a CPU."""
    kind = device_kind.lower()
    if backend == "tpu":
        for words, name in (("v5 lite", "v5e"), ("v5e", "v5e"), ("v6 lite", "v6e"),
                            ("v6e", "v6e"), ("v5p", "v5p"), ("v5", "v5p"), ("v4", "v4")):
            if words in kind:
                return f"tpu-{name}"
    return backend if backend == "cpu" else f"{backend}-{'-'.join(kind.split())}"


def print_table(record: dict) -> None:
    print(f"\n{record['chip']}: jax {record['jax']}, libtpu {record['libtpu']}, "
          f"commit {(record['commit'] or '?')[:9]}")
    head = f"{'notebook':<26} {'result':<9} {'s':>6}  {'cells':>7}  kernels / checks"
    print(head + "\n" + "-" * len(head))
    for r in record["notebooks"]:
        result = "HALT" if r["core_halt"] else "TIMEOUT" if r["timed_out"] else \
            "pass" if r["passed"] else "FAIL"
        if r["kind"] == "lesson":
            ran = [k["ran"] for k in r["kernels"]]
            what = ", ".join(f"{ran.count(w)} {w}" for w in ("compiled", "fell back",
                                                            "interpreted") if w in ran)
        else:
            what = f"{sum(c['passed'] for c in r['checks'])}/{len(r['checks'])} checks passed"
            newer = sum(c["needs_newer_jax"] for c in r["checks"])
            what += f", {newer} need a newer JAX" if newer else ""
        print(f"{r['notebook']:<26} {result:<9} {r['seconds']:>6.1f}  "
              f"{r['cells_run']:>3}/{r['cells']:<3}  {what}")
        for c in r["error_cells"]:
            print(f"{'':<28}cell {c['cell']}: {c['error'][:110]}")
        for k in r["kernels"]:
            if k["ran"] == "fell back":
                why = f"declared: {k['declared']}" if k["declared"] else "UNDECLARED"
                print(f"{'':<28}{k['kernel']} fell back ({why}): {(k['compile_error'] or '')[:80]}")
        for c in r["checks"]:
            if not c["passed"]:
                print(f"{'':<28}{c['task']}{' (hidden)' if c['hidden'] else ''}: "
                      f"{(c['error'] or '')[:100]}")
    print("summary:", json.dumps(record["summary"]))


def write(record: dict, out: Path | None, recorded: bool) -> Path:
    name = f"on_{record['chip']}.json" if recorded else "on_device.json"
    path = (out or (RECORDED if recorded else RESULTS)) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return path


# what a notebook's run depends on: a change here between its run and the merged commit is
# listed beside it (``changed_since_run``)
COURSE_CODE = ("lessons", "exercises/source", "kernelsim", "grader", "bench/on_device.py",
               "bench/gpu_kernels.py")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def merge(paths: list[Path]) -> dict:
    """One record from the records of runs on the same chip, JAX and libtpu. Runs may come from
    different commits of one line of history: the record takes the newest; a notebook that ran
    in several keeps its run at the newest commit (a rerun after a fix); and each notebook
    keeps the commit it ran at and the course files changed since (none, or what a reader
    must weigh)."""
    records = [json.loads(p.read_text()) for p in paths]
    same = ("jax", "libtpu", "chip", "hidden_checks")  # a record before the flag ran them all
    for r in records[1:]:
        differ = [k for k in same if r.get(k, True) != records[0].get(k, True)]
        if differ:
            raise SystemExit(f"cannot merge runs that differ in {', '.join(differ)}")

    def age(commit: str) -> int:  # commits before it: the order of one line of history
        return int(_git("rev-list", "--count", commit).stdout or -1)

    records.sort(key=lambda r: age(r["commit"]))
    newest = records[-1]["commit"]
    if any(_git("merge-base", "--is-ancestor", r["commit"], newest).returncode for r in records):
        raise SystemExit("cannot merge: the runs' commits are not one line of history")
    by_name: dict[str, dict] = {}
    for r in records:
        changed = sorted(_git("diff", "--name-only", r["commit"], newest, "--",
                              *COURSE_CODE).stdout.split()) if r["commit"] != newest else []
        for n in r["notebooks"]:
            earlier = by_name.get(n["notebook"])
            if earlier is not None and earlier["commit"] == r["commit"]:
                raise SystemExit(f"cannot merge: {n['notebook']} ran twice at {r['commit']}")
            by_name[n["notebook"]] = {**n, "commit": r["commit"], "changed_since_run": changed}
    runs = sorted(by_name.values(), key=lambda n: (n["kind"] != "lesson", n["notebook"]))
    merged = {**records[-1], "notebooks": runs, "commit": newest,
              "when": max(r["when"] for r in records)}
    merged["summary"] = summarise(runs, merged["backend"])
    return merged


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["lessons", "exercises"])
    parser.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per notebook")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks at once (1 on a TPU: one process holds the chip)")
    parser.add_argument("--record", action="store_true",
                        help="write on_<chip>.json (into bench/recorded/ unless --out)")
    parser.add_argument("--out", type=Path, help="folder for the JSON and the notebooks' logs")
    parser.add_argument("--commit", help="the tree's commit, where it is no git checkout")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--exercise", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--visible-only", action="store_true",
                        help="skip the assignments' hidden checks (what a learner's JAX runs)")
    parser.add_argument("stems", nargs="*", help="lesson or assignment names or numbers")
    args = parser.parse_args(argv)
    if args.child:
        return execute(args.child.resolve(), args.exercise, args.work.resolve(),
                       args.visible_only)
    if args.merge:
        record = merge(args.merge)
    else:
        chosen = notebooks(args.only, args.stems)
        if not chosen:
            parser.error(f"no notebook matches {args.stems}")
        commit, dirty = git_commit()
        if args.commit:
            commit, dirty = args.commit, False
        facts = {"commit": commit, "commit_dirty": dirty, **machine()}
        if facts["backend"] == "tpu" and args.jobs > 1:
            parser.error("on a TPU one process at a time can hold the chip: use --jobs 1")
        logs = (args.out or RESULTS) / "on_device_logs"
        logs.mkdir(parents=True, exist_ok=True)

        def one(n: tuple[str, Path, bool]) -> dict:
            run = run_notebook(*n, args.timeout, logs, facts["backend"], args.visible_only)
            print(f"{run['notebook']}: {'passed' if run['passed'] else 'FAILED'} in "
                  f"{run['seconds']:.1f} s", flush=True)
            return run

        with ThreadPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(one, chosen))
        record = {"benchmark": "on_device",
                  "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  **facts, "timeout_s": args.timeout, "hidden_checks": not args.visible_only,
                  "summary": summarise(runs, facts["backend"]),
                  "notebooks": runs}
    print_table(record)
    write(record, args.out, args.record)
    return 0 if all(r["passed"] for r in record["notebooks"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
