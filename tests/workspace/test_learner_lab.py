"""JupyterLab as `make start` serves it to a learner (chromium): rooted in the workspace, no
nbgrader instructor tool on screen or on the server, and the site's "open in JupyterLab" links
open their notebook in the browser that opened the printed URL."""

from __future__ import annotations

import re
import subprocess
import time
import types
import urllib.error
import urllib.request

import pytest
from sitetools import free_port, load_hooks  # on sys.path: conftest.py puts it there
from wstools import REPO

from grader import site, workspace

INSTRUCTOR_TOOLS = ("Create Assignment", "Create assignment", "Formgrader", "Course List")


def _site_links() -> list[str]:
    """The JupyterLab paths the site links to: every lesson's header, every released
    assignment's page."""
    hooks = load_hooks()
    html = [hooks.lesson_header(types.SimpleNamespace(file=types.SimpleNamespace(
        src_uri=f"lessons/{p.name}"))) for p in workspace.lesson_files(REPO)[:-1]]
    html += [hooks.assignment_md(a) for a in hooks.assignments()]
    links = re.findall(r"http://127\.0\.0\.1:8888(/lab/tree/[^\s\"')]+)", "\n".join(html))
    assert links, "the site links nothing in JupyterLab"
    return sorted(set(links))


@pytest.fixture(scope="module")
def learner_lab(full_course, tmp_path_factory):
    ws = tmp_path_factory.mktemp("learner") / "workspace"
    workspace.create(ws, full_course, REPO)
    port, token = free_port(), "learner-test-token"
    proc = subprocess.Popen(site.lab_command(port, token, ws), cwd=ws, env=site.lab_env(),
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
            page.locator(".jp-NotebookPanel .jp-CodeCell").first.wait_for(timeout=90000)
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
