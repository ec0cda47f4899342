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
  user can set) of the entry and its files. The learner's ``timestamp.txt`` is ignored. Its
  rules are ``inbound_entries`` and ``entry_time``, by which grading on submit
  (``grader.grading.on_submit``) also tells a new submission from a forged one.

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
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class InboundEntry:
    """One entry of the exchange's ``inbound/``, as collect judges it."""

    path: Path
    student: str  # the student its name names
    uid: int  # its owner's
    refused: str | None  # why collect does not take it; None: a folder of the named student's


def inbound_entries(inbound: Path, assignment: str, student: str = "*") -> list[InboundEntry]:
    """The entries of ``assignment`` (of ``student`` only, when named) in ``inbound``, each
    taken only when it is a real folder owned by the student it names."""
    out = []
    for entry in sorted(inbound.glob(f"{student}+{assignment}+*")):
        named = entry.name.rsplit("+", 3)[0]
        try:
            st = os.lstat(entry)
        except FileNotFoundError:  # its owner deleted it since the listing
            continue
        owner = owner_name(st.st_uid)
        refused = ("not a folder (a link?)" if not stat.S_ISDIR(st.st_mode)
                   else f"names {named} but was made by {owner}" if owner != named else None)
        out.append(InboundEntry(entry, named, st.st_uid, refused))
    return out


def _taken(entry: Path, uid: int, skipped: list[str]) -> Iterator[tuple[str, Path, float]]:
    """``(name below entry, path, st_ctime)`` of each file collect takes from ``entry``: the
    regular files owned by ``uid``; what it skips goes to ``skipped``, with why."""
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
            elif name != "timestamp.txt":  # the learner's clock: the server's is used
                yield rel, path, st.st_ctime


def entry_time(entry: Path, uid: int) -> datetime:
    """The server's time of the submission in ``entry`` (UTC): the latest change time
    (``st_ctime``, which no user can set) of the folder and of the files collect takes."""
    latest = max([os.lstat(entry).st_ctime, *(t for _, _, t in _taken(entry, uid, []))])
    return datetime.fromtimestamp(latest, UTC)


def entry_files(entry: Path, uid: int) -> tuple[dict[str, bytes], datetime, list[str]]:
    """The regular files of ``entry`` owned by ``uid`` (name -> bytes), the server's time of the
    submission (as ``entry_time``) and what was skipped, with why."""
    files, skipped = {}, []
    latest = os.lstat(entry).st_ctime
    for rel, path, changed in _taken(entry, uid, skipped):
        latest = max(latest, changed)
        try:
            files[rel] = read_regular(path, MAX_NOTEBOOK_BYTES)
        except Skip as e:
            skipped.append(f"{rel}: {e}")
    return files, datetime.fromtimestamp(latest, UTC), skipped


def collected_at(submitted: Path) -> datetime | None:
    """When the submission collected into ``submitted`` (``submitted/<student>/<assignment>``)
    was made, by its ``timestamp.txt`` (UTC); None when nothing was collected there."""
    from nbgrader.utils import parse_utc  # nbgrader's reading of its own timestamps

    try:
        when = parse_utc((submitted / "timestamp.txt").read_text().strip())
    except (OSError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)  # parse_utc drops the zone


class OwnedCollect(ExchangeCollect):
    """nbgrader's collect for a shared machine: entries decided by their owner, not their name."""

    def init_src(self):
        super().init_src()
        # nbgrader picked the newest entry per name by the timestamp in the name, which the
        # learner chose: pick again among the entries the named student really owns
        self.src_records = []
        by_student: dict[str, list[dict]] = {}
        for entry in inbound_entries(Path(self.inbound_path), self.coursedir.assignment_id,
                                     self.coursedir.student_id or "*"):
            if entry.refused:
                self.log.warning("%s: %s; not collected", entry.path, entry.refused)
                continue
            files, when, skipped = entry_files(entry.path, entry.uid)
            for why in skipped:
                self.log.warning("%s/%s; skipped", entry.path.name, why)
            by_student.setdefault(entry.student, []).append(
                {"username": entry.student, "filename": entry.path.name, "files": files,
                 "timestamp": when})
        for records in by_student.values():
            self.src_records.append(max(records, key=lambda r: r["timestamp"]))

    def copy_files(self):
        for rec in self.src_records:
            dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory,
                                                   rec["username"], self.coursedir.assignment_id))
            old = collected_at(dest)
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
