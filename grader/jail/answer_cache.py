"""The checker's answers kept by what decides them, so that programs already checked are not
run again: a regrade (a late policy changed, ``--resume``), a resubmission that changed one
task, or two learners who hand in the same kernel get the checker's earlier answer.

An answer (``grader.jail.checker.Checker.check``) is a function of the grader's code and the JAX
it runs on (``code_digest``), the check's cases with their inputs (``cases_digest``), the checker's
limits, and the request: the task, visible or hidden, the programs the notebook's process traced
(their bytes) and the errors it met tracing them. ``key`` hashes all of them: a program that differs
in one byte, a changed case or a changed line of grader/ or kernelsim/ is checked afresh. Only
answers the checker wrote are kept; a check stopped at its time limit or by a dead checker is not.

The answers live in the course folder (``<root>/cache/answers``), which no jailed run sees and
which only the grading account and the instructors write. Each file is one frame
(``exchange.frame``) tagged under its own key: a file cut short, or copied under another key's
name, does not read back, and the check runs again. ``prune`` keeps the newest ``MAX_BYTES``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import secrets
import sys
from pathlib import Path

import numpy as np

from grader.jail import exchange
from grader.verdict import refs

FOLDER = Path("cache") / "answers"  # under the course's root
MAX_BYTES = 2 << 30  # kept per course; the oldest answers go first
_CODE_ROOTS = ("grader", "kernelsim")


def code_digest() -> bytes:
    """SHA-256 of what makes the checker's answers: every file of the grader/ and kernelsim/
    the jailed runs import (``refs.REPO``; path and bytes), and the Python, JAX and jaxlib.
    Read afresh for each run (~10 ms): a grading worker outlives an update of the code."""
    import jax
    import jaxlib

    h = hashlib.sha256(f"{sys.version}|{platform.machine()}|{jax.__version__}|"
                       f"{jaxlib.__version__}".encode())
    for name in _CODE_ROOTS:
        for path in sorted((refs.REPO / name).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(refs.REPO)).encode() + b"\0" + path.read_bytes())
    return h.digest()


def cases_digest(cases: list[dict], arrays: dict[str, np.ndarray]) -> bytes:
    """SHA-256 of one check's cases as the checker gets them (``exchange.load_checks``): their
    descriptions and every input array they name (dtype, shape, bytes)."""
    h = hashlib.sha256(json.dumps(cases, sort_keys=True, default=str).encode())
    for case in cases:
        for _, name, _ in case["inputs"]:
            a = np.ascontiguousarray(arrays[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}".encode() + a.tobytes())
    return h.digest()


def key(code: bytes, cases: bytes, request: dict, blob: bytes, limits: object = None) -> bytes:
    """The key of the answer to ``request`` (with the programs' bytes ``blob``) by the checker
    whose ``code_digest`` is ``code``, on the cases whose ``cases_digest`` is ``cases``, under
    ``limits`` (its ``repr``: a check that passed under more memory is asked again under less).
    The cell the check stands in is not part of it."""
    asked = {k: request.get(k) for k in ("task", "hidden", "programs", "errors", "failed")}
    h = hashlib.sha256(code + cases + repr(limits).encode())
    h.update(json.dumps(asked, sort_keys=True, default=str).encode() + b"\0" + blob)
    return h.digest()


class AnswerCache:
    """The answers kept under ``folder`` (``<course root>/cache/answers``)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, k: bytes) -> Path:
        name = k.hex()
        return self.folder / name[:2] / name

    def get(self, k: bytes) -> tuple[dict, bytes] | None:
        """The answer kept under ``k``, or None (never kept, pruned, or not a whole frame)."""
        path = self._path(k)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        frames, used, problem = exchange.read_frames(data, k)
        if len(frames) != 1 or used != len(data) or problem:
            return None
        with contextlib.suppress(OSError):  # used now: the last that prune removes
            os.utime(path)
        return frames[0]

    def put(self, k: bytes, message: dict, blob: bytes) -> None:
        """Keep the checker's answer under ``k`` (written whole, then renamed into place)."""
        path = self._path(k)
        with contextlib.suppress(OSError):  # a full or read-only disk costs a rerun, no grade
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
            tmp.write_bytes(exchange.frame(k, message, blob))
            os.replace(tmp, path)

    def prune(self, max_bytes: int = MAX_BYTES) -> int:
        """Remove the oldest answers until at most ``max_bytes`` are kept; how many went."""
        entries = []
        for path in self.folder.glob("*/*"):
            with contextlib.suppress(OSError):
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total, removed = sum(size for _, size, _ in entries), 0
        for _, size, path in sorted(entries):
            if total <= max_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size
                removed += 1
        return removed
