"""Build the mkdocs site when its sources changed, and serve it beside JupyterLab.

``serve`` starts two child processes, each in its own session so that a terminal's Ctrl-C
reaches only this process: a static file server over ``build/site`` and JupyterLab rooted at
the repository (opening on ``lessons/``; jupytext opens the ``.py`` lessons as notebooks). On
Ctrl-C (SIGINT) or SIGTERM it stops both, waits for them and returns.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SITE_DIR = REPO / "build" / "site"
SITE_SOURCES = ("mkdocs.yml", "site", "lessons", "exercises/source", "exercises/release",
                "kernelsim")
# JupyterLab reads <dir>/labconfig/default_setting_overrides.json from JUPYTER_CONFIG_PATH:
# there, ``.py`` files default to the "Jupytext Notebook" viewer.
LAB_CONFIG_DIR = REPO / "site" / "jupyter"
SITE_URL = "http://127.0.0.1:8000"
LAB_URL = "http://127.0.0.1:8888"
READY_TIMEOUT_S = 90


def _newest_mtime(paths: list[Path]) -> float:
    """Latest modification time (seconds since the epoch) under `paths`; 0.0 when none exist."""
    newest = 0.0
    for path in paths:
        if path.is_file():
            newest = max(newest, path.stat().st_mtime)
        elif path.is_dir():
            for child in path.rglob("*"):
                if child.is_file() and "__pycache__" not in child.parts \
                        and ".ipynb_checkpoints" not in child.parts:
                    newest = max(newest, child.stat().st_mtime)
    return newest


def site_is_stale() -> bool:
    """True when build/site is missing or older than any of its sources."""
    index = SITE_DIR / "index.html"
    if not index.exists():
        return True
    return _newest_mtime([REPO / p for p in SITE_SOURCES]) > index.stat().st_mtime


def build_site(strict: bool = True) -> None:
    """Run `mkdocs build` into build/site; raises CalledProcessError when the build fails.

    Lessons are executed (mkdocs-jupyter); unchanged ones come from .cache/mkdocs-jupyter/.
    """
    cmd = [sys.executable, "-m", "mkdocs", "build", "--clean"]
    if strict:
        cmd.append("--strict")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(cmd, cwd=REPO, check=True, env=env)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status < 500
    except urllib.error.HTTPError as err:
        return err.code < 500
    except OSError:
        return False


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each child's process group, then SIGKILL what is left after 10 s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def lab_command(lab_port: int, token: str) -> list[str]:
    return [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
            "--port", str(lab_port), "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={REPO}", "--ServerApp.default_url=/lab/tree/lessons",
            f"--IdentityProvider.token={token}",
            # offline machines: no announcement feed, no update check
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])]


def serve(port: int = 8000, lab_port: int = 8888, build: bool = True) -> int:
    """Build the site if stale (unless ``build`` is False), serve it and JupyterLab until
    Ctrl-C; returns an exit code (0 after Ctrl-C, a child's code if one exits first)."""
    if build and site_is_stale():
        build_site()
    if not (SITE_DIR / "index.html").exists():
        print(f"no site in {SITE_DIR}: run `pallas-course build-site` first", file=sys.stderr)
        return 1
    token = secrets.token_hex(16)
    config_path = os.pathsep.join(p for p in (str(LAB_CONFIG_DIR),
                                              os.environ.get("JUPYTER_CONFIG_PATH", "")) if p)
    lab_env = {**os.environ, "JUPYTER_CONFIG_PATH": config_path}
    # SIGTERM (from `kill`, a service manager or a test) stops us the way Ctrl-C does
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
             "--directory", str(SITE_DIR)],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # nbgrader's lab extensions read nbgrader_config.py from the working directory
        course = REPO / "exercises"
        lab_cwd = course if (course / "nbgrader_config.py").is_file() else REPO
        procs.append(subprocess.Popen(lab_command(lab_port, token), cwd=lab_cwd, env=lab_env,
                                      start_new_session=True))
        site_url = f"http://127.0.0.1:{port}/"
        lab_url = f"http://127.0.0.1:{lab_port}/lab/tree/lessons?token={token}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = {site_url, f"http://127.0.0.1:{lab_port}/api/status?token={token}"}
        while pending and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            pending = {u for u in pending if not _answers(u)}
            if pending:
                time.sleep(0.3)
        print(f"site:       {site_url}")
        print(f"JupyterLab: {lab_url}")
        print("            (lessons/ opens first; the exercises are in exercises/release/)")
        if pending:
            print(f"not answering yet: {', '.join(sorted(pending))}", file=sys.stderr)
        print("Ctrl-C stops both.", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.3)
        return max(p.returncode or 0 for p in procs)
    except KeyboardInterrupt:
        print("\nstopping the site server and JupyterLab...", flush=True)
        return 0
    finally:
        _stop(procs)
        signal.signal(signal.SIGTERM, previous)
