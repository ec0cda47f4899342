"""Grading throughput: `pallas-course autograde` with 1 and 2 workers vs bare `nbgrader autograde`.

pallas-course runs each notebook once, in the grader's own jailed run of it
(``grader/jail/replay.py``), which makes the facts and the outputs; the test cells are judged
outside it. The bare run is nbgrader's own Execute on the same notebooks in a Jupyter kernel,
unjailed, with the checks inside the kernel: the ratio is what isolation and the trusted verdict
cost. 20 submissions of assignment 01 (the instructor notebook under 20 student ids) in a temporary
course copy. Prints a table and writes bench/results/grading.json.

Then the same batch on a Dask cluster on this machine speaking TLS only (``autograde
--scheduler``: a scheduler and 1 or 2 ``dask worker --nthreads 1`` processes, started before
the clock runs, as a class's cluster is, with deploy/dask/grading.yaml's settings), its overhead
against the local pool with as many workers, the CPU seconds of Dask's own processes per
submission (the scheduler, nannies and workers, not the grading under them), and a model of
a 2,000-learner term built from the measured cost of one submission (``term_model``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import dask  # noqa: E402
import psutil  # noqa: E402

from grader.logistics import batch, build, collect, submission  # noqa: E402

sys.path[:0] = [str(REPO / "tests" / "cluster"), str(REPO / "tests" / "site")]
from clustertools import DaskCluster  # noqa: E402  - the tests' scheduler and workers

N = int(os.environ.get("BENCH_SUBMISSIONS", "20"))
BARE_CONFIG = """
from nbgrader.preprocessors import Execute
c.Autograde.autograde_preprocessors = [Execute, IgnorePattern, ClearMetadataPreprocessor,
                                       LimitOutput, SaveAutoGrades, AssignLatePenalties,
                                       CheckCellMetadata]
