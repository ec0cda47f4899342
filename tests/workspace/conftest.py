"""Fixtures of the workspace tests: one released copy of the whole course per session (the
browser is tests/conftest.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from wstools import cli, make_course, ok

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))


@pytest.fixture(scope="session")
def full_course(tmp_path_factory) -> Path:
    """Every assignment, released once for the session."""
    course = make_course(tmp_path_factory.mktemp("course") / "exercises")
    ok(cli("release", cwd=course))
    return course
