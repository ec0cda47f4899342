"""Fixtures shared by every test folder: Debian's chromium, driven by playwright; the course
of exercises/ released once."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "site"))
from sitetools import CHROMIUM, CHROMIUM_ARGS  # noqa: E402


@pytest.fixture(scope="session")
def browser():
    """One headless chromium for the session (skipped where it is not installed)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: `make system-packages` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def released_course(tmp_path_factory) -> Path:
    """A course folder like exercises/ (config, sources, reference cases) with every assignment
    released, once per session (nbgrader's release is the slow part). Read-only: a test that
    writes in a course copies it first."""
    from grader.grading import batch as grading

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("released") / "exercises"
    root.mkdir()
    shutil.copy(repo / "exercises" / "nbgrader_config.py", root)
    for name in ("source", "refs"):
        shutil.copytree(repo / "exercises" / name, root / name,
                        ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    grading.release(root, log=lambda *a: None)
    return root
