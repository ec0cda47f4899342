"""`pallas-course check NOTEBOOK` finds the notebook where a learner types the command: from the
exercise's folder, from the workspace (by path or by name alone), from any folder below it,
and names what to do when the name is unknown or means two notebooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import check


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.delenv(check.WORKSPACE_ENV, raising=False)
    for rel in ("exercises/01_first_kernel/first_kernel.ipynb",
                "exercises/02_tiling/tiling.ipynb", "exercises/03_x/common.ipynb",
                "exercises/04_y/common.ipynb", "lessons/01-why.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    return tmp_path


def test_found_from_the_folder_the_workspace_and_below(ws, monkeypatch):
    nb = ws / "exercises" / "01_first_kernel" / "first_kernel.ipynb"
    assert check.find_notebook(Path("first_kernel.ipynb"), nb.parent) == nb
    assert check.find_notebook(Path("first_kernel.ipynb"), ws) == nb
    assert check.find_notebook(Path("first_kernel"), ws / "lessons") == nb
    assert check.find_notebook(
        Path("exercises/01_first_kernel/first_kernel.ipynb"), ws / "lessons") == nb
    assert check.find_notebook(Path("lessons/01-why.py"), nb.parent) == \
        ws / "lessons" / "01-why.py"
    # a checkout's root: its workspace/, not the course's exercises/ beside it
    checkout = ws.parent / "checkout"
    (checkout / "exercises" / "source").mkdir(parents=True)
    ws.rename(checkout / "workspace")
    (checkout / "workspace" / check.WORKSPACE_LEDGER).write_text("{}")
    assert check.find_notebook(Path("first_kernel.ipynb"), checkout) == \
        checkout / "workspace" / nb.relative_to(ws)
    (checkout / "workspace").rename(ws)
    # JupyterLab's terminals are told the workspace (serve sets it)
    monkeypatch.setenv(check.WORKSPACE_ENV, str(ws))
    assert check.find_notebook(Path("tiling.ipynb"), ws.parent) == \
        ws / "exercises" / "02_tiling" / "tiling.ipynb"


def test_unknown_or_ambiguous_names_say_what_to_do(ws):
    with pytest.raises(check.NotebookNotFound, match="several notebooks of that name: "
                       "exercises/03_x/common.ipynb, exercises/04_y/common.ipynb"):
        check.find_notebook(Path("common.ipynb"), ws)
    with pytest.raises(check.NotebookNotFound, match=r"no notebook nope.ipynb in .*give its "
                       r"path, e\.g\. `pallas-course check exercises/01_first_kernel/"):
        check.find_notebook(Path("nope.ipynb"), ws)
    assert check.run(Path("nope.ipynb")) == 2
