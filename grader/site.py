"""Build the mkdocs site when its sources changed, and serve it beside JupyterLab."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SITE_DIR = REPO / "build" / "site"
SITE_SOURCES = ("mkdocs.yml", "site", "lessons", "exercises/source", "kernelsim")
SITE_URL = "http://127.0.0.1:8000"
LAB_URL = "http://127.0.0.1:8888"


def _newest_mtime(paths: list[Path]) -> float:
    """Latest modification time (seconds since the epoch) under `paths`; 0.0 when none exist."""
    newest = 0.0
    for path in paths:
        if path.is_file():
            newest = max(newest, path.stat().st_mtime)
        elif path.is_dir():
            for child in path.rglob("*"):
                if child.is_file() and "__pycache__" not in child.parts:
                    newest = max(newest, child.stat().st_mtime)
    return newest


def site_is_stale() -> bool:
    """True when build/site is missing or older than any of its sources."""
    index = SITE_DIR / "index.html"
    if not index.exists():
        return True
    return _newest_mtime([REPO / p for p in SITE_SOURCES]) > index.stat().st_mtime


def build_site(strict: bool = True) -> None:
    """Run `mkdocs build` into build/site; raises CalledProcessError when the build fails."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "--clean"]
    if strict:
        cmd.append("--strict")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(cmd, cwd=REPO, check=True, env=env)


def serve(port: int = 8000, lab_port: int = 8888) -> int:
    """Build the site if stale, then serve it and JupyterLab until Ctrl-C; returns an exit code."""
    if site_is_stale():
        build_site()
    lab_root = REPO
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
             "--directory", str(SITE_DIR)],
            start_new_session=True,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
             "--port", str(lab_port), f"--ServerApp.root_dir={lab_root}",
             "--ServerApp.default_url=/lab/tree/lessons"],
            start_new_session=True,
        ),
    ]
    print(f"site:       http://127.0.0.1:{port}")
    print(f"JupyterLab: http://127.0.0.1:{lab_port}/lab (lessons/ and exercises/release/)")
    print("Ctrl-C stops both.", flush=True)
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return max(p.returncode or 0 for p in procs)
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
