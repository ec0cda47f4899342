"""Every grader test is on the learner's side unless it sets up grading itself: course.check
compares in its own process and writes no report. The courses graded for several modules are
built once per session (coursetools)."""

import pytest
from coursetools import graded_course, release_01


@pytest.fixture(autouse=True)
def learner_side(monkeypatch):
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    monkeypatch.delenv("PALLAS_COURSE_REPORT", raising=False)


@pytest.fixture(scope="module")
def slot():
    """A sandbox slot (uids) no other grader on this machine uses, for a test's own runs."""
    from grader.jail import sandbox

    with sandbox.claimed_slot() as number:
        yield number


@pytest.fixture(scope="session")
def course(tmp_path_factory, released_course):
    """The session's graded course (coursetools.graded_course): a copy of the released course,
    one batch for test_grading's and test_jail_imports' submissions."""
    return graded_course(released_course, tmp_path_factory.mktemp("course") / "exercises",
                         tmp_path_factory.mktemp("subs"))


@pytest.fixture(scope="session")
def released_01(tmp_path_factory):
    """Assignment 01 released once (coursetools.release_01); a batch grades in a copy of it."""
    root = tmp_path_factory.mktemp("released-01") / "course"
    release_01(root)
    return root
