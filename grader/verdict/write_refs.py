"""The course's reference outputs written: every task's reference evaluated on every case,
its inputs and expected output stored under the course's ``refs/`` with the manifest
(``pallas-course refs``). What the files are and how they are read is ``grader.verdict.refs``,
which the jail's view of grader/ holds; this module, which imports the tasks, stays out of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from grader import tasks
from grader.verdict.refs import checksum, course_root, jsonable, to_storable, write_npz


def generate(root: Path | None = None, only: set[str] | None = None, log=print) -> dict:
    """Evaluate every task's reference on every case and write files plus the manifest."""
    root = root or course_root()
    refdir = root / "refs"
    manifest_path = refdir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.setdefault("tolerances", {})
    manifest["tolerances"] = {kind: {d: {"rtol": r, "atol": a} for d, (r, a) in row.items()}
                              for kind, row in tasks.TOLERANCES.items()}
    entries = manifest.setdefault("cases", {})
    for task in tasks.TASKS:
        if only and task.id not in only and task.assignment not in only:
            continue
        for case in task.cases:
            inputs = task.inputs(case)
            expected = task.expected(case, inputs)
            stored, dtypes = {}, {}
            for k, v in {**inputs, "expected": expected}.items():
                stored[k], dtypes[k] = to_storable(np.asarray(v))
            kind = "hidden" if case.hidden else "visible"
            rel = f"{task.assignment}/{kind}/{task.id}-{case.name}.npz"
            write_npz(refdir / rel, stored)
            entries[f"{task.id}/{case.name}"] = {
                "task": task.id, "case": case.name, "assignment": task.assignment,
                "hidden": case.hidden, "file": rel, "seed": case.seed, "dtype": case.dtype,
                "inputs": list(inputs), "dtypes": dtypes,
                "shapes": {k: list(np.shape(v)) for k, v in stored.items()},
                "params": {k: jsonable(v) for k, v in case.params.items()},
                "values": case.values, "tolerance": task.tolerance,
                **dict(zip(("rtol", "atol"), tasks.TOLERANCES[task.tolerance][case.dtype],
                           strict=True)),
                "sha256": checksum(stored),
            }
        log(f"refs: {task.id}: {len(task.cases)} cases")
    manifest["cases"] = dict(sorted(entries.items()))
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
