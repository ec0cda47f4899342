"""One submission graded: the long-lived nbgrader worker process that grades it (``Worker``),
the jail check before the first one, and ``grade_one``'s status and reason. The local pool
(``grader.logistics.batch``) and the Dask cluster (``grader.logistics.cluster``) both run this.

Statuses (one JSON file per submission under ``<root>/status/<assignment>/<student>.json``, written
atomically, so a batch can be resumed and read while it runs): graded; timeout (a cell, the run's
CPU or wall-clock limit or the whole submission ran out of time); limit (the run broke another
of the jail's limits: memory, disk, file size; the learner's doing, graded for what passed and
never graded again by ``--resume``); crashed (the run died otherwise, or nbgrader failed);
malformed (not a readable notebook;
it scores 0, also when an earlier submission had a grade); error (the gradebook could not be
reached, or grading it failed, e.g. its Dask worker was lost each time: an infrastructure fault,
never a learner's 0, graded again by ``--resume`` like crashed); tampered (the notebook's code
changed the grading code in the grader's run of it, or test cells were edited, deleted, duplicated
or reordered, which nbgrader undoes before grading); missing (no submission).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from grader.jail import sandbox
from grader.logistics.hidden_tests import HIDDEN_RE
from grader.verdict import refs

# the gradebook's URL when it is not SQLite in the course folder (pallas-course --db); every
# nbgrader process reads it through nbgrader_config.py
DB_ENV = "PALLAS_COURSE_DB"


def worker_env(root: Path) -> dict[str, str]:
    """The environment of a ``grader.logistics.worker`` for the course at ``root``: this Python's
    tools and this grader first."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PALLAS_COURSE_ROOT"] = str(root)
    env["PYTHONPATH"] = str(refs.REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_worker(root: Path, *args: str, timeout: float | None = None) -> dict:
    """Run one ``grader.logistics.worker`` job in a fresh worker; its result dict (``success`` False
    on any failure). It claims a slot like a batch does: a release or a validation beside another
    grader on this machine must not run under, and kill, that grader's sandbox uid."""
    with sandbox.claimed_slot() as slot:
        worker = Worker(root, slot)
        try:
            return worker.run(*args, timeout=timeout)
        finally:
            worker.close()


def _status_path(root: Path, assignment: str, student: str) -> Path:
    return root / "status" / assignment / f"{student}.json"


def write_status(root: Path, assignment: str, student: str, record: dict) -> None:
    p = _status_path(root, assignment, student)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, p)


def read_status(root: Path, assignment: str, student: str) -> dict | None:
    p = _status_path(root, assignment, student)
    return json.loads(p.read_text()) if p.exists() else None


def _malformed(subdir: Path) -> str | None:
    import nbformat  # a second to import: only a submission graded here reads notebooks

    nbs = sorted(subdir.glob("*.ipynb"))
    if not nbs:
        return "no notebook in the submission"
    for nb in nbs:
        try:
            notebook = nbformat.read(nb, as_version=4)
            nbformat.validate(notebook)
        except Exception as e:  # noqa: BLE001
            return f"{nb.name}: not a valid notebook ({type(e).__name__}: {str(e)[:200]})"
        # JSON may spell a lone UTF-16 surrogate ("\ud800"), which no file can hold as UTF-8:
        # nbgrader fails writing it, and the submission would read as a crash of the grader
        for i, cell in enumerate(notebook.cells):
            try:
                cell.source.encode("utf-8")
            except UnicodeEncodeError:
                return (f"{nb.name}: cell {i + 1} ({cell.cell_type}) holds a character that is "
                        "not valid Unicode (a lone surrogate); delete it and submit again")
    return None


def _submitted_at(subdir: Path) -> str:
    """When the submission in ``subdir`` was made (its timestamp.txt, UTC) as nbgrader's export
    writes it (``2026-12-01 10:00:00``); ``""`` when it does not say."""
    from nbgrader.utils import parse_utc  # nbgrader takes seconds to import

    try:
        return str(parse_utc((subdir / "timestamp.txt").read_text().strip()))
    except (OSError, ValueError):
        return ""


