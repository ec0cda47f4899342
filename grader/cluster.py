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
more threads would wait on the lock below) in a sandbox slot of its own, claimed with a lock
file, so Dask workers on one machine never share a sandbox uid. Its grading worker is kept
between tasks: nbgrader starts once per Dask worker, not once per submission.

A Dask worker lost mid-task: the scheduler runs the task again on another worker (up to
``distributed.scheduler.allowed-failures`` times, then the submission is ``crashed`` with
Dask's reason). The lost worker's grading process dies with it (``setpriv --pdeathsig`` in
``grading.Worker``) and its jailed kernel with that (``bwrap --die-with-parent``), so no
second autograde of the submission runs beside the new one; nbgrader's ``autograde --force``
replaces a submission's grades and the gradebook's unique keys forbid a second row, so grading
a submission twice never duplicates a grade.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from grader import grading

# Dask workers' sandbox slots start here; a local pool on the same machine uses 0, 1, ...
SLOT_BASE = 100
MAX_SLOTS = 256
CONNECT_TIMEOUT = "30s"

_lock = threading.Lock()
_here: dict = {"slot": None, "slot_fd": None, "worker": None, "key": None}


def _claim_slot() -> tuple[int, int]:
    """A sandbox slot no other process on this machine holds, and the fd whose lock holds it
    (released by the kernel when this process ends, however it ends)."""
    folder = Path(tempfile.gettempdir()) / "pallas-course-slots"
    folder.mkdir(mode=0o700, exist_ok=True)
    for slot in range(SLOT_BASE, SLOT_BASE + MAX_SLOTS):
        fd = os.open(folder / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    raise RuntimeError(f"all {MAX_SLOTS} grading slots of this machine are taken")


def grade(root: str, student: str, assignment: str, timeout: float, db: str | None) -> dict:
    """Grade one submission on this Dask worker; the record ``grading.grade_one`` returns."""
    with _lock:
        if _here["slot"] is None:
            _here["slot"], _here["slot_fd"] = _claim_slot()
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
        return grading.grade_one(Path(root), student, assignment, timeout, _here["worker"])


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
        futs = {client.submit(grade, str(root), s, a, timeout, db, pure=False,
                              key=f"grade-{a}-{s}-{batch}"): (s, a) for s, a in todo}
        for fut in as_completed(futs):
            yield (*futs[fut], fut)
    finally:
        client.close()
