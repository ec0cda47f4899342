"""What the grader, the notebook's process (``grader.jail.replay``) and the checker
(``grader.jail.checker``) of its run send each other.

Every message is a **frame**: a 4-byte length, a 32-byte HMAC-SHA256 tag under a key, and a
payload: one JSON object, a NUL byte and a blob (an ``.npz`` of arrays, or pickled programs).
The grader reads frames as they come, without unpickling, under size limits, and refuses a
channel at the first byte that is not a frame under its key.

- **The checker's channel** (its stdin and stdout, pipes only the grader and the checker
  hold): the key on the first line, then the job (every check's cases: names, parameters and
  input arrays, hidden ones included; never the expected outputs), then one request per check
  (the programs the notebook traced) and one answer per check (outputs, kernelsim's trace,
  work facts). Its key is the checker's alone.
- **The notebook's channel**: its own key on the first line and its job (code cells, time
  limits, checks, the visible cases' shapes: ``signatures``), later the hidden cases'
  shapes; back, per cell its outputs and per check its programs. The notebook's process
  holds that key, so a tag there proves nothing; a frame out of order, or one cut short
  when the process ended by itself, is tampering, and nothing on it is a fact.

**Cell outputs** travel in the frames as nbformat outputs. They are learner display data:
``notebook_outputs`` rebuilds each as a well-formed nbformat output (``writable``: a file can
hold it), caps them per cell again, and the grader never reads them for a grade.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import re
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from grader.verdict import refs as _refs

if TYPE_CHECKING:  # imported where outputs are rebuilt, in the grader: importing nbformat
    # imports jsonschema's format checkers, ~2 s, which every grading run would pay at start
    from nbformat.notebooknode import NotebookNode

MAX_JOB_BYTES = 512 << 20  # every input of one notebook's checks; any one frame
MAX_CHANNEL_BYTES = 256 << 20  # everything one replay may answer
MAX_OUTPUT_BYTES = 16 << 20  # one case's output: far above any task's, far below the limits
MAX_CHECK_BYTES = 32 << 20  # the outputs of one check's cases together (real: ~1 MiB)
MAX_ERROR_CHARS = 2000  # of one error message in an answer
_HEADER = struct.Struct(">I32s")  # payload length, tag


class AnswerError(Exception):
    """The channel or a message on it is not what the harness writes."""


class AnswerTooLarge(AnswerError):
    """Outputs too big to read: a wrong answer of that task, not tampering."""


# ----------------------------------------------------------------------------- the job
def load_checks(cells: list[dict], refdir: Path) -> tuple[
        dict[str, list[dict]], dict[str, np.ndarray],
        dict[tuple[str, bool], tuple[list[dict], list[tuple]]]]:
    """The cases of every check of ``cells`` (dicts with ``checks``: ``[[task, hidden,
    function expression], ...]`` for a test cell, else empty).

    Returns, per ``check_key``, each case's name, parameters and inputs (``[name, array key,
    dtype]``); the input arrays by key; and per ``(task, hidden)`` the manifest entries and
    ``(entry, inputs, expected, params)`` per case, for the verdict.
    """
    manifest = _refs.load_manifest(refdir)
    loaded: dict[tuple[str, bool], tuple[list[dict], list[tuple]]] = {}
    arrays: dict[str, np.ndarray] = {}
    described: dict[str, list[dict]] = {}
    for cell in cells:
        for task_id, hidden, _ in cell["checks"]:
            if (task_id, hidden) in loaded:
                continue
            entries = [e for e in manifest["cases"].values()
                       if e["task"] == task_id and e["hidden"] == hidden]
            cases = [(e, *_refs.load_case(refdir, e)) for e in entries]
            loaded[(task_id, hidden)] = (entries, cases)
            tag = check_key(task_id, hidden)
            described[tag] = []
            for i, (e, inputs, _, params) in enumerate(cases):
                keys = []
                for name, a in inputs.items():
                    stored, dtype = _refs.to_storable(a)
                    arrays[f"{tag}/{i}/{name}"] = stored
                    keys.append([name, f"{tag}/{i}/{name}", dtype])
                described[tag].append({"case": e["case"], "inputs": keys,
                                       "params": {k: _refs.jsonable(v)
                                                  for k, v in params.items()}})
    return described, arrays, loaded


def signatures(described: dict[str, list[dict]], arrays: dict[str, np.ndarray],
               host_inputs: dict[str, int], hidden: bool) -> tuple[dict, dict[str, np.ndarray]]:
    """What the notebook's process needs to trace the checks of one kind (``hidden``): per
    check each case's name, parameters and per input ``[name, shape, dtype, key]`` (``key``:
    the array's key for the last ``host_inputs[task]`` inputs, which the function gets as
    NumPy values; else None), and those host arrays. Never a traced input's values."""
    out, host = {}, {}
    for tag, cases in described.items():
        task_id, _, kind = tag.rpartition("/")
        if (kind == "hidden") != hidden:
            continue
        out[tag] = []
        for c in cases:
            n = len(c["inputs"])
            rows = []
            for i, (name, key, dtype) in enumerate(c["inputs"]):
                on_host = i >= n - host_inputs.get(task_id, 0)
                rows.append([name, list(arrays[key].shape), dtype, key if on_host else None])
                if on_host:
                    host[key] = arrays[key]
            out[tag].append({"case": c["case"], "inputs": rows, "params": c["params"]})
    return out, host


