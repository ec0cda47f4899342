"""nbgrader jobs in a long-lived process: ``python -m grader.logistics.worker ROOT serve``.

It reads jobs as JSON lists, one per stdin line, until end of input: ``["generate", A...]``,
``["collect", A, STUDENT]`` (the student's newest submission from the exchange, by the
course's collector, as the formgrader's Collect takes it), ``["autograde", A, STUDENT]``,
``["forget", A, STUDENT]`` (an earlier grading of a submission replaced by one that is not a
notebook: its gradebook record, autograded notebooks and feedback), ``["feedback", A[,
STUDENT]]`` (made, and released to the exchange when the course has one), ``["export", FILE]``,
``["preflight"]`` (can a jailed Python import the course), ``["extend", A, STUDENT]`` (the
student's extension into the gradebook and the graded submission's late penalty worked out
again), ``["roster", CSV]`` (learners' names
and e-mails into the gradebook, ``grader.gradebook.roster``). Each runs
real nbgrader (``NbGraderAPI``) with the course's ``nbgrader_config.py`` and prints one JSON
line (prefixed ``@@RESULT``) with the outcome; ``submission.Worker`` is the other end. Learner code
never runs in this process: autograde executes it in a jailed run (``grader.jail.trusted``).

Gradebook safety: every ``nbgrader.api.Gradebook`` session in this process holds an exclusive
``fcntl`` lock on ``<root>/gradebook.db.lock`` from construction to ``close()``. nbgrader opens
its sessions only around short database reads and writes (never while a notebook executes), so
N autograde workers execute in parallel but write one at a time; each write is one SQLite
transaction (the ``?timeout=`` in ``db_url`` covers readers outside this lock). A worker killed
mid-way leaves at most a submission row without scores, which the next ``autograde`` overwrites
(``force=True``), and the parent records the status ``timeout``/``crashed`` for it.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
import sys
from pathlib import Path


def install_gradebook_lock(root: Path) -> None:
    import nbgrader.api as api  # optional: nbgrader comes with the class extra

    lock_path = root / "gradebook.db.lock"
    state = {"depth": 0, "fd": None}
    orig_init, orig_close = api.Gradebook.__init__, api.Gradebook.close

    def acquire():
        if state["depth"] == 0:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            state["fd"] = fd
        state["depth"] += 1

    def release():
        if state["depth"] <= 0:
            return
        state["depth"] -= 1
        if state["depth"] == 0 and state["fd"] is not None:
            fcntl.flock(state["fd"], fcntl.LOCK_UN)
            os.close(state["fd"])
            state["fd"] = None

    def init(self, *a, **kw):
        acquire()
        self._pc_locked = True
        try:
            orig_init(self, *a, **kw)
        except BaseException:
            self._pc_locked = False
            release()
            raise

    def close(self):
        try:
            orig_close(self)
        finally:
            if getattr(self, "_pc_locked", False):
                self._pc_locked = False
                release()

    api.Gradebook.__init__ = init
    api.Gradebook.close = close


def install_linear_ignore() -> None:
    """nbgrader's ``is_ignored`` lists a file's whole folder once per ignore pattern to decide
    about that one file, and its search for a submission's other files (autograde's and
    feedback's copy of them) asks it for every file: time quadratic in their count (a learner's
    2,000 files took 27 s to grade, 6,000 took 221 s). The same rule, decided by the name
    alone: a glob's pattern matches a hidden name only when the pattern starts with a dot."""
    import nbgrader.utils as utils  # optional: nbgrader comes with the class extra

    def is_ignored(filename: str, ignore_globs: list[str] | None = None) -> bool:
        name = os.path.basename(filename)
        return any(fnmatch.fnmatchcase(name, expr)
                   and (not name.startswith(".") or expr.startswith("."))
                   for expr in ignore_globs or ())

    utils.is_ignored = is_ignored


# the gradebook errors of this process's current job that were a lost or refused connection
GRADEBOOK_LOST: list[str] = []


def _record_lost_connection(context) -> None:
    # SQLAlchemy's driver dialect knows each driver's words for a dropped connection, including
    # one reused after the server restarted; no connection at all is a refused connect
    if context.is_disconnect or context.connection is None:
        GRADEBOOK_LOST.append(f"{type(context.original_exception).__name__}: "
                              f"{context.original_exception}"[:500])


