"""The lessons as notebooks to take away: each ``lessons/NN-slug.py`` as an ``.ipynb`` beside its
page (shipped with the site, so the download works offline), whose first cell sets a hosted
runtime up, and the links that open that notebook in Colab or Kaggle.

The links need the notebook at a public address: the site's own files on GitHub, where
``mkdocs gh-deploy`` pushes them (mkdocs.yml's ``repo_url``, a GitHub repository, and its
``remote_branch``, ``gh-pages`` unless set). Without a GitHub ``repo_url`` there are no links,
and the first cell only says where the notebook runs. With one, the first cell clones that
repository and installs it with ``pip --no-deps``, as ``bench/student_copy_on_device.sh``
installed the student copy on the TPU machine: the runtime's own JAX stays the one that runs.
Read by ``site/hooks.py``."""

from __future__ import annotations

import re
from pathlib import Path

COLAB = "https://colab.research.google.com/github/{repo}/blob/{branch}/{path}"
KAGGLE = ("https://www.kaggle.com/kernels/welcome"
          "?src=https://github.com/{repo}/blob/{branch}/{path}")
_GITHUB = re.compile(r"https?://(?:www\.)?github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?")
CLONE = "pallas-course"  # the folder a hosted runtime clones the course into

# A runtime with the course beside this notebook (`make start`'s JupyterLab, a student copy)
# finds lessons/_course.py and skips the cell; a hosted one fetches the course first.
SETUP_HOSTED = f'''\
# Colab or Kaggle: fetch the course and run from its lessons/ (beside them, this does nothing).
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("_course") is None:
    if not os.path.isdir("{CLONE}"):
        subprocess.run(["git", "clone", "-q", "--depth=1", "REPO_URL",
                        "{CLONE}"], check=True)
    if importlib.util.find_spec("kernelsim") is None:  # never over an installed course
        # --no-deps: the runtime's own jax, built for its TPU, stays the one the lessons run on
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--ignore-requires-python", "./{CLONE}"], check=True)
    os.chdir("{CLONE}/lessons")
    sys.path.insert(0, os.getcwd())'''
SETUP_LOCAL = '''\
# The cells below import lessons/_course.py and kernelsim: run this notebook from the course's
# lessons/ folder (JupyterLab from `make start`, or a student copy from `pallas-course dist`).
import importlib.util
if importlib.util.find_spec("_course") is None:
    raise ModuleNotFoundError("_course: open this notebook from the course's lessons/ folder")'''


def github_repo(repo_url: str | None) -> str | None:
    """``owner/name`` of a GitHub ``repo_url``; None for none or another host (Colab opens
    notebooks from GitHub only)."""
    m = _GITHUB.fullmatch(repo_url or "")
    return m.group(1) if m else None


def setup_cell(repo_url: str | None) -> str:
    """The notebook's first cell: fetch and install the course on a hosted runtime when the
    repository is known, else only say where the notebook runs."""
    if github_repo(repo_url) is None:
        return SETUP_LOCAL
    return SETUP_HOSTED.replace("REPO_URL", repo_url.rstrip("/"))


def notebook_uri(lesson_path: Path) -> str:
    """Where the site ships a lesson's notebook: beside its page (and mkdocs-jupyter's copy of
    the ``.py``)."""
    return f"lessons/{lesson_path.stem}/{lesson_path.stem}.ipynb"


def lesson_notebook(lesson_path: Path, repo_url: str | None) -> str:
    """The lesson as ``.ipynb`` text: its cells as jupytext reads them, after the setup cell,
    without outputs."""
    import jupytext  # seconds to import: only the build's notebooks need it
    import nbformat

    nb = jupytext.read(lesson_path)
    nb.cells.insert(0, nbformat.v4.new_code_cell(setup_cell(repo_url),
                                                 metadata={"tags": ["setup"]}))
    nb.metadata.pop("jupytext", None)  # a plain notebook, not one paired with a .py
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.validate(nb)
    return nbformat.writes(nb)


def hosted_links(repo_url: str | None, branch: str, uri: str) -> list[tuple[str, str]]:
    """(name, URL) of each hosted runtime that opens the site's notebook ``uri`` from the
    ``branch`` the site is published to; none without a GitHub ``repo_url``."""
    repo = github_repo(repo_url)
    if repo is None:
        return []
    return [(name, form.format(repo=repo, branch=branch, path=uri))
            for name, form in (("Colab", COLAB), ("Kaggle", KAGGLE))]
