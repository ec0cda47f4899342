"""The grading side of ``pallas-course``: release, collect, autograde, feedback, export, check.

Every nbgrader step runs in a child process (``grader.grading.worker``). Autograde keeps one worker
process per slot for the whole batch; inside it, each notebook is executed once, by the
grader's own run of it in the jail under limits, and the test cells are judged in the worker
(``grader.grading.trusted``), so a submission that kills that run, loops, exhausts memory or patches
the checks never takes the batch down or changes another grade.

Statuses (one JSON file per submission under ``<root>/status/<assignment>/<student>.json``,
written atomically, so a batch can be resumed and read while it runs): graded; timeout (a cell,
the run's CPU or wall-clock limit or the whole submission ran out of time); crashed (the run
died, ran out of memory or hit the disk or file-size limit, or nbgrader failed); malformed (not
a readable notebook; it scores 0, also when an earlier submission had a grade); error (the
gradebook could not be reached: an infrastructure fault, never a learner's 0, graded again by
``--resume`` like crashed); tampered (the notebook's code changed the grading code in the grader's
run of it, or test cells were edited, deleted, duplicated or reordered, which nbgrader undoes
before grading); missing (no submission).
"""

from __future__ import annotations

import contextlib
import csv
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
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader.grading import build, refs, sandbox
from grader.learner import workspace
from grader.learner.check import HIDDEN_RE

SUBMISSION_TIMEOUT = 900  # seconds for one whole submission (cells have their own timeouts)
# the gradebook's URL when it is not SQLite in the course folder (pallas-course --db); every
# nbgrader process reads it through nbgrader_config.py
DB_ENV = "PALLAS_COURSE_DB"


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PALLAS_COURSE_ROOT"] = str(root)
    env["PYTHONPATH"] = str(refs.REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_worker(root: Path, *args: str, timeout: float | None = None) -> dict:
    """Run one ``grader.grading.worker`` job in a fresh worker; its result dict (``success`` False
    on any failure). It claims a slot like a batch does: a release or a validation beside another
    grader on this machine must not run under, and kill, that grader's sandbox uid."""
    with sandbox.claimed_slot() as slot:
        worker = Worker(root, slot)
        try:
            return worker.run(*args, timeout=timeout)
        finally:
            worker.close()


# ----------------------------------------------------------------------------- release
def release(root: Path, assignment: str | None = None, log=print) -> list[str]:
    names = [assignment] if assignment else build.assignments(root)
    for a in names:
        nbs = build.build_assignment(root, a)
        log(f"built {', '.join(str(p.relative_to(root)) for p in nbs)}")
    # nbgrader's --force deletes release/<a>/: move anyone's edited notebook out of it first
    workspace.keep_edited_releases(root, names, log=log)
    res = run_worker(root, "generate", *names)
    failed = [a for a, r in res.get("results", {}).items() if not r["success"]]
    if not res.get("results"):
        raise RuntimeError(f"nbgrader generate_assignment failed: {res.get('error')}\n"
                           f"{res.get('log', '')}")
    for a in names:
        if a in failed:
            r = res["results"][a]
            raise RuntimeError(f"nbgrader generate_assignment {a} failed: {r['error']}\n"
                               f"{r['log']}")
        rel = root / "release" / a
        for leaked in list(rel.rglob("*.py")):
            leaked.unlink()  # belt and braces: a jupytext twin holds the solutions
        n = refs.write_visible(root, a, rel / "refs")
        log(f"released {a} -> {rel.relative_to(root)} ({n} visible reference cases)")
    workspace.record_release(root, names)
    return names


# ----------------------------------------------------------------------------- autograde
def _status_path(root: Path, assignment: str, student: str) -> Path:
    return root / "status" / assignment / f"{student}.json"


def _write_status(root: Path, assignment: str, student: str, record: dict) -> None:
    p = _status_path(root, assignment, student)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, p)


def read_status(root: Path, assignment: str, student: str) -> dict | None:
    p = _status_path(root, assignment, student)
    return json.loads(p.read_text()) if p.exists() else None