def watch_gradebook_connections() -> None:
    """Append to ``GRADEBOOK_LOST`` every gradebook error of this process that was a lost or
    refused connection (a server restarting); ``do_job`` reports them as ``gradebook_lost``."""
    from sqlalchemy import event  # optional: nbgrader's database layer, the class extra's
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "handle_error", _record_lost_connection):
        event.listen(Engine, "handle_error", _record_lost_connection)


def load(root: Path):
    # optional: nbgrader (and its traitlets) come with the class extra
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    coursedir = CourseDirectory(config=cfg)
    coursedir.root = str(root)
    return cfg, coursedir, NbGraderAPI(coursedir, config=cfg)


def _limit_errors(path: Path) -> dict[str, list[str]]:
    """Cells of an autograded notebook stopped by a limit, by kind (timeout, memory, disk);
    each as ``notebook:grade_id`` or ``notebook:cell #i``."""
    out: dict[str, list[str]] = {"timeout": [], "memory": [], "disk": []}
    try:
        nb = json.loads(path.read_text())
    except Exception:  # noqa: BLE001
        return out
    for i, cell in enumerate(nb.get("cells", [])):
        for o in cell.get("outputs", []):
            ename = str(o.get("ename", "")) if o.get("output_type") == "error" else ""
            kind = ("timeout" if "Timeout" in ename else "memory" if ename == "MemoryError"
                    else "disk" if "File too large" in str(o.get("evalue", "")) else None)
            if kind:
                gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                out[kind].append(f"{path.name}:{gid or f'cell #{i}'}")
                break
    return out


def do_job(root: Path, cfg, coursedir, api, job: str, args: list[str]) -> dict:
    result: dict = {"job": job, "args": args}
    GRADEBOOK_LOST.clear()
    try:
        _do_job(root, cfg, coursedir, api, job, args, result)
    except Exception as e:  # noqa: BLE001 - report, and the worker stays up for the next job
        result.update(success=False, error=f"{type(e).__name__}: {e}")
    if GRADEBOOK_LOST:  # submission.gradebook_down: retried, then an infrastructure fault
        result["gradebook_lost"] = GRADEBOOK_LOST[-1]
    return result


def _apply_extension(root: Path, coursedir, assignment: str, student: str) -> None:
    """Write the student's extension (``pallas-course extend``) into their gradebook row before
    nbgrader grades the submission: its lateness counts from the due date plus the extension.
    Nothing to do for a student never granted one."""
    from grader.gradebook.late import extensions  # imports nbgrader: this job's

    hours = extensions(root).get(assignment, {}).get(student)
    if hours is None:
        return
    from nbgrader.api import Gradebook  # optional: the class extra's

    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(assignment, student)
        gb.grant_extension(assignment, student, minutes=round(hours * 60))


def _late_penalties_again(cfg, coursedir, assignment: str, student: str) -> dict[str, float]:
    """Each graded notebook's late penalty worked out again from the gradebook (its score, the
    submission's lateness with the extension written there), as nbgrader's
    ``AssignLatePenalties`` does in autograde, without running the submission again; notebook
    -> penalty (points). Nothing for a submission never graded."""
    from nbgrader.api import Gradebook, MissingEntry  # optional: the class extra's
    from nbgrader.preprocessors import AssignLatePenalties

    penalties = AssignLatePenalties(config=cfg)
    penalties.init_plugin()
    out = {}
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return out
        late = submission.total_seconds_late
        for nb in submission.notebooks:
            penalty = (penalties.plugin_inst.late_submission_penalty(student, nb.score, late)
                       if late > 0 else None)
            # as nbgrader bounds it: never below 0, never above the notebook's score
            nb.late_submission_penalty = None if penalty is None else min(max(penalty, 0.0),
                                                                          nb.score)
            out[nb.name] = float(nb.late_submission_penalty or 0.0)
        gb.db.commit()
    return out


