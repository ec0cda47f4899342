"""Grading throughput: `pallas-course autograde` with 1 and 2 workers vs bare `nbgrader autograde`.

pallas-course runs each notebook in a jailed kernel and, beside it, in the grader's own fresh
run (``grader/replay.py``), which makes the facts; the test cells are judged outside both. The
bare run is nbgrader's own Execute on the same notebooks, unjailed, with the checks inside the
kernel: the ratio is what isolation and the trusted verdict cost. 20 submissions of assignment
01 (the instructor notebook under 20 student ids) in a temporary course copy. Prints a table
and writes bench/results/grading.json.

Then the same batch on a Dask cluster on this machine (``autograde --scheduler``: a scheduler
and 1 or 2 ``dask worker --nthreads 1`` processes, started before the clock runs, as a class's
cluster is), its overhead against the local pool with as many workers, and a model of a
2,000-learner term built from the measured cost of one submission (``term_model``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grader import build, collect, grading  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "cluster"))
from clustertools import DaskCluster  # noqa: E402  - the tests' scheduler and workers

N = int(os.environ.get("BENCH_SUBMISSIONS", "20"))
BARE_CONFIG = """
from nbgrader.preprocessors import Execute
c.Autograde.autograde_preprocessors = [Execute, IgnorePattern, ClearMetadataPreprocessor,
                                       LimitOutput, SaveAutoGrades, AssignLatePenalties,
                                       CheckCellMetadata]
"""
A = "01_first_kernel"


def fresh_course(tmp: Path) -> Path:
    root = tmp / "course"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    shutil.copytree(REPO / "exercises" / "source", root / "source",
                    ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copytree(REPO / "exercises" / "refs", root / "refs")
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", root)
    grading.release(root, A, log=lambda *a: None)
    subs = tmp / "subs"
    shutil.rmtree(subs, ignore_errors=True)
    (nb,) = (root / "source" / A).glob("*.ipynb")
    for i in range(N):
        d = subs / f"s{i:02d}" / A
        d.mkdir(parents=True)
        shutil.copy(nb, d / nb.name)
    collect.collect(root, subs, log=lambda *a: None)
    return root


def dask_rows(tmp: Path, local: dict[int, dict]) -> list[dict]:
    """The batch on a Dask cluster of 1 and 2 workers; ``local``: the local pool's rows by
    worker count, for the overhead."""
    rows = []
    for workers in (1, 2):
        root = fresh_course(tmp)
        cluster = DaskCluster(workers, tmp / f"dask-{workers}")
        try:
            t0 = time.monotonic()
            res = grading.autograde(root, A, scheduler=cluster.address, progress=None,
                                    log=lambda *a: None)
            wall = time.monotonic() - t0
        finally:
            cluster.close()
        rows.append({"runner": f"pallas-course --scheduler (dask, {workers} worker(s))",
                     "wall_s": round(wall, 1),
                     "median_s_per_submission": round(statistics.median(
                         r["seconds"] for r in res), 2),
                     "throughput_per_min": round(60 * len(res) / wall, 1),
                     "graded": sum(r["status"] == "graded" for r in res),
                     "overhead_vs_local_pool": round(wall / local[workers]["wall_s"] - 1, 3)})
    rows[1]["speedup_vs_1_worker"] = round(rows[0]["wall_s"] / rows[1]["wall_s"], 2)
    return rows


def term_model(cpu_s: float, worker_s: float, learners: int = 2000,
               turnaround_h: float = 1.0) -> dict:
    """A term of ``learners`` from the measured cost of one submission: ``cpu_s`` core-seconds
    (one local worker's batch time per submission) and ``worker_s`` seconds of one Dask worker
    (wall, one core) per submission."""
    assignments = len(build.assignments(REPO / "exercises"))
    per_assignment = learners  # one graded submission per learner and assignment
    workers = math.ceil(per_assignment * worker_s / (3600 * turnaround_h))
    return {"learners": learners, "assignments": assignments,
            "submissions_per_term": learners * assignments,
            "cpu_s_per_submission": round(cpu_s, 2),
            "worker_s_per_submission": round(worker_s, 2),
            "cpu_hours_per_term": round(learners * assignments * cpu_s / 3600, 1),
            "worker_hours_per_assignment": round(per_assignment * worker_s / 3600, 1),
            "workers_for_turnaround": workers, "turnaround_h": turnaround_h,
            "text": (f"{learners:,} learners x {assignments} assignments = "
                     f"{learners * assignments:,} submissions a term, "
                     f"{learners * assignments * cpu_s / 3600:,.0f} CPU-hours at "
                     f"{cpu_s:.1f} CPU-s each; grading one assignment ({per_assignment:,} "
                     f"submissions) within {turnaround_h:g} h at {worker_s:.1f} s per "
                     f"submission per worker takes {workers} Dask workers (one core each), "
                     f"e.g. {math.ceil(workers / 16)} machine(s) of 16 cores")}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for workers in (1, 2):
            root = fresh_course(tmp)
            t0 = time.monotonic()
            res = grading.autograde(root, A, workers=workers, progress=None, log=lambda *a: None)
            wall = time.monotonic() - t0
            per = [r["seconds"] for r in res]
            rows.append({"runner": f"pallas-course --workers {workers}", "wall_s": round(wall, 1),
                         "median_s_per_submission": round(statistics.median(per), 2),
                         "throughput_per_min": round(60 * len(res) / wall, 1),
                         "graded": sum(r["status"] == "graded" for r in res)})
        root = fresh_course(tmp)
        # bare: nbgrader's own Execute, so the kernel runs unjailed and checks itself
        with (root / "nbgrader_config.py").open("a") as f:
            f.write(BARE_CONFIG)
        env = grading._env(root)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "nbgrader", "autograde", A, "--force"], cwd=root,
                       env=env, capture_output=True, check=False)
        wall = time.monotonic() - t0
        rows.append({"runner": "bare nbgrader autograde", "wall_s": round(wall, 1),
                     "median_s_per_submission": round(wall / N, 2),
                     "throughput_per_min": round(60 * N / wall, 1), "graded": None})
        rows += dask_rows(tmp, {1: rows[0], 2: rows[1]})
    bare = rows[2]["wall_s"]
    for r in rows:
        r["ratio_to_bare"] = round(r["wall_s"] / bare, 2)
    print(f"{'runner':32} {'wall s':>8} {'median s/sub':>13} {'subs/min':>9} {'vs bare':>8}")
    for r in rows:
        print(f"{r['runner']:32} {r['wall_s']:8.1f} {r['median_s_per_submission']:13.2f} "
              f"{r['throughput_per_min']:9.1f} {r['ratio_to_bare']:8.2f}")
    out = REPO / "bench" / "results" / "grading.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # one local worker keeps one core busy: its wall time per submission is the core-seconds
    model = term_model(rows[0]["wall_s"] / N, rows[3]["wall_s"] / N)
    for r in rows[3:]:
        speedup = r.get("speedup_vs_1_worker")
        print(f"{r['runner']}: {100 * r['overhead_vs_local_pool']:+.1f} % vs the local pool"
              + (f", {speedup}x one worker" if speedup else ""))
    print(model["text"])
    out.write_text(json.dumps({"submissions": N, "assignment": A, "cores": os.cpu_count(),
                               "rows": rows, "term_model": model}, indent=1))


if __name__ == "__main__":
    main()
