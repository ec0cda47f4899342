"""Fixtures of the workspace tests: one released copy of the whole course per session, and
Debian's chromium driven by playwright."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from wstools import cli, make_course, ok

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "site"))
from sitetools import CHROMIUM, CHROMIUM_ARGS  # noqa: E402


@pytest.fixture(scope="session")
def full_course(tmp_path_factory) -> Path:
    """Every assignment, released once for the session."""
    course = make_course(tmp_path_factory.mktemp("course") / "exercises")
    ok(cli("release", cwd=course))
    return course


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: `make system-packages` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
