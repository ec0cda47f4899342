"""The checker: ``python -m grader.jail.checker``, the process that makes the facts a grade is
decided from, where no learner code runs.

``grader.jail.trusted`` starts it in the jail, under a uid of its own (not the notebook's: the
notebook's process can neither signal it nor read its memory), next to the notebook's
process (``grader.jail.replay``). It reads, on stdin, the channel key and the job: every check's
cases with their inputs, hidden ones included, which never reach the notebook's process.
Then, per check, the programs the notebook's process traced from the learner's function
(``grader.jail.wire``): it reads each with the allow-list unpickler, refuses a program that would
run Python while it executes (a host callback, a primitive the course does not know, an
object of a class that is not JAX's or NumPy's), executes it on the case's inputs, runs
kernelsim over it and reads its work facts (``grader.facts.work.run_traced``), and answers one
frame per check on stdout, tagged under the key. The grader stops it, and starts another,
when a check runs past its test cell's time limit.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax.experimental import pallas as _pl  # noqa: F401 - the primitives programs may use
from jax.experimental.pallas import tpu as _pltpu  # noqa: F401
from jax.extend.core import Primitive

import kernelsim  # noqa: F401
import kernelsim.backend  # noqa: F401
from grader import tasks
from grader.calling import Traced
from grader.facts.work import CaseRun, run_traced
from grader.jail import exchange, wire
from grader.verdict import refs

CALLBACKS = ("pure_callback", "io_callback", "debug_callback")  # primitives that run Python


def known_primitives() -> dict[int, Primitive]:
    """Every primitive a loaded module defines (JAX's, Pallas's), by id."""
    return {id(v): v for m in list(sys.modules.values())
            for v in list(getattr(m, "__dict__", {}).values()) if isinstance(v, Primitive)}


def _callbacks_in(obj, depth: int = 4):
    """The ``wire.Callback`` markers in a parameter (through containers and partials)."""
    if depth < 0:
        return
    if isinstance(obj, wire.Callback):
        yield obj
    elif isinstance(obj, list | tuple):
        for x in obj:
            yield from _callbacks_in(x, depth - 1)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _callbacks_in(x, depth - 1)
    elif hasattr(obj, "func") and hasattr(obj, "args"):
        yield from _callbacks_in([obj.func, obj.args, getattr(obj, "keywords", {})], depth - 1)


def python_at_run_time(program, known: dict[int, Primitive]) -> str | None:
    """Why executing ``program`` would run the learner's Python, or None. A callback arrives
    as a marker (``grader.jail.wire``) and never runs here: a host callback on the data path is
    refused; a ``debug_callback`` of the installed packages (``jax.debug.print``) is a no-op."""
    for eqn in wire.eqns(program):
        prim = eqn.primitive
        if known.get(id(prim)) is not prim:
            return f"it uses a primitive the course does not know ({prim.name})"
        if prim.name not in CALLBACKS:  # a function among other parameters (a custom_vjp's
            continue  # backward rule) is not called when the program runs: here, a no-op
        for cb in _callbacks_in(eqn.params.get("callback")):
            if prim.name != "debug_callback" or not cb.installed:
                return (f"it calls your Python function {cb.name} while it runs "
                        f"({prim.name}); graded functions compute with JAX and Pallas only")
    return None


class Checker:
    """The job's cases and inputs; ``check`` answers one request."""

    def __init__(self, job: dict, arrays: dict):
        self.cases, self.arrays = job["cases"], arrays
        graded = {tasks.get(tag.rpartition("/")[0]).assignment for tag in self.cases}
        if graded & {t.assignment for t in tasks.TASKS if t.target == "mosaic_gpu"}:
            # a Mosaic GPU program's primitives are loaded before they are read: the
            # unpickler imports nothing (half a second no other assignment's job spends)
            importlib.import_module("jax.experimental.pallas.mosaic_gpu")
        self.known = known_primitives()

    def inputs(self, tag: str) -> dict[str, list]:
        """Per case of the check ``tag``, the inputs its program takes (the host inputs were
        the notebook's to plan with: they are in the program)."""
        task_id = tag.rpartition("/")[0]
        host = tasks.get(task_id).host_inputs
        out = {}
        for c in self.cases.get(tag, []):
            rows = c["inputs"][:len(c["inputs"]) - host]
            out[c["case"]] = [jnp.asarray(refs.from_storable(self.arrays[key], dtype))
                              for _, key, dtype in rows]
        return out

    def check(self, request: dict, blob: bytes) -> tuple[dict, bytes]:
        inputs = self.inputs(exchange.check_key(str(request.get("task")),
                                                bool(request.get("hidden"))))
        spans = request.get("programs") or {}
        errors = {str(k) for k in (request.get("errors") or {})}
        failed, runs, refused = request.get("failed"), {}, None
        if failed is None:
            programs = {}
            for name in inputs:
                if name in errors:
                    continue
                at, size = spans.get(name, (0, 0))
                try:
                    programs[name] = wire.loads(blob[int(at):int(at) + int(size)])
                except wire.NotAProgram as e:
                    refused = refused or str(e)
            refused = refused or next((why for p in programs.values()
                                       if (why := python_at_run_time(p, self.known))), None)
            if refused:
                failed = f"your function cannot be graded: {refused}"
            else:
                runs = {name: run_traced(Traced(program, inputs[name]))
                        for name, program in programs.items()}
        return answer({**request, "failed": failed}, runs)


