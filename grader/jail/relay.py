"""The relay between the two processes of the grader's run of a notebook (``FreshRun`` in
``grader.jail.trusted``): the notebook's frames read in order, each check passed to the checker
one at a time under its test cell's time limit, and the answers collected as ``Replayed``.

Nothing here runs in the jail: this process reads what the jailed processes write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from grader.jail import answer_cache, checker, exchange, sandbox

STARTUP_SECONDS = 120  # the run's imports and JAX start, beyond its cells' time limits


class Run(Protocol):
    """What the relay reads and drives of the grader's run (``trusted.FreshRun``): the
    notebook's process and the checker with their channels' keys, the code cells (each with
    its ``index`` and ``timeout``, seconds), the frames the notebook sends when nothing stops it,
    the hidden cases' shapes it is sent after its last cell, and the checker's answers kept from
    earlier runs. The checker is started for the first check no kept answer decides (None
    until then: a notebook whose every check fails in it, raises on every case as it is
    traced, or was checked before, needs none)."""

    cells: list[dict]
    child: sandbox.Confined
    checker: sandbox.Confined | None
    key: bytes
    notebook_key: bytes
    hidden_frame: bytes
    answers: answer_cache.AnswerCache

    def expected_frames(self) -> list[tuple]: ...

    def start_checker(self) -> sandbox.Confined: ...

    def answer_key(self, request: dict, blob: bytes) -> bytes: ...

    def check_job(self, cell: int, task: str, hidden: bool) -> dict: ...


@dataclass
class Replayed:
    """What the grader's run answered: per check ``(cell index, task, hidden)`` its message
    and outputs; per cell index the output pieces it sent, and the error it raised; the cells
    that ran past their time limit; and why the cells and checks without an answer did not
    run (``stopped``, at cell ``stopped_at``), with ``timed_out`` when that was a time limit
    and ``died`` when the run did not end by itself. ``tampered`` stops the run;
    ``rewritten`` names the checks whose job the notebook changed, each of which fails alone;
    ``left_running`` how many processes each cell (or its checks' tracing) left running, which
    the harness ended after it."""

    answers: dict[tuple[int, str, bool], tuple[dict, bytes]] = field(default_factory=dict)
    outputs: dict[int, list] = field(default_factory=dict)
    cell_errors: dict[int, str] = field(default_factory=dict)
    timeouts: set[int] = field(default_factory=set)
    tampered: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    died: str | None = None
    stopped: str | None = None
    stopped_at: int | None = None
    timed_out: bool = False
    limit: str | None = None
    from_cache: int = 0
    left_running: dict[int, int] = field(default_factory=dict)  # cell index: processes ended


class Relay:
    """``FreshRun.finish``'s loop: the notebook's frames in order, the checks to the checker
    one at a time, each under its test cell's time limit."""

    POLL = 0.02

    def __init__(self, fresh: Run):
        self.fresh = fresh
        self.expected, self.position, self.done = fresh.expected_frames(), 0, False
        self.read = 0  # bytes of the notebook's channel read so far
        self.leftover = False
        self.problem: str | None = None
        self.stop_notebook: tuple | None = None
        self.outcome: sandbox.Outcome | None = None  # the notebook's, once it was stopped
        # (request, programs, seconds allowed, answer key)
        self.pending: list[tuple[dict, bytes, float, bytes]] = []
        # (request, when sent, seconds allowed, answer key)
        self.in_flight: tuple[dict, float, float, bytes] | None = None
        self.checker_read, self.ready = 0, False
        self.broken: str | None = None  # why the checker cannot start (the grader's fault)
        self.died: str | None = None
        self.timeouts = {c["index"]: c["timeout"] for c in fresh.cells}

    # ------------------------------------------------------------------ the notebook
    def _notebook(self, got: Replayed) -> None:
        reader = self.fresh.child.readers[0]
        data = bytes(reader.data[self.read:])
        frames, used, problem = exchange.read_frames(data, self.fresh.notebook_key)
        self.read += used
        self.leftover = used < len(data)
        for message, blob in frames:
            if self.problem or self.done:
                break
            self._take(message, blob, got)
        if problem and not self.problem:
            self.problem = problem
        if self.problem and self.stop_notebook is None:
            self.stop_notebook = ("failed", "sent bytes its harness did not write")

    def _take(self, message: dict, blob: bytes, got: Replayed) -> None:
        kind = message.get("kind")
        if kind == "done":
            self.done = True
            return
        if kind == "tampered" and not got.tampered:
            got.tampered += [str(r) for r in message.get("reasons") or ["(no reason)"]]
            return
        here = self.expected[self.position] if self.position < len(self.expected) else None
        key = (kind, *((message.get("cell"),) if kind != "cells_done" else ()),
               *((message.get("task"), message.get("hidden")) if kind == "programs" else ()))
        if got.tampered or key != here:
            self.problem = f"a {kind!r} frame out of order"
            return
        self.position += 1
        if kind == "cells_done":
            self.fresh.child.send(self.fresh.hidden_frame)
            return
        index = key[1]
        left = message.get("left_running")
        if isinstance(left, int) and left > 0:
            got.left_running[index] = got.left_running.get(index, 0) + left
        pieces = message.get("outputs")
        if not (kind == "programs" and key[3]):  # a hidden check's prints are never kept
            got.outputs.setdefault(index, []).extend(pieces if isinstance(pieces, list) else [])
        if kind == "cell":
            if message.get("error"):
                got.cell_errors[index] = str(message["error"])
            if message.get("timeout"):
                got.timeouts.add(index)
            return
        answer = {"kind": "check", "cell": index, "task": key[2], "hidden": key[3],
                  "failed": message.get("failed"), "timeout": bool(message.get("timeout"))}
        sent = self.fresh.check_job(*key[1:])  # the job this process sent for the check
        changed = self._job_changed(message.get("job"), sent)
        if changed:
            got.rewritten.append(f"the {'hidden' if key[3] else 'visible'} check of {key[2]} "
                                 f"was changed in the notebook's memory: {changed}")
            got.answers[key[1:]] = ({**answer, "timeout": False, "failed": (
                "not graded: the check's job (which function it calls, how, on which cases) "
                "was changed while your notebook ran")}, b"")
            return
        if answer["failed"] is not None:
            answer["failed"] = str(answer["failed"])[:exchange.MAX_ERROR_CHARS]
        if answer["timeout"] or answer["failed"]:
            got.answers[key[1:]] = (answer, b"")
            return
        request = {**answer, "kind": "check", "programs": message.get("programs") or {},
                   "errors": message.get("errors") or {}}
        traced = {c["case"] for c in sent["cases"]}
        if not request["programs"] and traced <= set(request["errors"]):
            # every case raised while the notebook traced it: nothing for a checker to run
            got.answers[key[1:]] = checker.answer(request, {})
            return
        answer_key = self.fresh.answer_key(request, blob)
        kept = self.fresh.answers.get(answer_key)
        if kept is not None:
            got.answers[key[1:]] = ({**kept[0], "cell": index}, kept[1])
            got.from_cache += 1
            return
        self.pending.append((request, blob, float(self.timeouts.get(index, 60)), answer_key))

    def _job_changed(self, jobs, sent: dict) -> str | None:
        """What differs between the job the notebook says a check ran (before and after the
        learner's function was traced) and the job this process sent (``sent``); None when
        nothing."""
        for job in jobs if isinstance(jobs, list) and jobs else [None]:
            if not isinstance(job, dict):
                return "its job is missing"
            if job.get("expr") != sent["expr"]:
                return f"it evaluated {str(job.get('expr'))[:80]!r}, not {sent['expr']!r}"
            if job != sent:
                return "its cases or the way it calls your function differ"
        return None

    # ------------------------------------------------------------------ the checker
    def _checker(self, got: Replayed) -> None:
        if self.fresh.checker is None:
            if not self.pending:
                return
            self.fresh.checker = self.fresh.start_checker()
        checker = self.fresh.checker
        data = bytes(checker.readers[0].data[self.checker_read:])
        frames, used, problem = exchange.read_frames(data, self.fresh.key)
        self.checker_read += used
        for message, blob in frames:
            if message.get("kind") == "ready":
                self.ready = True
            elif self.in_flight is not None:
                request, answer_key = self.in_flight[0], self.in_flight[3]
                got.answers[(request["cell"], request["task"], request["hidden"])] = \
                    (message, blob)
                self.fresh.answers.put(answer_key, message, blob)
                self.in_flight = None
        now = time.monotonic()
        if self.broken is None and not self.ready and checker.proc.poll() is None and \
                now - checker.started > STARTUP_SECONDS:
            checker.wait(("timeout", "not ready"))
        if self.broken:
            for request, *_ in self.pending:
                got.answers[(request["cell"], request["task"], request["hidden"])] = (
                    {**request, "programs": None, "failed": self.broken}, b"")
            self.pending.clear()
        elif problem or checker.proc.poll() is not None and not frames or not self.ready and \
                now - checker.started > STARTUP_SECONDS:
            if not self.ready:  # the grader's own fault: no learner program reached it yet
                tail = bytes(checker.readers[1].data).decode(errors="replace").strip() or \
                    f"not ready after {STARTUP_SECONDS} s"
                self.broken = ("not graded: the grader's checker could not start ("
                               f"{(tail.splitlines() or [problem or 'it ended'])[-1][:300]}); "
                               "check the jail with `pallas-course autograde` again")
                self.died = self.broken
                return
            why = problem or "it ended"
            self._lost(got, f"the checker stopped while checking your function ({why})")
        elif self.in_flight is not None and now - self.in_flight[1] > self.in_flight[2]:
            self._lost(got, None)
        if self.ready and self.in_flight is None and self.pending:
            request, blob, limit, answer_key = self.pending.pop(0)
            checker.send(exchange.frame(self.fresh.key, request, blob))
            self.in_flight = (request, time.monotonic(), limit, answer_key)

    def _lost(self, got: Replayed, failed: str | None) -> None:
        """The checker ran past a check's time limit (``failed`` None) or stopped: that check
        is answered so, and a new checker takes the rest."""
        if self.in_flight is not None:
            request = self.in_flight[0]
            got.answers[(request["cell"], request["task"], request["hidden"])] = (
                {**request, "programs": None, "timeout": failed is None, "failed": failed},
                b"")
            self.in_flight = None
        elif not self.pending:
            return
        self.fresh.checker.wait(("timeout", "stopped by the grader"))
        self.fresh.checker = None  # the next check pending starts a new one
        self.checker_read, self.ready = 0, False

    def end_checker(self) -> None:
        if self.fresh.checker is None:  # every check was decided without it
            return
        self.fresh.checker.send(b"", close=True)
        self.fresh.checker.wait(None if not self.pending and self.in_flight is None
                                else ("timeout", "stopped by the grader"))

    # ------------------------------------------------------------------ the loop
    def loop(self, got: Replayed) -> None:
        """Until the notebook's process has ended (or been stopped: a limit, bytes it did not
        write) and the checker has answered every check it sent before that."""
        child = self.fresh.child
        last_limits = 0.0
        while True:
            ended = self.outcome is not None or child.proc.poll() is not None
            if self.outcome is None:
                if ended:  # what it wrote before it ended, once its reader drained the pipe
                    child.readers[0].join(timeout=5)
                self._notebook(got)
                if self.problem and not ended:
                    self.outcome, ended = child.wait(self.stop_notebook), True
            if not ended and time.monotonic() - last_limits > 1.0:
                last_limits = time.monotonic()
                limit = child.past_limits()
                if limit is not None:
                    self.stop_notebook = limit
                    self.outcome, ended = child.wait(limit), True
            self._checker(got)
            if (self.done or ended) and not self.pending and self.in_flight is None:
                return
            time.sleep(self.POLL)
