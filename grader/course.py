"""What the exercise notebooks' test cells call: ``course.check(task_id, your_function)``.

``check`` runs the learner's function on the task's stored cases (``hidden=False``: the visible
cases shipped with the assignment; ``hidden=True``: the grading cases, only present on the
grader's machine), compares each output with the stored reference under the task's per-dtype
tolerance, then traces the function with kernelsim and checks its structural rules (a
``pallas_call`` is reached, grid, block shapes, scalar prefetch, HBM traffic budget).

It raises ``AssertionError`` with a message naming the case, the first differing element, its
block and the size of the difference, or the structural requirement and what was found.

Design note for grading hardening: the comparison (``compare``) and the structural verdict are
pure functions of (output, reference) and (trace dict, case); they can move to a trusted process
that receives only the learner's outputs and trace, without changing the notebooks' test cells.
When ``$PALLAS_COURSE_REPORT`` names a file, one JSON line per check is appended to it (used by
``pallas-course check``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from grader import refs as _refs
from grader import tasks as _tasks

__all__ = ["check", "compare", "CheckFailed"]


class CheckFailed(AssertionError):
    """A task's check failed: wrong values, wrong shape, or a structural rule not met."""


def _refdirs(hidden: bool) -> list[Path]:
    dirs = []
    env = os.environ.get("PALLAS_COURSE_REFS")
    if env:
        dirs.append(Path(env))
    root_refs = _refs.course_root() / "refs"
    dirs.append(root_refs)
    if not hidden:
        dirs.append(Path.cwd() / "refs")  # the copy shipped in a released assignment folder
    return dirs


def _cases(task_id: str, hidden: bool) -> tuple[Path, list[dict], dict]:
    for d in _refdirs(hidden):
        if not (d / "manifest.json").exists():
            continue
        manifest = _refs.load_manifest(d)
        entries = [e for e in manifest["cases"].values()
                   if e["task"] == task_id and e["hidden"] == hidden]
        if entries:
            return d, entries, manifest["tolerances"]
    kind = "hidden" if hidden else "visible"
    where = ", ".join(str(d) for d in _refdirs(hidden))
    hint = ("hidden cases only exist where the course is graded" if hidden
            else "run this notebook from its assignment folder (it ships a refs/ folder)")
    raise CheckFailed(f"no {kind} reference cases for task {task_id!r} in {where}: {hint}")


def _describe(entry: dict) -> str:
    shapes = ", ".join(f"{k}{tuple(entry['shapes'][k])}" for k in entry["inputs"])
    params = {k: v for k, v in entry["params"].items()}
    p = f" {params}" if params else ""
    return f"case {entry['case']} ({entry['dtype']}, seed {entry['seed']}: {shapes}{p})"


