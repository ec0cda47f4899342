"""The notebook's process of the grader's run: ``python -m grader.jail.replay`` in the jail.

It is the only execution of a submission's code cells. ``grader.jail.trusted`` starts it under
the grading limits and a uid of the worker's sandbox slot (``grader.jail.sandbox``), next to the
checker (``grader.jail.checker``, another uid), and relays between the two. It holds no secret
and decides nothing: the checker, which this process cannot reach, makes every fact.

1. Before any learner code: it reads its job on stdin (the code cells, their time limits and
   checks, the visible cases' shapes and dtypes and the values of inputs a task plans with on
   the host, and what a notebook may import of the grader), takes stdout for its channel, keeps
   stdin's pipe for one later message, starts JAX, imports what the job names (the harness
   itself imports nothing of the learner's room), takes a ``grader.integrity.Snapshot``
   and arms the
   ``grader.integrity.Guard`` (an alarm: what they see is reported ``tampered``; they
   protect nothing the grade needs).
2. It runs the code cells in order, as nbgrader would, in an IPython shell, each under its
   time limit (an error does not stop the run). At a test cell it reads each check's function
   from the learner's namespace; for a visible check it traces it at once on every case's
   shapes (``grader.calling.trace_case``, through the task's ``invoke`` the job names) and
   sends the programs (``grader.jail.wire``); a hidden check's function is traced after the last
   cell, once the grader has sent the hidden cases' shapes (``read_hidden``): no cell's
   output can show them.

**What it can import of the grader.** Its ``grader/`` is ``grader.jail.trusted.notebook_view``:
this module, what a notebook may import (``NOTEBOOK_IMPORTS``) and the few they import
(``NOTEBOOK_MODULES``); every other module of the grader
(the tasks with their references, block searches and byte counts, the verdict, the checker)
is a file there that raises ``ImportError`` saying why, so neither this harness nor a
learner's cell can load one.
3. It sends one frame per cell and per check (``grader.jail.exchange.frame``): the cell's
   outputs, or the check's programs and what the learner's code printed while they were traced.

**Outputs.** What a cell shows is caught as nbformat outputs (``Outputs``): ``sys.stdout`` and
``sys.stderr`` are streams of the harness, the shell's display publisher and display hook
record ``display_data`` and ``execute_result`` mime bundles, its traceback display records
``error`` outputs, and the pyplot figures a cell leaves open are shown at its end as PNG, as
Jupyter's inline backend shows them. Each cell's outputs are capped (the job's
``output_bytes``, as a kernel's were); what learner code writes to file descriptors 1 and 2
directly (C extensions, subprocesses) goes to the run's stderr, which is not kept. Outputs
are display data: the grader renders them and never reads them for a grade.
"""

from __future__ import annotations

import base64
import importlib
import io
import os
import signal
import sys
import time
from contextlib import contextmanager, suppress
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.pylabtools import print_figure
from jax.experimental import pallas as _pl  # noqa: F401 - what the notebooks' setup cells
from jax.experimental.pallas import tpu as _pltpu  # noqa: F401 - import is in the snapshot
from traitlets import Type
from traitlets.config import Config

import kernelsim.backend  # noqa: F401
from grader import calling, integrity
from grader.jail import exchange, wire
from grader.verdict import refs

CHANNEL_CLOSED = 86  # exit status: the answer channel could not be written


class TimeLimit(KeyboardInterrupt):
    """A cell or check ran past its time (raised by SIGALRM, as nbgrader's interrupt is)."""


def _alarm(signum, frame):
    raise TimeLimit()


