"""A gradebook that goes away under a batch (issue 35, item 14): whatever words the database
driver uses for it, a lost or refused connection is an infrastructure fault, and so is any
failure of the grading itself. The submission's status is ``error`` (graded again by
``--resume``), never ``crashed``, which is a learner's 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clustertools import REPO, A, new_course
from nbgrader.api import Gradebook
from sitetools import free_port

from grader.logistics import submission, worker

pytestmark = pytest.mark.slow


def test_a_connection_the_server_dropped_is_the_gradebooks_fault(postgres, monkeypatch):
    """A restart drops the connections a worker's pool holds: the next query on one fails with
    the driver's words for it (not always those of an OperationalError: a reused connection
    can also fail as closed, or as a transaction to roll back). SQLAlchemy's dialect reads them
    as a disconnect, and the worker reports it."""
    # the gradebook is made by alembic, a command beside this Python
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    url = postgres.database("dropped")
    worker.watch_gradebook_connections()
    worker.GRADEBOOK_LOST.clear()
    gb = Gradebook(url, "course")
    try:
        gb.add_student("before")  # the pool now holds a connection the server will drop
        subprocess.run([*postgres.as_user, postgres.bin / "psql", "-h", "127.0.0.1", "-p",
                        str(postgres.port), "-U", "pallas", "-d", "postgres", "-c",
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = 'dropped'"], check=True, capture_output=True)
        with pytest.raises(Exception) as raised:  # noqa: PT011 - whichever the driver raises
            gb.add_student("after")
    finally:
        gb.close()
    assert worker.GRADEBOOK_LOST, f"not read as a lost connection: {raised.value!r}"
    job = {"success": False, "error": f"{type(raised.value).__name__}: grading stopped",
           "gradebook_lost": worker.GRADEBOOK_LOST[-1]}
    assert submission.gradebook_down(job)
    assert not submission.gradebook_down({**job, "gradebook_lost": None}), \
        "the test must not pass on the error's words alone"


def test_grading_that_fails_for_want_of_the_gradebook_is_an_error_not_crashed(tmp_path):
    """A resubmission that is not a notebook must remove the earlier grade from the gradebook;
    with the gradebook's server not answering that fails, and the grading of it raises. The
    batch still finishes, and the submission is ``error`` with what to do next."""
    course = new_course(tmp_path / "course")
    env = {**os.environ, "PALLAS_COURSE_CELL_TIMEOUT": "5"}
    env.pop(submission.DB_ENV, None)

    def pallas(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "grader.cli", "--course", str(course),
                               *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600, check=False)

    assert pallas("release", A).returncode == 0
    d = course / "submitted" / "s1" / A
    d.mkdir(parents=True)
    (d / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    (d / "first_kernel.ipynb").write_text("{not a notebook")
    # nothing listens on this port: the gradebook's server is down
    res = pallas("--db", f"postgresql://pallas@127.0.0.1:{free_port()}/course", "autograde", A)
    record = json.loads((course / "status" / A / "s1.json").read_text())
    assert record["status"] == "error", (record, res.stdout[-2000:], res.stderr[-2000:])
    assert "infrastructure fault" in record["detail"], record
    assert "--resume" in record["detail"], record
    assert "crashed" not in res.stdout, res.stdout
