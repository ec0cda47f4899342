"""Where the test suite's time goes: the slowest tests, each folder's share, and the total.

    .venv/bin/python bench/ci_time.py                   # runs `make test-main`, then reports
    .venv/bin/python bench/ci_time.py --junit F.xml ... # reports a run made earlier (`make test`
                                                        # writes build/junit.xml and
                                                        # build/junit-side.xml, one per process)

The main suite runs as two pytest processes at once (the Makefile's ``test-main``), so the
tests' seconds add up to more than the wall time. A run is `pytest --junitxml`; a test's time
there is its setup, call and teardown together (pytest's default ``junit_duration_report =
total``), so a fixture shared by a module is charged to the first test that builds it. The
report prints the 20 slowest tests, seconds per test folder and the total, and writes
bench/results/ci_time.json. ``make test`` prints pytest's own ``--durations`` table too; this
script is for planning the suite's budget (20 minutes on two idle cores), not for CI.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# what `make test-main` writes: one junit file per pytest process
MAIN_JUNITS = [REPO / "build" / "junit.xml", REPO / "build" / "junit-side.xml"]


def test_times(junit: Path) -> list[tuple[str, float]]:
    """(test id, seconds) for every test case of a junit XML file, slowest first."""
    cases = []
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        cases.append((f"{module}::{case.get('name')}", float(case.get("time", 0.0))))
    return sorted(cases, key=lambda c: -c[1])


def folder_of(test_id: str) -> str:
    """The test folder a test id belongs to: ``tests/grader`` for ``tests/grader/test_x/...``."""
    parts = test_id.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", type=Path, nargs="+",
                    help="report these junit XML files instead of running the suite")
    ap.add_argument("--slowest", type=int, default=20)
    args = ap.parse_args()
    wall = None
    junits = args.junit
    if junits is None:
        start = time.perf_counter()
        subprocess.run(["make", "--no-print-directory", "test-main"], cwd=REPO)
        wall = time.perf_counter() - start
        junits = MAIN_JUNITS
    cases = sorted((case for junit in junits for case in test_times(junit)), key=lambda c: -c[1])
    per_folder: dict[str, float] = defaultdict(float)
    for test_id, seconds in cases:
        per_folder[folder_of(test_id)] += seconds
    total = sum(seconds for _, seconds in cases)
    rows = [{"test": test_id, "seconds": round(seconds, 1)}
            for test_id, seconds in cases[:args.slowest]]
    write("ci_time", rows, {
        "tests": len(cases), "test_seconds": round(total, 1),
        "wall_seconds": None if wall is None else round(wall, 1),
        "per_folder_seconds": {k: round(v, 1) for k, v in
                               sorted(per_folder.items(), key=lambda kv: -kv[1])},
    })
    for folder, seconds in sorted(per_folder.items(), key=lambda kv: -kv[1]):
        print(f"{folder:<24} {seconds:8.1f} s")
    print(f"{len(cases)} tests, {total:.0f} s in tests" +
          ("" if wall is None else f", {wall:.0f} s wall"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
