"""Every grader test is on the learner's side unless it sets up grading itself: course.check
compares in its own process and writes no report."""

import pytest


@pytest.fixture(autouse=True)
def learner_side(monkeypatch):
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    monkeypatch.delenv("PALLAS_COURSE_REPORT", raising=False)


@pytest.fixture(scope="module")
def slot():
    """A sandbox slot (uids) no other grader on this machine uses, for a test's own runs."""
    import os

    from grader import grading

    number, lock = grading.claim_slot()
    yield number
    os.close(lock)
