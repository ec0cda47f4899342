"""Every structural rule a task can fail is stated before it is graded: in the task's own text
(its assignment's introduction or its section) or in a lesson the task comes after.

The rules every task shares are written in ``grader/tasks/core.py`` (``work_rules``,
``tpu_block_rule``, ``own_kernels``, ``calls_at_least``); ``STATED`` below holds each to the
words that state it. Assignment 4's any-K matmul lost 3 of 15 points to "dot precision right
on a TPU" while neither its text nor an earlier lesson said it. A task comes after its own
lesson (``grader.syllabus.PRACTISES``), or after the later lessons its tasks wait for
(``LATER_TASKS``). The rules of one task (its grid, blocks, budgets) are the task text's own:
``TASK_RULES`` reads the rule names each task's ``structure``/``body_rules``/``output_rules``/
``dma_rules`` can emit from its assignment module (the ``Rule`` literals and core helpers of the
functions they name, followed through the module), and ``WORDS`` holds each to the words that
state it.
"""

from __future__ import annotations

import ast
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

# the per-task rules: rule name (searched in it) -> the words that state it (searched in the
# task's text and the lessons before it, as STATED's); the first row whose key the name matches
WORDS: tuple[tuple[str, str], ...] = (
    (r"grid semantics|dimension_semantics", r"dimension_semantics|parallel|arbitrary"),
    (r"^(dk/dv|dq|forward) grid", r"\bgrid\b"),
    (r"\bgrid\b", r"\bgrid\b"),
    (r"block shape|block accepted", r"\bblock"),
    (r"HBM (reads|read traffic|write traffic|writes)", r"\bread|\bfetch|traffic|\bbytes\b"),
    (r"left in HBM|memory space", r"pl\.any|memory_space|memory space"),
    (r"scalar prefetch", r"scalar prefetch|num_scalar_prefetch"),
    (r"accumulator", r"accumulat"),
    (r"passed twice", r"twice"),
    (r"bias as a kernel input", r"bias is one more input"),
    (r"as a kernel input", r"\binputs?\b"),
    (r"output writebacks", r"writ(e|es|ten) back|writeback|written once"),
    (r"number of pallas_calls|pallas_calls reached", r"pallas_call"),
    (r"estimated time", r"kernelsim"),
    (r"CostEstimate's remote_bytes", r"remote_bytes_transferred"),
    (r"CostEstimate", r"costestimate"),
    (r"sweep", r"sweep"),
    (r"\(Lq, Lk\)", r"\(lq, lk\)"),
    (r"running max and sum", r"running max"),
    (r"a dk/dv kernel", r"dk"),
    (r"a dq kernel", r"\bdq\b"),
    (r"saving lse", r"\blse\b"),
    (r"bits", r"\bseed\b"),
    (r"keep mask", r"keep mask"),
    (r"DMA order", r"\bdma"),
    (r"in-place safety", r"copy into a buffer (whose|while a) copy out"),
    (r"overlap", r"overlap"),
    (r"on-chip buffers|copies .*: buffers", r"buffer"),
    (r"waited", r"\bwait"),
    (r"both directions", r"both directions"),
    (r"where the copies go", r"neighbou?r"),
    (r"remote cop", r"remote|neighbou?r"),
    (r"copies", r"\bcop(y|ies)\b"),
    (r"backward", r"backward"),
    (r"scales applied", r"\bscales?\b"),
    (r"int8", r"int8"),
    (r"Mosaic GPU", r"mosaic gpu"),
    (r"WGMMA", r"wgmma"),
    (r"TMA", r"\btma\b"),
    (r"shared memory", r"shared memory|smem"),
    (r"kernels run", r"calls kernelsim or the grader's code fails"),
    (r"one kernel per device", r"shard_map"),
    (r"B read as it is stored", r"as (it is )?stored"),
    (r"bytes each device sends", r"each device sends"),
    (r"kept fraction", r"keeps `1 - rate`"),
    (r"on-chip peak", r"on-chip peak"),
    (r"one CTA per output tile", r"one cta per"),
    (r"scratch_shapes", r"scratch"),
    (r"two receive slots", r"two\**\s*receive slots"),
)

