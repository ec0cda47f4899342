"""A feedback page that still holds a hidden test never reaches a learner (the release leaves it
out and says why), and the test for one reads the page as a browser shows it: nbconvert's
highlighter splits ``course.check(..., hidden=True)`` into one span per token."""

from __future__ import annotations

import nbformat
from nbconvert import HTMLExporter

from grader.logistics import hidden_tests, inbound

MARKER = "### {} HIDDEN TESTS"
TEST_CELL = ('course.check("add", add)\n' + MARKER.format("BEGIN") +
             '\ncourse.check("add", add, hidden=True)\n' + MARKER.format("END"))


def _page(source: str) -> str:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["language_info"] = {"name": "python"}
    return HTMLExporter().from_notebook_node(nb)[0]


def test_a_highlighted_hidden_check_is_found():
    leaking = _page(TEST_CELL)
    assert "hidden=True" not in leaking  # what the old check looked for: tokens in spans
    assert hidden_tests.in_page(leaking)
    # the marker alone, and the hidden call alone, are each a leak
    assert hidden_tests.in_page(_page(MARKER.format("BEGIN")))
    assert hidden_tests.in_page(_page('course.check("add", add, hidden=True)'))
    assert not hidden_tests.in_page(_page(hidden_tests.HIDDEN_RE.sub("", TEST_CELL)))


def test_a_leaking_page_is_not_released(tmp_path):
    folder = tmp_path / "feedback" / "ada" / "01_first_kernel"
    folder.mkdir(parents=True)
    (folder / "submission_secret.txt").write_text("s")
    (folder / "first_kernel.html").write_text(_page('course.check("add", add)'))
    assert inbound.unreleasable(folder) is None
    (folder / "first_kernel.html").write_text(_page(TEST_CELL))
    why = inbound.unreleasable(folder)
    assert why and "first_kernel.html still holds a hidden test" in why
    assert "nbgrader_config.py" in why
    assert hidden_tests.withheld_pages(folder) == [folder / "first_kernel.html"]
