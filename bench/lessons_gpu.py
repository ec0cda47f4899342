"""Execute every lesson and report, per kernel, how it ran and how fast, against its reference.

Each lesson checks its kernels with ``lessons/_course.py:check``; with the environment
variable ``PALLAS_COURSE_RECORD`` set, ``check`` appends one JSON line per kernel: the
execution label, whether it compiled, whether a compile failure made it fall back to
interpret mode, and median seconds for the kernel and its plain-JAX reference. This script
sets that variable, runs each lesson notebook with nbclient (as the tests do), and writes
``bench/results/lessons_gpu.json`` plus a printed table.

On a GPU the table shows which kernels the GPU lowering compiled and which fell back; on a
CPU every kernel reports interpret mode (timings then measure the interpreter).
Usage: python bench/lessons_gpu.py [LESSON_STEM ...]   (default: all lessons)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
RECORD_ENV = "PALLAS_COURSE_RECORD"  # same name as lessons/_course.py


def run_lesson(path: Path, record: Path) -> tuple[float, str | None]:
    """Execute one lesson; returns (seconds, error or None)."""
    nb = nbformat.from_dict(jupytext.read(path))
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(LESSONS)}})
    os.environ[RECORD_ENV] = str(record)
    start = time.perf_counter()
    try:
        client.execute()
        error = None
    except Exception as err:  # noqa: BLE001 - report and go on with the next lesson
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
    return time.perf_counter() - start, error


def main(argv: list[str]) -> int:
    paths = sorted(LESSONS.glob("[0-9][0-9]-*.py"))
    if argv:
        paths = [p for p in paths if p.stem in argv or p.name[:2] in argv]
    rows, lessons = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            record = Path(tmp) / f"{path.stem}.jsonl"
            seconds, error = run_lesson(path, record)
            lessons.append({"lesson": path.stem, "seconds": round(seconds, 1), "error": error})
            print(f"{path.stem}: {seconds:.1f} s" + (f"  FAILED {error}" if error else ""),
                  flush=True)
            if record.exists():
                for line in record.read_text().splitlines():
                    r = json.loads(line)
                    rows.append({
                        "lesson": r["lesson"], "kernel": r["kernel"],
                        "ran": ("compiled" if r["compiled"] else
                                "fell back to interpret" if r["fell_back"] else "interpret"),
                        "kernel_ms": 1e3 * r["kernel_seconds"],
                        "reference_ms": 1e3 * r["reference_seconds"],
                        "ratio": r["kernel_seconds"] / max(r["reference_seconds"], 1e-12),
                        "label": r["label"],
                    })
    if not rows:
        print("no kernel records: did every lesson fail?", file=sys.stderr)
        return 1
    backends = sorted({r["label"].split(" on ")[-1].split(" ")[0] for r in rows
                       if " on " in r["label"]})
    write("lessons_gpu", rows, {"lessons": lessons, "backends_in_labels": backends,
                                "summary": {k: sum(r["ran"] == k for r in rows) for k in
                                            ("compiled", "fell back to interpret",
                                             "interpret")}})
    return 1 if any(entry["error"] for entry in lessons) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
