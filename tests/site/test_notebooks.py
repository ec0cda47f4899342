"""The lessons as notebooks to take away (site/notebooks.py, site/hooks.py's lesson header):
fast, no build. The setup cell runs here with its commands recorded, never run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import jupytext
import nbformat
import pytest
from sitetools import REPO, load_hooks, load_site

hooks = load_hooks()
notebooks = load_site("notebooks")
LESSON = REPO / "lessons" / "02-first-kernel.py"
URL = "https://github.com/acme/pallas-course"
CONFIG = {"repo_url": URL, "remote_branch": "gh-pages"}


def _page(lesson: Path):
    return types.SimpleNamespace(file=types.SimpleNamespace(src_uri=f"lessons/{lesson.name}"),
                                 url=f"lessons/{lesson.stem}/")


@pytest.mark.parametrize("repo_url", [None, URL])
def test_the_notebook_is_the_lesson_after_a_setup_cell(repo_url):
    nb = nbformat.reads(notebooks.lesson_notebook(LESSON, repo_url), as_version=4)
    nbformat.validate(nb)
    setup, *rest = nb.cells
    assert setup.cell_type == "code" and setup.source == notebooks.setup_cell(repo_url)
    assert [c.source for c in rest] == [c.source for c in jupytext.read(LESSON).cells]
    assert (URL in setup.source) == (repo_url is not None)


def test_hosted_links_need_a_github_repository():
    uri = notebooks.notebook_uri(LESSON)
    assert notebooks.hosted_links(None, "gh-pages", uri) == []
    assert notebooks.hosted_links("https://gitlab.com/acme/pallas-course", "gh-pages", uri) == []
    links = dict(notebooks.hosted_links(URL + ".git", "gh-pages", uri))
    path = "acme/pallas-course/blob/gh-pages/lessons/02-first-kernel/02-first-kernel.ipynb"
    assert links == {
        "Colab": f"https://colab.research.google.com/github/{path}",
        "Kaggle": f"https://www.kaggle.com/kernels/welcome?src=https://github.com/{path}"}


def test_the_lesson_header_offers_the_notebook_and_hosted_runtimes_only_with_a_repo_url():
    bare = hooks.lesson_header(_page(LESSON), {})
    assert '<a href="02-first-kernel.ipynb" download>' in bare
    assert "colab" not in bare.lower() and "kaggle" not in bare.lower()
    hosted = hooks.lesson_header(_page(LESSON), CONFIG)
    assert '<a href="02-first-kernel.ipynb" download>' in hosted
    assert ">Open in Colab</a>" in hosted and ">Open in Kaggle</a>" in hosted
    assert "colab.research.google.com/github/acme/pallas-course/blob/gh-pages/" in hosted


def _run_setup(tmp_path, monkeypatch, have: set[str]) -> list[list[str]]:
    """Run the hosted setup cell in ``tmp_path`` as if only the modules ``have`` of
    ``_course`` and ``kernelsim`` were importable; returns the commands it ran (a clone makes
    the clone's lessons/ folder)."""
    ran: list[list[str]] = []

    def run(cmd, check):
        ran.append(cmd)
        if cmd[:2] == ["git", "clone"]:
            (Path(cmd[-1]) / "lessons").mkdir(parents=True)

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        real("os") if name in have else None) if name in ("_course", "kernelsim")
        else real(name, *a))
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(notebooks.setup_cell(URL), {})  # noqa: S102 - the cell as a notebook runs it
    return ran


def test_the_setup_cell_does_nothing_beside_the_lessons(tmp_path, monkeypatch):
    assert _run_setup(tmp_path, monkeypatch, {"_course", "kernelsim"}) == []
    assert Path.cwd() == tmp_path


def test_the_setup_cell_installs_the_course_without_its_jax(tmp_path, monkeypatch):
    clone, pip = _run_setup(tmp_path, monkeypatch, set())
    assert clone[:2] == ["git", "clone"] and URL in clone
    assert pip[1:4] == ["-m", "pip", "install"] and "--no-deps" in pip
    assert not [a for a in pip[4:] if "jax" in a], pip
    assert Path.cwd() == tmp_path / "pallas-course" / "lessons"
    assert sys.path[0] == os.getcwd()


def test_the_setup_cell_never_installs_over_an_installed_course(tmp_path, monkeypatch):
    (clone,) = _run_setup(tmp_path, monkeypatch, {"kernelsim"})
    assert clone[:2] == ["git", "clone"]


def test_without_a_repository_the_setup_cell_only_says_where_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a process that ran the lessons' tests has lessons/ on its path and _course imported
    monkeypatch.delitem(sys.modules, "_course", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if not (Path(p or ".") / "_course.py").exists()])
    with pytest.raises(ModuleNotFoundError, match="lessons/ folder"):
        exec(notebooks.setup_cell(None), {})  # noqa: S102
    (tmp_path / "_course.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    exec(notebooks.setup_cell(None), {})  # noqa: S102
