"""Reference outputs: inputs and expected outputs of every task case, stored with seed and checksum.

Layout under the course root (``exercises/`` by default)::

    refs/manifest.json                       seeds, dtypes, shapes, params, sha256 per case
    refs/<assignment>/visible/<task>-<case>.npz
    refs/<assignment>/hidden/<task>-<case>.npz   never copied into release/

The ``.npz`` files are written byte-for-byte deterministically (fixed zip timestamps), so
regenerating unchanged references changes nothing in git. bfloat16 arrays are stored as their
uint16 bit patterns; the manifest records the real dtype. The checksum covers dtype, shape and
bytes of every array and is verified on every load.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[2]


def course_root() -> Path:
    """The nbgrader course root: ``$PALLAS_COURSE_ROOT`` or the repository's ``exercises/``."""
    env = os.environ.get("PALLAS_COURSE_ROOT")
    return Path(env).resolve() if env else REPO / "exercises"


class ReferenceError_(RuntimeError):
    """A reference file is missing or does not match its checksum."""


def to_storable(a: np.ndarray) -> tuple[np.ndarray, str]:
    name = str(a.dtype)
    if name == "bfloat16":
        return a.view(np.uint16), name
    return a, name


def from_storable(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return a.view(ml_dtypes.bfloat16)
    return a.astype(dtype, copy=False)


def checksum(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for k in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[k]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{k}.npy", date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())
    os.replace(tmp, path)


def jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return {"__tuple__": list(v)}
    return v


def unjson(v: Any) -> Any:
    if isinstance(v, dict) and "__tuple__" in v:
        return tuple(v["__tuple__"])
    return v


def load_manifest(refdir: Path) -> dict:
    path = refdir / "manifest.json"
    if not path.exists():
        raise ReferenceError_(f"{path} is missing: run `pallas-course refs` (instructors) or "
                              "re-download the assignment folder (learners).")
    return json.loads(path.read_text())


def load_case(refdir: Path, entry: dict) -> tuple[dict[str, np.ndarray], np.ndarray, dict]:
    """Inputs (in call order), expected output and params of one manifest entry."""
    path = refdir / entry["file"]
    if not path.exists():
        raise ReferenceError_(f"reference file {path} is missing: run `pallas-course refs`.")
    with np.load(path, allow_pickle=False) as z:
        stored = {k: z[k] for k in z.files}
    if checksum(stored) != entry["sha256"]:
        raise ReferenceError_(f"reference file {path} does not match its checksum in "
                              "manifest.json: it was modified; run `pallas-course refs`.")
    arrays = {k: from_storable(v, entry["dtypes"][k]) for k, v in stored.items()}
    inputs = {k: arrays[k] for k in entry["inputs"]}
    params = {k: unjson(v) for k, v in entry["params"].items()}
    return inputs, arrays["expected"], params


def write_visible(root: Path, assignment: str, dest: Path) -> int:
    """Copy one assignment's visible reference files (and a manifest of only those) to dest."""
    refdir = root / "refs"
    manifest = load_manifest(refdir)
    cases = {k: v for k, v in manifest["cases"].items()
             if v["assignment"] == assignment and not v["hidden"]}
    dest.mkdir(parents=True, exist_ok=True)
    for entry in cases.values():
        target = dest / entry["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((refdir / entry["file"]).read_bytes())
    (dest / "manifest.json").write_text(json.dumps(
        {"tolerances": manifest["tolerances"], "cases": cases}, indent=1, sort_keys=True) + "\n")
    return len(cases)
