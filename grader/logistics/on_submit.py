"""Grading on submit, for a class on JupyterHub: each new submission to the exchange is
collected, graded on the Dask cluster and its feedback released to its learner within a minute.

Off by default. ``pallas-course grade-on-submit A`` turns it on for assignment A (``--all``: for
the course, assignments added later included) and ``--off`` off again. The setting is a file in
the course folder (``SETTING``), which only the instructors' group can write: no root, no
service restarted, no secret anywhere. The watcher reads it at every poll.

The watcher, ``pallas-course watch --scheduler URL``, is a service of ``deploy/setup-class.sh``,
run as the grading account: a member of the instructors' group (it reads the exchange's inbound
entries, writes the course folder and the exchange's feedback), the owner of a gradebook
password file (``~/.pgpass``) and able to read the Dask key. Every ``POLL_SECONDS`` it looks at
the exchange's inbound entries of the assignments turned on, and for each student:

- an entry that collect refuses (``inbound.inbound_entries``: not a folder, or made by an account
  other than the student it names) is logged once, never collected or graded;
- when the student's newest own entry is later, by the server's clock (``inbound.entry_time``),
  than the submission collected, it is collected by the course's collector (``OwnedCollect``,
  the formgrader's Collect: a ``grader.logistics.worker`` job), graded on the cluster
  (``batch.autograde``) and its feedback made and released to the exchange for that learner
  (``batch.released_feedback``). A resubmission is a newer entry: graded again, the latest counts;
- a grading that ended ``error`` (the gradebook or the cluster out of reach: never a learner's
  0), a collect or a release that failed, is tried again after ``RETRY_SECONDS``, then after
  twice as long each time, ``MAX_ATTEMPTS`` attempts in all; then the watcher gives up on that
  submission, says what to run by hand, and tries again only when the learner submits anew.
  Each failure is one line: what failed, its cause, and when it is tried again.

Whatever one submission does, the watcher goes on with the others; its log (standard output) has
a line for each thing it did to a submission, and it writes the time of its last look
(``SEEN``), which ``pallas-course grade-on-submit`` shows.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from grader.jail import sandbox
from grader.logistics import batch, build, inbound
from grader.logistics.collect import expected_notebooks
from grader.logistics.submission import Worker, read_status, write_status
from grader.logistics.worker import load

SETTING = "grade_on_submit.json"  # in the course folder: {"course": bool, "assignments": [...]}
SEEN = "grade_on_submit.seen"  # in the course folder: the watcher's last look, and how many
POLL_SECONDS = 5.0
RETRY_SECONDS = 60.0  # the first retry's wait; each next one waits twice as long
MAX_ATTEMPTS = 5  # of one collect, grading or release: 60 s to 16 min apart, 31 min in all
COLLECT_TIMEOUT = 300  # seconds for one collect job
NO_FEEDBACK = ("error", "malformed")  # no grade to give feedback on (the status says why)


# ----------------------------------------------------------------------------- the setting
def setting(root: Path) -> dict:
    """The course's grading-on-submit setting: ``course`` (every assignment) and the
    ``assignments`` turned on one by one."""
    try:
        data = json.loads((root / SETTING).read_text())
    except FileNotFoundError:
        data = {}
    return {"course": bool(data.get("course")), "assignments": sorted(data.get("assignments", []))}


def assignments_on(root: Path, on: dict) -> list[str]:
    """The assignments ``on`` (a ``setting``) grades on submit."""
    known = build.assignments(root)
    return known if on["course"] else [a for a in on["assignments"] if a in known]


def turn(root: Path, assignment: str | None, on: bool) -> dict:
    """Turn grading on submit on or off for ``assignment``, or for the course when None; the
    new setting."""
    now = setting(root)
    if assignment is None:
        new = {"course": on, "assignments": now["assignments"] if on else []}
    elif assignment not in build.assignments(root):
        raise ValueError(f"no assignment {assignment!r} under {root / 'source'}; known: "
                         f"{', '.join(build.assignments(root))}")
    elif not on and now["course"]:
        raise ValueError("grading on submit is on for the whole course: turn it off with "
                         "--all --off, then on for the assignments that keep it")
    else:
        names = (set(now["assignments"]) | {assignment}) if on \
            else (set(now["assignments"]) - {assignment})
        new = {"course": now["course"], "assignments": sorted(names)}
    tmp = root / f".{SETTING}.tmp"
    tmp.write_text(json.dumps(new))
    os.replace(tmp, root / SETTING)
    return new


def describe(on: dict) -> str:
    if on["course"]:
        return "on for every assignment of the course"
    if on["assignments"]:
        return f"on for {', '.join(on['assignments'])}"
    return "off"


def last_seen(root: Path) -> str:
    """When the watcher last looked at the exchange, in words."""
    try:
        seen = json.loads((root / SEEN).read_text())
    except (FileNotFoundError, ValueError):
        return "no watcher has looked at the exchange yet (deploy/setup-class.sh starts it)"
    ago = time.time() - seen["time"]
    return f"the watcher last looked at the exchange {ago:.0f} s ago"


# ----------------------------------------------------------------------------- the watcher
class Watcher:
    """Collects, grades on the cluster at ``scheduler`` and releases feedback for each new
    submission of the assignments turned on; ``step`` is one look at the exchange."""

    def __init__(self, root: Path, scheduler: str, log=print):
        cfg = load(root)[0]  # the course's nbgrader configuration: the exchange collect reads
        self.entries = Path(cfg.Exchange.root) / cfg.CourseDirectory.course_id / "inbound"
        self.root, self.scheduler, self.log = root, scheduler, log
        self.reported: set[str] = set()  # refused entries, logged once each
        self.not_before: dict[tuple[str, str], float] = {}  # (student, assignment): retry time
        self.failures: dict[tuple[str, str], int] = {}  # failed attempts in a row
        self.newest: dict[tuple[str, str], datetime] = {}  # the newest entry's time
        self.gave_up: dict[tuple[str, str], datetime] = {}  # the newest entry's time then
        self.feedback_due: set[tuple[str, str]] = set()  # graded, feedback not released yet
        self.on: dict | None = None
        self.steps = 0
        self.slot, self._slot_lock = sandbox.claim_slot()
        self.worker = Worker(root, self.slot)  # collect and feedback: nbgrader started once

    def close(self) -> None:
        self.worker.close()
        os.close(self._slot_lock)

    def step(self) -> None:
        on = setting(self.root)
        if on != self.on:
            self.log(f"grading on submit is {describe(on)}")
            self.on = on
        for assignment in assignments_on(self.root, on):
            try:
                self.handle(assignment, self.due(assignment))
            except Exception as e:  # noqa: BLE001 - one assignment's fault never stops the others
                self.log(f"{assignment}: this look failed ({one_line(f'{type(e).__name__}: {e}')})"
                         f"; the next, in {POLL_SECONDS:g} s, tries again")
        self.steps += 1
        seen = self.root / f".{SEEN}.tmp"
        seen.write_text(json.dumps({"time": time.time(), "steps": self.steps}))
        os.replace(seen, self.root / SEEN)

    def due(self, assignment: str) -> dict[str, tuple[str, datetime | None]]:
        """Student -> (what is due: new, regrade or feedback; the newest entry's time)."""
        newest: dict[str, datetime] = {}
        expected = expected_notebooks(self.root, assignment)
        for entry in inbound.inbound_entries(self.entries, assignment):
            if entry.refused:
                if entry.path.name not in self.reported:
                    self.reported.add(entry.path.name)
                    self.log(f"{entry.student}/{assignment}: entry {entry.path.name!r} "
                             f"{entry.refused}: refused, not graded")
                continue
            try:
                when = inbound.entry_time(entry.path, entry.uid, expected)
            except FileNotFoundError:  # its owner deleted it meanwhile
                continue
            newest[entry.student] = max(newest.get(entry.student, when), when)
        out: dict[str, tuple[str, datetime | None]] = {}
        for student, when in newest.items():
            key = (student, assignment)
            self.newest[key] = when
            if key in self.gave_up and when > self.gave_up[key]:  # submitted anew: start over
                del self.gave_up[key]
                self.failures.pop(key, None)
                self.not_before.pop(key, None)
            if key in self.gave_up or self.not_before.get(key, 0.0) > time.monotonic():
                continue
            collected = inbound.collected_at(self.root / "submitted" / student / assignment)
            if collected is None or when > collected:
                out[student] = ("new", when)
            elif (read_status(self.root, assignment, student) or {}).get("status") == "error":
                out[student] = ("regrade", None)
            elif key in self.feedback_due:
                out[student] = ("feedback", None)
        return out

    def handle(self, assignment: str, due: dict[str, tuple[str, datetime | None]]) -> None:
        grade = [s for s, (why, _) in due.items() if why == "regrade"]
        grade += [s for s, (why, when) in due.items()
                  if why == "new" and self.collect(assignment, s, when)]
        graded = self.grade(assignment, sorted(grade))
        for s in sorted([s for s, status in graded.items() if status not in NO_FEEDBACK]
                        + [s for s, (why, _) in due.items() if why == "feedback"]):
            self.release(assignment, s)

    def retry_later(self, student: str, assignment: str, failed: str, why: str,
                    by_hand: str) -> None:
        """Log, in one line, that ``failed`` (what the watcher did) because ``why``, and when
        it is tried again: after a wait that doubles with each failure in a row, until
        ``MAX_ATTEMPTS``; then ``by_hand`` (the command that does it) is what to do."""
        key = (student, assignment)
        attempts = self.failures[key] = self.failures.get(key, 0) + 1
        said = f"{student}/{assignment}: {failed} ({one_line(why)})"
        if attempts >= MAX_ATTEMPTS:
            self.gave_up[key] = self.newest.get(key) or inbound.collected_at(
                self.root / "submitted" / student / assignment) or datetime.now(UTC)
            self.log(f"{said}; gave up after {attempts} attempts: {by_hand}; a new submission "
                     "is taken again")
            return
        wait = RETRY_SECONDS * 2 ** (attempts - 1)
        self.not_before[key] = time.monotonic() + wait
        self.log(f"{said}; tried again in {wait:.0f} s (attempt {attempts} of {MAX_ATTEMPTS})")

    def succeeded(self, student: str, assignment: str) -> None:
        self.failures.pop((student, assignment), None)

    def collect(self, assignment: str, student: str, when: datetime) -> bool:
        """Collect ``student``'s submission made at ``when`` (or a later one); did it come?"""
        res = self.worker.run("collect", assignment, student, timeout=COLLECT_TIMEOUT)
        got = inbound.collected_at(self.root / "submitted" / student / assignment)
        if res.get("success") and got is not None and got >= when:
            self.log(f"{student}/{assignment}: collected the submission of "
                     f"{got:%Y-%m-%d %H:%M:%S} UTC")
            return True
        if res.get("success"):  # nbgrader's collect ran and took nothing newer
            why = ("the collector took no submission newer than the one collected: "
                   + one_line(res.get("log") or "its log says nothing"))
        else:
            why = res.get("error") or res.get("log") or "the collect job gave no reason"
        self.retry_later(student, assignment, "not collected", why,
                         f"collect it in the formgrader (Manage Assignments, {assignment}, "
                         "Collect) and see its log")
        return False

    def grade(self, assignment: str, students: list[str]) -> dict[str, str]:
        """Grade ``students``' submissions of ``assignment`` on the cluster; student -> status."""
        if not students:
            return {}
        try:
            results = batch.autograde(self.root, assignment, scheduler=self.scheduler,
                                      students=students, progress=None, log=lambda *_: None)
        except Exception as e:  # noqa: BLE001 - the cluster or the gradebook out of reach
            results = []
            for s in students:
                rec = read_status(self.root, assignment, s)
                if rec is None:  # its grading never ended: an infrastructure fault, not a 0
                    rec = {"student": s, "assignment": assignment, "status": "error",
                           "detail": f"grading it on the cluster failed ({type(e).__name__}: "
                                     f"{e}), an infrastructure fault, not the submission's: "
                                     "the watcher grades it again"}
                    write_status(self.root, assignment, s, rec)
                results.append(rec)
        for r in results:
            s, status = r["student"], r["status"]
            score = (f"{r['score']:g} / {r['max_score']:g}, " if r.get("max_score") else "")
            detail = f" ({one_line(r['detail'])})" if r.get("detail") else ""
            self.log(f"{s}/{assignment}: graded on the cluster: {score}{status}{detail}")
            if status == "error":
                self.retry_later(s, assignment, "not graded", r.get("detail") or "error",
                                 f"once the cluster and the gradebook answer, run pallas-course "
                                 f"autograde {assignment} --student {s} --scheduler "
                                 f"{self.scheduler}")
            else:
                self.succeeded(s, assignment)
        return {r["student"]: r["status"] for r in results}

    def release(self, assignment: str, student: str) -> None:
        said: list[str] = []
        files, problem = batch.released_feedback(self.worker, self.root, assignment, student,
                                                 log=said.append)
        key = (student, assignment)
        if problem or not files:
            self.feedback_due.add(key)
            self.retry_later(student, assignment, "feedback not released", problem or (
                "nbgrader made no feedback page for this submission: "
                + one_line("\n".join(said))), f"run pallas-course feedback {assignment}")
        else:
            self.feedback_due.discard(key)
            self.succeeded(student, assignment)
            self.log(f"{student}/{assignment}: feedback released to the exchange for "
                     f"{student} ({', '.join(f.name for f in files)})")


def one_line(text: str) -> str:
    """The cause in ``text`` (a reason, an error, a log) as one line: its last line that names
    an exception (``ValueError: ...``), else its first line; at most 300 characters."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", line)]
    return ((errors or lines or ["no reason given"])[-1 if errors else 0])[:300]


def watch(root: Path, scheduler: str, poll: float = POLL_SECONDS) -> None:
    """The watcher's service: a look at the exchange every ``poll`` seconds, until killed."""
    def log(message: str) -> None:
        print(f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} {message}", flush=True)

    watcher = Watcher(root, scheduler, log)
    log(f"watching {watcher.entries} every {poll:g} s; grading on {scheduler}")
    try:
        while True:
            try:
                watcher.step()
            except Exception as e:  # noqa: BLE001 - the setting unreadable, the course folder gone
                log(f"this look failed ({one_line(f'{type(e).__name__}: {e}')}); the next, in "
                    f"{poll:g} s, tries again; check that {root} and {SETTING} in it are "
                    "readable by this account")
            time.sleep(poll)
    finally:
        watcher.close()
