"""Every grader test is on the learner's side unless it sets up grading itself: course.check
compares in its own process and writes no report."""

import pytest


@pytest.fixture(autouse=True)
def learner_side(monkeypatch):
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    monkeypatch.delenv("PALLAS_COURSE_REPORT", raising=False)
