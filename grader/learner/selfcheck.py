"""The learner's own check of a task (``grader.learner.course.check`` outside the grader's run): the
task's stored cases run through the learner's function, compared with the references under the
task's tolerance, and its structure checked on kernelsim's trace.

``grader.learner.course`` imports this only when a check runs (in JupyterLab, ``pallas-course
check``, a test): the notebook's process of the grader's run has no ``grader/learner/selfcheck.py``,
nor the tasks, references and verdict it imports (``grader.jail.trusted.notebook_view``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from grader import tasks
from grader.facts import work
from grader.learner import speed
from grader.learner.failure import CheckFailed
from grader.verdict import messages, refs, verdict
from kernelsim.backend import NeedsNewerJax


def task_ids(checked) -> list[str]:
    """The tasks of every assignment that one of ``checked`` (task ids) belongs to, in the
    course's order, then any unknown ones of ``checked``."""
    assignments = {tasks.get(t).assignment for t in checked if t in tasks.BY_ID}
    ids = [t.id for t in tasks.TASKS if t.assignment in assignments]
    return ids + [t for t in checked if t not in ids]


def _refdirs(hidden: bool) -> list[Path]:
    dirs = []
    env = os.environ.get("PALLAS_COURSE_REFS")
    if env:
        dirs.append(Path(env))
    root_refs = refs.course_root() / "refs"
    dirs.append(root_refs)
    if not hidden:
        dirs.append(Path.cwd() / "refs")  # the copy shipped in a released assignment folder
    return dirs


def _cases(task_id: str, hidden: bool) -> tuple[Path, list[dict]]:
    for d in _refdirs(hidden):
        if not (d / "manifest.json").exists():
            continue
        manifest = refs.load_manifest(d)
        entries = [e for e in manifest["cases"].values()
                   if e["task"] == task_id and e["hidden"] == hidden]
        if entries:
            return d, entries
    kind = "hidden" if hidden else "visible"
    where = ", ".join(str(d) for d in _refdirs(hidden))
    hint = ("hidden cases only exist where the course is graded" if hidden
            else "run this notebook from its assignment folder (it ships a refs/ folder)")
    raise CheckFailed(f"no {kind} reference cases for task {task_id!r} in {where}: {hint}")


# JAX logs the whole traceback of every io_callback that raises, and TPU interpret mode's race
# detector raises in one: some 150 lines on stderr for one racy ring, which a notebook shows
# above the check's message, while that message states the race in a few lines (issue 50)
CALLBACK_LOGGER = "jax._src.callback"


@contextlib.contextmanager
def _callback_tracebacks_unlogged() -> Iterator[None]:
    logger = logging.getLogger(CALLBACK_LOGGER)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def check(task_id: str, fn, hidden: bool, quiet: bool, record: dict[str, Any]) -> None:
    """Check ``fn`` on the task's visible (or hidden) cases; fill ``record`` (rules, kernelsim's
    summary, the message) and raise ``CheckFailed`` when it fails."""
    kind = "hidden" if hidden else "visible"
    refdir, entries = _cases(task_id, hidden)
    loaded = [(e, *refs.load_case(refdir, e)) for e in entries]
    task = tasks.get(task_id)
    with _callback_tracebacks_unlogged():
        runs = [work.run_case(task, fn, [jnp.asarray(v) for v in inputs.values()], params)
                for _, inputs, _, params in loaded]  # one run per case: values, trace and work
    too_old = next((r.error for r in runs if (r.error or "").startswith("NeedsNewerJax:")), None)
    if too_old:  # this JAX cannot run the check: not the learner's failure
        record["message"] = f"{task_id}: cannot be checked here: {too_old.split(': ', 1)[1]}"
        raise NeedsNewerJax(record["message"])
    results = [verdict.case_result(e, inputs, expected, params, r.output, r.error, r.trace,
                                    r.trace_error, r.work)
               for (e, inputs, expected, params), r in zip(loaded, runs, strict=True)]
    v = verdict.decide(task_id, results)
    record.update(rules=v.rules, kernelsim=next((r.summary for r in runs if r.summary), None))
    if not v.passed:
        # the stub, still as released: ``course.summary`` lists it as still to write
        record["to_write"] = v.message == f"{task_id}: {verdict.NOT_IMPLEMENTED}"
        message = v.message
        facts = results[0].trace
        if facts is not None and any(r.startswith("[FAIL]") for r in v.rules):
            message += "\n" + messages.traffic_table(facts)
        record["message"] = message = messages.annotate(message, results[0].trace_error)
        raise CheckFailed(message)
    record["passed"] = True
    if not quiet:
        # one line: the rules that held are in the record (``pallas-course check --verbose``)
        print(f"{task_id}: {len(entries)} {kind} case(s) passed and all "
              f"{len(v.checked)} structural rules held")
    shown = None if hidden else speed_of(task, fn, loaded, runs)
    if shown is not None:
        record["speed"] = {**shown.to_dict(), "lines": shown.lines()}
        if not quiet:
            print("\n".join(shown.lines()))


def speed_of(task, fn, loaded, runs) -> speed.SpeedReport | None:
    """A performance task's speed (``grader.learner.speed``) on its largest checked case:
    the learner's function with that case's parameters bound, kernelsim's trace of its run."""
    if task.id not in speed.SPEED_TASKS:
        return None
    size = [sum(v.size for v in inputs.values()) for _, inputs, _, _ in loaded]
    i = size.index(max(size))
    _, inputs, _, params = loaded[i]
    arrays = [jnp.asarray(v) for v in inputs.values()]
    return speed.report(task.id, lambda *a: task.call(fn, list(a), params), arrays,
                        runs[i].trace)