def check_job(expr: str, call, cases: list[dict], host: dict[str, np.ndarray]) -> dict:
    """One check's job as the notebook's process ran it, in JSON's terms: the expression it
    evaluated, how the task calls the learner's function (``calling.Call``'s fields), the cases
    it traced (``signatures``' rows) and a digest of each host array they name. The harness
    sends it with the check's programs and the relay compares it with the job it sent, so a
    job rewritten in the notebook's memory is found (both sides call this one function)."""
    arrays = {key: np.ascontiguousarray(host[key]) for c in cases for *_, key in c["inputs"]
              if key in host}
    digests = {key: hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest()
               for key, a in sorted(arrays.items())}
    return json.loads(json.dumps({"expr": expr, "call": list(call), "cases": cases,
                                  "host": digests}, default=str))


def check_key(task_id: str, hidden: bool) -> str:
    return f"{task_id}/{'hidden' if hidden else 'visible'}"


def arrays_of(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (no pickles)."""
    if not blob:
        return {}
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for k in sorted(arrays):
            one = io.BytesIO()
            np.lib.format.write_array(one, np.ascontiguousarray(arrays[k]), allow_pickle=False)
            zf.writestr(f"{k}.npy", one.getvalue())
    return buf.getvalue()


# ----------------------------------------------------------------------------- the channel
def frame(key: bytes, message: dict, blob: bytes = b"") -> bytes:
    """One frame of the answer channel: ``message`` (JSON) and ``blob`` under ``key``."""
    payload = json.dumps(message, default=str).encode() + b"\0" + blob
    tag = hmac.new(key, payload, hashlib.sha256).digest()
    return _HEADER.pack(len(payload), tag) + payload


def read_frames(data: bytes, key: bytes, at: int = 0
                ) -> tuple[list[tuple[dict, bytes]], int, str | None]:
    """The whole frames in ``data`` from byte ``at``: ``(frames, where the next frame starts,
    problem)``; ``problem`` names the first byte that is not a frame written under ``key``
    (None when the rest is only the start of a frame yet to come)."""
    out = []
    while len(data) - at >= _HEADER.size:
        size, tag = _HEADER.unpack_from(data, at)
        if size > MAX_CHANNEL_BYTES:
            return out, at, f"the frame at byte {at:,} claims {size:,} bytes"
        payload = data[at + _HEADER.size:at + _HEADER.size + size]
        if len(payload) != size:
            break
        if not hmac.compare_digest(tag, hmac.new(key, payload, hashlib.sha256).digest()):
            return out, at, f"the bytes at {at:,} are not a frame the harness wrote (wrong tag)"
        head, sep, blob = payload.partition(b"\0")
        try:
            message = json.loads(head) if sep else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            message = None
        if not isinstance(message, dict):
            return out, at, f"the frame at byte {at:,} holds no message"
        out.append((message, blob))
        at += _HEADER.size + size
    return out, at, None


def read_frame(stream, key: bytes) -> tuple[dict, bytes]:
    """The next frame of a blocking ``stream`` (a pipe); ``EOFError`` at its end,
    ``AnswerError`` when the bytes are not a frame under ``key``."""
    head = _read_exactly(stream, _HEADER.size)
    if not head:
        raise EOFError
    if len(head) < _HEADER.size:
        raise AnswerError("the stream ends inside a frame")
    size, _ = _HEADER.unpack(head)
    if size > MAX_JOB_BYTES:
        raise AnswerError(f"a frame of {size:,} bytes")
    frames, _, problem = read_frames(head + _read_exactly(stream, size), key)
    if problem or not frames:
        raise AnswerError(problem or "the stream ends inside a frame")
    return frames[0]


def _read_exactly(stream, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def outputs_of(blob: bytes, dtypes: Any) -> dict[str, np.ndarray]:
    """The output arrays of a check's message (no pickles; unpacked size limited)."""
    if not blob:
        return {}
    if not isinstance(dtypes, dict):
        raise AnswerError("the answer's dtypes are not a mapping")
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            if sum(i.file_size for i in zf.infolist()) > MAX_CHANNEL_BYTES:
                raise AnswerTooLarge(f"the outputs unpack to more than {MAX_CHANNEL_BYTES:,} "
                                     "bytes")
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            return {k: _refs.from_storable(z[k], str(dtypes.get(k, z[k].dtype))) for k in z.files}
    except AnswerError:
        raise
    except Exception as e:  # noqa: BLE001 - anything unreadable is a broken answer
        raise AnswerError(f"the outputs are unreadable ({type(e).__name__}: {e})") from None


def answer_of(message: dict, blob: bytes) -> dict[str, Any]:
    """A check's answer: outputs (arrays), errors, and per case the trace and work facts."""
    per_case = {}
    for key in ("errors", "traces", "trace_errors", "work", "dtypes"):
        value = message.get(key) or {}
        if not isinstance(value, dict):
            raise AnswerError(f"the answer's {key} are not a mapping")
        per_case[key] = value
    return {"outputs": outputs_of(blob, per_case.pop("dtypes")),
            **per_case, "errors": {str(k): str(v) for k, v in per_case["errors"].items()}}


def encode_outputs(outputs: dict[str, Any], budget: int = MAX_CHECK_BYTES
                   ) -> tuple[bytes, dict[str, str], dict[str, str]]:
    """``(npz, dtypes, errors)`` for one check's outputs per case; an output that is not a
    numeric array of a sensible size (or beyond ``budget`` bytes in all) becomes that case's
    error instead."""
    stored, dtypes, errors, total = {}, {}, {}, 0
    for name, value in outputs.items():
        try:
            a, dtype = _refs.to_storable(np.asarray(value))
            if a.dtype == object:
                raise TypeError("an object array")
            if a.nbytes > MAX_OUTPUT_BYTES or total + a.nbytes > min(budget, MAX_CHECK_BYTES):
                raise ValueError(f"shape {a.shape}, {a.nbytes:,} bytes: more than the "
                                 f"{MAX_OUTPUT_BYTES:,} any case needs")
            stored[name], dtypes[name], total = a, dtype, total + a.nbytes
        except Exception as e:  # noqa: BLE001
            errors[name] = f"the result is not a numeric array of a sensible size ({e})"
    return npz_bytes(stored), dtypes, errors


# ----------------------------------------------------------------------------- cell outputs
_MIME = re.compile(r"^[\w.+-]+/[\w.+-]+$")
_JSON_MIME = re.compile(r"^application/(.*\+)?json$")


def dropped_notice(limit: int) -> dict:
    """The piece that ends a cell's outputs past ``limit`` bytes. Display data, not a stream:
    nbgrader's LimitOutput drops every stream after a cell's first 1,000 lines, and a flood
    has more."""
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/plain": f"[output beyond {limit:,} bytes was dropped by the grader]"}}


def piece_size(piece: dict) -> int:
    """What an output piece counts against its cell's limit: a stream's text as JSON (so
    many small writes count about what the kernel's batched messages did), anything else
    all of its JSON."""
    if piece.get("output_type") == "stream" and isinstance(piece.get("text"), str):
        return len(json.dumps(piece["text"]))
    return len(json.dumps(piece, default=str))


def _text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "".join(value)
    return None


def _bundle(data) -> dict:
    """A mime bundle with only what nbformat allows: text per mime type, JSON for JSON types."""
    if not isinstance(data, dict):
        return {}
    out = {}
    for mime, value in data.items():
        if isinstance(mime, str) and _MIME.match(mime):
            value = value if _JSON_MIME.match(mime) else _text(value)
            if value is not None:
                out[mime] = value
    return out


MAX_DEPTH = 64  # of JSON in an output (nbformat's validator recurses once per level)
_SURROGATE = re.compile("[\ud800-\udfff]")


def writable(value, depth: int = 0):
    """``value`` (JSON) as a notebook file can hold it: a lone surrogate (which UTF-8 cannot
    encode) becomes U+FFFD, and anything nested deeper than ``MAX_DEPTH`` levels a note that
    it was."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if depth >= MAX_DEPTH and isinstance(value, dict | list):
        return f"[nested deeper than {MAX_DEPTH} levels: not kept by the grader]"
    if isinstance(value, dict):
        return {writable(str(k)): writable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [writable(v, depth + 1) for v in value]
    return value


def _output(piece) -> NotebookNode | None:
    """``piece`` rebuilt as an nbformat output (or a ``clear_output`` or
    ``update_display_data`` instruction); None when it is not one. Any text and JSON in it
    is made ``writable``."""
    from nbformat.notebooknode import NotebookNode  # a second: the jailed processes go without

    piece = writable(piece) if isinstance(piece, dict) else None
    if not isinstance(piece, dict):
        return None
    kind = piece.get("output_type")
    if kind == "stream" and piece.get("name") in ("stdout", "stderr"):
        text = _text(piece.get("text"))
        return None if text is None else NotebookNode(output_type=kind, name=piece["name"],
                                                      text=text)
    if kind in ("display_data", "execute_result", "update_display_data"):
        metadata = piece.get("metadata")
        out = NotebookNode(output_type=kind, data=NotebookNode(_bundle(piece.get("data"))),
                           metadata=NotebookNode(metadata if isinstance(metadata, dict) else {}))
        if kind == "execute_result":
            out.execution_count = None  # the grader numbers the cells
        if isinstance(piece.get("display_id"), str):
            out.display_id = piece["display_id"]
        return out
    if kind == "error":
        trace = piece.get("traceback")
        return NotebookNode(output_type=kind, ename=str(piece.get("ename")),
                            evalue=str(piece.get("evalue")),
                            traceback=[str(x) for x in trace] if isinstance(trace, list) else [])
    if kind == "clear_output":
        return NotebookNode(output_type=kind, wait=bool(piece.get("wait")))
    return None


def notebook_outputs(pieces, limit: int, displays: dict[str, list[NotebookNode]]
                     ) -> list[NotebookNode]:
    """One cell's outputs from the pieces its frames carried, as nbclient would have made them
    from a kernel's messages: at most ``limit`` bytes (then a notice), ``clear_output`` applied
    (with ``wait``: at the next output), display updates applied to every output of that
    display id in the notebook so far (``displays``, shared by the notebook's cells)."""
    outputs: list[NotebookNode] = []
    size, clear_next = 0, False
    for piece in pieces if isinstance(pieces, list) else []:
        out = _output(piece)
        if out is None:
            continue
        size += piece_size(piece)
        if size > limit:
            outputs.append(_output(dropped_notice(limit)))
            break
        kind = out.output_type
        if kind == "clear_output":
            if out.wait:
                clear_next = True
            else:
                outputs.clear()
            continue
        display_id = out.pop("display_id", None)
        if kind == "update_display_data":
            for shown in displays.get(display_id, []):
                shown.data, shown.metadata = out.data, out.metadata
            continue
        if clear_next:
            outputs.clear()
            clear_next = False
        if display_id is not None and kind == "display_data":
            displays.setdefault(display_id, []).append(out)
        if kind == "stream" and outputs and outputs[-1].output_type == "stream" \
                and outputs[-1].name == out.name:
            outputs[-1].text += out.text
        else:
            outputs.append(out)
    return outputs
