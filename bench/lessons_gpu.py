"""Execute every lesson and every exercise notebook and report, per kernel, where it ran.

Lessons check their kernels with ``lessons/_course.py:check``; with ``PALLAS_COURSE_RECORD``
set, ``check`` appends one JSON line per kernel: the execution label, whether it compiled,
whether a compile failure made it fall back to interpret mode, and median seconds for the
kernel and its plain-JAX reference.

Exercise notebooks (``exercises/source/*/``, the instructor's version: solutions and hidden
tests) are run with one cell of this script's own put first. It wraps ``pl.pallas_call`` to
note the ``interpret=`` each kernel was built with (``False``: compiled for the default
backend; ``True``: interpret mode; ``InterpretParams``: TPU interpret mode) and
``course.check`` to note, per test cell, the task, whether it passed, and those modes. The
notebooks themselves are not changed.

Each notebook runs with nbclient in its own process (``--jobs N`` at a time; on a GPU every
kernel process allocates GPU memory on demand, not 75 % of it up front). Writes
``bench/results/lessons_gpu.json`` and prints a table. On a CPU every kernel reports interpret
mode (timings then measure the interpreter).

Usage: python bench/lessons_gpu.py [--jobs N] [--only lessons|exercises] [STEM ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
EXERCISES = ROOT / "exercises" / "source"
RECORD_ENV = "PALLAS_COURSE_RECORD"  # same name as lessons/_course.py
TIMEOUT_S = 900  # per cell
# Triton's refusal of a block whose size is not a power of two. Hidden cases hold such shapes
# on purpose (a whole (5, 7) array, ragged rows): they are graded where grading runs, on the
# CPU (grader/grading/sandbox.py sets JAX_PLATFORMS=cpu), so on a GPU this is expected, not a
# failure.
TRITON_SHAPE_REFUSAL = "Pallas Triton lowering currently requires"

# Put first in each exercise notebook: records where each kernel ran, per course.check call.
_PROBE = '''
import json as _bench_json
from jax.experimental import pallas as _bench_pl
from grader.learner import course as _bench_course

_bench_pallas_call, _bench_check, _bench_modes = _bench_pl.pallas_call, _bench_course.check, []


def _bench_mode(interpret):
    if interpret is None or interpret is False:
        return "compiled"
    return "interpret" if interpret is True else "TPU interpret"


def _bench_recording_call(*args, **kwargs):
    _bench_modes.append(_bench_mode(kwargs.get("interpret")))
    return _bench_pallas_call(*args, **kwargs)


def _bench_recording_check(task_id, fn, hidden=False, **kwargs):
    _bench_modes.clear()
    record = {"task": task_id, "hidden": hidden, "passed": False, "error": None}
    try:
        _bench_check(task_id, fn, hidden=hidden, **kwargs)
        record["passed"] = True
    except BaseException as err:
        first = str(err).splitlines()[0][:200] if str(err) else ""
        record["error"] = f"{type(err).__name__}: {first}"
        raise
    finally:
        record["ran"] = sorted(set(_bench_modes))
        with open(%(record)r, "a") as f:
            f.write(_bench_json.dumps(record) + "\\n")


_bench_pl.pallas_call, _bench_course.check = _bench_recording_call, _bench_recording_check
'''


def run_notebook(path: str, record: str, probe: bool) -> dict:
    """Execute one notebook in this process's own kernel; returns seconds and errors."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    os.environ[RECORD_ENV] = record
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    nb = nbformat.from_dict(jupytext.read(path))
    if probe:
        nb.cells.insert(0, nbformat.v4.new_code_cell(_PROBE % {"record": record}))
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", allow_errors=probe,
                            resources={"metadata": {"path": str(Path(path).parent)}})
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as err:  # noqa: BLE001 - report it and go on with the next notebook
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
    failed_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                    and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    return {"seconds": round(time.perf_counter() - start, 1), "error": error,
            "error_cells": [i - probe for i in failed_cells]}


def _lesson_rows(record: Path) -> list[dict]:
    rows = []
    for line in record.read_text().splitlines() if record.exists() else []:
        r = json.loads(line)
        rows.append({"notebook": r["lesson"], "kernel": r["kernel"],
                     "ran": ("compiled" if r["compiled"] else
                             "fell back to interpret" if r["fell_back"] else "interpret"),
                     "passed": True, "expected": True,  # _course.check raises when wrong
                     "kernel_ms": round(1e3 * r["kernel_seconds"], 3),
                     "reference_ms": round(1e3 * r["reference_seconds"], 3),
                     "detail": r["label"]})
    return rows


def _exercise_rows(stem: str, record: Path) -> list[dict]:
    rows = []
    for line in record.read_text().splitlines() if record.exists() else []:
        r = json.loads(line)
        graded_on_cpu = r["hidden"] and TRITON_SHAPE_REFUSAL in (r["error"] or "")
        rows.append({"notebook": stem, "kernel": r["task"] + (" (hidden)" if r["hidden"] else ""),
                     "ran": ("refused by Triton (graded on the CPU)" if graded_on_cpu
                             else " + ".join(r["ran"]) or "no kernel"),
                     "passed": r["passed"], "expected": r["passed"] or graded_on_cpu,
                     "kernel_ms": None, "reference_ms": None, "detail": r["error"] or ""})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run at once")
    parser.add_argument("--only", choices=["lessons", "exercises"])
    parser.add_argument("stems", nargs="*", help="lesson or assignment names (default: all)")
    args = parser.parse_args(argv)
    notebooks = []  # (stem, path, is_exercise)
    if args.only != "exercises":
        notebooks += [(p.stem, p, False) for p in sorted(LESSONS.glob("[0-9][0-9]-*.py"))]
    if args.only != "lessons":
        notebooks += [(p.parent.name, p, True) for p in sorted(EXERCISES.glob("*/*.py"))
                      if p.stem == p.parent.name[3:]]
    if args.stems:
        notebooks = [n for n in notebooks if n[0] in args.stems or n[0][:2] in args.stems]
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.jobs) as pool:
        records = {stem: Path(tmp) / f"{stem}.jsonl" for stem, _, _ in notebooks}
        futures = [(stem, is_ex, pool.submit(run_notebook, str(path), str(records[stem]), is_ex))
                   for stem, path, is_ex in notebooks]
        for stem, is_ex, fut in futures:
            run = {"notebook": stem, "exercise": is_ex, **fut.result()}
            runs.append(run)
            print(f"{stem}: {run['seconds']:.1f} s"
                  + (f"  FAILED {run['error']}" if run["error"] else "")
                  + (f"  error cells {run['error_cells']}" if run["error_cells"] else ""),
                  flush=True)
            rows += _exercise_rows(stem, records[stem]) if is_ex else \
                _lesson_rows(records[stem])
    if not rows:
        print("no kernel records: did every notebook fail?", file=sys.stderr)
        return 1
    import jax
    import jaxlib

    summary = {k: sum(r["ran"] == k for r in rows) for k in sorted({r["ran"] for r in rows})}
    write("lessons_gpu", rows, {
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "notebooks": runs, "summary": summary,
        "failed": [f"{r['notebook']}: {r['kernel']}" for r in rows if not r["expected"]]})
    # a lesson fails on any error; an exercise notebook's failed checks are its error cells,
    # judged row by row
    lessons_failed = any(r["error"] or r["error_cells"] for r in runs if not r["exercise"])
    return 1 if lessons_failed or any(r["error"] for r in runs) or \
        not all(r["expected"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
