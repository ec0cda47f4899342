"""Every structural rule a task can fail is stated before it is graded: in the task's own text
(its assignment's introduction or its section) or in a lesson the task comes after.

The rules every task shares are written in ``grader/tasks/core.py`` (``work_rules``,
``tpu_block_rule``, ``own_kernels``, ``calls_at_least``); ``STATED`` below holds each to the
words that state it. Assignment 4's any-K matmul lost 3 of 15 points to "dot precision right
on a TPU" while neither its text nor an earlier lesson said it. A task comes after its own
lesson (``grader.syllabus.PRACTISES``), or after the later lessons its tasks wait for
(``LATER_TASKS``). The rules of one task (its grid, blocks, budgets) are the task text's own.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from grader import syllabus, tasks
from grader.tasks import core

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "exercises" / "source"
LESSONS = {int(p.name[:2]): p for p in (REPO / "lessons").glob("[0-9][0-9]-*.py")}


def _any(task: core.Task) -> bool:
    return True


def _tpu(task: core.Task) -> bool:
    return task.target == "tpu"


def _tpu_dot(task: core.Task) -> bool:
    return task.target == "tpu" and any("dot_general" in g for g in task.kernel_ops)


def _own(task: core.Task) -> bool:
    return task.own_kernels


# rule name (its start, before any f-string part) -> (which tasks can fail it, a pattern of
# the words that state it, searched in lower case with comment marks and line breaks removed)
STATED: dict[str, tuple[Callable[[core.Task], bool], str]] = {
    "pallas_call reached": (_any, r"reaches `pl\.pallas_call`|must be a pallas kernel"),
    "kernels are your own": (_own, r"kernels are your own"),
    "result comes from the kernel": (_any, r"result comes from the kernel"),
    "kernel inputs are your function's inputs": (
        _any, r"kernel's inputs are your function's arguments"),
    "compute outside kernels": (_any, r"compute outside kernels"),
    "data moved outside kernels": (_any, r"data moved outside kernels"),
    "kernel computes ": (_any, r"kernel computes the task's operation"),
    "every kernel input is read": (_any, r"every kernel input is read"),
    "no host callbacks": (_any, r"no host callbacks"),
    "scalar prefetch carries indices": (_any, r"scalar prefetch[^.]*carries indices"),
    "dot precision right on a TPU": (
        _tpu_dot, r"float32 dot[^.]{0,30}(at|passes|must pass) "
                  r"`precision=(jax\.lax\.precision\.)?highest`"),
    "strided ref reads Mosaic lowers": (_tpu, r"`pl\.ds\(\.\.\., stride=k\)`, only of 32-bit"),
    "block shapes Mosaic accepts": (_tpu, r"block shapes mosaic accepts"),
    "output index maps read scalar prefetch at the step's own index": (
        _tpu, r"index map reads only at the step's own index"),
}

RULE = re.compile(r'Rule\(\s*f?"([^"{]*)')


def _words(text: str) -> str:
    lines = (re.sub(r"^\s*#\s?", "", line) for line in text.splitlines())
    return " ".join(" ".join(lines).split()).lower()


def _task_text(task: core.Task) -> str:
    """The assignment's introduction (before its first task) and the task's own section."""
    notebook = next((SOURCE / task.assignment).glob("*.py")).read_text()
    sections = re.split(r"^(?=# ## )", notebook, flags=re.MULTILINE)
    own = [s for s in sections if re.match(rf"# ## Task \d+ — .*`{task.id}\(", s)]
    return _words(sections[0] + "".join(own))


def _task_number(task: core.Task) -> int | None:
    notebook = next((SOURCE / task.assignment).glob("*.py")).read_text()
    found = re.search(rf"^# ## Task (\d+) — .*`{task.id}\(", notebook, re.MULTILINE)
    return int(found.group(1)) if found else None


def _comes_after(task: core.Task) -> int:
    """The last lesson ``task`` comes after."""
    later, lessons = syllabus.LATER_TASKS.get(task.assignment, ((), ()))
    if _task_number(task) in later:
        return max(lessons)
    return syllabus.PRACTISES[task.assignment]


def _lessons_before(number: int) -> str:
    return " ".join(_words(p.read_text()) for n, p in LESSONS.items() if n <= number)


def test_every_shared_rule_has_its_words():
    """A rule added to the shared ones, or renamed, needs its line in STATED."""
    shared = [core.work_rules, core.tpu_block_rule, core.own_kernels, core.calls_at_least]
    names = {m.strip() for fn in shared for m in RULE.findall(inspect.getsource(fn))}
    unstated = [n for n in names if not any(n.startswith(k.strip()) for k in STATED)]
    assert not unstated, f"grader/tasks/core.py's rules {unstated} have no line in STATED"


@pytest.mark.parametrize("task", tasks.TASKS, ids=lambda t: t.id)
def test_every_rule_a_task_can_fail_is_stated_before_it(task: core.Task):
    before = _comes_after(task)
    text = _task_text(task)
    earlier = _lessons_before(before)
    unstated = [rule for rule, (applies, words) in STATED.items()
                if applies(task) and not re.search(words, text) and not re.search(words, earlier)]
    assert not unstated, (
        f"{task.assignment}'s task {task.id} can fail {unstated}, which neither its text "
        f"(exercises/source/{task.assignment}) nor lessons 1-{before} state: say it in the task "
        "text, or in a lesson before it, in words that STATED in this file finds")
