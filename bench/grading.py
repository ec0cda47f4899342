"""Grading throughput: `pallas-course autograde` with 1 and 2 workers vs bare `nbgrader autograde`.

pallas-course runs each notebook in a jailed kernel and judges the test cells outside it; the
bare run is nbgrader's own Execute on the same notebooks, unjailed, with the checks inside the
kernel: the ratio is what isolation and the trusted verdict cost. 20 submissions of assignment
01 (the instructor notebook under 20 student ids) in a temporary course copy. Prints a table
and writes bench/results/grading.json.
"""

from __future__ import annotations

import json
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

from grader import collect, grading  # noqa: E402

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
    bare = rows[-1]["wall_s"]
    for r in rows:
        r["ratio_to_bare"] = round(r["wall_s"] / bare, 2)
    print(f"{'runner':32} {'wall s':>8} {'median s/sub':>13} {'subs/min':>9} {'vs bare':>8}")
    for r in rows:
        print(f"{r['runner']:32} {r['wall_s']:8.1f} {r['median_s_per_submission']:13.2f} "
              f"{r['throughput_per_min']:9.1f} {r['ratio_to_bare']:8.2f}")
    out = REPO / "bench" / "results" / "grading.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"submissions": N, "assignment": A, "cores": os.cpu_count(),
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
