"""Where the test suite's CPU goes: CPU seconds by program, under the pytest process that
started it.

    .venv/bin/python bench/ci_cpu.py -- make test        # samples /proc while the command runs
    .venv/bin/python bench/ci_cpu.py --report FILE.json  # reports a sample taken earlier

On CI's two cores the suite is CPU-bound (both cores 95-100 % busy from the first minute to the
last), so a test's seconds in the junit files (bench/ci_time.py) are mostly time spent waiting
for a core: the class module took 455 s in a clean clone's suite and 147 s alone, 145 CPU
seconds. What shortens the suite is CPU taken out, and this says where it is spent. Once a
second it reads every process's CPU ticks (/proc/PID/stat, utime + stime), its command line and
its parent; a process is charged to the suite process it descends from (``main``, ``side``: the
Makefile's two pytest processes, ``compat``: the jax 0.10.2 run; ``other``: the rest, such as
the venv's install) and to a program (``checker``, ``replay``, ``chromium``, ...). A process
that lives less than a second is missed, and one's last second before it exits, so the rows add
up to less than the machine's busy time, which the report prints beside them. Writes
bench/results/ci_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

# (program, a word of its command line), the first that matches names it: a batch's jail check
# (grader/jail/trusted.py, PREFLIGHT) names the checker and the replay among its imports, and
# the compat venv's pip install names ipykernel among its packages
PROGRAMS = [("jail preflight", "-c import jax, jax.experimental.pallas,"), ("pip", "-m pip "),
            ("checker", "grader.jail.checker"), ("replay", "grader.jail.replay"),
            ("grading worker", "grader.logistics.worker"), ("notebook kernel", "ipykernel"),
            ("on_device notebook", "on_device.py --child"), ("chromium", "chrom"),
            ("postgres", "postgres"), ("dask", "distributed"), ("jupyterhub", "jupyterhub"),
            ("jupyterlab", "jupyter-lab"), ("pip", "pip"), ("node", "node"), ("strace", "strace"),
            ("pytest", "pytest"), ("pallas-course", "grader.cli"),
            ("pallas-course", "pallas-course")]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def program(cmdline: str) -> str:
    """The program a command line runs, as the report groups them."""
    for name, word in PROGRAMS:
        if word in cmdline:
            return name
    return Path(cmdline.split(" ")[0]).name or "?"


def suite_process(pid: int, processes: dict[int, dict]) -> str:
    """Which of the suite's processes ``pid`` descends from (itself included)."""
    seen = set()
    while pid in processes and pid not in seen:
        seen.add(pid)
        cmdline = processes[pid]["cmdline"]
        if "pytest" in cmdline:
            if "junit-side.xml" in cmdline:
                return "side"
            if "junit.xml" in cmdline:
                return "main"
            if "no:cacheprovider" in cmdline:
                return "compat"
        pid = processes[pid]["ppid"]
    return "other"


def _busy_ticks() -> int:
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return user + nice + system + irq + softirq + steal


def _read(pid: str) -> tuple[int, int, int, str] | None:
    """(parent, CPU ticks, start time, command line) of a live process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19]),
            cmdline.replace(b"\0", b" ").decode(errors="replace").strip())


def sample(command: list[str]) -> dict:
    """Run ``command``, reading /proc once a second until it ends: each process's CPU seconds
    spent while it ran, and the machine's busy CPU seconds and wall seconds."""
    start_busy, start_wall = _busy_ticks(), time.monotonic()
    seen: dict[tuple[int, int], dict] = {}
    first = True
    child = subprocess.Popen(command)
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            found = _read(pid)
            if found is None:
                continue
            ppid, ticks, started, cmdline = found
            row = seen.setdefault((int(pid), started), {
                "pid": int(pid), "ppid": ppid, "cmdline": cmdline[:300],
                "ticks_before": ticks if first else 0})  # running before the command began
            row["ticks"] = ticks
            row["cmdline"] = row["cmdline"] or cmdline[:300]
        first = False
        if child.poll() is not None:
            break
        time.sleep(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    return {"command": command, "commit": commit, "returncode": child.returncode,
            "wall_s": round(time.monotonic() - start_wall, 1),
            "busy_cpu_s": round((_busy_ticks() - start_busy) / CLOCK_TICKS, 1),
            # every process, idle ones too: a jailed check's parent (bwrap) spends nothing
            "processes": [{**r, "cpu_s": (r["ticks"] - r["ticks_before"]) / CLOCK_TICKS}
                          for r in seen.values()]}


def cpu_by_program(processes: list[dict]) -> list[dict]:
    """CPU seconds per (suite process, program), most first."""
    by_pid = {p["pid"]: p for p in processes}
    spent: Counter = Counter()
    count: Counter = Counter()
    for p in processes:
        key = (suite_process(p["pid"], by_pid), program(p["cmdline"]))
        spent[key] += p["cpu_s"]
        count[key] += 1
    return [{"suite_process": s, "program": prog, "processes": count[(s, prog)],
             "cpu_s": round(cpu, 1)} for (s, prog), cpu in spent.most_common()]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="report this sample instead of taking one")
    parser.add_argument("--sample-to", type=Path, default=Path("build/ci_cpu_sample.json"),
                        help="where a new sample is kept (default: %(default)s)")
    parser.add_argument("command", nargs="*", help="the command to sample, after --")
    args = parser.parse_args(argv)
    if args.report:
        taken = json.loads(args.report.read_text())
    elif args.command:
        taken = sample(args.command)
        args.sample_to.parent.mkdir(parents=True, exist_ok=True)
        args.sample_to.write_text(json.dumps(taken))
    else:
        parser.error("name a command to sample (after --) or a sample to --report")
    rows = [r for r in cpu_by_program(taken["processes"]) if r["cpu_s"] >= 1]
    seen = sum(r["cpu_s"] for r in rows)
    write("ci_cpu", rows, {"command": taken["command"], "commit": taken.get("commit"),
                           "wall_s": taken["wall_s"],
                           "busy_cpu_s": taken["busy_cpu_s"], "seen_cpu_s": round(seen, 1)})
    print(f"wall {taken['wall_s']} s; the machine busy {taken['busy_cpu_s']} CPU s, "
          f"{seen:.0f} of them seen in processes that lived a second or more")
    return taken["returncode"] or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
