"""Grading on a Dask distributed cluster: ``pallas-course autograde --scheduler tcp://HOST:8786``.

Each submission is one Dask task, :func:`grade`, that runs on a Dask worker exactly what the
local pool runs: ``grading.grade_one`` with a long-lived ``grader.worker`` process, so the jailed
kernel, the limits, the trusted verdict, the statuses and the status file are the same code.
Dask only decides where a submission is graded; learner code never runs in a Dask process.

Design: a shared course folder, not submissions shipped with the task. Every worker machine
mounts the course root at the same path as the machine that runs ``autograde`` (NFS v4, CephFS:
any file system with working ``flock``), and the gradebook is a server (``--db
postgresql://...``; SQLite is not safe for writers on several machines). A task is then only
``(root, student, assignment)``: nbgrader's autograde reads the submission, the released
notebooks and the hidden reference cases from the course and writes ``autograded/`` (read later
by ``feedback``) and ``status/`` there, as it does on one machine. Shipping would copy the hidden
references into every task and every result back, and re-create nbgrader's course layout on the
worker; a course on JupyterHub already lives on shared storage (the exchange), so the folder
is there anyway.

Each Dask worker process grades one submission at a time (start workers with ``--nthreads 1``;
more threads would wait on the lock below) in a sandbox slot of its own (``grading.claim_slot``,
as the local pool's), so graders on one machine never share a sandbox uid. Its grading worker
is kept between tasks: nbgrader starts once per Dask worker, not once per submission. Before a
batch every Dask worker runs the jail check a local batch runs (``grading.check_jail``).

A Dask worker lost mid-task: the scheduler runs the task again on another worker (up to
``distributed.scheduler.allowed-failures`` times, then the submission is ``crashed`` with
Dask's reason). The lost worker's grading process dies with it (``setpriv --pdeathsig`` in
``grading.Worker``) and its jailed kernel with that (``bwrap --die-with-parent``), so no
second autograde of the submission runs beside the new one; nbgrader's ``autograde --force``
replaces a submission's grades and the gradebook's unique keys forbid a second row, so grading
a submission twice never duplicates a grade.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from grader import grading

CONNECT_TIMEOUT = "30s"

_lock = threading.Lock()
_here: dict = {"slot": None, "lock": None, "worker": None, "key": None}


def _worker(root: str, db: str | None) -> grading.Worker:
    """This Dask worker's grading worker for ``root`` and gradebook ``db`` (call under _lock)."""
    if not (Path(root) / "nbgrader_config.py").is_file():  # else: every submission "malformed"
        raise RuntimeError(f"the course folder {root} is not mounted on the Dask worker at "
                           f"{socket.gethostname()}")
    if _here["slot"] is None:
        _here["slot"], _here["lock"] = grading.claim_slot()
    if _here["key"] != (root, db):  # another course or gradebook: a fresh grading worker
        if _here["worker"] is not None:
            _here["worker"].close()
        _here["worker"] = grading.Worker(Path(root), _here["slot"])
        _here["key"] = (root, db)
    # the grading worker's nbgrader reads the gradebook URL from its environment
    if db:
        os.environ[grading.DB_ENV] = db
    else:
        os.environ.pop(grading.DB_ENV, None)
    return _here["worker"]


def preflight(root: str, db: str | None) -> None:
    """On every Dask worker before a batch, as before a local one: can a jailed kernel there
    import the course?"""
    with _lock:
        grading.check_jail(_worker(root, db))


def grade(root: str, student: str, assignment: str, timeout: float, db: str | None) -> dict:
    """Grade one submission on this Dask worker; the record ``grading.grade_one`` returns."""
    with _lock:
        return grading.grade_one(Path(root), student, assignment, timeout, _worker(root, db))


def graded_on(scheduler: str, root: Path, todo: list[tuple[str, str]],
              timeout: float) -> Iterator[tuple[str, str, object]]:
    """``(student, assignment, future)`` as each submission is graded on the Dask cluster whose
    scheduler is at ``scheduler``; the future's ``result()`` is ``grade``'s record or raises
    why the cluster could not grade it."""
    from distributed import Client, as_completed

    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT)
    except OSError as e:
        raise RuntimeError(f"no Dask scheduler answers at {scheduler}: {e}") from None
    db = os.environ.get(grading.DB_ENV)
    batch = uuid.uuid4().hex[:8]
    try:
        if todo:
            try:
                client.run(preflight, str(root), db)
            except Exception as e:  # noqa: BLE001 - any worker's failure stops the batch
                raise RuntimeError(f"not grading on {scheduler}: {type(e).__name__}: {e}") from e
        futs = {client.submit(grade, str(root), s, a, timeout, db, pure=False,
                              key=f"grade-{a}-{s}-{batch}"): (s, a) for s, a in todo}
        for fut in as_completed(futs):
            yield (*futs[fut], fut)
    finally:
        client.close()
