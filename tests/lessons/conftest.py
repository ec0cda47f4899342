"""The lessons' shared helper, as a lesson imports it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"


@pytest.fixture
def course(monkeypatch):
    """``lessons/_course.py``, loaded afresh, with lessons/ on the path (lessons import
    ``_course``, as in JupyterLab)."""
    monkeypatch.syspath_prepend(str(LESSONS_DIR))
    spec = importlib.util.spec_from_file_location("_course", LESSONS_DIR / "_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
