"""Helpers of the workspace tests (a module name no other test folder uses): a course of one's
own for each test, a copy of exercises/ (config, chosen assignments, references) in a temporary
folder, so nothing a test runs writes into the repository; and the CLI run from a folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COURSE = REPO / "exercises"


def make_course(dest: Path, assignments: list[str] | None = None) -> Path:
    """``dest`` as a course root holding ``assignments`` (default: all of them)."""
    names = assignments or sorted(p.name for p in (COURSE / "source").iterdir() if p.is_dir())
    dest.mkdir(parents=True)
    shutil.copy(COURSE / "nbgrader_config.py", dest)
    shutil.copytree(COURSE / "refs", dest / "refs")
    for a in names:
        add_assignment(dest, a)
    return dest


def add_assignment(course: Path, assignment: str) -> None:
    shutil.copytree(COURSE / "source" / assignment, course / "source" / assignment,
                    ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``pallas-course ARGS`` run from ``cwd``, as a learner or instructor would."""
    env = {k: v for k, v in os.environ.items() if k != "PALLAS_COURSE_ROOT"}
    return subprocess.run([sys.executable, "-m", "grader.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout
