"""Grading on submit (grader/logistics/on_submit.py) without a cluster: the instructor's setting,
and what the watcher's look at the exchange finds due. tests/cluster/test_class_setup.py runs
the watcher for real: real accounts, the hub, the Dask cluster, PostgreSQL."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from grader.logistics import on_submit
from grader.logistics.inbound import ENTRY_MODE, TIMESTAMP_FORMAT, entry_time
from grader.logistics.submission import write_status

REPO = Path(__file__).resolve().parents[3]
A, B = "01_first_kernel", "02_second"
NB = "first_kernel.ipynb"


@pytest.fixture
def course(tmp_path, monkeypatch):
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    for a in (A, B):
        (root / "source" / a).mkdir(parents=True)
        (root / "source" / a / "task.py").write_text("")
        (root / "release" / a).mkdir(parents=True)
        (root / "release" / a / NB).write_text("{}")
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", root)
    (exchange / "pallas-course" / "inbound").mkdir(parents=True)
    monkeypatch.setenv("PALLAS_COURSE_EXCHANGE", str(exchange))
    return root


def test_off_by_default_then_per_assignment_or_for_the_course(course):
    assert on_submit.describe(on_submit.setting(course)) == "off"
    assert on_submit.turn(course, A, on=True) == {"course": False, "assignments": [A]}
    assert on_submit.assignments_on(course, on_submit.setting(course)) == [A]
    with pytest.raises(ValueError, match="no assignment 'nope'"):
        on_submit.turn(course, "nope", on=True)
    on_submit.turn(course, None, on=True)
    assert on_submit.assignments_on(course, on_submit.setting(course)) == [A, B]
    with pytest.raises(ValueError, match="on for the whole course"):
        on_submit.turn(course, A, on=False)
    on_submit.turn(course, None, on=False)
    assert on_submit.describe(on_submit.setting(course)) == "off"


def _entry(course: Path, named: str) -> Path:
    inbound = Path(os.environ["PALLAS_COURSE_EXCHANGE"]) / "pallas-course" / "inbound"
    entry = inbound / f"{named}+{A}+2000-01-01 00:00:00.000000 UTC+{os.urandom(4).hex()}"
    entry.mkdir(mode=ENTRY_MODE)
    (entry / NB).write_text("{}")
    return entry


def test_a_look_finds_new_submissions_refuses_forged_ones_and_retries_errors(course):
    me = getpass.getuser()  # an entry is the submitter's when its owner is the student it names
    said: list[str] = []
    watcher = on_submit.Watcher(course, "tls://127.0.0.1:1", log=said.append)
    try:
        assert watcher.due(A) == {}
        entry = _entry(course, me)
        _entry(course, "a-classmate")  # made by this account in another's name
        assert watcher.due(A) == {me: ("new", entry_time(entry, os.getuid(), [NB]))}
        assert watcher.due(A) == {me: ("new", entry_time(entry, os.getuid(), [NB]))}
        refused = [line for line in said if "refused" in line]
        assert len(refused) == 1 and f"names a-classmate but was made by {me}" in refused[0]

        collected = course / "submitted" / me / A  # as collect leaves it
        collected.mkdir(parents=True)
        (collected / "timestamp.txt").write_text(
            entry_time(entry, os.getuid(), [NB]).strftime(TIMESTAMP_FORMAT))
        assert watcher.due(A) == {}
        write_status(course, A, me, {"student": me, "assignment": A, "status": "error"})
        assert watcher.due(A) == {me: ("regrade", None)}
        watcher.retry_later(me, A, "not graded", "the gradebook is down", "by hand")
        assert watcher.due(A) == {}  # not before a minute has passed

        time.sleep(0.05)  # a resubmission: a later change time by the server's clock
        again = _entry(course, me)
        watcher.not_before.clear()
        assert watcher.due(A) == {me: ("new", entry_time(again, os.getuid(), [NB]))}

    finally:
        watcher.close()


def test_a_cluster_out_of_reach_leaves_error_never_a_zero(course, monkeypatch):
    """The cluster or the gradebook fails the batch: a submission whose grading never ended
    is ``error`` (graded again a minute later), one that was graded keeps its grade."""
    def out_of_reach(*args, **kwargs):
        raise RuntimeError("no Dask scheduler answers at tls://127.0.0.1:1")

    monkeypatch.setattr(on_submit.batch, "autograde", out_of_reach)
    said: list[str] = []
    watcher = on_submit.Watcher(course, "tls://127.0.0.1:1", log=said.append)
    try:
        write_status(course, A, "graded-before", {"student": "graded-before", "assignment": A,
                                                  "status": "graded"})
        assert watcher.grade(A, ["graded-before", "waiting"]) == {"graded-before": "graded",
                                                                  "waiting": "error"}
        status = json.loads((course / "status" / A / "waiting.json").read_text())
        assert "no Dask scheduler answers" in status["detail"]
        assert "infrastructure fault" in status["detail"]
        assert ("waiting", A) in watcher.not_before  # tried again after RETRY_SECONDS
        assert any(line.startswith(f"waiting/{A}: graded on the cluster: error") for line in said)
    finally:
        watcher.close()


def test_failed_feedback_is_retried_less_and_less_often_then_given_up_in_one_line(course,
                                                                                  monkeypatch):
    """Issue 52: a release of feedback that kept failing was tried every 60 s forever, each time
    with a whole traceback. Each failure is one line naming its cause; the waits double; after
    ``MAX_ATTEMPTS`` the watcher says what to run by hand and waits for a new submission."""
    def failing(worker, root, assignment, student, log):
        log("feedback 01_first_kernel: 0 HTML file(s)\nTraceback (most recent call last):\n"
            '  File "x.py", line 1\nPermissionError: [Errno 13] feedback/ann')
        return [], None

    monkeypatch.setattr(on_submit.batch, "released_feedback", failing)
    me = getpass.getuser()
    said: list[str] = []
    watcher = on_submit.Watcher(course, "tls://127.0.0.1:1", log=said.append)
    try:
        entry = _entry(course, me)
        collected = course / "submitted" / me / A
        collected.mkdir(parents=True)
        (collected / "timestamp.txt").write_text(
            entry_time(entry, os.getuid(), [NB]).strftime(TIMESTAMP_FORMAT))
        waits = []
        for _ in range(on_submit.MAX_ATTEMPTS):
            watcher.release(A, me)
            if (me, A) in watcher.not_before:
                waits.append(round(watcher.not_before.pop((me, A)) - time.monotonic(), -1))
        assert waits == [60, 120, 240, 480]
        assert all("\n" not in line for line in said)
        assert all("PermissionError: [Errno 13] feedback/ann" in line for line in said)
        assert said[-1].endswith(f"gave up after 5 attempts: run pallas-course feedback {A}; "
                                 "a new submission is taken again")
        assert watcher.due(A) == {}  # given up: no more tries
        time.sleep(0.05)
        again = _entry(course, me)  # until the learner submits anew
        assert watcher.due(A) == {me: ("new", entry_time(again, os.getuid(), [NB]))}
    finally:
        watcher.close()
