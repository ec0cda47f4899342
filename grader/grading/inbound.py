"""nbgrader's filesystem exchange with Unix accounts: who submitted is who owns the entry.

nbgrader 0.9.6 names an inbound entry ``<student>+<assignment>+<timestamp>+<random>``, writes
the learner's own clock into it, makes it mode 0777 and collects it by copying whatever it
holds, links followed; its owner check only logs a warning. A learner could then file work
under a classmate's name, forge the time, write into a classmate's entry or plant a link that
copies the instructor's files into ``submitted/``. Here (configured by the course's and the
learners' ``nbgrader_config.py``):

- :class:`PrivateSubmit` (the learner's server) leaves the entry ``2770``: its owner and the
  instructors' group (inherited from ``inbound/``, setgid) only;
- :class:`OwnedCollect` (the formgrader's Collect and ``nbgrader collect``) takes an entry only
  when it is a real folder whose owner *is* the student it names, copies only regular files
  owned by that student (no links followed, sizes capped as in ``grader.grading.collect``), and
  stamps the submission with the server's clock: the latest change time (``st_ctime``, which no
  user can set) of the entry and its files. The learner's ``timestamp.txt`` is ignored.

And for any exchange: :class:`ReleaseFeedbackWhereSubmitted` (the formgrader's Release feedback,
``pallas-course feedback``) releases every learner's feedback it can file. nbgrader's stopped at
the first submission that never went through the exchange (``pallas-course collect DIR``: no
``submission_secret.txt``, the name a learner's feedback is filed under), so nobody after it got
any.
"""

from __future__ import annotations

import glob
import os
import pwd
import stat
from datetime import UTC, datetime
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.exchange.default.submit import ExchangeSubmit

from grader.grading import hidden_tests
from grader.grading.collect import MAX_NOTEBOOK_BYTES, Skip, read_regular

ENTRY_MODE = 0o2770
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # nbgrader's


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, the entry readable by its owner and the instructors only."""

    def copy_files(self):
        super().copy_files()
        os.chmod(os.path.join(self.inbound_path, self.assignment_filename), ENTRY_MODE)


def owner_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def entry_files(entry: Path, uid: int) -> tuple[dict[str, bytes], float, list[str]]:
    """The regular files of ``entry`` owned by ``uid`` (name -> bytes), the server's time of the
    submission (latest ``st_ctime``) and what was skipped, with why."""
    files, skipped = {}, []
    latest = os.lstat(entry).st_ctime
    for dirpath, dirnames, filenames in os.walk(entry, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()
                       and d != ".ipynb_checkpoints"]
        for name in filenames:
            path = here / name
            rel = str(path.relative_to(entry))
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                skipped.append(f"{rel}: not a regular file (a link is never followed)")
            elif st.st_uid != uid:
                skipped.append(f"{rel}: written by {owner_name(st.st_uid)}, not the submitter")
            elif name == "timestamp.txt":
                continue  # the learner's clock: the server's is used
            else:
                try:
                    files[rel] = read_regular(path, MAX_NOTEBOOK_BYTES)
                except Skip as e:
                    skipped.append(f"{rel}: {e}")
                    continue
                latest = max(latest, st.st_ctime)
    return files, latest, skipped


class OwnedCollect(ExchangeCollect):
    """nbgrader's collect for a shared machine: entries decided by their owner, not their name."""

    def init_src(self):
        super().init_src()
        # nbgrader picked the newest entry per name by the timestamp in the name, which the
        # learner chose: pick again among the entries the named student really owns
        assignment = self.coursedir.assignment_id
        who = self.coursedir.student_id or "*"
        self.src_records = []
        by_student: dict[str, list[dict]] = {}
        for entry in sorted(Path(self.inbound_path).glob(f"{who}+{assignment}+*")):
            student = entry.name.rsplit("+", 3)[0]
            st = os.lstat(entry)
            owner = owner_name(st.st_uid)
            if not stat.S_ISDIR(st.st_mode):
                self.log.warning("%s: not a folder (a link?); not collected", entry)
            elif owner != student:
                self.log.warning("%s names %s but was made by %s; not collected", entry,
                                 student, owner)
            else:
                files, when, skipped = entry_files(entry, st.st_uid)
                for why in skipped:
                    self.log.warning("%s/%s; skipped", entry.name, why)
                by_student.setdefault(student, []).append(
                    {"username": student, "filename": entry.name, "files": files,
                     "timestamp": datetime.fromtimestamp(when, UTC)})
        for records in by_student.values():
            self.src_records.append(max(records, key=lambda r: r["timestamp"]))

    def copy_files(self):
        for rec in self.src_records:
            dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory,
                                                   rec["username"], self.coursedir.assignment_id))
            old = self.coursedir.get_existing_timestamp(str(dest)) if dest.is_dir() else None
            if old is not None and old.tzinfo is None:
                old = old.replace(tzinfo=UTC)  # nbgrader's parse_utc drops the zone: it is UTC
            if old is not None and (old >= rec["timestamp"] or not self.update):
                self.log.info("Submission already collected: %s", rec["username"])
                continue
            if dest.is_dir():
                for p in sorted(dest.rglob("*"), reverse=True):
                    p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
            dest.mkdir(parents=True, exist_ok=True)
            for rel, data in rec["files"].items():
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
            (dest / "timestamp.txt").write_text(rec["timestamp"].strftime(TIMESTAMP_FORMAT))
            self.log.info("Collected %s %s (%d file(s), submitted %s by the server's clock)",
                          rec["username"], self.coursedir.assignment_id, len(rec["files"]),
                          rec["timestamp"].strftime(TIMESTAMP_FORMAT))


def unreleasable(feedback: Path) -> str | None:
    """Why the feedback in ``feedback`` (``<course>/feedback/<student>/<assignment>``) cannot be
    released to the exchange, or None when it can."""
    leaking = hidden_tests.withheld_pages(feedback)
    if leaking:
        return (f"{', '.join(p.name for p in leaking)} still holds a hidden test: nbgrader's "
                "ClearHiddenTests did not run on it; check the course's nbgrader_config.py, "
                "then run feedback again")
    if (feedback / "submission_secret.txt").is_file():
        return None
    return ("its submission was collected from a folder or zip (pallas-course collect), not from "
            "the exchange, so the exchange has no name to file it under: send the learner "
            f"{feedback}")


class ReleaseFeedbackWhereSubmitted(ExchangeReleaseFeedback):
    """nbgrader's release of feedback, leaving out (with a warning that says why) the learners
    whose feedback cannot be filed in the exchange instead of stopping at the first of them."""

    def copy_files(self):
        left_out = {}
        for html in map(Path, glob.glob(os.path.join(self.src_path, "*.html"))):
            why = unreleasable(html.parent)
            if why:
                left_out[html.parent.parent.name] = why
        for student, why in sorted(left_out.items()):
            self.log.warning("feedback of %s not released: %s", student, why)
        excluded = self.coursedir.student_id_exclude
        self.coursedir.student_id_exclude = ",".join(filter(None, [excluded, *left_out]))
        try:
            super().copy_files()
        finally:  # the formgrader's course settings outlive this release
            self.coursedir.student_id_exclude = excluded
