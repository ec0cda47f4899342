"""nbgrader's Validate dialog in JupyterLab as the course serves it (site/jupyter on
JUPYTER_CONFIG_PATH, which loads site/jupyter/custom/custom.css): a failing check's message
and hint, the traceback's last and longest lines, wrap inside the dialog instead of running
past its right edge."""

from __future__ import annotations

import urllib.request

import nbformat
import pytest
from sitetools import start_lab, watch

from grader.website import site

HINT = ("Hint: the block's last two dimensions must be divisible by (8, 128) or equal the "
        "array's; for x of shape (256, 512) the nearest legal block is (8, 128).")
CHECK = f"""\
def check():
    raise AssertionError("task 1 failed: block (4, 100) of x breaks TPU's (8, 128) tiling. "
                         {HINT!r})

check()"""


def _nbgrader_notebook(path) -> None:
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {
            "grade": False, "solution": True, "locked": False, "grade_id": "answer",
            "schema_version": 3}}),
        nbformat.v4.new_code_cell(CHECK, metadata={"nbgrader": {
            "grade": True, "solution": False, "locked": True, "points": 1,
            "grade_id": "check_task_1", "schema_version": 3}})])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


@pytest.mark.slow
def test_validate_dialog_shows_the_whole_message_and_hint(browser, tmp_path):
    _nbgrader_notebook(tmp_path / "task.ipynb")
    with open(tmp_path / "lab.log", "w") as log:
        proc, base, token = start_lab(tmp_path, log)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    w = watch(context)
    try:
        css = urllib.request.urlopen(f"{base}/custom/custom.css?token={token}",
                                     timeout=30).read().decode()
        assert "#validation-message pre" in css
        page = w.page
        page.goto(f"{base}/lab/tree/task.ipynb?token={token}")
        button = page.locator(".jp-Toolbar [title='Validate Assignment']").first
        button.wait_for(timeout=90_000)
        button.click()
        dialog = page.locator(".nbgrader-ErrorDialog .jp-Dialog-content")
        dialog.wait_for(timeout=120_000)
        pre = page.locator("#validation-message pre").last
        assert "nearest legal block is (8, 128)" in pre.inner_text()
        assert pre.evaluate("p => p.scrollWidth <= p.clientWidth")  # nothing past the edge
        box, text = dialog.bounding_box(), pre.bounding_box()
        assert text["x"] + text["width"] <= box["x"] + box["width"]
        assert box["x"] >= 0 and box["x"] + box["width"] <= 1280
    finally:
        context.close()
        site.stop_processes([proc])