class Worker:
    """A long-lived ``grader.logistics.worker serve`` process: nbgrader starts once, not per
    submission.

    ``slot`` picks the sandbox uid of the runs it starts, so concurrent workers never share
    one. A job that runs past its time kills the process (and its run); the next job starts
    a fresh one.
    """

    def __init__(self, root: Path, slot: int):
        self.root, self.slot = root, slot
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr = None

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.lines = queue.Queue()
        env = {**worker_env(self.root), sandbox.SLOT_ENV: str(self.slot)}
        # it dies with the thread that started it (and its jailed run with it: bwrap
        # --die-with-parent): a grader or Dask worker killed mid-job leaves no autograde running
        # beside the one that grades the submission again
        die = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        self.proc = subprocess.Popen(
            [*die, sys.executable, "-m", "grader.logistics.worker", str(self.root), "serve"],
            cwd=self.root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True, start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines),
                         daemon=True).start()

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    def _stderr_tail(self, since: int) -> str:
        self.stderr.seek(since)
        return self.stderr.read()[-6000:].decode(errors="replace")

    def run(self, *args: str, timeout: float | None = None) -> dict:
        """One job (``autograde A STUDENT``, ...); None: no time limit."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        since = self.stderr.seek(0, os.SEEK_END)
        self.proc.stdin.write(json.dumps(list(args)) + "\n")
        self.proc.stdin.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=None if deadline is None
                                      else max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.close()
                sandbox.kill_slot(self.slot)  # what the killed worker's run left
                return {"success": False, "killed": "timeout", "error": f"ran past {timeout:.0f} s",
                        "log": ""}
            if line is None:
                code = self.proc.wait()
                log = self._stderr_tail(since)
                self.proc = None
                return {"success": False, "error": f"worker exited {code} without a result",
                        "log": log}
            if line.startswith("@@RESULT "):
                res = json.loads(line[len("@@RESULT "):])
                res.setdefault("log", "")
                res["stderr"] = self._stderr_tail(since)
                return res

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None


def check_jail(worker: Worker) -> None:
    """Stop before grading anything when a jailed run could not import the course."""
    res = worker.run("preflight", timeout=300)
    if not res.get("success"):
        raise RuntimeError(f"not grading: {res.get('error') or 'the jail check failed'}")


def _cause(log: str) -> str | None:
    """The last exception line of an nbgrader log (``KeyError: 'grade_id'``), if any."""
    lines = [x.strip() for x in log.splitlines()]
    found = [x for x in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", x)]
    return f"nbgrader failed: {found[-1][:400]}" if found else None


def test_cell_changes(release_nb: Path, submitted_nb: Path) -> list[str]:
    """How a submission's test (locked) cells differ from the released notebook's."""
    def locked(nb: dict) -> list[tuple[str, str, dict]]:
        out = []
        for cell in nb.get("cells", []):
            meta = (cell.get("metadata") or {}).get("nbgrader") or {}
            if meta.get("locked") or meta.get("grade"):
                src = cell.get("source", "")
                src = "".join(src) if isinstance(src, list) else str(src)
                # the release has no hidden tests; an instructor copy may lack checksums
                src = "\n".join(line for line in HIDDEN_RE.sub("", src).splitlines()
                                 if line.strip())
                try:
                    points = float(meta.get("points") or 0)
                except (TypeError, ValueError):
                    points = -1.0
                keys = {"grade": bool(meta.get("grade")), "solution": bool(meta.get("solution")),
                        "points": points,
                        "timeout": (cell.get("metadata") or {}).get("timeout")}
                out.append((str(meta.get("grade_id")), src, keys))
        return out

    try:
        released = locked(json.loads(release_nb.read_text()))
        submitted = locked(json.loads(submitted_nb.read_text()))
    except Exception:  # noqa: BLE001 - unreadable files are reported as malformed elsewhere
        return []
    name, changes = submitted_nb.name, []
    by_id: dict[str, list] = {}
    for gid, src, keys in submitted:
        by_id.setdefault(gid, []).append((src, keys))
    for gid, src, keys in released:
        got = by_id.get(gid, [])
        if not got:
            changes.append(f"{name}: test cell {gid} was deleted or lost its metadata")
        elif len(got) > 1:
            changes.append(f"{name}: test cell {gid} appears {len(got)} times")
        elif got[0][0] != src:
            changes.append(f"{name}: test cell {gid} was edited")
        elif got[0][1] != keys:
            which = ", ".join(k for k in keys if got[0][1][k] != keys[k])
            changes.append(f"{name}: the metadata of {gid} was changed ({which})")
    order = [g for g, _, _ in submitted if g in {r[0] for r in released}]
    if list(dict.fromkeys(order)) != [g for g, _, _ in released if g in order]:
        changes.append(f"{name}: test cells were reordered")
    return changes


# a gradebook server that is down or restarting, as SQLAlchemy and libpq report it
GRADEBOOK_DOWN = re.compile(r"OperationalError|could not connect to server|Connection refused|"
                            r"terminating connection|server closed the connection|"
                            r"the database system is (?:starting up|shutting down)", re.I)
GRADEBOOK_RETRIES = (2, 5, 10, 20)  # seconds between attempts: rides out a server restart
# outcomes that say nothing about the submission: --resume grades them again
REGRADABLE = ("error", "crashed")


def gradebook_down(res: dict) -> bool:
    """Did this autograde job fail because the gradebook could not be reached? The worker's
    word (``gradebook_lost``: SQLAlchemy read one of its errors as a lost or refused
    connection), else the words of its error and log."""
    text = f"{res.get('error') or ''}\n{res.get('log') or ''}\n{res.get('stderr') or ''}"
    return not res.get("killed") and bool(res.get("gradebook_lost")
                                          or GRADEBOOK_DOWN.search(text))


def grade_one(root: Path, student: str, assignment: str, timeout: float,
              worker: Worker) -> dict:
    t0 = time.monotonic()
    rec = {"student": student, "assignment": assignment}
    subdir = root / "submitted" / student / assignment
    # a status file says how the last grading of the submission ended: the old one goes
    # first, so that a grading that cannot finish (or write its status) never leaves "graded"
    _status_path(root, assignment, student).unlink(missing_ok=True)
    why = _malformed(subdir)
    if why:
        # it replaces an earlier submission: no output (gradebook, table, export, feedback)
        # may keep that one's score, time or feedback
        res = worker.run("forget", assignment, student, timeout=timeout)
        if not res.get("success"):
            raise RuntimeError(f"the earlier grade of {student}/{assignment} could not be "
                               f"removed: {res.get('error')}")
        rec.update(status="malformed", detail=why, timestamp=_submitted_at(subdir))
    else:
        res = worker.run("autograde", assignment, student, timeout=timeout)
        for pause in GRADEBOOK_RETRIES:  # a gradebook restarting: wait and grade again
            if res.get("success") or not gradebook_down(res):
                break
            time.sleep(pause)
            res = worker.run("autograde", assignment, student, timeout=timeout)
        reports = res.get("reports") or []
        changes = [c for nb in sorted(subdir.glob("*.ipynb"))
                   for c in test_cell_changes(root / "release" / assignment / nb.name, nb)]
        tampered = list(dict.fromkeys(t for r in reports for t in r.get("tampered", [])))
        died = [r["died"] for r in reports if r.get("died")]
        if res.get("killed") == "timeout":
            rec.update(status="timeout", detail=f"the whole submission {res['error']}")
        elif not res.get("success") and gradebook_down(res):
            rec.update(status="error", detail="the gradebook could not be reached after "
                       f"{len(GRADEBOOK_RETRIES) + 1} attempts (an infrastructure fault, not "
                       "the submission's): grade it again with autograde --resume")
        elif not res.get("success"):
            log = (res.get("log") or "") + (res.get("stderr") or "")
            rec.update(status="crashed", detail=_cause(log) or
                       str(res.get("error") or "nbgrader failed")[:500], log=log[-3000:])
        elif died:
            late = any(r.get("timed_out") for r in reports)  # a CPU or wall-clock limit
            limit = any(r.get("limit") for r in reports)  # memory, disk, file size
            rec.update(status="timeout" if late else "limit" if limit else "crashed",
                       detail="; ".join(died))
        elif res.get("timeouts"):
            cells = res["timeouts"]
            rec.update(status="timeout", detail=f"{len(cells)} cell(s) ran past the per-cell time "
                       f"limit and were interrupted: {', '.join(cells)}")
        elif res.get("memory"):
            rec.update(status="limit", detail="ran out of its memory limit in "
                       + ", ".join(res["memory"]))
        elif res.get("disk"):
            rec.update(status="limit", detail="wrote a file larger than the limit in "
                       + ", ".join(res["disk"]))
        elif tampered or changes:
            detail = "; ".join(tampered + changes)
            if changes and not tampered:
                detail += " (the original test cells were restored from the gradebook and graded)"
            rec.update(status="tampered", detail=detail)
        else:
            rec.update(status="graded")
        left = {cell: n for r in reports for cell, n in (r.get("left_running") or {}).items()}
        if left:  # flagged whatever the status: a cell's processes end with the cell
            rec["left_running"] = left
            rec["detail"] = "; ".join(filter(None, [rec.get("detail"), (
                "processes left running by " + ", ".join(f"{c} ({n})" for c, n in left.items())
                + " were ended after their cell")]))
        if reports:
            rec["isolation"] = reports[0].get("isolation")
            rec["process_limit"] = reports[0].get("process_limit")
            # checks decided by the checker's answer to the same programs in an earlier run
            rec["checks_from_cache"] = sum(r.get("checks_from_cache", 0) for r in reports)
        # nbgrader's autograde did not finish: the gradebook's row, if any, is an earlier
        # submission's, whose time and score no export may show as this one's
        rec.update(timestamp=_submitted_at(subdir), in_gradebook=bool(res.get("success")))
    rec["seconds"] = round(time.monotonic() - t0, 2)
    write_status(root, assignment, student, rec)
    return rec