def answer(request: dict, runs: dict[str, CaseRun]) -> tuple[dict, bytes]:
    """The answer to one check's ``request`` (its ``failed`` as decided) once its programs ran
    (``runs``, by case): the message, with the errors the notebook's process met tracing a
    case and those the runs raised, and the outputs' bytes. With no run (every case raised
    while the notebook traced it) it is the relay's own answer, and no checker starts."""
    message = {"kind": "check", "cell": request.get("cell"), "task": request.get("task"),
               "hidden": bool(request.get("hidden")), "failed": request.get("failed"),
               "timeout": False, "outputs": []}
    errors = {str(k): str(v) for k, v in (request.get("errors") or {}).items()}
    outputs = {n: r.output for n, r in runs.items() if r.error is None}
    out_blob, dtypes, bad = exchange.encode_outputs(outputs)
    errors.update({n: r.error[:exchange.MAX_ERROR_CHARS] for n, r in runs.items()
                   if r.error is not None})
    errors.update(bad)
    ok = [n for n in runs if n not in errors]
    message.update(
        errors=errors if message["failed"] is None else {}, dtypes=dtypes,
        traces={n: runs[n].trace for n in ok},
        trace_errors={n: runs[n].trace_error for n in ok},
        work={n: runs[n].work for n in ok},
        summary=next((r.summary for r in runs.values() if r.summary), None))
    return message, out_blob


def compile_each_program_once() -> None:
    """Keep what XLA compiles in this process, in a folder of its own /tmp (the jail's: no other
    run sees it), so that a kernel is compiled once per checker. kernelsim runs each kernel as
    JAX runs a ``pallas_call`` outside ``jit``, which lowers and compiles it again at every
    call: the cases of a check, and two tasks that share a kernel, would compile it again."""
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="checker-xla-"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main() -> int:
    compile_each_program_once()
    stdin = sys.stdin.buffer
    key = bytes.fromhex(stdin.readline().decode().strip())
    out = os.dup(1)
    os.dup2(2, 1)  # nothing but frames on the channel
    job, blob = exchange.read_frame(stdin, key)
    checker = Checker(job, exchange.arrays_of(blob))
    jax.jit(lambda x: x + 1)(jnp.zeros(8)).block_until_ready()  # JAX started: ready

    def send(message: dict, data: bytes = b"") -> None:
        view = memoryview(exchange.frame(key, message, data))
        while view:
            view = view[os.write(out, view):]

    send({"kind": "ready"})
    while True:
        try:
            request, data = exchange.read_frame(stdin, key)
        except EOFError:
            return 0
        send(*checker.check(request, data))


if __name__ == "__main__":
    sys.exit(main())
