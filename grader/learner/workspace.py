"""The learner's workspace, and the guard that keeps ``release`` from overwriting anyone's work.

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

nbgrader's ``generate_assignment --force`` deletes the release folder it regenerates. Before it
runs, ``keep_edited_releases`` moves every notebook there that is not byte-for-byte what the last
release wrote (someone worked in it) to ``<course>/release-kept/<assignment>/`` and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from grader.grading import build
from grader.learner import check

RELEASE_LEDGER = ".pallas-course-release.json"  # in the course root, beside release/
WORKSPACE_LEDGER = check.WORKSPACE_LEDGER  # in the workspace
KEPT_DIR = "release-kept"  # in the course root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


# ----------------------------------------------------------------------------- release guard
def source_fingerprint(root: Path, assignment: str) -> str:
    """What a release of ``assignment`` is made from: its jupytext sources and the manifest."""
    h = hashlib.sha256()
    for py in sorted((root / "source" / assignment).glob("*.py")):
        h.update(py.name.encode() + b"\0" + py.read_bytes() + b"\0")
    manifest = root / "refs" / "manifest.json"
    if manifest.exists():
        h.update(manifest.read_bytes())
    return h.hexdigest()


def stale_releases(root: Path) -> list[str]:
    """Assignments whose ``release/`` folder is missing or older than their sources."""
    ledger = _read_json(root / RELEASE_LEDGER)
    return [a for a in build.assignments(root)
            if not (root / "release" / a).is_dir()
            or ledger.get(a, {}).get("source") != source_fingerprint(root, a)]


def keep_edited_releases(root: Path, assignments: list[str], log=print) -> list[Path]:
    """Move notebooks in ``release/<a>/`` that the last release did not write (edited by hand,
    or from before this ledger existed) to ``release-kept/<a>/``; returns where they went."""
    ledger = _read_json(root / RELEASE_LEDGER)
    kept = []
    for a in assignments:
        written = ledger.get(a, {}).get("files", {})
        for nb in sorted((root / "release" / a).glob("*.ipynb")):
            if written.get(nb.name) == sha256(nb):
                continue
            dest = root / KEPT_DIR / a / nb.name
            if dest.exists():
                dest = dest.with_name(f"{nb.stem}.{time.strftime('%Y%m%d-%H%M%S')}{nb.suffix}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(nb, dest)
            kept.append(dest)
            log(f"kept {nb.relative_to(root)} -> {dest.relative_to(root)}: it differs from what "
                "`release` wrote (your work?); release never overwrites it. Learners work in "
                "`pallas-course workspace` (workspace/), which release does not touch.")
    return kept


def record_release(root: Path, assignments: list[str]) -> None:
    """Remember what ``release`` wrote, so the next one can tell an edited notebook apart."""
    path = root / RELEASE_LEDGER
    ledger = _read_json(path)
    for a in assignments:
        ledger[a] = {"source": source_fingerprint(root, a),
                     "files": {nb.name: sha256(nb)
                               for nb in sorted((root / "release" / a).glob("*.ipynb"))}}
    _write_json(path, ledger)


# ----------------------------------------------------------------------------- workspace
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
        if sha256(path) == sha256(src):
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
    import yaml

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
    stale = stale_releases(root)
    if stale:
        from grader.grading import batch

        log(f"preparing {len(stale)} exercise(s) for the workspace (nbgrader's release)...")
        # one nbgrader start for all of them (about 6 s each on two cores)
        batch.release(root, stale[0] if len(stale) == 1 else None, log=release_log or log)
    dest.mkdir(parents=True, exist_ok=True)
    ledger_path = dest / WORKSPACE_LEDGER
    ledger = _read_json(ledger_path)
    copied = ledger.setdefault("files", {})
    done: dict[str, list[str]] = {"added": [], "updated": [], "offered": [], "refreshed": []}
    readme = dest / "README.md"
    if not readme.exists():
        readme.write_text(README.format(help_url=help_url(repo)))
    for rel, src in course_files(root, repo).items():
        target = dest / rel
        digest = sha256(src)
        if not target.exists():
            kind = "added"
        elif not update or copied.get(rel) == digest:
            continue
        elif _is_data(rel):
            kind = "refreshed"
        elif rel in copied and sha256(target) == copied[rel]:
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
    _write_json(ledger_path, ledger)
    n_ex = sum(1 for r in done["added"] if r.endswith(".ipynb"))
    log(f"workspace {dest}: {len(done['added'])} file(s) added ({n_ex} exercise notebook(s)), "
        f"{len(done['updated'])} you never edited updated, "
        f"{len(done['offered'])} newer version(s) offered beside yours, "
        f"{len(done['refreshed'])} reference file(s) refreshed; nothing of yours was changed")
    for rel in done["offered"]:
        log(f"  newer course version: {rel}")
    return done
