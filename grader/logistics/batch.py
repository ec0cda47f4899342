"""The grading side of ``pallas-course``: release, collect, autograde, feedback, export, check.

Every nbgrader step runs in a child process (``grader.logistics.worker``). Autograde keeps one
worker process per slot for the whole batch; inside it, each notebook is executed once, by the
grader's own run of it in the jail under limits, and the test cells are judged in the worker
(``grader.jail.trusted``), so a submission that kills that run, loops, exhausts memory or patches
the checks never takes the batch down or changes another grade.

One submission is graded by ``grader.logistics.submission.grade_one``, which the Dask cluster
(``grader.logistics.cluster``) runs too; its status file says how that grading ended.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import queue
import sys
import tempfile
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader.jail import answer_cache, sandbox
from grader.logistics import build, cluster, hidden_tests, releases
from grader.logistics.submission import (
    DB_ENV,
    REGRADABLE,
    Worker,
    check_jail,
    grade_one,
    read_status,
    run_worker,
    write_status,
)
from grader.verdict import refs

SUBMISSION_TIMEOUT = 900  # seconds for one whole submission (cells have their own timeouts)


# ----------------------------------------------------------------------------- release
def release(root: Path, assignment: str | None = None, log=print) -> list[str]:
    names = [assignment] if assignment else build.assignments(root)
    for a in names:
        nbs = build.build_assignment(root, a)
        log(f"built {', '.join(str(p.relative_to(root)) for p in nbs)}")
    # nbgrader's --force deletes release/<a>/: move anyone's edited notebook out of it first
    releases.keep_edited_releases(root, names, log=log)
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
    releases.record_release(root, names)
    return names


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
    from nbgrader.api import Gradebook  # nbgrader takes seconds to import

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


# ----------------------------------------------------------------------------- autograde
def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def _graded_locally(root: Path, todo: list[tuple[str, str]], timeout: float, workers: int):
    """``(student, assignment, future)`` as each submission is graded by a local worker pool of
    at most ``workers``: no more than there are submissions (a worker costs seconds of imports),
    and none for an empty batch."""
    workers = min(max(1, workers), len(todo))
    if not workers:
        return
    slots: queue.Queue[Worker] = queue.Queue()

    def grade(s: str, a: str) -> dict:
        worker = slots.get()  # one submission per worker at a time
        try:
            return grade_one(root, s, a, timeout, worker)
        finally:
            slots.put(worker)

    with contextlib.ExitStack() as held:  # the slots' locks, released after the workers close
        try:
            for _ in range(workers):
                slots.put(Worker(root, held.enter_context(sandbox.claimed_slot())))
            check_jail(slots.queue[0])
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futs = {pool.submit(grade, s, a): (s, a) for s, a in todo}
                for fut in as_completed(futs):
                    yield (*futs[fut], fut)
        finally:
            while not slots.empty():
                slots.get().close()


def autograde(root: Path, assignment: str | None = None, workers: int = 1,
              timeout: float = SUBMISSION_TIMEOUT, resume: bool = False,
              progress=sys.stderr, log=print, scheduler: str | None = None,
              students: Collection[str] | None = None) -> list[dict]:
    """Grade the submissions (of ``students`` only, when named) on ``workers`` local workers,
    or on the Dask cluster whose scheduler is at ``scheduler`` (``tcp://HOST:8786``, see
    ``grader.logistics.cluster``)."""
    todo = [(s, a) for s, a in submissions(root, assignment)
            if students is None or s in students]
    absent = sorted(set(students or ()) - {s for s, _ in todo})
    if absent:
        raise FileNotFoundError(f"no submission of {', '.join(map(repr, absent))} under "
                                f"{root / 'submitted'}: collect it first, or check the "
                                "student id")
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
        finished = cluster.graded_on(scheduler, root, todo, timeout, log=log)
    else:
        finished = _graded_locally(root, todo, timeout, workers)
    for s, a, fut in finished:
        try:
            rec = fut.result()
        except Exception as e:  # noqa: BLE001 - one bad item never stops the batch
            # grade_one returns every outcome of the learner's code as a record: what it
            # raised is the grading's own fault (a worker or its machine lost), never a 0
            rec = {"student": s, "assignment": a, "status": "error",
                   "detail": f"grading it failed ({type(e).__name__}: {e}), an infrastructure "
                             "fault, not the submission's: grade it again with "
                             "autograde --resume"}
            write_status(root, a, s, rec)
        results.append(rec)
        if progress:
            print(f"{_bar(len(results), len(todo))} {s}/{a}: {rec['status']}      ",
                  end="\r", file=progress, flush=True)
    if progress:
        print(file=progress)
    answer_cache.AnswerCache(root / answer_cache.FOLDER).prune()
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
    """Every learner's feedback on ``assignment`` (on each assignment submitted, when None),
    made and released to the exchange where the course has one; the HTML files made."""
    names = [assignment] if assignment else sorted({a for _, a in submissions(root)})
    with sandbox.claimed_slot() as slot:
        worker = Worker(root, slot)
        try:
            return [f for a in names for f in released_feedback(worker, root, a, log=log)[0]]
        finally:
            worker.close()


def released_feedback(worker: Worker, root: Path, assignment: str, student: str | None = None,
                      log=print) -> tuple[list[Path], str | None]:
    """The feedback on ``assignment`` of ``student`` (of every learner when None), made by
    ``worker`` and released to the exchange where the course has one: the HTML files made,
    and why not all of it reached the learners (None: it did, or the course has no exchange
    and the log names the files to send)."""
    a = assignment
    res = worker.run("feedback", a, *([student] if student else []))
    problem = None
    if not res.get("success"):
        problem = f"feedback for {a} failed: {res.get('error')}"
        log(f"{problem}\n{res.get('log', '')[-2000:]}")
    withheld = [page for folder in sorted((root / "feedback").glob(f"{student or '*'}/{a}"))
                for page in hidden_tests.withheld_pages(folder)]
    # with an exchange, its release left these out and said why (``not_released``)
    for page in [] if res.get("exchange") else withheld:
        log(f"feedback {a}: {page} still holds a hidden test: never send it; nbgrader's "
            "ClearHiddenTests did not run (check the course's nbgrader_config.py)")
    files = [f for f in sorted((root / "feedback").glob(f"{student or '*'}/{a}/*.html"))
             if f not in withheld]
    where = (f"released to the exchange ({res['exchange']}): learners get it with "
             "Assignments -> Fetch feedback" if res.get("exchange") and res.get("success")
             else "no exchange to release it to: send the files, or set one up "
             "(README, Teaching a class)")
    log(f"feedback {a}: {len(files)} HTML file(s) under {root / 'feedback'}; {where}")
    for who, why in res.get("not_released", {}).items():
        log(f"feedback {a}: not released for {who}: {why}")
        problem = problem or f"not released: {why}"
    return files, problem


def extend(root: Path, student: str, assignment: str, hours: float, log=print) -> None:
    """Give ``student`` ``hours`` more on ``assignment`` (``late.grant_extension``) and bring
    what it changes up to date at once: a graded submission's late penalty in the gradebook
    (so its grade and every export) and its feedback, made and released again where there
    was some. Nothing is run again; a submission not graded yet gets it when it is."""
    from grader.gradebook import late  # imports nbgrader: this command's alone

    late.grant_extension(root, student, assignment, hours)
    log(f"{student} has {hours:g} h more on {assignment}" if hours
        else f"{student}'s extension on {assignment} is gone")
    if not (root / "autograded" / student / assignment).is_dir():
        log(f"  applied when {student}'s submission is graded (pallas-course autograde "
            f"{assignment} --student {student})")
        return
    with sandbox.claimed_slot() as slot:
        worker = Worker(root, slot)
        try:
            res = worker.run("extend", assignment, student)
            if not res.get("success"):
                raise RuntimeError(f"the extension is kept but the grade of {student} was not "
                                   f"updated: {res.get('error')}; run pallas-course autograde "
                                   f"{assignment} --student {student}")
            lost = sum(res.get("penalties", {}).values())
            log(f"  late penalty now {lost:g} point(s); the grade and exports say so")
            if (root / "feedback" / student / assignment).is_dir():
                files, problem = released_feedback(worker, root, assignment, student, log=log)
                if problem:
                    raise RuntimeError(f"{student}'s feedback on {assignment} was not remade: "
                                       f"{problem}; run pallas-course feedback {assignment}")
        finally:
            worker.close()


LMS_FORMATS = ("canvas", "moodle")
# statuses that export no grade (blank, with the reason), never a 0: those that say nothing
# about the submission, which --resume grades again (a learner breaking the jail's limits
# is `limit`, graded on what ran)
NO_GRADE = REGRADABLE


def lms_table(rows: list[dict], lms: str) -> list[list[str]]:
    """The export's rows as a gradebook import table: one row per student, one column per
    assignment (its score after the late penalty). Canvas: its export's first columns, the
    student matched by SIS Login ID (the hub's user name), then a "Points Possible" row; new
    columns become assignments. Moodle: a "Username" column to map to the user's username, the
    assignment columns to map to grade items. The roster's names and e-mails, where imported:
    Canvas's Student column reads "Last, First", Moodle's table gains "Email address". A
    submission without a grade of its own (``NO_GRADE``, or an earlier submission's grade in
    the gradebook) is a blank cell, no grade, in both; Moodle's table gives the reason in a
    column "<assignment> feedback" to map to that grade item's feedback, and the export's
    log names each."""
    assignments = sorted({r["assignment"] for r in rows})
    students = sorted({r["student_id"] for r in rows})
    # an infrastructure fault is no grade at all, never a 0: a blank cell, which both
    # gradebooks import as no grade; Moodle's table gives the reason as that grade's feedback
    score = {(r["student_id"], r["assignment"]):
             "" if r.get("score") == "" or r.get("status") in NO_GRADE
             else str(r.get("score") or 0) for r in rows}
    reason = {(r["student_id"], r["assignment"]): r.get("reason") or "" for r in rows
              if score[(r["student_id"], r["assignment"])] == ""}
    # from the roster (``pallas-course roster``), where the gradebook has one
    name = {r["student_id"]: ", ".join(p for p in (r.get("last_name"), r.get("first_name"))
                                       if p and p != "None") for r in rows}
    email = {r["student_id"]: r.get("email") for r in rows
             if r.get("email") and r.get("email") != "None"}
    most = {a: max((float(r.get("max_score") or 0) for r in rows if r["assignment"] == a),
                   default=0.0) for a in assignments}
    if lms == "canvas":
        table = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *assignments],
                 ["Points Possible", "", "", "", "", *(f"{most[a]:g}" for a in assignments)]]
        return table + [[name[s] or s, "", "", s, "", *(score.get((s, a), "0")
                                                         for a in assignments)]
                        for s in students]
    if lms == "moodle":  # an e-mail column where the roster gave any, to map users by
        def mail(s: str) -> list[str]:
            return [email.get(s, "")] if email else []

        # a feedback column beside each assignment with a grade left blank, to map in the
        # import to that grade item's feedback
        why = [a for a in assignments if any(k[1] == a for k in reason)]

        header = ["Username", *(["Email address"] if email else [])]
        for a in assignments:
            header += [a, f"{a} feedback"] if a in why else [a]

        def cells(s: str) -> list[str]:
            out = []
            for a in assignments:
                out += [score.get((s, a), "0"), reason.get((s, a), "")] if a in why \
                    else [score.get((s, a), "0")]
            return out

        return [header] + [[s, *mail(s), *cells(s)] for s in students]
    raise ValueError(f"unknown gradebook format {lms!r}: one of {', '.join(LMS_FORMATS)}")


def export(root: Path, to: Path, log=print, lms: str | None = None) -> Path:
    """The grades CSV (nbgrader's columns, with the roster's names and e-mails, plus the
    student's extension, late_by, status, reason), or with ``lms`` a table that gradebook
    imports (``lms_table``)."""
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
    # imports nbgrader, seconds: the export's alone
    from grader.gradebook.late import extensions, late_by

    granted = extensions(root)
    for row in rows:
        hours = granted.get(row["assignment"], {}).get(row["student_id"], 0.0)
        row["extension_hours"] = f"{hours:g}" if hours else ""
        row["late_by"] = late_by(row.get("timestamp", ""), row.get("duedate", ""), hours)
        st = read_status(root, row["assignment"], row["student_id"])
        row["reason"] = (st or {}).get("detail", "")
        if st:
            row["status"] = st["status"]
            if st["status"] == "malformed" or not st.get("in_gradebook", True):
                # its earlier grade is gone (grade_one), or the gradebook's row is an earlier
                # submission's: this submission's time, and no grade but its own
                row["timestamp"] = st.get("timestamp", "")
                row["late_by"] = late_by(row["timestamp"], row.get("duedate", ""), hours)
            if not st.get("in_gradebook", True):
                row["score"] = ""
        elif row.get("timestamp") in ("", "None", None) and float(row.get("score") or 0) == 0:
            row["status"] = "missing"
        else:
            row["status"] = "graded"
    seen = {(r["student_id"], r["assignment"]) for r in rows}
    for st_file in sorted((root / "status").glob("*/*.json")):
        st = json.loads(st_file.read_text())
        if (st["student"], st["assignment"]) not in seen:  # never reached the gradebook
            rows.append({**{k: "" for k in fields}, "extension_hours": "", "late_by": "",
                         "assignment": st["assignment"],
                         "student_id": st["student"], "timestamp": st.get("timestamp", ""),
                         "score": "" if st["status"] in NO_GRADE else 0,
                         "status": st["status"], "reason": st.get("detail", "")})
    to.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        if row["score"] == "":
            log(f"  {row['student_id']}/{row['assignment']}: no grade exported "
                f"({row['status']}: {row['reason']})")
    with to.open("w", newline="") as f:
        if lms:
            csv.writer(f).writerows(lms_table(rows, lms))
        else:
            w = csv.DictWriter(f, fieldnames=[*fields, "extension_hours", "late_by", "status",
                                              "reason"])
            w.writeheader()
            w.writerows(rows)
    log(f"exported {len(rows)} row(s) to {to}")
    return to
