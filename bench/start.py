"""Time to URL of `make start`: cold (a fresh clone: nothing released, no workspace, no site,
no lesson cache) and warm (the same clone started again).

    .venv/bin/python bench/start.py [--warm-runs N]

The clone is `git clone` of this repository's HEAD into a temporary folder. The steps are the
`start:` recipe of the Makefile, read from it and run from the clone with this virtual
environment's Python (`$(PY)`); the serve step gets free ports. Venv creation is not timed: it
is the `$(STAMP)` prerequisite, a no-op once installed. Per run it records the seconds until the
URL box is printed, until both URLs answer (the site may still be the "being built" page) and
until the built site replaces it (the cold run waits for that build, so the warm runs find the
site built), and where the build took the lessons from (shipped in site/executed/, the cache,
or executed). Prints a table and writes bench/results/start.json.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "site"))
from sitetools import free_port  # noqa: E402


def start_steps(port: int, lab_port: int) -> list[list[str]]:
    """The Makefile's start recipe as argument lists, ports added to the serve step."""
    text = (REPO / "Makefile").read_text()
    recipe = re.search(r"^start:.*\n((?:\t.*\n)+)", text, re.M)
    if not recipe:
        raise SystemExit("no start: target in the Makefile")
    steps = []
    for line in recipe.group(1).splitlines():
        argv = line.strip().removeprefix("@").replace("$(PY)", sys.executable).split()
        if argv[-2:] == ["grader.cli", "serve"]:
            argv += ["--port", str(port), "--lab-port", str(lab_port)]
        steps.append(argv)
    return steps


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def one_start(clone: Path, timeout: float = 900) -> dict:
    port, lab_port = free_port(), free_port()
    *setup, serve = start_steps(port, lab_port)
    t0 = time.perf_counter()
    for argv in setup:
        subprocess.run(argv, cwd=clone, check=True, stdout=subprocess.DEVNULL)
    setup_s = time.perf_counter() - t0
    proc = subprocess.Popen(serve, cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    printed = threading.Event()
    built = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("└"):
                printed.set()
            if line.startswith("site built in") or "site build FAILED" in line:
                built.set()

    threading.Thread(target=read, daemon=True).start()
    row = {"setup_s": round(setup_s, 1)}
    try:
        if not printed.wait(timeout):
            raise SystemExit("no URL box within the timeout:\n" + "".join(lines))
        row["url_printed_s"] = round(time.perf_counter() - t0, 1)
        token = re.search(r"token=(\w+)", "".join(lines))[1]
        site, lab = f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{lab_port}/api/status" \
            f"?token={token}"
        while not (_answers(site) and _answers(lab)):
            time.sleep(0.2)
        row["both_answer_s"] = round(time.perf_counter() - t0, 1)
        building = any("being built" in x for x in lines)
        row["site_built_behind"] = building
        if building:
            built.wait(timeout)
        row["site_ready_s"] = round(time.perf_counter() - t0, 1) if building \
            else row["both_answer_s"]
        # where the build's lessons came from: shipped pages, the cache, or executed now
        log = clone / "build" / "logs" / "site-build.log"
        row["lessons"] = next((x.removeprefix("lessons: ") for x in
                               (log.read_text().splitlines() if building else [])
                               if x.startswith("lessons: ")), "-")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-runs", type=int, default=2)
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as d:
        clone = Path(d) / "pallas-course"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        cold = one_start(clone)
        warm = [one_start(clone) for _ in range(args.warm_runs)]
    rows = [{"start": "cold (fresh clone)", **cold}]
    if warm:
        rows.append({"start": f"warm (median of {len(warm)})",
                     **{k: (statistics.median(r[k] for r in warm) if isinstance(v, float)
                            else v) for k, v in warm[0].items()}})
    keys = ["start", "setup_s", "url_printed_s", "both_answer_s", "site_built_behind",
            "site_ready_s", "lessons"]
    rows = [{k: r.get(k, "-") for k in keys} for r in rows]
    write("start", rows, {"commit": head, "cpus": os.cpu_count(), "warm_runs": warm,
                          "goal": "the built site served <= 90 s after a cold make start "
                          "(site_ready_s, pip cache warm, two cores); warm <= 15 s"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
