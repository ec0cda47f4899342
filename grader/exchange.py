"""The files through which a jailed kernel and the grader trade cases and answers.

Before a test cell runs, the grader writes ``request.json`` and the cases' *inputs* (never the
expected outputs) into a folder the jail sees read-only; they are deleted when the cell ends,
so no learner cell that runs earlier can read them. ``course.check`` in the kernel runs the
learner's function on them and writes ``answer-<task>-<hidden|visible>.json`` (+ ``.npz`` of
outputs) into its working folder. The grader reads the answer without following links, with
size limits and without unpickling, and decides the verdict itself (``grader.verdict``).
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from grader import refs as _refs

REQUEST = "request.json"
MAX_ANSWER_BYTES = 256 << 20  # outputs of one check, uncompressed
MAX_OUTPUT_BYTES = 16 << 20  # one case's output: far above any task's, far below the limits
MAX_ERROR_CHARS = 2000  # of one error message in an answer


class AnswerError(Exception):
    """An answer file is missing, stale or not what ``course.check`` writes."""


class AnswerTooLarge(AnswerError):
    """An answer that is too big to read: a wrong answer of that task, not tampering."""


def answer_name(task_id: str, hidden: bool) -> str:
    return f"answer-{task_id}-{'hidden' if hidden else 'visible'}"


# ----------------------------------------------------------------------------- grader side
def write_request(request_dir: Path, nonce: str, checks: list[tuple[str, bool]],
                  refdir: Path) -> dict[tuple[str, bool], tuple[list[dict], list[tuple]]]:
    """Write the inputs of every ``(task, hidden)`` check of one cell; return what was loaded.

    Returns per check the manifest entries and ``(entry, inputs, expected, params)`` per case.
    """
    manifest = _refs.load_manifest(refdir)
    loaded: dict[tuple[str, bool], tuple[list[dict], list[tuple]]] = {}
    request: dict[str, Any] = {"nonce": nonce, "checks": []}
    for n, (task_id, hidden) in enumerate(checks):
        entries = [e for e in manifest["cases"].values()
                   if e["task"] == task_id and e["hidden"] == hidden]
        cases = [(e, *_refs.load_case(refdir, e)) for e in entries]
        loaded[(task_id, hidden)] = (entries, cases)
        arrays, described = {}, []
        for i, (e, inputs, _, params) in enumerate(cases):
            keys = []
            for name, a in inputs.items():
                stored, dtype = _refs.to_storable(a)
                arrays[f"c{i}_{name}"] = stored
                keys.append([name, f"c{i}_{name}", dtype])
            described.append({"case": e["case"], "inputs": keys,
                              "params": {k: _refs.jsonable(v) for k, v in params.items()}})
        file = f"inputs-{n}.npz"
        _refs.write_npz(request_dir / file, arrays)
        request["checks"].append({"task": task_id, "hidden": hidden, "file": file,
                                  "cases": described})
    (request_dir / REQUEST).write_text(json.dumps(request))
    return loaded


def clear_request(request_dir: Path) -> None:
    for p in request_dir.iterdir():
        p.unlink()


def read_no_follow(folder: Path, name: str, limit: int, consume: bool = False) -> bytes:
    """The bytes of regular file ``folder/name``; links and oversized files are refused.

    consume: delete the file once read, so that nothing can hand the same bytes in again.
    """
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            raise AnswerError("no answer was written") from None
        except OSError as e:
            raise AnswerError(f"{name} could not be opened ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise AnswerError(f"{name} is not a regular file")
            if st.st_size > limit:
                raise AnswerTooLarge(f"{name} is {st.st_size:,} bytes (limit {limit:,})")
            data = f.read(limit + 1)[:limit]
        if consume:
            os.unlink(name, dir_fd=dfd)
        return data
    finally:
        os.close(dfd)


def read_answer(workdir: Path, nonce: str, task_id: str, hidden: bool) -> dict[str, Any]:
    """The kernel's answer to one check: outputs (arrays), errors, trace dict, summary."""
    base = answer_name(task_id, hidden)
    try:
        meta = json.loads(read_no_follow(workdir, base + ".json", 16 << 20, consume=True))
    except (ValueError, UnicodeDecodeError) as e:
        raise AnswerError(f"the answer is not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("nonce") != nonce:
        raise AnswerError("the answer does not belong to this test cell (wrong nonce)")
    raw = read_no_follow(workdir, base + ".npz", MAX_ANSWER_BYTES, consume=True)
    outputs: dict[str, np.ndarray] = {}
    dtypes = meta.get("dtypes") or {}
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            if sum(i.file_size for i in zf.infolist()) > MAX_ANSWER_BYTES:
                raise AnswerTooLarge("the outputs unpack to more than "
                                     f"{MAX_ANSWER_BYTES:,} bytes")
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            for k in z.files:
                outputs[k] = _refs.from_storable(z[k], str(dtypes.get(k, z[k].dtype)))
    except AnswerError:
        raise
    except Exception as e:  # noqa: BLE001 - anything unreadable is a broken answer
        raise AnswerError(f"the outputs are unreadable ({type(e).__name__}: {e})") from None
    errors = meta.get("errors") or {}
    if not isinstance(errors, dict):
        raise AnswerError("the answer's errors are not a mapping")
    per_case = {}
    for key in ("traces", "trace_errors", "work"):
        if not isinstance(meta.get(key) or {}, dict):
            raise AnswerError(f"the answer's {key} are not a mapping")
        per_case[key] = meta.get(key) or {}
    return {"outputs": outputs, "errors": {str(k): str(v) for k, v in errors.items()},
            **per_case, "summary": str(meta.get("summary") or "")}


# ----------------------------------------------------------------------------- kernel side
def answer(request_dir: Path, task_id: str, fn, hidden: bool) -> None:
    """Run ``fn`` on the request's cases for this check and write the answer (in the kernel)."""
    import jax.numpy as jnp

    from grader import tasks, work

    kind = "hidden" if hidden else "visible"
    try:
        request = json.loads((request_dir / REQUEST).read_text())
    except FileNotFoundError:
        print(f"{task_id}: only test cells are graded; this {kind} check is not one of them")
        return
    check = next((c for c in request["checks"]
                  if c["task"] == task_id and c["hidden"] == hidden), None)
    if check is None:
        print(f"{task_id}: this test cell does not grade a {kind} check of {task_id!r}")
        return
    with np.load(request_dir / check["file"], allow_pickle=False) as z:
        cases = [(c["case"],
                  [jnp.asarray(_refs.from_storable(z[key], dtype)) for _, key, dtype
                   in c["inputs"]],
                  {k: _refs.unjson(v) for k, v in c["params"].items()})
                 for c in check["cases"]]
    task = tasks.get(task_id)
    stored, dtypes, errors = {}, {}, {}
    traces, trace_errors, work_facts, summary = {}, {}, {}, None
    for name, arrays, params in cases:
        run = work.run_case(task, fn, arrays, params)
        if run.error is not None:
            errors[name] = run.error[:MAX_ERROR_CHARS]
            continue
        traces[name], trace_errors[name], work_facts[name] = run.trace, run.trace_error, run.work
        summary = summary or run.summary
        try:
            stored[name], dtypes[name] = _refs.to_storable(np.asarray(run.output))
            if stored[name].dtype == object:
                raise TypeError("an object array")
            if stored[name].nbytes > MAX_OUTPUT_BYTES:
                raise ValueError(f"shape {stored[name].shape}, {stored[name].nbytes:,} bytes: "
                                 f"more than the {MAX_OUTPUT_BYTES:,} any case needs")
        except Exception as e:  # noqa: BLE001
            stored.pop(name, None)
            dtypes.pop(name, None)
            errors[name] = f"the result is not a numeric array of a sensible size ({e})"
    base = answer_name(task_id, hidden)
    _refs.write_npz(Path(base + ".npz"), stored)
    tmp = Path(base + ".json.tmp")
    tmp.write_text(json.dumps({"nonce": request["nonce"], "dtypes": dtypes, "errors": errors,
                               "traces": traces, "trace_errors": trace_errors,
                               "work": work_facts, "summary": summary}, default=str))
    os.replace(tmp, base + ".json")
    print(f"{task_id}: {len(cases)} {kind} case(s) run; the grader compares the results")
