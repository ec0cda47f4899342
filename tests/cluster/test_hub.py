"""A class on a real JupyterHub (deploy/jupyterhub/jupyterhub_config.py, configurable-http-proxy
from npm): two learners and an instructor, driven through the hub's REST API and the servers'
nbgrader extensions; grades from ``pallas-course autograde`` on the collected submissions."""

from __future__ import annotations

import json
import re
import shutil
import time

import nbformat
import pytest
from clustertools import REPO, A, Hub, new_course, solved

from grader.logistics import batch as grading

LEARNERS, INSTRUCTOR = ["ana", "ben"], "teacher"
COURSE_ID = "pallas-course"

pytestmark = pytest.mark.skipif(shutil.which("configurable-http-proxy") is None,
                                reason="configurable-http-proxy missing: make system-packages "
                                "installs it from npm")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    course = new_course(tmp_path_factory.mktemp("hub") / "course")
    grading.release(course, A, log=lambda *a: None)
    h = Hub(tmp_path_factory.mktemp("hub-state"), course, LEARNERS, [INSTRUCTOR],
            REPO / "deploy" / "jupyterhub" / "jupyterhub_config.py")
    h.course = course
    try:
        h.tokens = {u: h.api("POST", f"/hub/api/users/{u}/tokens",
                             json={"note": "test", "expires_in": 3600})["token"]
                    for u in [*LEARNERS, INSTRUCTOR]}
        for u in h.tokens:
            h.api("POST", f"/hub/api/users/{u}/server")
        deadline = time.monotonic() + 180
        for u in h.tokens:
            while not h.api("GET", f"/hub/api/users/{u}")["servers"].get("", {}).get("ready"):
                assert time.monotonic() < deadline, f"{u}'s server did not start"
                time.sleep(1)
        yield h
    finally:
        h.close()


def test_roles_get_their_extensions(hub):
    learner, teacher = hub.tokens["ana"], hub.tokens[INSTRUCTOR]
    assert hub.api("GET", f"/user/{INSTRUCTOR}/formgrader/api/status", teacher)["status"]
    with pytest.raises(RuntimeError, match="404"):
        hub.api("GET", "/user/ana/formgrader/api/status", learner)
    page = hub.api("GET", "/user/ana/lab", learner).text
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page,
                                  re.S).group(1))
    assert "@jupyter/nbgrader:formgrader" in config["disabledExtensions"]
    assert "@jupyter/nbgrader:create-assignment" in config["disabledExtensions"]
    assert "@jupyter/nbgrader:assignment-list" not in config["disabledExtensions"]


def test_release_fetch_submit_collect_autograde(hub):
    teacher = hub.tokens[INSTRUCTOR]
    fg = f"/user/{INSTRUCTOR}/formgrader/api/assignment/{A}"
    res = hub.api("POST", f"{fg}/release", teacher)
    assert res["success"], res
    assert (hub.course / "exchange" / COURSE_ID / "outbound" / A).is_dir()

    source = json.loads(next((hub.course / "source" / A).glob("*.ipynb")).read_text())
    for learner, wrong in zip(LEARNERS, (False, True), strict=True):
        token, base = hub.tokens[learner], f"/user/{learner}"
        listed = hub.api("GET", f"{base}/assignments", token, params={"course_id": COURSE_ID})
        assert [x["assignment_id"] for x in listed["value"]] == [A], listed
        hub.api("POST", f"{base}/assignments/fetch", token,
                json={"course_id": COURSE_ID, "assignment_id": A})
        # the learner edits the fetched notebook (Jupyter's contents API) and submits it
        folder = f"{base}/api/contents/{COURSE_ID}/{A}"
        (name,) = [f["name"] for f in hub.api("GET", folder, token)["content"]
                   if f["name"].endswith(".ipynb")]
        nb = hub.api("GET", f"{folder}/{name}", token)["content"]
        hub.api("PUT", f"{folder}/{name}", token,
                json={"type": "notebook", "format": "json",
                      "content": solved(nb, source, wrong)})
        res = hub.api("POST", f"{base}/assignments/submit", token,
                      json={"course_id": COURSE_ID, "assignment_id": A})
        assert "success" not in res or res["success"], res

    res = hub.api("POST", f"{fg}/collect", teacher)
    assert res["success"], res
    assert sorted(s for s, _ in grading.submissions(hub.course, A)) == sorted(LEARNERS)
    nbformat.read(next((hub.course / "submitted" / "ben" / A).glob("*.ipynb")), as_version=4)

    results = grading.autograde(hub.course, A, workers=2, progress=None, log=lambda *a: None)
    assert {r["student"]: r["status"] for r in results} == {"ana": "graded", "ben": "graded"}
    # the instructor's formgrader reads the same gradebook
    subs = hub.api("GET", f"/user/{INSTRUCTOR}/formgrader/api/submissions/{A}", teacher)
    scores = {s["student"]: (s["score"], s["max_score"]) for s in subs}
    assert scores == {"ana": (9, 9), "ben": (6, 9)}, scores
