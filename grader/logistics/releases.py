"""The guard that keeps ``release`` from overwriting anyone's work, and its ledger.

nbgrader's ``generate_assignment --force`` deletes the release folder it regenerates. Before it
runs, ``keep_edited_releases`` moves every notebook there that is not byte-for-byte what the last
release wrote (someone worked in it) to ``<course>/release-kept/<assignment>/`` and says so;
after it, ``record_release`` writes what it wrote to ``<course>/.pallas-course-release.json``.
``stale_releases`` names the assignments whose release is older than their sources (the
learner's workspace and the student copy release those first).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from grader.logistics import build

RELEASE_LEDGER = ".pallas-course-release.json"  # in the course root, beside release/
KEPT_DIR = "release-kept"  # in the course root


def sha256(path: Path) -> str:
    """The file's sha256 (hex): what a ledger records of a file it wrote or copied."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_json(path: Path) -> dict:
    """A ledger; empty when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    """Write a ledger atomically: a reader sees the old one or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


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
    ledger = read_json(root / RELEASE_LEDGER)
    return [a for a in build.assignments(root)
            if not (root / "release" / a).is_dir()
            or ledger.get(a, {}).get("source") != source_fingerprint(root, a)]


def keep_edited_releases(root: Path, assignments: list[str], log=print) -> list[Path]:
    """Move notebooks in ``release/<a>/`` that the last release did not write (edited by hand,
    or from before this ledger existed) to ``release-kept/<a>/``; returns where they went."""
    ledger = read_json(root / RELEASE_LEDGER)
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
    ledger = read_json(path)
    for a in assignments:
        ledger[a] = {"source": source_fingerprint(root, a),
                     "files": {nb.name: sha256(nb)
                               for nb in sorted((root / "release" / a).glob("*.ipynb"))}}
    write_json(path, ledger)