@contextmanager
def time_limit(seconds: float):
    """SIGALRM after ``seconds`` and every second after that, until the block ends."""
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 0.01), 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _processes() -> dict[int, int]:
    """Every live process this one can see (``/proc``: the jail's pid namespace), by its
    parent; zombies (ended, not yet reaped) left out."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state, parent = f.read().rsplit(b")", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue  # it ended meanwhile
            if state != b"Z":
                parents[int(entry)] = int(parent)
    return parents


def left_running(kept: frozenset[int] = frozenset()) -> set[int]:
    """The processes a cell left running: this one's descendants and, where this is the jail's
    first process (its parent the pid namespace's init, pid 1), what the init adopted: their
    processes orphaned. ``kept``: what ran before any learner code."""
    parents = _processes()
    me = os.getpid()
    roots = {me} | ({pid for pid, parent in parents.items() if parent == 1}
                    if os.getppid() == 1 else set())
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found and child != me:
                found.add(child)
                todo.append(child)
    return (found | (roots - {me})) - kept


def end_left_running(kept: frozenset[int] = frozenset()) -> int:
    """SIGKILL what the last cell left running (``left_running``), in rounds until none is
    left (a fork bomb forks while it is killed), reaping this process's own children among
    them (a zombie still holds a pid of the run's limit); how many processes were ended. The
    run's cgroup bounds them meanwhile (its processes, cores and CPU seconds): this ends a
    cell's processes with it, so that none spends the CPU of the cells after it."""
    ended: set[int] = set()
    for _ in range(100):
        left = left_running(kept)
        if not left:
            break
        for pid in left:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended |= left
        time.sleep(0.01)
        for pid in left:
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    return len(ended)


def _warm_up() -> None:
    """Start JAX's backend and compile once: what that sets up (a thread, backend globals)
    belongs to the baseline, not to the learner."""
    jax.devices()
    jax.jit(lambda x: x + 1)(jnp.zeros(8)).block_until_ready()


class Outputs:
    """What one cell shows, as nbformat outputs (dicts), at most ``limit`` bytes of them.

    Pieces are measured by ``exchange.piece_size``; past the limit one notice is added and the
    rest dropped, so a flood costs neither memory nor channel. ``clear_output`` and display
    updates are kept as pieces of their own (``clear_output``, ``update_display_data``) for
    the grader to apply as nbclient does.
    """

    def __init__(self, limit: int):
        self.limit, self.size, self.pieces, self.dropped = limit, 0, [], False

    def _room(self, size: int) -> bool:
        if self.dropped:
            return False
        self.size += size
        if self.size > self.limit:
            self.dropped = True
            self.pieces.append(exchange.dropped_notice(self.limit))
            return False
        return True

    def add(self, piece: dict) -> None:
        if self._room(exchange.piece_size(piece)):
            self.pieces.append(piece)

    def stream(self, name: str, text: str) -> None:
        piece = {"output_type": "stream", "name": name, "text": text}
        if not text or not self._room(exchange.piece_size(piece)):
            return
        last = self.pieces[-1] if self.pieces else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["text"] += text
        else:
            self.pieces.append(piece)

    def take(self) -> list[dict]:
        """The pieces since the last ``take`` (a test cell sends one frame per check)."""
        pieces, self.pieces = self.pieces, []
        return pieces


class Capture:
    """Where the harness's streams, publisher and display hook write: the running cell's
    ``Outputs`` (``current``)."""

    def __init__(self):
        self.current = Outputs(0)


def _json_bundle(data) -> dict:
    """A mime bundle as JSON: bytes (images) in base64, as a kernel sends them."""
    return {str(k): base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v
            for k, v in (data or {}).items()}


class CellStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` of the run: text goes to the running cell."""

    encoding, errors = "utf-8", "strict"

    def __init__(self, capture: Capture, name: str):
        super().__init__()
        self.capture, self.name = capture, name

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.capture.current.stream(self.name, text)
        return len(text)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return 2  # the run's stderr, which is not kept (see the module's docstring)


class Publisher(DisplayPublisher):
    """``display()`` and ``clear_output()`` record pieces of the running cell."""

    capture: Capture  # set by ``_shell`` before any learner code runs

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False,
                **kwargs) -> None:
        piece = {"output_type": "update_display_data" if update else "display_data",
                 "data": _json_bundle(data), "metadata": metadata or {}}
        display_id = (transient or {}).get("display_id")
        if display_id is not None:
            piece["display_id"] = str(display_id)
        self.capture.current.add(piece)

    def clear_output(self, wait=False) -> None:
        self.capture.current.add({"output_type": "clear_output", "wait": bool(wait)})


class ResultHook(DisplayHook):
    """The value of a cell's last expression becomes an ``execute_result`` piece."""

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict, md_dict=None) -> None:
        self.shell.display_pub.capture.current.add(
            {"output_type": "execute_result", "data": _json_bundle(format_dict),
             "metadata": md_dict or {}, "execution_count": self.prompt_count})

    def finish_displayhook(self) -> None:
        self._is_active = False


class GradingShell(InteractiveShell):
    """IPython's shell with its displays and tracebacks recorded as the cell's outputs."""

    displayhook_class = Type(ResultHook)
    display_pub_class = Type(Publisher)

    def _showtraceback(self, etype, evalue, stb) -> None:
        self.display_pub.capture.current.add(
            {"output_type": "error", "ename": str(etype.__name__), "evalue": str(evalue),
             "traceback": [str(line) for line in stb]})


def _shell(capture: Capture) -> GradingShell:
    cfg = Config()
    cfg.HistoryManager.enabled = False  # no history thread, no sqlite file
    cfg.InteractiveShell.colors = "NoColor"
    shell = GradingShell.instance(config=cfg)
    shell.display_pub.capture = capture
    # a Figure shows as a PNG, as under Jupyter's inline backend (matplotlib is imported only
    # when learner code imports it)
    shell.display_formatter.formatters["image/png"].for_type_by_name(
        "matplotlib.figure", "Figure", partial(print_figure, fmt="png", base64=True))
    return shell


class Harness:
    """The run: shell, snapshot, guard, channel; ``cell`` and ``check`` send one frame each."""

    def __init__(self, job: dict, host: dict, channel_fd: int, requests: int):
        self.job, self.host, self.fd, self.requests = job, host, channel_fd, requests
        self.key = bytes.fromhex(job["key"])
        self.signatures = job["visible"]
        self.output_bytes = int(job["output_bytes"])
        self.capture = Capture()
        sys.stdout = CellStream(self.capture, "stdout")
        sys.stderr = CellStream(self.capture, "stderr")
        self.shell = _shell(self.capture)
        signal.signal(signal.SIGALRM, _alarm)
        for name in job["imports"]:  # what a notebook may import of the grader: in the snapshot
            importlib.import_module(name)
        self.roots = integrity.trusted_roots()
        self.snapshot = integrity.Snapshot(self.shell)
        self.guard = integrity.Guard()
        sys.addaudithook(self.guard)
        self.kept = frozenset(left_running())  # the harness's own, if any: never ended
        self.guard.armed = True  # from here on, learner code may run

    def send(self, message: dict, blob: bytes = b"") -> None:
        data = memoryview(exchange.frame(self.key, message, blob))
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            os._exit(CHANNEL_CLOSED)

    def tampering(self) -> list[str]:
        return list(dict.fromkeys(self.guard.found + self.snapshot.changes()))

    def show_figures(self) -> None:
        """Show the pyplot figures left open, then close them (Jupyter's inline backend does
        this after every cell); what drawing them raises is the cell's error."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        try:
            for number in pyplot.get_fignums():
                self.shell.display_pub.publish(*self.shell.display_formatter.format(
                    pyplot.figure(number)))
            pyplot.close("all")
        except TimeLimit:
            raise
        except BaseException:  # noqa: BLE001 - learner artists draw here
            self.shell.showtraceback()

    def cell(self, cell: dict) -> None:
        """Run a learner cell under its time limit; send its outputs and whether it raised."""
        self.capture.current = outputs = Outputs(self.output_bytes)
        error, timed_out = None, False
        try:
            with time_limit(cell["timeout"]):
                result = self.shell.run_cell(cell["source"], store_history=True)
                self.show_figures()
            e = result.error_before_exec or result.error_in_exec
            if e is not None:
                timed_out = isinstance(e, TimeLimit)
                error = f"{type(e).__name__}: {e}"[:exchange.MAX_ERROR_CHARS]
        except TimeLimit:  # between the cell's end and the timer's: the cell ran long
            error, timed_out = "TimeLimit: the cell ran past its time limit", True
        self.send({"kind": "cell", "cell": cell["index"], "error": error,
                   "timeout": timed_out, "outputs": outputs.take(),
                   "left_running": end_left_running(self.kept)})

    def function(self, cell: dict, expr: str):
        """The function a check names, read from the learner's namespace now; or why not."""
        try:
            with self.shell.builtin_trap:
                return eval(compile(expr, f"<test cell {cell['id']}>", "eval"),  # noqa: S307
                            self.shell.user_ns), None
        except Exception as e:  # noqa: BLE001 - the learner's namespace lacks it
            return None, (f"the test cell could not find your function: "
                          f"{type(e).__name__}: {e}")

    def check(self, cell: dict, task_id: str, hidden: bool, expr: str, fn, failed: str | None
              ) -> list[str]:
        """Trace ``fn`` (what ``expr`` named) on every case of one ``course.check`` (their
        shapes, dtypes and host inputs only) and send the programs to be checked elsewhere
        (``grader.jail.checker``), with the job they were traced for
        (``exchange.check_job``) as it was before the learner's function ran and after.
        Returns the tampering found (then nothing was sent but a ``tampered`` frame)."""
        call = self.job["calls"][task_id]
        cases = self.signatures.get(exchange.check_key(task_id, hidden), [])
        task = calling.Call(*call)
        message = {"kind": "programs", "cell": cell["index"], "task": task_id,
                   "hidden": hidden, "failed": failed, "timeout": False}
        job = [exchange.check_job(expr, call, cases, self.host)]
        programs, errors, blob = {}, {}, b""
        try:
            with time_limit(cell["timeout"]), self.shell.builtin_trap:
                for c in [] if failed else cases:
                    arrays = [np.asarray(refs.from_storable(self.host[key], dtype)) if key
                              else jax.ShapeDtypeStruct(tuple(shape), _dtype(dtype))
                              for _, shape, dtype, key in c["inputs"]]
                    t = calling.trace_case(task, fn, arrays,
                                   {k: refs.unjson(v) for k, v in c["params"].items()})
                    if t.error is not None:
                        errors[c["case"]] = t.error[:exchange.MAX_ERROR_CHARS]
                        continue
                    try:
                        data = wire.dumps(t.program, lambda f: integrity.defined_in(
                            f, self.roots))
                    except Exception as e:  # noqa: BLE001 - what the program holds
                        errors[c["case"]] = (f"your function's program cannot be sent to "
                                             f"the checker ({type(e).__name__}: {e})")[
                            :exchange.MAX_ERROR_CHARS]
                        continue
                    programs[c["case"]] = [len(blob), len(data)]
                    blob += data
                self.show_figures()
        except TimeLimit:
            message["timeout"], programs, errors, blob = True, {}, {}, b""
        found = self.tampering()
        if found:
            return found
        job.append(exchange.check_job(expr, call, cases, self.host))
        message.update(job=job, programs=programs, errors=errors,
                       outputs=self.capture.current.take(),
                       left_running=end_left_running(self.kept))
        self.send(message, blob)
        return []

    def read_hidden(self) -> None:
        """The hidden cases' shapes and host inputs, asked for once every learner cell has
        run and sent its outputs (so nothing a later cell shows can hold them)."""
        self.send({"kind": "cells_done"})
        with os.fdopen(self.requests, "rb", buffering=0) as stream:
            message, blob = exchange.read_frame(stream, self.key)
        self.signatures = message.get("hidden") or {}
        self.host = exchange.arrays_of(blob)

    def run(self) -> None:
        deferred = []
        for cell in self.job["cells"]:
            if not cell["checks"]:
                self.cell(cell)
                continue
            self.shell.execution_count += 1  # a test cell counts as run, as in a kernel
            self.capture.current = Outputs(self.output_bytes)  # the checks' outputs
            found = []
            for task_id, hidden, expr in cell["checks"]:
                fn, failed = self.function(cell, expr)
                if hidden:  # traced after the last learner cell (``read_hidden``)
                    deferred.append((cell, task_id, expr, fn, failed))
                    continue
                found = self.check(cell, task_id, False, expr, fn, failed)
                if found:
                    break
            if found:
                self.send({"kind": "tampered", "cell": cell["index"], "reasons": found})
                self.send({"kind": "done"})
                return
        self.read_hidden()
        for cell, task_id, expr, fn, failed in deferred:
            self.capture.current = Outputs(0)  # what a hidden check prints is not kept
            found = self.check(cell, task_id, True, expr, fn, failed)
            if found:
                self.send({"kind": "tampered", "cell": cell["index"], "reasons": found})
                break
        self.send({"kind": "done"})


def _dtype(name: str):
    return jnp.bfloat16 if name == "bfloat16" else np.dtype(name)


def main() -> int:
    stdin = sys.stdin.buffer
    key = bytes.fromhex(stdin.readline().decode().strip())
    job, blob = exchange.read_frame(stdin, key)  # before any learner code
    requests = os.dup(0)  # where the hidden cases' shapes come, after the last learner cell
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # input() in a learner cell reads end of file
    os.close(null)
    channel = os.dup(1)  # the answer channel; not inherited by exec'd children
    os.dup2(2, 1)  # what is written to the descriptors directly goes to stderr
    _warm_up()
    Harness({**job, "key": key.hex()}, exchange.arrays_of(blob), channel, requests).run()
    os._exit(0)  # no atexit handler or finalizer of learner code runs after the last frame


if __name__ == "__main__":
    # run as the module grader.jail.replay, not as __main__ (which the shell replaces and the
    # snapshot skips): then the harness's own globals and classes are in the snapshot too
    from grader.jail import replay

    replay.main()