def compare(got: Any, expected: np.ndarray, dtype: str, tol: float, tolerances: dict,
            block: tuple[int, ...] | None = None) -> str | None:
    """None when ``got`` matches ``expected``; otherwise a message saying where and by how much."""
    try:
        g = np.asarray(got)
    except Exception as e:  # noqa: BLE001 - anything unconvertible is a wrong answer
        return f"the result could not be read as an array ({type(e).__name__}: {e})"
    if g.shape != expected.shape:
        return f"shape {g.shape} but expected {expected.shape}"
    if str(g.dtype) != str(expected.dtype):
        return f"dtype {g.dtype} but expected {expected.dtype} (cast the kernel's output)"
    t = tolerances.get(dtype) or tolerances["float32"]
    rtol, atol = t["rtol"] * tol, t["atol"] * tol
    gf, ef = g.astype(np.float64), expected.astype(np.float64)
    diff = np.abs(gf - ef)
    bad = ~(diff <= atol + rtol * np.abs(ef))  # NaN counts as bad
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"[{', '.join(map(str, idx))}]"
    msg = (f"{nbad} of {bad.size} elements differ; first at {where}: got {gf[idx]:.6g}, "
           f"expected {ef[idx]:.6g} (|diff| {diff[idx]:.3g} > tolerance "
           f"{atol + rtol * abs(ef[idx]):.3g}; rtol {rtol:.3g}, atol {atol:.3g}); "
           f"max |diff| {np.nanmax(np.where(np.isnan(diff), np.inf, diff)):.3g}")
    if block is not None and len(block) == len(idx):
        bidx = tuple(i // max(int(b), 1) for i, b in zip(idx, block, strict=True))
        nblk = tuple(-(-s // max(int(b), 1)) for s, b in zip(expected.shape, block, strict=True))
        msg += f"; that element lies in output block {bidx} of {nblk} (block shape {block})"
        if any(b == n - 1 for b, n in zip(bidx, nblk, strict=True)):
            msg += " -- an edge block: check partial (non-divisible) blocks"
    return msg


def _trace(task, fn, inputs: dict, params: dict):
    import jax.numpy as jnp

    import kernelsim

    arrays = [jnp.asarray(v) for v in inputs.values()]
    return kernelsim.trace(lambda *a: task.call(fn, list(a), params), *arrays)


def _out_block(t) -> tuple[int, ...] | None:
    try:
        outs = [o for o in t.calls[-1].operands if o.role == "output"]
        return tuple(outs[0].block_shape) if outs and outs[0].block_shape else None
    except Exception:  # noqa: BLE001
        return None


def _report(record: dict) -> None:
    path = os.environ.get("PALLAS_COURSE_REPORT")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def check(task_id: str, fn, hidden: bool = False, quiet: bool = False) -> None:
    """Run ``fn`` on the task's visible (or hidden) cases and check values and structure."""
    import jax
    import jax.numpy as jnp

    import kernelsim

    task = _tasks.get(task_id)
    kind = "hidden" if hidden else "visible"
    record: dict[str, Any] = {"task": task_id, "hidden": hidden, "passed": False}
    try:
        refdir, entries, tolerances = _cases(task_id, hidden)
        first = None
        for entry in entries:
            inputs, expected, params = _refs.load_case(refdir, entry)
            case = next(c for c in task.cases if c.name == entry["case"])
            if first is None:
                first = (case, inputs, params)
            arrays = [jnp.asarray(v) for v in inputs.values()]
            try:
                got = jax.device_get(task.call(fn, arrays, params))
            except NotImplementedError:
                raise CheckFailed(f"{task_id}: not implemented yet") from None
            msg = compare(got, expected, entry["dtype"], entry["tol"], tolerances)
            if msg is not None:
                block = None
                try:
                    block = _out_block(_trace(task, fn, inputs, params))
                except Exception:  # noqa: BLE001 - the block is only a hint
                    pass
                if block is not None:
                    msg = compare(got, expected, entry["dtype"], entry["tol"], tolerances, block)
                raise CheckFailed(f"{task_id}: wrong values for {_describe(entry)}: {msg}")
        case, inputs, params = first
        try:
            t = _trace(task, fn, inputs, params)
        except kernelsim.TraceError as e:
            record["rules"] = [str(_tasks.Rule("pallas_call reached", ">= 1", "none", False))]
            raise CheckFailed(f"{task_id}: structural check failed: your function never calls "
                              f"pl.pallas_call ({e}). The answer must be a Pallas kernel."
                              ) from None
        rules = task.structure(t, case, inputs)
        record["rules"] = [str(r) for r in rules]
        record["kernelsim"] = t.summary() if hasattr(t, "summary") else str(t)
        failed = [r for r in rules if not r.ok]
        if failed:
            lines = "\n  ".join(str(r) for r in failed)
            raise CheckFailed(f"{task_id}: structural check failed on {case.name} "
                              f"({case.dtype}, {case.arrays}):\n  {lines}")
        record["passed"] = True
        if not quiet:
            print(f"{task_id}: {len(entries)} {kind} case(s) passed; structure: "
                  + "; ".join(f"{r.what} ok" for r in rules))
    except CheckFailed as e:
        record["message"] = str(e)
        raise
    except Exception as e:
        record["message"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        _report(record)