# core.py's helpers that build rules: helper -> the names of its rules, or (the label
# argument's position, the name around the label)
NAMED_HELPERS = {"grid_is": ("grid",), "grid_rank": ("grid rank",),
                 "calls_exactly": ("number of pallas_calls",),
                 "total_budget": ("HBM read traffic", "HBM write traffic")}
LABELLED_HELPERS = {"block_is": (4, "{} block shape"), "read_budget": (4, "{} HBM reads"),
                    "role_count": (3, "{}")}
RULE_ARGUMENTS = ("structure", "body_rules", "output_rules", "dma_rules")


def _literal(node: ast.AST | None) -> str:
    """A string's text, an f-string's with ``{}`` for each formatted part, else ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return "{}"


def _rule_names(node: ast.AST, functions: dict[str, ast.FunctionDef]) -> set[str]:
    """The rule names ``node`` can emit, following the module's own functions it names."""
    names: set[str] = set()
    seen: set[str] = set()
    todo = [node]
    while todo:
        for sub in ast.walk(todo.pop()):
            if isinstance(sub, ast.Name) and sub.id in functions and sub.id not in seen:
                seen.add(sub.id)
                todo.append(functions[sub.id])
            if not isinstance(sub, ast.Call) or not isinstance(sub.func, ast.Name):
                continue
            called = sub.func.id
            if called == "Rule" and sub.args:
                names.add(_literal(sub.args[0]))
            elif called in NAMED_HELPERS:
                names.update(NAMED_HELPERS[called])
            elif called in LABELLED_HELPERS:
                at, around = LABELLED_HELPERS[called]
                label = (sub.args[at] if len(sub.args) > at else
                         next((k.value for k in sub.keywords if k.arg == "label"), None))
                names.add(around.format(_literal(label)))
    return names


def _task_rules() -> dict[str, set[str]]:
    """Each task's id -> the names of the rules its own functions can emit (and the functions
    its module imports from another assignment's, such as a04's ``prediction_structure``)."""
    trees = {m.stem: ast.parse(m.read_text())
             for m in sorted((REPO / "grader" / "tasks").glob("a[0-9][0-9]_*.py"))}
    defined = {stem: {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
               for stem, tree in trees.items()}
    found: dict[str, set[str]] = {}
    for stem, tree in trees.items():
        functions = dict(defined[stem])
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module.startswith("grader.tasks.a"):
                other = defined[node.module.rsplit(".", 1)[1]]
                functions.update({a.name: other[a.name] for a in node.names if a.name in other})
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "register_task":
                given = {k.arg: k.value for k in call.keywords}
                found[given["id"].value] = set().union(
                    *(_rule_names(given[k], functions) for k in RULE_ARGUMENTS if k in given))
    return found


TASK_RULES = _task_rules()

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


def test_every_task_rule_has_its_words():
    """A task's rule added or renamed needs its row in WORDS."""
    names = set().union(*TASK_RULES.values())
    unworded = sorted(n for n in names if not any(re.search(k, n) for k, _ in WORDS))
    assert not unworded, f"task rules {unworded} have no row in WORDS in this file"


def test_every_task_is_read():
    assert set(TASK_RULES) == {t.id for t in tasks.TASKS}


@pytest.mark.parametrize("task", tasks.TASKS, ids=lambda t: t.id)
def test_every_rule_of_a_task_is_stated_before_it(task: core.Task):
    before = _comes_after(task)
    text = _task_text(task)
    earlier = _lessons_before(before)
    unstated = []
    for rule in sorted(TASK_RULES[task.id]):
        words = next((w for k, w in WORDS if re.search(k, rule)), None)
        if words is not None and not re.search(words, text) and not re.search(words, earlier):
            unstated.append(rule)
    assert not unstated, (
        f"{task.assignment}'s task {task.id} grades {unstated}, which neither its text "
        f"(exercises/source/{task.assignment}) nor lessons 1-{before} state: say it in the task "
        "text, or in a lesson before it, in words that WORDS in this file finds")