def _do_job(root: Path, cfg, coursedir, api, job: str, args: list[str], result: dict) -> None:
    if job == "generate":
        result["results"] = {}
        ok = True
        for a in args:
            r = api.generate_assignment(a, force=True, create=True)
            result["results"][a] = {"success": r["success"], "error": r.get("error"),
                                    "log": r.get("log", "")[-4000:]}
            ok &= bool(r["success"])
        result["success"] = ok
    elif job == "preflight":
        from grader.jail import sandbox, trusted  # JAX and the tasks: seconds, for this job

        with sandbox.slot_for_this_run() as slot:
            why = trusted.preflight(trusted.TrustedExecute(config=cfg).limits(), slot=slot)
        result.update(success=why is None, error=why)
    elif job == "collect":
        a, s = args
        coursedir.student_id = s  # this job's course settings: read afresh for the next
        r = api.collect(a)
        result.update(success=r["success"], error=r.get("error"), log=r.get("log", "")[-4000:])
    elif job == "autograde":
        from grader.jail import trusted  # JAX and the tasks: seconds, for this job

        a, s = args
        trusted.REPORTS.clear()
        _apply_extension(root, coursedir, a, s)
        r = api.autograde(a, s, force=True, create=True)
        result.update(success=r["success"], error=r.get("error"), log=r.get("log", "")[-6000:])
        out_dir = root / "autograded" / s / a
        nbs = sorted(out_dir.glob("*.ipynb")) if out_dir.is_dir() else []
        limits = [_limit_errors(p) for p in nbs]
        result["timeouts"] = [c for x in limits for c in x["timeout"]]
        result["memory"] = [c for x in limits for c in x["memory"]]
        result["disk"] = [c for x in limits for c in x["disk"]]
        result["notebooks"] = [p.name for p in nbs]
        result["reports"] = list(trusted.REPORTS)
    elif job == "extend":
        a, s = args
        _apply_extension(root, coursedir, a, s)
        result.update(success=True, penalties=_late_penalties_again(cfg, coursedir, a, s))
    elif job == "roster":
        from nbgrader.api import Gradebook  # optional: the class extra's

        from grader.gradebook import roster  # a course's roster only

        learners = roster.read(Path(args[0]))
        with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
            for learner in learners:
                gb.update_or_create_student(learner.id, first_name=learner.first_name,
                                            last_name=learner.last_name, email=learner.email)
        result.update(success=True, students=len(learners))
    elif job == "forget":
        from nbgrader.api import Gradebook, MissingEntry  # optional: the class extra's

        a, s = args
        with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
            try:
                gb.remove_submission(a, s)
            except MissingEntry:
                pass
        for step in ("autograded", "feedback"):
            shutil.rmtree(root / step / s / a, ignore_errors=True)
        result["success"] = True
    elif job == "feedback":
        a = args[0]
        s = args[1] if len(args) > 1 else None
        r = api.generate_feedback(a, s, force=True)
        result.update(success=r["success"], error=r.get("error"), log=r.get("log", "")[-4000:])
        # one step for the instructor: where learners fetch from an exchange, the feedback
        # goes there too (nbgrader's release_feedback, as the formgrader's button does)
        exchange = cfg.Exchange.root if "root" in cfg.Exchange else ""
        if r["success"] and exchange and os.path.isdir(exchange):
            from grader.logistics.inbound import unreleasable  # a course with an exchange only

            released = api.release_feedback(a, s)
            result.update(success=released["success"], exchange=exchange,
                          error=released.get("error"),
                          log=(result["log"] + released.get("log", ""))[-4000:])
            result["not_released"] = {
                d.parent.name: why for d in sorted((root / "feedback").glob(f"{s or '*'}/{a}"))
                if (why := unreleasable(d))}
    elif job == "export":
        # optional: nbgrader comes with the class extra
        from nbgrader.api import Gradebook
        from nbgrader.plugins.export import CsvExportPlugin

        plugin = CsvExportPlugin(config=cfg)
        plugin.to = args[0]
        with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
            plugin.export(gb)
        result["success"] = True
    else:
        result.update(success=False, error=f"unknown job {job!r}")


def main(argv: list[str]) -> int:
    if argv[1:] != ["serve"]:
        raise SystemExit("usage: python -m grader.logistics.worker ROOT serve  (jobs on stdin)")
    root = Path(argv[0]).resolve()
    os.chdir(root)
    os.environ["PALLAS_COURSE_ROOT"] = str(root)
    install_gradebook_lock(root)
    install_linear_ignore()
    watch_gradebook_connections()
    # one JSON list [job, args...] per stdin line, one @@RESULT line per job; nbgrader and its
    # imports are paid for once per worker instead of once per submission. The course's
    # configuration is read again for every job (~4 ms): a worker that kept the one it started
    # with graded equally late work with the old late policy beside workers with the new one.
    for line in sys.stdin:
        if not line.strip():
            continue
        job, *args = json.loads(line)
        try:
            result = do_job(root, *load(root), job, args)
        except Exception as e:  # noqa: BLE001 - the course's configuration could not be read
            result = {"job": job, "args": args, "success": False,
                      "error": f"{type(e).__name__}: {e}"}
        print("@@RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
