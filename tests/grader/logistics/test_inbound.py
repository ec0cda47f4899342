"""``OwnedCollect`` (a class's exchange, grader/logistics/inbound.py) collects again: a second
collect takes a resubmission and leaves an older copy alone (issue 35, item 2: the second
collect crashed comparing nbgrader's naive timestamp with the server's aware one); feedback is
released beside work collected from a folder (item 5: nbgrader's release stopped for everyone)."""

from __future__ import annotations

import getpass
import os
import sys
import time
import tracemalloc
from pathlib import Path

import nbformat
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from traitlets.config import Config

from grader.logistics.inbound import ENTRY_MODE, OwnedCollect, ReleaseFeedbackWhereSubmitted

A = "01_first_kernel"
NB = "first_kernel.ipynb"


def _entry(inbound: Path, student: str, cells: int, stamp: str) -> Path:
    entry = inbound / f"{student}+{A}+{stamp}+{os.urandom(4).hex()}"
    entry.mkdir(mode=ENTRY_MODE)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x = {i}")
                                         for i in range(cells)])
    (entry / NB).write_text(nbformat.writes(nb))
    (entry / "timestamp.txt").write_text("2000-01-01 00:00:00.000000 UTC")  # ignored
    return entry


def _released(root: Path) -> None:
    """The course's release of A: the notebook collect takes from an entry."""
    (root / "release" / A).mkdir(parents=True)
    (root / "release" / A / NB).write_text(nbformat.writes(nbformat.v4.new_notebook()))


def _course(root: Path, exchange: Path) -> tuple[Config, CourseDirectory]:
    config = Config()
    config.Exchange.root = str(exchange)
    config.Exchange.path_includes_course = True
    coursedir = CourseDirectory(root=str(root), config=config)
    coursedir.assignment_id = A
    coursedir.course_id = "pallas-course"
    return config, coursedir


def _collect(root: Path, exchange: Path, update: bool = True) -> None:
    config, coursedir = _course(root, exchange)
    app = OwnedCollect(coursedir=coursedir, authenticator=Authenticator(config=config),
                       config=config)
    app.update = update
    app.start()


def _submitted(root: Path, student: str) -> tuple[int, str]:
    d = root / "submitted" / student / A
    return len(nbformat.read(d / NB, 4).cells), (d / "timestamp.txt").read_text()


def test_collect_twice_takes_the_resubmission(tmp_path, monkeypatch):
    # the gradebook is made by alembic, a command beside this Python
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    me = getpass.getuser()  # an entry is collected only when its owner is the student it names
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    _released(root)
    inbound = exchange / "pallas-course" / "inbound"
    inbound.mkdir(parents=True)
    _entry(inbound, me, 1, "2026-12-01 10:00:00.000000 UTC")
    _collect(root, exchange)
    cells, first = _submitted(root, me)
    assert cells == 1

    _collect(root, exchange)  # nothing new: the copy stays as it was
    assert _submitted(root, me) == (1, first)

    time.sleep(0.05)  # the server's clock (st_ctime) of the resubmission is later
    _entry(inbound, me, 2, "2026-12-01 09:00:00.000000 UTC")  # the learner's clock is ignored
    _collect(root, exchange, update=False)  # without --update an existing copy stays
    assert _submitted(root, me) == (1, first)
    _collect(root, exchange)
    cells, second = _submitted(root, me)
    assert cells == 2 and second > first


def test_an_entry_of_20000_files_gives_its_notebook_alone_in_bounded_memory(tmp_path,
                                                                            monkeypatch):
    """Issue 52, the blocker: one learner's entry of 20,000 small files and big ones beside the
    notebook. Collect read all of it into memory and copied it into ``submitted/``, where every
    grading and feedback of it searched the folder once per file (nbgrader: quadratic). It
    takes the assignment's notebook alone, one file in memory at a time, and says why the rest
    was left out."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    me = getpass.getuser()
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    _released(root)
    inbound = exchange / "pallas-course" / "inbound"
    inbound.mkdir(parents=True)
    entry = _entry(inbound, me, 3, "2026-12-01 10:00:00.000000 UTC")
    junk = entry / "junk"
    junk.mkdir()
    for i in range(20_000):
        (junk / f"{i}.txt").write_bytes(b"x")
    for i in range(5):  # 30 MB each, sparse: no disk used, 150 MB read by a collect of all
        with (entry / f"big{i}.ipynb").open("wb") as f:
            f.truncate(30 << 20)
    tracemalloc.start()
    try:
        _collect(root, exchange)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    submitted = root / "submitted" / me / A
    assert sorted(p.name for p in submitted.iterdir()) == [NB, "timestamp.txt"]
    assert _submitted(root, me)[0] == 3
    assert peak < 16 << 20, f"collect held {peak:,} bytes at once"


def test_collect_keeps_the_name_feedback_is_filed_under(tmp_path, monkeypatch):
    """Collect takes an entry's notebooks and nbgrader's ``submission_secret.txt`` beside them,
    and nothing else: without it no feedback reached a learner through the exchange (a class's
    end-to-end test: "collected from a folder or zip")."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    me = getpass.getuser()
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    _released(root)
    inbound = exchange / "pallas-course" / "inbound"
    inbound.mkdir(parents=True)
    entry = _entry(inbound, me, 1, "2026-12-01 10:00:00.000000 UTC")
    (entry / "submission_secret.txt").write_text("s3cret")
    (entry / "notes.txt").write_text("not collected")
    _collect(root, exchange)
    submitted = root / "submitted" / me / A
    assert sorted(p.name for p in submitted.iterdir()) == [
        NB, "submission_secret.txt", "timestamp.txt"]
    assert (submitted / "submission_secret.txt").read_text() == "s3cret"


def test_feedback_is_released_for_all_but_work_collected_from_a_folder(tmp_path, caplog):
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    for student, secret in (("a-from-a-zip", None), ("b-through-the-exchange", "s3cret")):
        d = root / "feedback" / student / A
        d.mkdir(parents=True)
        (d / "first_kernel.html").write_text(f"<p>{student}</p>")
        (d / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
        if secret:
            (d / "submission_secret.txt").write_text(secret)
    (exchange / "pallas-course").mkdir(parents=True)
    config, coursedir = _course(root, exchange)
    app = ReleaseFeedbackWhereSubmitted(coursedir=coursedir,
                                        authenticator=Authenticator(config=config), config=config)
    app.start()
    (released,) = (exchange / "pallas-course" / "feedback").glob("*.html")
    assert released.read_text() == "<p>b-through-the-exchange</p>"
    assert "feedback of a-from-a-zip not released: its submission was collected from a folder" \
        in caplog.text
    assert coursedir.student_id_exclude == ""
