"""`pallas-course serve`: both servers answer, and SIGINT (Ctrl-C) stops both."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sitetools import CHROMIUM, REPO, free_port


def _children(pid: int) -> list[int]:
    kids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if re.search(rf"^PPid:\s+{pid}$", text, re.MULTILINE):
            kids.append(int(status.parent.name))
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return not re.search(r"^State:\s+Z", state, re.MULTILINE)


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status


def _wait_for(url: str, deadline: float, proc: subprocess.Popen) -> int:
    last: Exception | None = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited with {proc.returncode}"
        try:
            return _get(url)
        except Exception as e:  # noqa: BLE001 - not up yet
            last = e
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer: {last}")


def _lesson_opens_as_notebook(browser, lab_port: int, token: str) -> None:
    """Opening a jupytext lesson's URL in JupyterLab shows notebook cells, not a text editor."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{lab_port}/lab/tree/lessons/01-why-pallas.py"
                  f"?token={token}")
        page.locator(".jp-NotebookPanel .jp-MarkdownCell").first.wait_for(timeout=60000)
        # JupyterLab renders cells progressively: wait for a code cell rather than count now
        page.locator(".jp-NotebookPanel .jp-CodeCell").first.wait_for(timeout=60000)
        assert page.locator(".jp-NotebookPanel .jp-CodeCell").count() > 0
    finally:
        context.close()


def lessons_workspace(dest: Path) -> Path:
    """A learner workspace holding only the lessons (what serve needs; no release step)."""
    from grader.learner import workspace

    (dest / "lessons").mkdir(parents=True)
    for f in workspace.lesson_files(REPO):
        shutil.copy(f, dest / "lessons" / f.name)
    return dest


@pytest.mark.slow
def test_serve_answers_and_sigint_stops_both(built_site, tmp_path, request):
    port, lab_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    ws = lessons_workspace(tmp_path / "ws")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grader.cli", "serve", "--port", str(port),
             "--lab-port", str(lab_port), "--no-build", "--workspace", str(ws)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # (a failure below shows the log: serve.log holds both servers' output)
        assert _wait_for(f"http://127.0.0.1:{port}/", deadline, proc) == 200
        lab_url = None
        while time.monotonic() < deadline and not lab_url:
            m = re.search(r"JupyterLab: (http://\S+)", log.read_text())
            lab_url = m.group(1) if m else None
            time.sleep(0.2)
        assert lab_url, log.read_text()
        token = lab_url.split("token=")[1]
        assert _wait_for(f"http://127.0.0.1:{lab_port}/api/status?token={token}",
                         deadline, proc) == 200
        # the lesson opens as a notebook through jupytext's contents manager
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{lab_port}/api/contents/lessons/01-why-pallas.py"
            f"?type=notebook&content=1&token={token}", timeout=30).read().decode()
        assert '"type": "notebook"' in body or '"type":"notebook"' in body
        if Path(CHROMIUM).exists():
            _lesson_opens_as_notebook(request.getfixturevalue("browser"), lab_port, token)
        assert len(_children(proc.pid)) >= 1  # JupyterLab; the site is served in-process
        kids = _descendants(proc.pid)  # the servers, and the kernel the lesson started
        # the token is in a 0600 file, never on a command line (ps shows those to every user)
        cmdlines = [b" ".join(Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0"))
                    for k in kids if _alive(k)]
        assert cmdlines and not [c for c in cmdlines if token.encode() in c], cmdlines
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log.read_text()
        stop = time.monotonic() + 15
        while time.monotonic() < stop and any(_alive(k) for k in kids):
            time.sleep(0.2)
        assert not [k for k in kids if _alive(k)], f"left running: {kids}\n{log.read_text()}"
    finally:
        if proc.poll() is None:  # a failed test: stop what it started, JupyterLab (in a
            leftover = _descendants(proc.pid)  # session of its own) and its kernel with it
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in leftover:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_lab_opens_python_files_as_jupytext_notebooks():
    import json

    from grader.website import site

    overrides = json.loads((site.LAB_CONFIG_DIR / "labconfig" /
                            "default_setting_overrides.json").read_text())
    viewers = overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers["python"] == "Jupytext Notebook"
    cmd = site.lab_command(8888, REPO / "workspace")
    assert f"--ServerApp.root_dir={REPO / 'workspace'}" in cmd
    assert "--ServerApp.default_url=/lab/tree/lessons" in cmd


def test_lab_asks_no_learner_about_jupyter_news():
    """JupyterLab's default ("none") pops up "Would you like to get notified about official
    Jupyter news?" on a learner's first page (issue 37); the course answers "Never" for them,
    with a value the installed JupyterLab's own schema accepts."""
    import json

    from jupyterlab.commands import get_app_dir

    from grader.website import site

    plugin = "@jupyterlab/apputils-extension:notification"
    overrides = json.loads((site.LAB_CONFIG_DIR / "labconfig" /
                            "default_setting_overrides.json").read_text())[plugin]
    schema = json.loads((Path(get_app_dir()) / "schemas" / plugin.replace(":", "/")
                         ).with_suffix(".json").read_text())["properties"]
    assert overrides["fetchNews"] == "false"
    assert {"const": "false", "title": "Never"} in schema["fetchNews"]["oneOf"]
    assert overrides["checkForUpdates"] is False and schema["checkForUpdates"]["type"] == "boolean"


def test_lab_token_is_private_and_kept_per_workspace(tmp_path):
    """One token per workspace, in files only its owner reads; a restart finds the same one, so
    the printed URL and the browser's login stay valid."""
    import stat

    from grader.website import site

    ws, other = tmp_path / "ws", tmp_path / "other"
    folder, token = site.lab_settings(ws, tmp_path / "state")
    assert site.lab_settings(ws, tmp_path / "state") == (folder, token)
    assert site.lab_settings(other, tmp_path / "state")[1] != token
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for f in ("token", "jupyter_server_config.json"):
        assert stat.S_IMODE((folder / f).stat().st_mode) == 0o600, f
    config = (folder / "jupyter_server_config.json").read_text()
    assert token in config and "-l" not in config  # a terminal that is not a login shell
    assert token not in " ".join(site.lab_command(8888, ws))
    env = site.lab_env(ws, folder)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0] == str(folder)
