"""Fixtures of the workspace tests: one released copy of the whole course per session (the
released course and the browser are tests/conftest.py's)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))


@pytest.fixture(scope="session")
def full_course(tmp_path_factory, released_course) -> Path:
    """Every assignment, released once for the session: a copy of ``released_course``."""
    course = tmp_path_factory.mktemp("course") / "exercises"
    shutil.copytree(released_course, course)
    return course