"""
A = "01_first_kernel"


def fresh_course(tmp: Path, assignment: str = A, n: int = N) -> Path:
    """A course under ``tmp`` with ``n`` collected submissions of ``assignment``, each its
    instructor notebook."""
    root = tmp / "course"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    shutil.copytree(REPO / "exercises" / "source", root / "source",
                    ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copytree(REPO / "exercises" / "refs", root / "refs")
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", root)
    batch.release(root, assignment, log=lambda *a: None)
    subs = tmp / "subs"
    shutil.rmtree(subs, ignore_errors=True)
    (nb,) = (root / "source" / assignment).glob("*.ipynb")
    for i in range(n):
        d = subs / f"s{i:02d}" / assignment
        d.mkdir(parents=True)
        shutil.copy(nb, d / nb.name)
    collect.collect(root, subs, log=lambda *a: None)
    return root


def _busy_cpu_seconds() -> float:
    """CPU seconds this machine's cores have spent busy since boot (/proc/stat: all but idle
    and iowait), so a run's delta counts every process it started, reaped or not."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def measured(row: dict):
    """Fill ``row`` with the block's wall seconds, the CPU seconds of the processes it started
    and reaped (``cpu_s``: getrusage of the children), and the whole machine's busy CPU
    seconds over the block (``machine_cpu_s``: on an idle machine, the same plus the jailed
    processes of other uids), per submission too."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy, t0 = _busy_cpu_seconds(), time.monotonic()
    yield row
    row["wall_s"] = round(time.monotonic() - t0, 1)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    row["cpu_s_per_submission"] = round(cpu / N, 2)
    row["machine_cpu_s_per_submission"] = round((_busy_cpu_seconds() - busy) / N, 2)


def dask_processes(cluster: DaskCluster) -> list[psutil.Process]:
    """The cluster's own processes: the scheduler, each worker's nanny and its worker process
    (not the grading processes under it, which the local pool runs too)."""
    nannies = [psutil.Process(p.pid) for p in cluster.workers]
    return [psutil.Process(cluster.scheduler.pid), *nannies,
            *(c for n in nannies for c in n.children())]


def _cpu_s(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def dask_rows(tmp: Path, local: dict[int, dict]) -> list[dict]:
    """The batch on a Dask cluster of 1 and 2 workers; ``local``: the local pool's rows by
    worker count, for the overhead."""
    rows = []
    for workers in (1, 2):
        root = fresh_course(tmp)
        # TLS, as a class runs it (deploy/setup-class.sh): its cost is in the overhead
        cluster = DaskCluster(workers, tmp / f"dask-{workers}", tls=True)
        row = {"runner": f"pallas-course --scheduler (dask, TLS, {workers} worker(s))"}
        try:
            own = dask_processes(cluster)
            before = _cpu_s(own)
            # the workers' CPU: the machine's (they are not our children)
            with measured(row), dask.config.set(cluster.client_config):
                res = batch.autograde(root, A, scheduler=cluster.address, progress=None,
                                        log=lambda *a: None)
            # what Dask itself costs beside the grading, whatever else the machine runs
            row["dask_cpu_s_per_submission"] = round((_cpu_s(own) - before) / N, 2)
        finally:
            cluster.close()
        row.update({"median_s_per_submission": round(statistics.median(
                        r["seconds"] for r in res), 2),
                    "throughput_per_min": round(60 * len(res) / row["wall_s"], 1),
                    "graded": sum(r["status"] == "graded" for r in res),
                    "overhead_vs_local_pool": round(row["wall_s"] / local[workers]["wall_s"] - 1,
                                                    3)})
        rows.append(row)
    rows[1]["speedup_vs_1_worker"] = round(rows[0]["wall_s"] / rows[1]["wall_s"], 2)
    return rows


def term_model(cpu_s: float, worker_s: float, learners: int = 2000,
               turnaround_h: float = 1.0) -> dict:
    """A term of ``learners`` from the measured cost of one submission: ``cpu_s`` core-seconds
    (the machine's busy CPU seconds per submission, one local worker) and ``worker_s`` seconds
    of one Dask worker (wall) per submission."""
    assignments = len(build.assignments(REPO / "exercises"))
    per_assignment = learners  # one graded submission per learner and assignment
    hours = per_assignment / (3600 * turnaround_h)
    workers = math.ceil(hours * worker_s)
    cores = math.ceil(hours * cpu_s)  # a worker's submission keeps more than one core busy
    return {"learners": learners, "assignments": assignments,
            "submissions_per_term": learners * assignments,
            "cpu_s_per_submission": round(cpu_s, 2),
            "worker_s_per_submission": round(worker_s, 2),
            "cpu_hours_per_term": round(learners * assignments * cpu_s / 3600, 1),
            "worker_hours_per_assignment": round(per_assignment * worker_s / 3600, 1),
            "workers_for_turnaround": workers, "cores_for_turnaround": cores,
            "turnaround_h": turnaround_h,
            "text": (f"{learners:,} learners x {assignments} assignments = "
                     f"{learners * assignments:,} submissions a term, "
                     f"{learners * assignments * cpu_s / 3600:,.0f} CPU-hours at "
                     f"{cpu_s:.1f} CPU-s each; grading one assignment ({per_assignment:,} "
                     f"submissions) within {turnaround_h:g} h at {worker_s:.1f} s per "
                     f"submission per worker takes {workers} Dask workers and {cores} cores, "
                     f"e.g. {math.ceil(cores / 16)} machine(s) of 16 cores")}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for workers in (1, 2):
            root = fresh_course(tmp)
            row = {"runner": f"pallas-course --workers {workers}"}
            with measured(row):
                res = batch.autograde(root, A, workers=workers, progress=None,
                                        log=lambda *a: None)
            row.update({"median_s_per_submission": round(statistics.median(
                            r["seconds"] for r in res), 2),
                        "throughput_per_min": round(60 * len(res) / row["wall_s"], 1),
                        "graded": sum(r["status"] == "graded" for r in res)})
            rows.append(row)
        root = fresh_course(tmp)
        # bare: nbgrader's own Execute, so the kernel runs unjailed and checks itself
        with (root / "nbgrader_config.py").open("a") as f:
            f.write(BARE_CONFIG)
        env = submission.worker_env(root)
        row = {"runner": "bare nbgrader autograde"}
        with measured(row):
            subprocess.run([sys.executable, "-m", "nbgrader", "autograde", A, "--force"],
                           cwd=root, env=env, capture_output=True, check=False)
        row.update({"median_s_per_submission": round(row["wall_s"] / N, 2),
                    "throughput_per_min": round(60 * N / row["wall_s"], 1), "graded": None})
        rows.append(row)
        rows += dask_rows(tmp, {1: rows[0], 2: rows[1]})
    bare = rows[2]
    for r in rows:
        r["ratio_to_bare"] = round(r["wall_s"] / bare["wall_s"], 2)
        r["cpu_ratio_to_bare"] = round(r["machine_cpu_s_per_submission"]
                                       / bare["machine_cpu_s_per_submission"], 2)
    print(f"{'runner':44} {'wall s':>7} {'CPU s/sub':>9} {'median s/sub':>12} {'subs/min':>8} "
          f"{'wall vs bare':>12} {'CPU vs bare':>11}")
    for r in rows:
        print(f"{r['runner']:44} {r['wall_s']:7.1f} {r['machine_cpu_s_per_submission']:9.2f} "
              f"{r['median_s_per_submission']:12.2f} {r['throughput_per_min']:8.1f} "
              f"{r['ratio_to_bare']:12.2f} {r['cpu_ratio_to_bare']:11.2f}")
    out = REPO / "bench" / "results" / "grading.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # JAX's threads can keep more than one core busy for one submission: the term is costed in
    # CPU seconds, not one worker's wall time
    model = term_model(rows[0]["machine_cpu_s_per_submission"], rows[3]["wall_s"] / N)
    for r in rows[3:]:
        speedup = r.get("speedup_vs_1_worker")
        print(f"{r['runner']}: {100 * r['overhead_vs_local_pool']:+.1f} % vs the local pool"
              + (f", {speedup}x one worker" if speedup else "")
              + f"; Dask's own processes {r['dask_cpu_s_per_submission']:.2f} CPU-s per "
              "submission")
    print(model["text"])
    out.write_text(json.dumps({"submissions": N, "assignment": A, "cores": os.cpu_count(),
                               "rows": rows, "term_model": model}, indent=1))


COST_SUBMISSIONS = int(os.environ.get("BENCH_COST_SUBMISSIONS", "2"))
CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, where it is mounted


@contextlib.contextmanager
def cpu_per_submission(spent: dict):
    """Fill ``spent`` with (student, assignment) -> CPU seconds of grading it: each local
    worker process is moved into a cpuacct cgroup of its own, which the jailed processes it
    starts inherit (getrusage misses them: bwrap does not reap them for their parent), and
    read before and after each of its jobs, which it runs one at a time."""
    original = submission.Worker.run
    groups: list[Path] = []

    def run(worker, *args, timeout=None):
        if args[0] != "autograde":
            return original(worker, *args, timeout=timeout)
        if worker.proc is None or worker.proc.poll() is not None:
            original(worker, "start", timeout=timeout)  # a job it does not know starts it
        group = CPUACCT / f"bench-grading-{worker.proc.pid}"
        if group not in groups:
            group.mkdir()
            groups.append(group)
            (group / "cgroup.procs").write_text(str(worker.proc.pid))
        before = int((group / "cpuacct.usage").read_text())
        res = original(worker, *args, timeout=timeout)
        spent[(args[2], args[1])] = round((int((group / "cpuacct.usage").read_text())
                                           - before) / 1e9, 2)
        return res

    submission.Worker.run = run
    try:
        yield spent
    finally:
        submission.Worker.run = original
        for group in groups:
            with contextlib.suppress(OSError):  # still holds a worker that outlived the batch
                group.rmdir()


def startup_cpu_s() -> dict:
    """CPU seconds of starting each jailed process a submission starts, doing nothing but
    import what it imports (``trusted.preflight``'s commands): the notebook's process and
    the checker, counted in a cpuacct cgroup this process is in meanwhile."""
    from grader.jail import sandbox, trusted

    out = {}
    group = CPUACCT / f"bench-startup-{os.getpid()}"
    group.mkdir()
    (group / "cgroup.procs").write_text(str(os.getpid()))
    with sandbox.claimed_slot() as slot:
        view = trusted.notebook_view(trusted.jail_folder(slot, "-grader"))
        try:
            for name, command, readable, views in (
                    ("checker", trusted.PREFLIGHT, trusted.readable(), None),
                    ("notebook", trusted.PREFLIGHT_NOTEBOOK, trusted.notebook_readable(),
                     {REPO / "grader": view})):
                workdir = trusted.jail_folder(slot, "-bench")
                before = int((group / "cpuacct.usage").read_text()) - _self_cpu_ns()
                try:
                    res = sandbox.run([sys.executable, "-c", command], workdir,
                                      sandbox.Limits(), slot=slot, readable=readable,
                                      views=views, env=trusted.grading_env())
                finally:
                    sandbox.remove_workdir(workdir)
                after = int((group / "cpuacct.usage").read_text()) - _self_cpu_ns()
                assert res.status == "ok", res.stderr[-2000:]
                out[name] = round((after - before) / 1e9, 2)
        finally:
            shutil.rmtree(view, ignore_errors=True)
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            group.rmdir()
    return out


def _self_cpu_ns() -> int:
    """This process's CPU nanoseconds, all its threads (not its children)."""
    t = os.times()
    return int((t.user + t.system) * 1e9)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def cost_main(assignments: list[str]) -> None:
    """``python bench/grading.py cost [ASSIGNMENT...]``: each assignment's instructor notebook
    graded as ``BENCH_COST_SUBMISSIONS`` learners' submissions in one batch on 2 local workers
    (each in its own jail, with a cold answer cache: no submission reuses another's answers),
    the CPU seconds (the worker's and its jailed runs', ``cpu_seconds`` of each result) and
    wall seconds of each; the share of starting the jailed processes and importing JAX; a
    class-sized projection. Writes bench/recorded/grading_cost.json."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=REPO, capture_output=True, text=True).stdout.strip())
    startup = startup_cpu_s()
    per_submission_startup = startup["checker"] + startup["notebook"]
    rows = {}
    loads = [_load()]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for assignment in assignments or build.assignments(REPO / "exercises"):
            root = fresh_course(tmp, assignment, COST_SUBMISSIONS)
            t0 = time.monotonic()
            with cpu_per_submission({}) as spent:
                res = batch.autograde(root, assignment, workers=2, progress=None,
                                      log=lambda *a: None)
            cpu = list(spent.values())
            wall = [r["seconds"] for r in res]
            rows[assignment] = {
                "submissions": len(res), "statuses": sorted({r["status"] for r in res}),
                "score": [r["score"] for r in res], "max_score": res[0].get("max_score"),
                "cpu_s_median": round(statistics.median(cpu), 1), "cpu_s_max": max(cpu),
                "wall_s_median": round(statistics.median(wall), 1), "wall_s_max": max(wall),
                "batch_wall_s": round(time.monotonic() - t0, 1),
                "startup_share": round(per_submission_startup / statistics.median(cpu), 3)}
            loads.append(_load())
            print(f"{assignment:24} CPU s median {rows[assignment]['cpu_s_median']:6.1f} "
                  f"max {rows[assignment]['cpu_s_max']:6.1f}  wall s median "
                  f"{rows[assignment]['wall_s_median']:6.1f} max "
                  f"{rows[assignment]['wall_s_max']:6.1f}  {rows[assignment]['statuses']}  "
                  f"load {loads[-1]}", flush=True)
    medians = sorted(r["cpu_s_median"] for r in rows.values())
    median_cpu = statistics.median(medians)
    # a class: every learner submits each assignment once; the cost is core-seconds
    learners = 1000
    term_cpu_h = sum(r["cpu_s_median"] for r in rows.values()) * learners / 3600
    record = {
        "commit": commit + ("+uncommitted" if dirty else ""),
        "what": "each assignment's instructor notebook as learners' submissions, graded in "
                "one batch on 2 local workers, cold answer cache; cpu: the CPU seconds of "
                "the worker and the jailed processes it starts per submission (a cpuacct "
                "cgroup per worker); wall: seconds per submission",
        "submissions_per_assignment": COST_SUBMISSIONS, "cores": os.cpu_count(),
        "load_average": loads,
        "startup_cpu_s": {**startup, "per_submission": round(per_submission_startup, 2),
                          "what": "a jailed Python importing JAX and what each process "
                                  "imports, nothing else; a submission starts both"},
        "assignments": rows,
        "median_submission_cpu_s": round(median_cpu, 1),
        "startup_share_of_median": round(per_submission_startup / median_cpu, 3),
        "projection": {
            "learners": learners, "assignments": len(rows),
            "submissions": learners * len(rows),
            "cpu_hours": round(term_cpu_h, 1),
            "days_on_2_cores": round(term_cpu_h / 2 / 24, 1),
            "text": f"{learners:,} learners x {len(rows)} assignments: {term_cpu_h:,.0f} "
                    f"CPU-hours a term ({term_cpu_h / 2 / 24:.1f} days of a 2-core machine, "
                    f"{math.ceil(term_cpu_h / 16 / 24):.0f} day(s) of 16 cores), one "
                    "graded submission per learner and assignment"}}
    out = REPO / "bench" / "recorded" / "grading_cost.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(record["projection"]["text"])
    print(f"median submission {median_cpu:.1f} CPU-s, of which starting its jailed processes "
          f"{per_submission_startup:.1f} ({100 * per_submission_startup / median_cpu:.0f} %)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["cost"]:
        cost_main(sys.argv[2:])
    else:
        main()
