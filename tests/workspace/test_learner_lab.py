"""JupyterLab as `make start` serves it to a learner (chromium): rooted in the workspace, no
nbgrader instructor tool on screen or on the server, the site's "open in JupyterLab" links
open their notebook in the browser that opened the printed URL, and the check command a
notebook names works in JupyterLab's terminal from the workspace and from the exercise's
folder."""

from __future__ import annotations

import json
import re
import subprocess
import time
import types
import urllib.error
import urllib.request

import jupytext
import pytest
import websocket
from sitetools import free_port, load_hooks, load_site  # on sys.path: conftest.py puts it there
from wstools import REPO

from grader.learner import workspace
from grader.website import site

INSTRUCTOR_TOOLS = ("Create Assignment", "Create assignment", "Formgrader", "Course List")


def _site_links() -> list[str]:
    """The JupyterLab paths the site links to: every lesson's header, every released
    assignment's page."""
    hooks = load_hooks()
    html = [hooks.lesson_header(types.SimpleNamespace(
        file=types.SimpleNamespace(src_uri=f"lessons/{p.name}"), url=f"lessons/{p.stem}/"), {})
        for p in workspace.lesson_files(REPO)[:-1]]
    html += [load_site("pages").assignment_md(a) for a in load_site("content").assignments()]
    links = re.findall(r"http://127\.0\.0\.1:8888(/lab/tree/[^\s\"')]+)", "\n".join(html))
    assert links, "the site links nothing in JupyterLab"
    return sorted(set(links))


@pytest.fixture(scope="module")
def learner_lab(full_course, tmp_path_factory):
    ws = tmp_path_factory.mktemp("learner") / "workspace"
    workspace.create(ws, full_course, REPO)
    port = free_port()
    settings, token = site.lab_settings(ws, tmp_path_factory.mktemp("lab"))
    proc = subprocess.Popen(site.lab_command(port, ws), cwd=ws, env=site.lab_env(ws, settings),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"JupyterLab exited {proc.returncode}"
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not answer in 120 s"
                time.sleep(0.3)
        yield base, token, ws
    finally:
        site.stop_processes([proc])  # as serve stops it: SIGTERM, then SIGKILL after 10 s


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_instructor_server_extensions_are_off(learner_lab):
    base, token, _ = learner_lab
    assert _status(f"{base}/formgrader?token={token}") == 404
    assert _status(f"{base}/api/contents/lessons?token={token}") == 200


def test_learner_sees_no_instructor_tool_and_site_links_open(learner_lab, browser):
    base, token, ws = learner_lab
    links = _site_links()
    for path in links:  # every linked notebook is in the workspace make start makes
        assert (ws / path.removeprefix("/lab/tree/")).is_file(), path
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{base}/lab/tree/lessons?token={token}")  # the printed URL
        page.locator(".jp-DirListing-item").first.wait_for(timeout=90000)
        # The site links exercise notebooks only once the repository's course is released (a
        # clean clone's is not): then open the workspace's first exercise the same way.
        exercise = next((x for x in links if x.endswith(".ipynb")), None) or (
            "/lab/tree/" + str(sorted(ws.glob("exercises/*/*.ipynb"))[0].relative_to(ws)))
        for path in [links[0], exercise]:
            page.goto(base + path)  # a site link: no token in it
            # the visible panel's: JupyterLab may restore the notebook opened before as a
            # hidden tab, whose cells come first in the page
            page.locator(".jp-NotebookPanel .jp-CodeCell:visible").first.wait_for(timeout=90000)
            assert "/login" not in page.url
        page.locator(".jp-Toolbar [title='Validate Assignment']").first.wait_for(timeout=30000)
        labels = page.locator(".lm-MenuBar-itemLabel").all_inner_texts()
        assert "Nbgrader" not in labels, labels
        shown = page.locator("body").inner_text()
        titles = " ".join(page.locator("[title]").evaluate_all("els => els.map(e => e.title)"))
        for tool in INSTRUCTOR_TOOLS:
            assert tool not in shown and tool not in titles, tool
    finally:
        context.close()


def _terminal(base: str, token: str, command: str, timeout: float = 300) -> str:
    """``command`` typed into a new JupyterLab terminal (its websocket API); what it printed."""
    req = urllib.request.Request(f"{base}/api/terminals?token={token}", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=30) as r:
        name = json.load(r)["name"]
    ws_url = base.replace("http://", "ws://") + f"/terminals/websocket/{name}?token={token}"
    conn = websocket.create_connection(ws_url, timeout=timeout)
    out = []
    try:
        conn.send(json.dumps(["stdin", f"{command}; echo DONE-$?-DONE\r"]))
        deadline = time.monotonic() + timeout
        while not re.search(r"DONE-\d+-DONE", "".join(out)):
            assert time.monotonic() < deadline, "".join(out)
            kind, *rest = json.loads(conn.recv())
            if kind == "stdout":
                out.append(rest[0])
    finally:
        conn.close()
        urllib.request.urlopen(urllib.request.Request(
            f"{base}/api/terminals/{name}?token={token}", method="DELETE"), timeout=30)
    return "".join(out)


def test_documented_check_command_works_in_the_terminal(learner_lab):
    base, token, ws = learner_lab
    nb = ws / "exercises" / "01_first_kernel" / "first_kernel.ipynb"
    intro = jupytext.read(nb).cells[0].source
    command = re.search(r"`(pallas-course check [^`]+)`", intro)[1]
    for folder in (ws, nb.parent):
        out = _terminal(base, token, f"cd {folder} && {command}")
        assert "command not found" not in out and "no notebook" not in out, out
        # the released notebook's tasks are not done yet: each check runs and fails
        assert "FAIL  add_visible: CheckFailed: add: not implemented yet" in out, out
        assert "0 passed, 3 failed" in out and "DONE-1-DONE" in out, out
