"""The learner's workspace: ``make start``'s copy of the lessons and the released notebooks.

``pallas-course workspace [DIR]`` (``make start`` runs it) fills ``DIR`` (default
``workspace/`` in the repository) with what a learner works on::

    DIR/lessons/NN-*.py, _course.py        the lessons (jupytext notebooks) and their helper
    DIR/exercises/<assignment>/<nb>.ipynb  the released student notebooks
    DIR/exercises/<assignment>/refs/       their visible reference cases (course data)

A file is copied when it is missing. A notebook or lesson that is already there is never
written again once the learner changed it: ``--update`` replaces a file the learner never edited
(still byte for byte what was copied) with the course's newer version in place, offers the newer
version of an edited one as ``<name>.new<suffix>`` beside it, and refreshes ``refs/`` (reference
data, not learner work). ``DIR/.pallas-course-workspace.json`` records the course version each
file was copied from, so ``--update`` knows what changed and what the learner edited.

The guard that keeps ``release`` from overwriting a notebook someone worked in is
``grader.logistics.releases``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from grader.learner import check
from grader.logistics import build, releases

WORKSPACE_LEDGER = check.WORKSPACE_LEDGER  # in the workspace


def lesson_files(repo: Path) -> list[Path]:
    """The lessons a learner runs: ``lessons/NN-*.py`` and their shared ``_course.py``."""
    lessons = repo / "lessons"
    return sorted(lessons.glob("[0-9][0-9]-*.py")) + [lessons / "_course.py"]


def course_files(root: Path, repo: Path) -> dict[str, Path]:
    """Workspace path -> course file, for everything a workspace holds (released notebooks and
    their visible references must exist: run ``release`` first)."""
    files = {f"lessons/{p.name}": p for p in lesson_files(repo)}
    for a in build.assignments(root):
        rel = root / "release" / a
        for p in sorted(rel.rglob("*")):
            if p.is_file() and ".ipynb_checkpoints" not in p.parts:
                files[f"exercises/{a}/{p.relative_to(rel).as_posix()}"] = p
    return files


def _is_data(rel: str) -> bool:
    return "/refs/" in rel


def _beside(target: Path, src: Path) -> Path | None:
    """A free name for the newer version beside ``target`` (``x.new.ipynb``, ``x.new2.ipynb``,
    ...); None when one of them already holds exactly that version."""
    for n in range(1, 100):
        path = target.with_name(f"{target.stem}.new{n if n > 1 else ''}{target.suffix}")
        if not path.exists():
            return path
        if releases.sha256(path) == releases.sha256(src):
            return None
    raise RuntimeError(f"{target}: 99 newer versions are already beside it; tidy them up")


README = """# Your pallas-course workspace

Everything here is yours: `make start` and `pallas-course workspace` only add files that are
missing and never change or delete a file you edited.

- `lessons/` - the lessons (open a `.py` file in JupyterLab: it opens as a notebook)
- `exercises/<assignment>/` - the exercise notebooks; each test cell checks your kernel on the
  visible cases in `refs/`. *Kernel > Restart Kernel and Run All Cells* checks every task and
  the last cell lists what passed; in JupyterLab's terminal (*File > New > Terminal*):
  `pallas-course check first_kernel.ipynb`

When the course gets new material, `pallas-course workspace --update` adds new assignments,
updates the files you never edited in place, and puts a newer version of a file you edited
beside it as `<name>.new.ipynb` / `.new.py`. To start an exercise over, rename or delete your
notebook and run `make start` again.

Stuck? Ask here: {help_url}
"""
HELP_URL_ENV = "PALLAS_COURSE_HELP_URL"


def help_url(repo: Path) -> str:
    """Where a learner asks: ``$PALLAS_COURSE_HELP_URL``, else ``extra.ask.url`` of the
    checkout's mkdocs.yml (the site links the same place under every page)."""
    import yaml  # the site extra's (mkdocs brings it): the env var does without

    env = os.environ.get(HELP_URL_ENV)
    if env:
        return env
    try:
        config = yaml.safe_load((repo / "mkdocs.yml").read_text())
        return str(config["extra"]["ask"]["url"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return "your course's forum (ask your instructor)"


def create(dest: Path, root: Path, repo: Path, update: bool = False,
           log: Callable[[str], None] = print,
           release_log: Callable[[str], None] | None = None) -> dict[str, list[str]]:
    """Fill ``dest`` from the course; returns the workspace paths ``added``, ``updated`` (in
    place: the learner never edited them), ``offered`` (``.new`` copies beside a learner's
    edited file) and ``refreshed`` (reference data). ``release_log`` takes the instructor's
    side of it (what nbgrader's release says), default ``log``."""
    stale = releases.stale_releases(root)
    if stale:
        from grader.logistics import batch  # seconds to import: make start does without it

        log(f"preparing {len(stale)} exercise(s) for the workspace (nbgrader's release)...")
        # one nbgrader start for all of them (about 6 s each on two cores)
        batch.release(root, stale[0] if len(stale) == 1 else None, log=release_log or log)
    dest.mkdir(parents=True, exist_ok=True)
    ledger_path = dest / WORKSPACE_LEDGER
    ledger = releases.read_json(ledger_path)
    copied = ledger.setdefault("files", {})
    done: dict[str, list[str]] = {"added": [], "updated": [], "offered": [], "refreshed": []}
    readme = dest / "README.md"
    if not readme.exists():
        readme.write_text(README.format(help_url=help_url(repo)))
    for rel, src in course_files(root, repo).items():
        target = dest / rel
        digest = releases.sha256(src)
        if not target.exists():
            kind = "added"
        elif not update or copied.get(rel) == digest:
            continue
        elif _is_data(rel):
            kind = "refreshed"
        elif rel in copied and releases.sha256(target) == copied[rel]:
            kind = "updated"  # the learner never edited it: nothing of theirs to keep
        else:
            kind = "offered"
            target = _beside(target, src)
            if target is None:
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(target)
        copied[rel] = digest
        done[kind].append(str(target.relative_to(dest)))
    releases.write_json(ledger_path, ledger)
    n_ex = sum(1 for r in done["added"] if r.endswith(".ipynb"))
    log(f"workspace {dest}: {len(done['added'])} file(s) added ({n_ex} exercise notebook(s)), "
        f"{len(done['updated'])} you never edited updated, "
        f"{len(done['offered'])} newer version(s) offered beside yours, "
        f"{len(done['refreshed'])} reference file(s) refreshed; nothing of yours was changed")
    for rel in done["offered"]:
        log(f"  newer course version: {rel}")
    return done