def _malformed(subdir: Path) -> str | None:
    import nbformat

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
    from nbgrader.utils import parse_utc

    try:
        return str(parse_utc((subdir / "timestamp.txt").read_text().strip()))
    except (OSError, ValueError):
        return ""


def submissions(root: Path, assignment: str | None = None) -> list[tuple[str, str]]:
    sub = root / "submitted"
    out = []
    if not sub.is_dir():
        return out
    for s in sorted(p for p in sub.iterdir() if p.is_dir()):
        for a in sorted(p for p in s.iterdir() if p.is_dir()):
            if assignment is None or a.name == assignment:
                out.append((s.name, a.name))
    return out


def _scores(root: Path) -> dict[tuple[str, str], tuple[float, float]]:
    from nbgrader.api import Gradebook

    out = {}
    db = root / "gradebook.db"
    url = os.environ.get(DB_ENV) or f"sqlite:///{db}?timeout=120"  # as nbgrader_config.py
    if url.startswith("sqlite") and not db.exists():
        return out
    with Gradebook(url, "pallas-course") as gb:
        for a in gb.assignments:
            for sub in a.submissions:
                out[(sub.student.id, a.name)] = (float(sub.score), float(sub.max_score))
    return out


class Worker:
    """A long-lived ``grader.grading.worker serve`` process: nbgrader starts once, not per
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
        env = {**_env(self.root), sandbox.SLOT_ENV: str(self.slot)}
        # it dies with the thread that started it (and its jailed run with it: bwrap
        # --die-with-parent): a grader or Dask worker killed mid-job leaves no autograde running
        # beside the one that grades the submission again
        die = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        self.proc = subprocess.Popen(
            [*die, sys.executable, "-m", "grader.grading.worker", str(self.root), "serve"],
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
                uid = sandbox.sandbox_uid(self.slot)
                if uid is not None:  # what the killed worker's run left
                    sandbox.kill_uid(uid)
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
    """Did this autograde job fail because the gradebook could not be reached?"""
    text = f"{res.get('error') or ''}\n{res.get('log') or ''}\n{res.get('stderr') or ''}"
    return not res.get("killed") and bool(GRADEBOOK_DOWN.search(text))


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
            rec.update(status="timeout" if late else "crashed", detail="; ".join(died))
        elif res.get("timeouts"):
            cells = res["timeouts"]
            rec.update(status="timeout", detail=f"{len(cells)} cell(s) ran past the per-cell time "
                       f"limit and were interrupted: {', '.join(cells)}")
        elif res.get("memory"):
            rec.update(status="crashed", detail="ran out of its memory limit in "
                       + ", ".join(res["memory"]))
        elif res.get("disk"):
            rec.update(status="crashed", detail="wrote a file larger than the limit in "
                       + ", ".join(res["disk"]))
        elif tampered or changes:
            detail = "; ".join(tampered + changes)
            if changes and not tampered:
                detail += " (the original test cells were restored from the gradebook and graded)"
            rec.update(status="tampered", detail=detail)
        else:
            rec.update(status="graded")
        if reports:
            rec["isolation"] = reports[0].get("isolation")
    rec["seconds"] = round(time.monotonic() - t0, 2)
    _write_status(root, assignment, student, rec)
    return rec


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def _graded_locally(root: Path, todo: list[tuple[str, str]], timeout: float, workers: int):
    """``(student, assignment, future)`` as each submission is graded by a local worker pool."""
    slots: queue.Queue[Worker] = queue.Queue()

    def grade(s: str, a: str) -> dict:
        worker = slots.get()  # one submission per worker at a time
        try:
            return grade_one(root, s, a, timeout, worker)
        finally:
            slots.put(worker)

    with contextlib.ExitStack() as held:  # the slots' locks, released after the workers close
        try:
            for _ in range(max(1, workers)):
                slots.put(Worker(root, held.enter_context(sandbox.claimed_slot())))
            if todo:
                check_jail(slots.queue[0])
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                futs = {pool.submit(grade, s, a): (s, a) for s, a in todo}
                for fut in as_completed(futs):
                    yield (*futs[fut], fut)
        finally:
            while not slots.empty():
                slots.get().close()


def autograde(root: Path, assignment: str | None = None, workers: int = 1,
              timeout: float = SUBMISSION_TIMEOUT, resume: bool = False,
              progress=sys.stderr, log=print, scheduler: str | None = None,
              student: str | None = None) -> list[dict]:
    """Grade the submissions (of ``student`` only, when named) on ``workers`` local workers,
    or on the Dask cluster whose scheduler is at ``scheduler`` (``tcp://HOST:8786``, see
    ``grader.grading.cluster``)."""
    todo = [(s, a) for s, a in submissions(root, assignment) if student in (None, s)]
    if student is not None and not todo:
        raise FileNotFoundError(f"no submission of {student!r} under {root / 'submitted'}: "
                                "collect it first, or check the student id")
    if resume:
        # a status file is written when a submission is finished, whatever its outcome; one
        # that was in progress when the batch stopped has none and is graded again, as is one
        # that an infrastructure fault (error) or a crash left without a grade
        todo = [(s, a) for s, a in todo
                if (read_status(root, a, s) or {}).get("status", "error") in REGRADABLE]
    results: list[dict] = []
    t0 = time.monotonic()
    if progress:
        print(_bar(0, len(todo)), end="\r", file=progress, flush=True)
    if scheduler:
        from grader.grading import cluster

        finished = cluster.graded_on(scheduler, root, todo, timeout, log=log)
    else:
        finished = _graded_locally(root, todo, timeout, workers)
    for s, a, fut in finished:
        try:
            rec = fut.result()
        except Exception as e:  # noqa: BLE001 - one bad item never stops the batch
            rec = {"student": s, "assignment": a, "status": "crashed",
                   "detail": f"{type(e).__name__}: {e}"}
            _write_status(root, a, s, rec)
        results.append(rec)
        if progress:
            print(f"{_bar(len(results), len(todo))} {s}/{a}: {rec['status']}      ",
                  end="\r", file=progress, flush=True)
    if progress:
        print(file=progress)
    scores = _scores(root)
    for r in results:
        sc = scores.get((r["student"], r["assignment"]))
        r["score"], r["max_score"] = sc if sc else (0.0, None)
    results.sort(key=lambda r: (r["assignment"], r["student"]))
    log(summary_table(results))
    log(f"{len(results)} submission(s) in {time.monotonic() - t0:.1f} s "
        + (f"on the Dask cluster at {scheduler}" if scheduler else f"with {workers} worker(s)"))
    return results


def summary_table(results: list[dict]) -> str:
    rows = [("student", "assignment", "score", "status")]
    for r in results:
        mx = r.get("max_score")
        score = f"{r.get('score', 0):g} / {mx:g}" if mx else f"{r.get('score', 0):g}"
        rows.append((r["student"], r["assignment"], score, r["status"]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- feedback/export
def feedback(root: Path, assignment: str | None = None, log=print) -> list[Path]:
    names = [assignment] if assignment else sorted({a for _, a in submissions(root)})
    out = []
    for a in names:
        res = run_worker(root, "feedback", a)
        if not res.get("success"):
            log(f"feedback for {a} failed: {res.get('error')}\n{res.get('log', '')[-2000:]}")
        files = sorted((root / "feedback").glob(f"*/{a}/*.html"))
        for f in files:
            _scrub_hidden(f)
        out.extend(files)
        where = (f"released to the exchange ({res['exchange']}): learners get it with "
                 "Assignments -> Fetch feedback" if res.get("exchange") and res.get("success")
                 else "no exchange to release it to: send the files, or set one up "
                 "(README, Teaching a class)")
        log(f"feedback {a}: {len(files)} HTML file(s) under {root / 'feedback'}; {where}")
        for student, why in res.get("not_released", {}).items():
            log(f"feedback {a}: not released for {student}: {why}")
    return out


def _scrub_hidden(html: Path) -> None:
    """Defence in depth: ClearHiddenTests already ran; make sure no hidden call survives."""
    text = html.read_text()
    if "course.check(" in text and "hidden=True" in text or "BEGIN HIDDEN TESTS" in text:
        raise RuntimeError(f"{html}: hidden tests leaked into feedback; check nbgrader_config.py")


LMS_FORMATS = ("canvas", "moodle")


def lms_table(rows: list[dict], lms: str) -> list[list[str]]:
    """The export's rows as a gradebook import table: one row per student, one column per
    assignment (its score after the late penalty). Canvas: its export's first columns, the
    student matched by SIS Login ID (the hub's user name), then a "Points Possible" row; new
    columns become assignments. Moodle: a "Username" column to map to the user's username, the
    assignment columns to map to grade items."""
    assignments = sorted({r["assignment"] for r in rows})
    students = sorted({r["student_id"] for r in rows})
    score = {(r["student_id"], r["assignment"]): str(r.get("score") or 0) for r in rows}
    most = {a: max((float(r.get("max_score") or 0) for r in rows if r["assignment"] == a),
                   default=0.0) for a in assignments}
    if lms == "canvas":
        table = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *assignments],
                 ["Points Possible", "", "", "", "", *(f"{most[a]:g}" for a in assignments)]]
        return table + [[s, "", "", s, "", *(score.get((s, a), "0") for a in assignments)]
                        for s in students]
    if lms == "moodle":
        return [["Username", *assignments]] + [
            [s, *(score.get((s, a), "0") for a in assignments)] for s in students]
    raise ValueError(f"unknown gradebook format {lms!r}: one of {', '.join(LMS_FORMATS)}")


def export(root: Path, to: Path, log=print, lms: str | None = None) -> Path:
    """The grades CSV (nbgrader's columns plus late_by, status, reason), or with ``lms`` a
    table that gradebook imports (``lms_table``)."""
    to = Path(to).resolve()
    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "grades.csv"
        res = run_worker(root, "export", str(raw))
        if not res.get("success"):
            raise RuntimeError(f"nbgrader export failed: {res.get('error')}\n{res.get('log')}")
        with raw.open() as f:
            rows = list(csv.DictReader(f))
            fields = list(rows[0].keys()) if rows else ["assignment", "student_id", "score",
                                                          "max_score"]
    from grader.grading.late import late_by

    for row in rows:
        row["late_by"] = late_by(row.get("timestamp", ""), row.get("duedate", ""))
        st = read_status(root, row["assignment"], row["student_id"])
        row["reason"] = (st or {}).get("detail", "")
        if st:
            row["status"] = st["status"]
            if st["status"] == "malformed":  # its earlier grade is gone (grade_one): its time
                row["timestamp"] = st.get("timestamp", "")
                row["late_by"] = late_by(row["timestamp"], row.get("duedate", ""))
        elif row.get("timestamp") in ("", "None", None) and float(row.get("score") or 0) == 0:
            row["status"] = "missing"
        else:
            row["status"] = "graded"
    seen = {(r["student_id"], r["assignment"]) for r in rows}
    for st_file in sorted((root / "status").glob("*/*.json")):
        st = json.loads(st_file.read_text())
        if (st["student"], st["assignment"]) not in seen:  # never reached the gradebook
            rows.append({**{k: "" for k in fields}, "late_by": "", "assignment": st["assignment"],
                         "student_id": st["student"], "timestamp": st.get("timestamp", ""),
                         "score": 0, "status": st["status"], "reason": st.get("detail", "")})
    to.parent.mkdir(parents=True, exist_ok=True)
    with to.open("w", newline="") as f:
        if lms:
            csv.writer(f).writerows(lms_table(rows, lms))
        else:
            w = csv.DictWriter(f, fieldnames=[*fields, "late_by", "status", "reason"])
            w.writeheader()
            w.writerows(rows)
    log(f"exported {len(rows)} row(s) to {to}")
    return to
