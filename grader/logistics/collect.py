"""``pallas-course collect``: submissions from a folder or a zip into the course's ``submitted/``.

The input is laid out ``<student>/<assignment>/<notebook>.ipynb`` (a zip may wrap it in one top
folder). Nothing in it is trusted:

- only regular files are read: symbolic links (to another student's notebook, the solutions,
  a grader-side file), devices (``/dev/zero``), FIFOs and sockets are skipped, and files are
  opened without following links;
- sizes are capped: per notebook, per archive (unpacked), and per zip entry's compression
  ratio (zip bombs); a zip entry's declared size is not believed, its bytes are counted;
- a bad entry (dangling link, bad CRC, encrypted, unsafe path) is skipped with its reason and
  collection goes on;
- student ids must match ``STUDENT_ID`` in full (no trailing newline);
- a notebook that replaces one collected earlier is reported;
- ``timestamp.txt`` (nbgrader's submission time) is the collection time, unless the instructor
  asks for the archive's own dates (``archive_dates``), which the submitter controls.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from grader.logistics import build

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # matched with fullmatch
MAX_NOTEBOOK_BYTES = 32 << 20  # one submitted notebook, outputs included
MAX_ARCHIVE_BYTES = 1 << 30  # everything read from one zip or folder
MAX_COMPRESSION_RATIO = 100  # unpacked / packed size of one zip entry above 1 MiB
SYSTEM_NAMES = ("__MACOSX",)


class Skip(Exception):
    """A file that is not collected; the message says why."""


@dataclass
class Entry:
    """One file of the input: its path below the students, how to read it, its own date."""

    rel: str
    read: Callable[[int], bytes]  # read(limit) -> bytes, raising Skip
    mtime: float


def read_regular(path: Path, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise Skip(f"cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Skip("not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Skip(f"larger than {limit:,} bytes")
    return data


def _folder_entries(base: Path, skipped: list) -> Iterator[Entry]:
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if (here / name).is_symlink():  # os.walk lists it but does not enter it
                skipped.append((str((here / name).relative_to(base)), "a symbolic link"))
        dirnames.sort()
        for name in sorted(filenames):
            path = here / name
            rel = str(path.relative_to(base))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                skipped.append((rel, "a symbolic link"))
            elif not stat.S_ISREG(st.st_mode):
                skipped.append((rel, "not a regular file"))
            else:
                yield Entry(rel, lambda limit, p=path: read_regular(p, limit), st.st_mtime)


def _zip_entries(zf: zipfile.ZipFile, skipped: list) -> Iterator[Entry]:
    infos = [i for i in zf.infolist() if not i.is_dir()]
    tops = {PurePosixPath(i.filename).parts[0] for i in infos
            if len(PurePosixPath(i.filename).parts) > 1
            and not PurePosixPath(i.filename).parts[0].startswith(SYSTEM_NAMES)}
    strip = None
    if len(tops) == 1:  # a zip of one top folder holding the students
        (top,) = tops
        if not any(len(PurePosixPath(i.filename).parts) == 3 and i.filename.startswith(top + "/")
                   and i.filename.endswith(".ipynb") for i in infos):
            strip = top
    for info in infos:
        parts = PurePosixPath(info.filename).parts
        if strip is not None and parts[0] == strip:
            parts = parts[1:]
        rel = "/".join(parts)
        # Unix zips keep the file type in the high bits; 0 there (other tools) means a file
        kind = stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0
        if info.filename.startswith("/") or ".." in parts or "\\" in info.filename:
            skipped.append((info.filename, "an unsafe path"))
        elif kind == stat.S_IFLNK:
            skipped.append((rel, "a symbolic link"))
        elif kind not in (0, stat.S_IFREG):
            skipped.append((rel, "not a regular file"))
        elif info.file_size > (1 << 20) and \
                info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
            skipped.append((rel, f"compressed more than {MAX_COMPRESSION_RATIO}:1 "
                                 f"({info.file_size:,} bytes unpacked): not a notebook"))
        else:
            yield Entry(rel, lambda limit, i=info: _read_member(zf, i, limit),
                        datetime(*info.date_time, tzinfo=UTC).timestamp())


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    try:
        with zf.open(info) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, RuntimeError, OSError, EOFError, ValueError) as e:
        raise Skip(f"unreadable in the archive ({e})") from None
    if len(data) > limit:
        raise Skip(f"larger than {limit:,} bytes")
    return data


def expected_notebooks(root: Path, assignment: str) -> list[str]:
    """The names of the notebooks collected for ``assignment``: those the course released
    (``release/<assignment>/``; before a release, the source's). Whatever else a learner hands
    in (data, caches, a planted 20,000 files) is never graded: copied, it slowed every grading
    of the submission (nbgrader searched the folder once per file) and, read from the
    exchange, filled the grader's memory."""
    for step in ("release", "source"):
        names = sorted(p.name for p in (root / step / assignment).glob("*.ipynb"))
        if names:
            return names
    return []


def _place(rel: str, known: set[str], root: Path, released: dict[str, list[str]]) -> Path:
    """Where ``rel`` goes under ``submitted/``; Skip when it is not a submission."""
    parts = PurePosixPath(rel).parts
    if any(p.startswith(".") or p.startswith(SYSTEM_NAMES) for p in parts):
        raise Skip("hidden or system file")
    if len(parts) != 3:
        raise Skip("not laid out <student>/<assignment>/<notebook>")
    student, assignment, name = parts
    if not STUDENT_ID.fullmatch(student):
        raise Skip(f"student id {student!r} has unsupported characters")
    if assignment not in known:
        raise Skip(f"unknown assignment {assignment!r}")
    if not name.endswith(".ipynb"):
        raise Skip("not a notebook (.ipynb)")
    names = released.setdefault(assignment, expected_notebooks(root, assignment))
    if names and name not in names:
        raise Skip(f"not a notebook of this assignment (it has {', '.join(names)}); a second "
                   "copy is not graded")
    return root / "submitted" / student / assignment / name


def collect(root: Path, path: Path, log=print, archive_dates: bool = False) -> dict:
    """Copy ``<student>/<assignment>/<notebook>.ipynb`` (folder or zip) into ``submitted/``.

    Returns ``copied`` (paths), ``skipped`` and ``replaced`` (``(path, reason)`` pairs).
    """
    path = Path(path)
    skipped: list[tuple[str, str]] = []
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            return _collect(root, _zip_entries(zf, skipped), skipped, log, archive_dates)
    if path.is_dir():
        return _collect(root, _folder_entries(path, skipped), skipped, log, archive_dates)
    raise FileNotFoundError(f"{path}: not a folder or a zip file")


def _collect(root: Path, entries: Iterator[Entry], skipped: list, log, archive_dates: bool
             ) -> dict:
    known = set(build.assignments(root))
    released: dict[str, list[str]] = {}
    copied: list[str] = []
    replaced: list[tuple[str, str]] = []
    written: set[Path] = set()
    budget = MAX_ARCHIVE_BYTES
    now = datetime.now(UTC)
    for entry in sorted(entries, key=lambda e: e.rel):
        try:
            dest = _place(entry.rel, known, root, released)
            if budget <= 0:
                raise Skip(f"the input holds more than {MAX_ARCHIVE_BYTES:,} bytes of notebooks")
            data = entry.read(min(MAX_NOTEBOOK_BYTES, budget))
        except Skip as e:
            skipped.append((entry.rel, str(e)))
            continue
        budget -= len(data)
        if dest.exists():
            why = ("a second copy in this input replaces the first" if dest in written
                   else "replaces the submission collected earlier")
            replaced.append((entry.rel, why))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".ipynb.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        when = datetime.fromtimestamp(entry.mtime, UTC) if archive_dates else now
        (dest.parent / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f %Z"))
        written.add(dest)
        copied.append(entry.rel)
    log(f"collected {len(copied)} notebook(s) into {root / 'submitted'}")
    for rel, why in replaced:
        log(f"  {rel}: {why}")
    for rel, why in skipped:
        log(f"  skipped {rel}: {why}")
    return {"copied": copied, "skipped": skipped, "replaced": replaced}
