"""12 submissions graded twice, by ``pallas-course`` as a user runs it: on the local pool with
the SQLite gradebook, and on a real Dask cluster (scheduler and two workers, separate processes)
with the gradebook in a real PostgreSQL server, one Dask worker killed mid-batch. Both CSVs must
be the same: nothing lost, nothing graded twice into the gradebook."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import psycopg
import pytest
from clustertools import LEARNER_CELL_TIMEOUT, REPO, A, descendants, new_course

# who submits what: every kind more than once but the last two, and the ids that the resume
# checks name (s03, graded; s18, whose kernel dies) as a batch of twenty numbered them
KINDS = {**{f"s{i:02d}": ("right", "right", "wrong", "blank")[i % 4] for i in range(10)},
         "s18": "dies", "s19": "malformed"}
N = len(KINDS)
TIMESTAMP = "2026-12-01 10:00:00.000000 UTC"
pytestmark = pytest.mark.slow


def pallas(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PALLAS_COURSE_CELL_TIMEOUT": LEARNER_CELL_TIMEOUT}
    return subprocess.run([sys.executable, "-m", "grader.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200, check=False, **kw)


def ok(res: subprocess.CompletedProcess, *codes: int) -> subprocess.CompletedProcess:
    assert res.returncode in (codes or (0,)), res.stdout[-3000:] + res.stderr[-3000:]
    return res


def with_solution_code(nb, grade_id: str, code: str):
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    cell.source += "\n" + code
    return nb


def submit_all(course: Path) -> dict[str, str]:
    """The KINDS submissions straight into submitted/ (as nbgrader's collect leaves them): right,
    wrong (first task doubled), blank, one whose kernel dies, one that is not a notebook."""
    (src,) = (course / "source" / A).glob("*.ipynb")
    for student, kind in KINDS.items():
        d = course / "submitted" / student / A
        d.mkdir(parents=True)
        (d / "timestamp.txt").write_text(TIMESTAMP)
        if kind == "malformed":
            (d / src.name).write_text("{not a notebook")
        else:
            nb = nbformat.read(course / "release" / A / src.name if kind == "blank" else src,
                               as_version=4)
            if kind == "wrong":
                with_solution_code(nb, "add_solution",
                                   "_orig = add\nadd = lambda *a, **k: _orig(*a, **k) * 2")
            elif kind == "dies":
                with_solution_code(nb, "add_solution", "import os\nos._exit(1)")
            nbformat.write(nb, d / src.name)
    return dict(KINDS)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # gone, or a zombie
        return []


def grades(csv_path: Path) -> list[dict]:
    return sorted(csv.DictReader(csv_path.open()), key=lambda r: r["student_id"])


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The reference: today's local pool and SQLite."""
    course = new_course(tmp_path_factory.mktemp("local") / "course")
    ok(pallas("--course", str(course), "release", A))
    kinds = submit_all(course)
    ok(pallas("--course", str(course), "autograde", A, "--workers", "2"), 3)
    ok(pallas("--course", str(course), "export", "--to", str(course / "grades.csv")))
    return kinds, grades(course / "grades.csv")


def test_dask_and_postgres_grade_like_the_local_pool(local_run, dask_cluster, postgres,
                                                    tmp_path):
    kinds, expected = local_run
    assert sorted(r["student_id"] for r in expected) == sorted(kinds)
    by_kind = {r["student_id"]: (r["status"], r["score"]) for r in expected}
    assert {by_kind[s] for s, k in kinds.items() if k == "right"} == {("graded", "9.0")}
    assert {by_kind[s] for s, k in kinds.items() if k == "wrong"} == {("graded", "6.0")}
    assert {by_kind[s] for s, k in kinds.items() if k == "blank"} == {("graded", "0.0")}

    url = postgres.database("class")
    course = new_course(tmp_path / "course")
    db = ["--course", str(course), "--db", url]
    ok(pallas(*db, "release", A))
    submit_all(course)
    env = {**os.environ, "PALLAS_COURSE_CELL_TIMEOUT": LEARNER_CELL_TIMEOUT}
    batch = subprocess.Popen([sys.executable, "-m", "grader.cli", *db, "autograde", A,
                              "--scheduler", dask_cluster.address], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # mid-batch (4 submissions done), kill a Dask worker and everything in its process group
        status = course / "status" / A
        while len(list(status.glob("*.json"))) < 4:
            assert batch.poll() is None, batch.communicate()
            time.sleep(0.5)
        victim = dask_cluster.workers[0]
        tree = descendants(victim.pid)
        graders = [p for p in tree if "grader.logistics.worker" in " ".join(_cmdline(p))]
        assert graders, "the Dask worker had no grading worker running"
        os.killpg(victim.pid, signal.SIGKILL)  # the nanny and the worker, not the grader
        victim.wait()
        # its grading worker, in a session of its own, dies with it (setpriv --pdeathsig)
        _, alive = psutil.wait_procs(graders, timeout=15)
        for p in tree:  # nothing of it may outlive the test, whatever the assertion says
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        assert not alive, alive
        # a machine joins that has not mounted the course folder (a mount namespace hides it
        # under an empty tmpfs): it must grade nothing and be retired, its submission graded
        # elsewhere; then a good replacement machine joins
        unmounted = dask_cluster.add_worker(wait=False, wrapper=[
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs none "{course}" && exec "$0" "$@"'])
        dask_cluster.add_worker(wait=False)
        out, err = batch.communicate(timeout=1200)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert batch.returncode == 3, out + err  # not all "graded": s18 crashed, s19 malformed
    assert f"{N}/{N}" in err and f"on the Dask cluster at {dask_cluster.address}" in out
    assert f"the course folder {course} is not mounted here" in out, out
    assert unmounted.wait(timeout=60) is not None  # retired: the worker process ended

    ok(pallas(*db, "export", "--to", str(tmp_path / "grades.csv")))
    assert grades(tmp_path / "grades.csv") == expected
    statuses = {p.stem: json.loads(p.read_text())["status"] for p in status.glob("*.json")}
    assert statuses == {r["student_id"]: r["status"] for r in expected}

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT student_id) FROM submitted_assignment")
        assert cur.fetchone() == (N - 1, N - 1)  # the malformed one never reaches nbgrader
        cur.execute("SELECT count(*) FROM (SELECT 1 FROM grade GROUP BY notebook_id, cell_id "
                    "HAVING count(*) > 1) AS dup")
        assert cur.fetchone() == (0,)

    # resume on the cluster grades exactly the submissions without a status file and the one
    # that crashed (s18, whose kernel dies: crashed again)
    (status / "s03.json").unlink()
    res = ok(pallas(*db, "autograde", A, "--scheduler", dask_cluster.address, "--resume"), 3)
    assert "2 submission(s)" in res.stdout and "s03" in res.stdout and "s18" in res.stdout
    assert json.loads((status / "s03.json").read_text())["status"] == "graded"
    assert json.loads((status / "s18.json").read_text())["status"] == "crashed"


def test_a_worker_that_cannot_grade_before_the_batch_is_retired_and_the_others_grade(
        dask_cluster, postgres, tmp_path):
    """Issue 52: one Dask worker that failed its jail check when the batch began stopped the
    whole batch, nothing graded. It is retired, with why, and the other workers grade."""
    import shutil

    db = ["--course", str(new_course(tmp_path / "course")), "--db",
          postgres.database("preflight")]
    course = Path(db[1])
    ok(pallas(*db, "release", A))
    (src,) = (course / "source" / A).glob("*.ipynb")
    for student in ("p1", "p2"):
        d = course / "submitted" / student / A
        d.mkdir(parents=True)
        (d / "timestamp.txt").write_text(TIMESTAMP)
        shutil.copy(src, d / src.name)
    # a machine that has not mounted the course folder joins before the batch
    unmounted = dask_cluster.add_worker(wrapper=[
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t tmpfs none "{course}" && exec "$0" "$@"'])
    res = ok(pallas(*db, "autograde", A, "--scheduler", dask_cluster.address))
    assert f"the course folder {course} is not mounted here" in res.stdout, res.stdout
    statuses = {p.stem: json.loads(p.read_text())["status"]
                for p in (course / "status" / A).glob("*.json")}
    assert statuses == {"p1": "graded", "p2": "graded"}
    assert unmounted.wait(timeout=60) is not None  # retired: the worker process ended
