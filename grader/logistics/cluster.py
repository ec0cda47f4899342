"""Grading on a Dask distributed cluster: ``pallas-course autograde --scheduler tcp://HOST:8786``.

Each submission is one Dask task, :func:`grade`, that runs on a Dask worker exactly what the
local pool runs: ``submission.grade_one`` with a long-lived ``grader.logistics.worker`` process, so
the jailed kernel, the limits, the trusted verdict, the statuses and the status file are the same
code.
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
more threads would wait on the lock below) in a sandbox slot of its own (``sandbox.claim_slot``,
as the local pool's), so graders on one machine never share a sandbox uid. Its grading worker
is kept between tasks: nbgrader starts once per Dask worker, not once per submission. The
scheduler and workers read deploy/dask/grading.yaml (in ``DASK_CONFIG``): a worker is handed its
next submission when it finishes the last, as in the local pool's queue, it imports what grading
needs when it starts (``dask_setup``), and Dask's housekeeping, made for millisecond tasks,
polls seldom beside tasks that wait seconds on their grading process. Every
Dask worker runs the jail check a local batch runs (``submission.check_jail``) before it grades
anything: the workers present run it before the batch starts, a worker that joins mid-batch
runs it before its first submission. A worker that fails it grades nothing: the batch retires
it from the cluster, says why, and grades on the others (a late one: its submission
elsewhere); only when no worker can grade does the batch stop.

A Dask worker lost mid-task: the scheduler runs the task again on another worker (up to
``distributed.scheduler.allowed-failures`` times, then the submission is ``error``, an
infrastructure fault, with Dask's reason). The lost worker's grading process dies with it (``setpriv
--pdeathsig`` in ``submission.Worker``) and its jailed run with that (``bwrap --die-with-parent``),
so no second autograde of the submission runs beside the new one; nbgrader's ``autograde --force``
replaces a submission's grades and the gradebook's unique keys forbid a second row, so grading a
submission twice never duplicates a grade.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from grader.jail import sandbox
from grader.logistics import shared, submission

CONNECT_TIMEOUT = "30s"

_lock = threading.Lock()
_here: dict = {"slot": None, "lock": None, "worker": None, "key": None, "checked": False}


class WorkerUnfit(RuntimeError):
    """This Dask worker cannot grade (no jail, or the course not mounted); ``address`` is its
    Dask address, for the client to retire it."""

    def __init__(self, address: str, reason: str):
        super().__init__(f"the Dask worker {address} ({socket.gethostname()}) cannot grade: "
                         f"{reason}")
        self.address = address

    def __reduce__(self):  # raised on the worker, unpickled on the client
        return (_unfit, (self.address, str(self)))


def _unfit(address: str, message: str) -> WorkerUnfit:
    e = WorkerUnfit.__new__(WorkerUnfit)
    RuntimeError.__init__(e, message)
    e.address = address
    return e


def _worker(root: str, db: str | None, address: str) -> submission.Worker:
    """The grading worker of the Dask worker at ``address`` for ``root`` and gradebook ``db``,
    jail-checked (call under _lock). Raises ``WorkerUnfit`` when this machine cannot grade."""
    if not (Path(root) / "nbgrader_config.py").is_file():  # else: every submission "malformed"
        raise WorkerUnfit(address, f"the course folder {root} is not mounted here")
    shared.share_with_group(Path(root))  # the instructors regrade what this worker writes
    if _here["slot"] is None:
        _here["slot"], _here["lock"] = sandbox.claim_slot()
    if _here["key"] != (root, db):  # another course or gradebook: a fresh grading worker
        if _here["worker"] is not None:
            _here["worker"].close()
        _here["worker"] = submission.Worker(Path(root), _here["slot"])
        _here["key"], _here["checked"] = (root, db), False
    # the grading worker's nbgrader reads the gradebook URL from its environment
    if db:
        os.environ[submission.DB_ENV] = db
    else:
        os.environ.pop(submission.DB_ENV, None)
    if not _here["checked"]:
        try:
            submission.check_jail(_here["worker"])
        except RuntimeError as e:
            raise WorkerUnfit(address, str(e)) from None
        _here["checked"] = True
    return _here["worker"]


def dask_setup(server) -> None:
    """Run when a Dask scheduler or worker starts (``distributed.scheduler.preload`` and
    ``distributed.worker.preload`` in deploy/dask/grading.yaml name this module).

    Every Dask scheduler and worker serves HTTP pages (its workers, logs, exceptions) whatever
    ``--no-dashboard`` says, without TLS or a login: any account on the machine could read
    them. Grading needs none of them: that server stops listening here. A worker also imports
    what grading a submission needs (nbformat checks that a submission is a notebook: seconds
    of CPU on a busy machine) once, when it starts, instead of in its first submission."""
    from distributed import Worker  # optional: Dask comes with the class extra

    server.http_server.stop()
    if isinstance(server, Worker):
        import nbformat  # noqa: F401


def preflight(root: str, db: str | None, dask_worker=None) -> None:
    """On every Dask worker before a batch (``Client.run`` passes ``dask_worker``), as before a
    local one: can a jailed Python there import the course?"""
    with _lock:
        _worker(root, db, dask_worker.address)


def grade(root: str, student: str, assignment: str, timeout: float, db: str | None) -> dict:
    """Grade one submission on this Dask worker; the record ``submission.grade_one`` returns."""
    from distributed import get_worker  # optional: Dask comes with the class extra

    with _lock:
        return submission.grade_one(Path(root), student, assignment, timeout,
                                 _worker(root, db, get_worker().address))


def graded_on(scheduler: str, root: Path, todo: list[tuple[str, str]], timeout: float,
              log=print) -> Iterator[tuple[str, str, object]]:
    """``(student, assignment, future)`` as each submission is graded on the Dask cluster whose
    scheduler is at ``scheduler``; the future's ``result()`` is ``grade``'s record or raises
    why the cluster could not grade it. A worker that joined late and cannot grade is retired
    and its submission graded on another; when no worker can, the batch stops (``--resume``
    grades what is left)."""
    from distributed import Client, as_completed  # optional: Dask comes with the class extra

    try:
        client = Client(scheduler, timeout=CONNECT_TIMEOUT)
    except OSError as e:
        raise RuntimeError(f"no Dask scheduler answers at {scheduler}: {e}") from None
    db = os.environ.get(submission.DB_ENV)
    batch_id = uuid.uuid4().hex[:8]

    def submit(student: str, assignment: str, attempt: int):
        return client.submit(grade, str(root), student, assignment, timeout, db, pure=False,
                             key=f"grade-{assignment}-{student}-{batch_id}-{attempt}")

    try:
        retired: set[str] = set()
        if todo:
            # a worker that cannot grade is retired, and the batch goes on with the others:
            # one bad machine, or one worker busy with a learner's flood of files, stopped
            # whole batches with nothing graded
            checked = client.run(preflight, str(root), db, on_error="return")
            for address, why in sorted(checked.items()):
                if why is not None:
                    retired.add(address)
                    log(f"retired {why}" if isinstance(why, WorkerUnfit) else
                        f"retired the Dask worker {address}: its jail check failed "
                        f"({type(why).__name__}: {why})")
            if retired:
                client.retire_workers(sorted(retired), close_workers=True)
            if not set(checked) - retired:
                raise RuntimeError(f"not grading on {scheduler}: no Dask worker can grade "
                                   "(each one's reason above); fix them, then run the batch "
                                   "again")
        futs = {submit(s, a, 0): (s, a, 0) for s, a in todo}
        finished = as_completed(futs)
        for fut in finished:
            s, a, attempt = futs.pop(fut)
            unfit = fut.exception() if fut.status == "error" else None
            if isinstance(unfit, WorkerUnfit):
                if unfit.address not in retired:
                    retired.add(unfit.address)
                    log(f"retired {unfit}")
                    client.retire_workers([unfit.address], close_workers=True)
                if not set(client.scheduler_info()["workers"]) - retired:
                    raise RuntimeError(f"not grading on {scheduler}: no Dask worker left that "
                                       f"can grade; last: {unfit}")
                again = submit(s, a, attempt + 1)
                futs[again] = (s, a, attempt + 1)
                finished.add(again)
                continue
            yield s, a, fut
    finally:
        client.close()
