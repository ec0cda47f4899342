"""What the exercise notebooks' test cells call: ``course.check(task_id, your_function)``.

``check`` runs the learner's function on the task's stored cases (``hidden=False``: the visible
cases shipped with the assignment; ``hidden=True``: the grading cases, only present on the
grader's machine), compares each output with the stored reference under the task's per-dtype
tolerance, then traces the function with kernelsim and checks its structural rules (a
``pallas_call`` is reached, grid, block shapes, scalar prefetch, HBM traffic budget).

A failure is a ``CheckFailed`` (an ``AssertionError``) with a message naming every failure at
once: the case, the first differing element, its block and the size of the difference, and each
structural requirement not met with what was found. In a Jupyter kernel it is shown as the
cell's error output but not raised, so a Restart-and-Run-All reaches every task's check;
``summary()`` (each notebook's last cell) then lists what passed and failed. Outside a kernel (a
script, a test) it is raised. ``view(task_id, show)`` runs a cell that shows the learner's kernel
(kernelsim's view of it) once the task is written, and says it is still to write until then.

The checking itself is ``grader.learner.selfcheck``, imported when a check first runs; this module
imports no other part of the grader but ``CheckFailed``'s light module
(``grader.learner.failure``), so it is what the notebook's process of the grader's run (its jail)
can import of the checks, where ``check`` and ``summary`` do nothing. The verdict
(``grader.verdict.verdict``) is a pure function of the outputs, the references and the trace's
``to_dict()``; under grading it is reached from the grader's process, never from here.
When ``$PALLAS_COURSE_REPORT`` names a file, one JSON line per check is appended to it (used by
``pallas-course check``).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from grader.learner.failure import CheckFailed

__all__ = ["check", "view", "summary", "CheckFailed"]

# this process's latest check of each task (visible cases): what ``summary`` reports
_SESSION: dict[str, dict[str, Any]] = {}


def _cell_frames(frame) -> list[traceback.FrameSummary]:
    """``frame`` and its callers up to the code IPython runs (the notebook's cell): what IPython
    would have shown for an exception raised out of ``frame``."""
    import IPython  # present where a check's failure is shown in a kernel

    ipython_dir = os.path.dirname(IPython.__file__) + os.sep
    frames = []
    while frame is not None and not frame.f_code.co_filename.startswith(ipython_dir):
        frames.append(frame)
        frame = frame.f_back
    return list(traceback.StackSummary.extract((f, f.f_lineno) for f in reversed(frames)))


def _jupyter_shell():
    """The IPython shell of the Jupyter kernel this runs in (JupyterLab, nbclient, nbgrader's
    validate), else None (a script, a test, a plain IPython terminal)."""
    try:
        from IPython import get_ipython  # optional: present where a notebook runs
    except ImportError:
        return None
    shell = get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


def selfcheck():
    """``grader.learner.selfcheck``, imported when a check runs outside the grader's run: the
    grader's run of a notebook (its jail) has no such module, nor the tasks, references or verdict
    it imports, and ``check`` does nothing there."""
    from grader.learner import selfcheck  # optional: the jail's view of grader/ has none

    return selfcheck


def _report(record: dict) -> None:
    path = os.environ.get("PALLAS_COURSE_REPORT")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def check(task_id: str, fn, hidden: bool = False, quiet: bool = False) -> None:
    """Run ``fn`` on the task's visible (or hidden) cases and check values and structure.

    A failure is a ``CheckFailed``, shown as the learner's own frames and the message, never
    the grader's code; known Pallas errors get a one-line hint (``grader.verdict.messages``). In a
    Jupyter kernel it becomes the cell's error output without stopping the run (``Run All``
    checks every task; nbgrader's validate and ``pallas-course check`` read error outputs);
    elsewhere it is raised.

    While a submission is graded (``$PALLAS_COURSE_GRADING`` is set) this does nothing: the
    grader runs the notebook again in a fresh process of its own, runs each test cell's checks
    there itself and compares the results in its own process, which holds the references
    (``grader.jail.trusted``, ``grader.jail.replay``).
    """
    __tracebackhide__ = True  # debuggers (%debug) skip this frame
    if os.environ.get("PALLAS_COURSE_GRADING"):
        return
    from kernelsim.backend import NeedsNewerJax  # starts JAX: ``import course`` stays light

    record: dict[str, Any] = {"task": task_id, "hidden": hidden, "passed": False}
    try:
        try:
            selfcheck().check(task_id, fn, hidden, quiet, record)
        except CheckFailed as e:
            record.setdefault("message", str(e))
            raise
        except NeedsNewerJax:  # this JAX cannot run the check (selfcheck says which it needs)
            record["needs_newer_jax"] = True
            raise
        except Exception as e:  # the course's own files are missing or damaged: say which
            record["message"] = f"{type(e).__name__}: {e}"
            raise CheckFailed(record["message"]) from e
        finally:
            _report(record)
            if not hidden:
                _SESSION.pop(task_id, None)  # re-checked: it moves to the end
                _SESSION[task_id] = record
    except CheckFailed as e:
        shell = _jupyter_shell()
        if shell is None:
            raise
        e.caller_frames = _cell_frames(sys._getframe(1))
        shell.showtraceback()  # the cell's error output; the cell itself succeeds


def _unwritten(e: BaseException | None) -> bool:
    """Whether ``e`` (or an exception it was raised from) is the stub's NotImplementedError."""
    while e is not None:
        if isinstance(e, NotImplementedError):
            return True
        e = e.__cause__ or e.__context__
    return False


def view(task_id: str, show: Callable[[], object]) -> None:
    """Run ``show`` (no arguments: it calls the learner's function for a task and prints or
    draws what kernelsim sees of it). While the task is still the stub, whose function raises
    NotImplementedError, print that it is still to write instead; any other error of ``show``
    becomes the cell's error output in a Jupyter kernel, as a check's failure does, so Restart
    and Run All goes on to the later checks and the summary (raised elsewhere). While a
    submission is graded this does nothing: no view is graded."""
    __tracebackhide__ = True
    if os.environ.get("PALLAS_COURSE_GRADING"):
        return
    try:
        show()
    except Exception as e:
        if _unwritten(e):
            print(f"{task_id}: still to write (your function raises NotImplementedError); "
                  "this cell shows what kernelsim sees of your kernel once it is written.")
            return
        shell = _jupyter_shell()
        if shell is None:
            raise
        shell.showtraceback()  # the cell's error output; the run goes on


def summary() -> None:
    """Print which tasks of the notebook passed, failed or were not checked in this kernel
    (the tasks of every assignment checked so far). Each exercise notebook ends with it."""
    if os.environ.get("PALLAS_COURSE_GRADING"):
        return
    if not _SESSION:
        print("No task was checked yet: run the notebook's cells (Kernel > Restart Kernel and "
              "Run All Cells).")
        return
    ids = selfcheck().task_ids(_SESSION)
    lines, passed, to_write = [], 0, []
    for tid in ids:
        record = _SESSION.get(tid)
        if record is None:
            lines.append(f"  not checked  {tid}: its check cell did not run")
        elif record["passed"]:
            passed += 1
            lines.append(f"  pass         {tid}")
        elif record.get("to_write"):
            to_write.append(tid)
            lines.append(f"  to write     {tid}: its function still raises NotImplementedError")
        elif record.get("needs_newer_jax"):
            lines.append(f"  not checked  {tid}: needs a newer JAX release (its check cell "
                         "says which)")
        else:
            # a check's message starts with its task id, which this line already shows
            first = (record.get("message") or "failed").splitlines()[0].removeprefix(f"{tid}: ")
            lines.append(f"  FAIL         {tid}: {first}")
    still = f"; still to write: {', '.join(to_write)}" if to_write else ""
    print(f"Checks in this kernel: {passed} of {len(ids)} task(s) passed{still}\n"
          + "\n".join(lines))
