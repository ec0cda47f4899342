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
  when it is a real folder whose owner *is* the student it names, copies only the assignment's
  notebooks (``expected_notebooks``), each a regular file owned by that student (no links
  followed, sizes capped: ``MAX_NOTEBOOK_BYTES`` each, ``MAX_ENTRY_BYTES`` together, read one at
  a time), and stamps the submission with the server's clock: the latest change time
  (``st_ctime``, which no user can set) of the entry and those notebooks. Nothing else in an
  entry is read, copied or walked: one learner's 20,000 files and 1.2 GB once filled the
  collector's memory and slowed every grading after it. The learner's ``timestamp.txt`` is
  ignored. Its rules are ``inbound_entries`` and ``entry_time``, by which grading on submit
  (``grader.logistics.on_submit``) also tells a new submission from a forged one.

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
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.exchange.default.submit import ExchangeSubmit

from grader.logistics import hidden_tests
from grader.logistics.collect import MAX_NOTEBOOK_BYTES, Skip, expected_notebooks

ENTRY_MODE = 0o2770
MAX_ENTRY_BYTES = 2 * MAX_NOTEBOOK_BYTES  # the notebooks collected from one entry, together
MAX_LISTED = 1000  # names of an entry counted to say what was left out
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


# nbgrader's submit writes it into the entry; collect keeps it beside the notebooks and the
# feedback's release names the learner's feedback after it (``unreleasable``)
SUBMISSION_SECRET = "submission_secret.txt"


def _taken(entry: Path, uid: int, expected: list[str], skipped: list[str]
           ) -> Iterator[tuple[str, Path, float]]:
    """``(name, path, st_ctime)`` of each file collect takes from ``entry``: the ``expected``
    notebooks at its top, each a regular file owned by ``uid``; what it skips goes to
    ``skipped``, with why. Nothing else in the entry is looked at."""
    for name in expected:
        path = entry / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # not handed in: nbgrader scores that notebook 0
            continue
        if not stat.S_ISREG(st.st_mode):
            skipped.append(f"{name}: not a regular file (a link is never followed)")
        elif st.st_uid != uid:
            skipped.append(f"{name}: written by {owner_name(st.st_uid)}, not the submitter")
        else:
            yield name, path, st.st_ctime


def entry_time(entry: Path, uid: int, expected: list[str]) -> datetime:
    """The server's time of the submission in ``entry`` (UTC): the latest change time
    (``st_ctime``, which no user can set) of the folder and of the ``expected`` files
    collect takes."""
    latest = max([os.lstat(entry).st_ctime, *(t for _, _, t in _taken(entry, uid, expected,
                                                                       []))])
    return datetime.fromtimestamp(latest, UTC)


def _left_out(entry: Path, expected: list[str]) -> str | None:
    """What else ``entry`` holds at its top, in words (counted up to ``MAX_LISTED`` names,
    never read); None when nothing."""
    count = 0
    with os.scandir(entry) as names:
        for item in names:
            if item.name not in (*expected, "timestamp.txt", SUBMISSION_SECRET):
                count += 1
                if count > MAX_LISTED:
                    break
    if not count:
        return None
    many = f"more than {MAX_LISTED:,}" if count > MAX_LISTED else f"{count:,}"
    return (f"{many} other file(s) or folder(s) not collected: only the assignment's "
            f"notebooks ({', '.join(expected)}) are graded")


def read_owned(path: Path, uid: int, limit: int) -> tuple[bytes, float]:
    """The bytes of ``path`` (at most ``limit``) and its change time, read only when it is
    still a regular file owned by ``uid`` (checked on the file opened, not on its name)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise Skip(f"cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            raise Skip("no longer a regular file of the submitter's")
        if st.st_size > limit:
            raise Skip(f"larger than {limit:,} bytes")
        chunks, size = [], 0  # read(limit) would hold the limit in memory, whatever the file
        while chunk := f.read(min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Skip(f"larger than {limit:,} bytes")
        changed = os.fstat(f.fileno()).st_ctime
    return b"".join(chunks), changed


def entry_notebooks(entry: Path, uid: int, expected: list[str]
                    ) -> tuple[list[tuple[str, Path]], datetime, list[str]]:
    """The ``expected`` notebooks of ``entry`` that collect takes (name, path: read one at a
    time when copied, ``read_owned``), the server's time of the submission (as
    ``entry_time``) and what was left out, with why."""
    skipped: list[str] = []
    if not expected:
        skipped.append("the assignment has no released notebook: release it, then collect")
    taken = [(name, path) for name, path, _ in _taken(entry, uid, expected, skipped)]
    more = _left_out(entry, expected)
    if more:
        skipped.append(more)
    return taken, entry_time(entry, uid, expected), skipped


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
        expected = expected_notebooks(Path(self.coursedir.root), self.coursedir.assignment_id)
        for entry in inbound_entries(Path(self.inbound_path), self.coursedir.assignment_id,
                                     self.coursedir.student_id or "*"):
            if entry.refused:
                self.log.warning("%s: %s; not collected", entry.path, entry.refused)
                continue
            try:
                taken, when, skipped = entry_notebooks(entry.path, entry.uid, expected)
            except FileNotFoundError:  # its owner deleted it since the listing
                continue
            for why in skipped:
                self.log.warning("%s/%s; skipped", entry.path.name, why)
            by_student.setdefault(entry.student, []).append(
                {"username": entry.student, "filename": entry.path.name, "files": taken,
                 "uid": entry.uid, "timestamp": when})
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
            # one notebook in memory at a time, written to a folder beside the submission,
            # which replaces it once every notebook is there
            tmp = dest.with_name(f".{dest.name}.collecting")
            if tmp.is_dir():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            when, budget = rec["timestamp"], MAX_ENTRY_BYTES
            for name, path in rec["files"]:
                try:
                    data, changed = read_owned(path, rec["uid"],
                                               min(MAX_NOTEBOOK_BYTES, budget))
                except Skip as e:
                    self.log.warning("%s/%s: %s; skipped", rec["filename"], name, e)
                    continue
                budget -= len(data)
                when = max(when, datetime.fromtimestamp(changed, UTC))  # changed since
                (tmp / name).write_bytes(data)
            try:  # what nbgrader files the entry's feedback under in the exchange
                secret, _ = read_owned(Path(self.inbound_path) / rec["filename"] /
                                       SUBMISSION_SECRET, rec["uid"], 4096)
                (tmp / SUBMISSION_SECRET).write_bytes(secret)
            except Skip:  # none, or not the submitter's: its feedback is sent by hand
                pass
            (tmp / "timestamp.txt").write_text(when.strftime(TIMESTAMP_FORMAT))
            if dest.is_dir():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
            self.log.info("Collected %s %s (%d notebook(s), submitted %s by the server's clock)",
                          rec["username"], self.coursedir.assignment_id,
                          len(list(dest.glob("*.ipynb"))), when.strftime(TIMESTAMP_FORMAT))


def unreleasable(feedback: Path) -> str | None:
    """Why the feedback in ``feedback`` (``<course>/feedback/<student>/<assignment>``) cannot be
    released to the exchange, or None when it can."""
    leaking = hidden_tests.withheld_pages(feedback)
    if leaking:
        return (f"{', '.join(p.name for p in leaking)} still holds a hidden test: nbgrader's "
                "ClearHiddenTests did not run on it; check the course's nbgrader_config.py, "
                "then run feedback again")
    if (feedback / SUBMISSION_SECRET).is_file():
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
