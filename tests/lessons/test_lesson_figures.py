"""Lessons' own figures can be read: no overlapping or clipped text, none too faint on its fill
(``kernelsim.views.readability.unreadable_text``).

Every executed lesson prints ``_course.UNREADABLE_MARK`` under a figure that fails the check
(test_lessons.py looks for it). Here a notebook kernel shows that it does, and the figure
cells of lessons 13 and 14, whose data is small enough to give by hand, run alone (in
seconds, without executing the lessons).
"""

from __future__ import annotations

import os
from pathlib import Path

import jupytext
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LESSONS_DIR = REPO / "lessons"

# what each figure cell reads from the cells before it
FIGURE_DATA = {
    # what two_core_block_owners() returns (the lesson asserts it): rows 0-1 core 0, 2-3 core 1
    "13-kernel-api": {"block_owner": np.array([[0, 0], [0, 0], [1, 1], [1, 1]])},
    "14-across-chips": {"DEVICES": 4},
}


@pytest.mark.parametrize("lesson", list(FIGURE_DATA))
def test_the_lessons_figure_cell_draws_a_readable_figure(lesson, course):
    cells = [c.source for c in jupytext.read(LESSONS_DIR / f"{lesson}.py").cells
             if c.cell_type == "code" and "plt.subplots(" in c.source]
    assert len(cells) == 1, f"{lesson}: {len(cells)} figure cells, this test runs one"
    namespace = {"np": np, "plt": plt, "_course": course, **FIGURE_DATA[lesson]}
    exec(compile(cells[0], f"{lesson} figure cell", "exec"), namespace)  # noqa: S102
    fig = namespace["fig"]
    try:
        assert course.unreadable_text(fig) == []
    finally:
        plt.close(fig)


CELLS = {
    "faint": "fig, ax = plt.subplots()\nax.set_title('faint')\n"
             "ax.text(0.5, 0.5, 'pale', color='#dddddd')",
    "clean": "fig, ax = plt.subplots()\nax.set_title('clean')\nax.text(0.5, 0.5, 'dark')",
    "bare": "bare = Figure()\nbare.subplots().set_title('bare')\n"
            "bare.text(0.5, 0.5, 'pale', color='#eeeeee')\nbare",
    "returned": "fig, ax = plt.subplots()\nax.set_title('returned')\n"
                "ax.text(0.5, 0.5, 'pale', color='#eeeeee')\nfig",
}


def test_a_notebook_cell_prints_the_mark_under_a_figure_it_shows(course, monkeypatch):
    """In a kernel (the inline backend), as the lessons execute: a pyplot figure left open, a
    bare Figure a cell returns and a pyplot figure a cell returns are each checked once, and
    still shown."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import _course\nimport matplotlib.pyplot as plt\nfrom matplotlib.figure import Figure")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in CELLS.values()]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]))  # this checkout's kernelsim
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(LESSONS_DIR)}}).execute()
    for name, cell in zip(CELLS, nb.cells[1:], strict=True):
        errors = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stderr")
        marks = [line for line in errors.splitlines() if line.startswith(course.UNREADABLE_MARK)]
        assert len(marks) == (name != "clean"), (name, errors)
        assert all(f"figure '{name}'" in m and "'pale'" in m for m in marks), marks
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), name
