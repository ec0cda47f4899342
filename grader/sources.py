"""What the course's stored outputs are made from: the lessons, the files each lesson's output
comes from, and one digest of "made from these files".

A stored output records the digest of its sources, and is current while that digest is
(``grader.website.shipped_lessons``: the lessons' executed pages; ``grader.tasks.shipped``:
the shipped-kernels corpus). Both stand on this module; it imports nothing of the grader.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LESSONS_DIR = REPO / "lessons"
# a lesson that takes functions from another one: _course.definitions("08-flash-attention", ...)
_DEFINITIONS = re.compile(r"""definitions\(\s*["'](\d\d-[\w-]+)["']""")
# a module a lesson imports (a benchmark's, from bench/ on its path), a record it reads
_IMPORTED = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.M)
_RECORDED = re.compile(r"""["']recorded["']\s*/\s*["']([\w.-]+)["']""")


def lessons() -> list[Path]:
    return sorted(LESSONS_DIR.glob("[0-9][0-9]-*.py"))


def lesson_inputs(lesson: Path) -> list[Path]:
    """The files a lesson's outputs come from: the lesson, the lessons it takes functions from,
    ``lessons/_course.py``, kernelsim (Python and the viewer's JavaScript), and the benchmark's
    modules it imports and records it reads (lesson 16: ``bench/gpu_kernels.py``, the H200
    run)."""
    text = lesson.read_text()
    taken = {LESSONS_DIR / f"{stem}.py" for stem in _DEFINITIONS.findall(text)}
    bench = {REPO / "bench" / f"{name}.py" for name in _IMPORTED.findall(text)}
    recorded = {REPO / "bench" / "recorded" / name for name in _RECORDED.findall(text)}
    return sorted({lesson, *taken, LESSONS_DIR / "_course.py",
                   *(p for p in bench | recorded if p.is_file()),
                   *(REPO / "kernelsim").rglob("*.py"), *(REPO / "kernelsim").rglob("*.js")})


def files_digest(paths: Iterable[Path], header: bytes = b"") -> str:
    """sha256 (hex) of ``header`` then, in path order, each file's path under the repository
    and its bytes: what a stored output (a shipped page, the shipped-kernels corpus) was made
    from. The same files give the same digest in any order."""
    digest = hashlib.sha256(header)
    for path in sorted(set(paths)):
        digest.update(b"\0" + path.relative_to(REPO).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
