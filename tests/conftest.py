"""Fixtures shared by every test folder: Debian's chromium, driven by playwright; the course
of exercises/ released once."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One JAX compilation cache for the suite's processes and every process they start with their
# environment (notebook kernels, bench/on_device.py's notebooks, the `pallas-course check` a
# test runs): the tests check the same instructor kernels on the same cases again and again,
# in one process and across them, and XLA's compile was half of a check's CPU time (assignment
# 7's checks: 28 CPU seconds, 13 with the cache warm). The grader's jail is left out: its
# children get a clean environment (grader/jail/sandbox.py's child_env), as in a class. A
# cached executable is the one XLA compiled, so no result changes. One folder per JAX release
# (per venv: the compat run's jax 0.10.2 beside the pin); `make clean` removes it.
_JAX_CACHE = {
    "JAX_COMPILATION_CACHE_DIR": str(REPO / "build" / "jax-cache" / Path(sys.prefix).name),
    # every compile, not only those over a second, and every size
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
for _name, _value in _JAX_CACHE.items():
    os.environ.setdefault(_name, _value)

# `make test` runs one of its two pytest processes in the background, and a shell starts a
# background command with SIGINT ignored, which every program it starts inherits: a server a
# test stops with Ctrl-C's signal, or a kernel JupyterLab interrupts, would never hear it.
# A handler (unlike an ignored signal) is reset by exec, so this restores it for them too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
    from grader.logistics import batch as grading

    root = tmp_path_factory.mktemp("released") / "exercises"
    root.mkdir()
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", root)
    for name in ("source", "refs"):
        shutil.copytree(REPO / "exercises" / name, root / name,
                        ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    grading.release(root, log=lambda *a: None)
    return root
