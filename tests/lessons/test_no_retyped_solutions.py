"""No graded task's solution is a lesson's code retyped (issue 22).

Every function in a task's solution cell (the solution function and the kernels, index maps
and helpers defined inside it) is compared with every function the lessons define, modulo
whitespace, comments, docstrings and names: each statement is parsed and its local names
(variables, arguments) replaced by their order of first appearance in that statement.
Attribute names (`jnp.dot`, `pl.BlockSpec`) and constants stay: they are the API and the
numbers a learner would have to find. A solution function whose statements are, for at least
``SAME`` of them, statements of one lesson function was handed over by that lesson.

Functions under ``MIN_NODES`` syntax-tree nodes (a `pl.when` body of one line, a one-line
kernel) are idioms, not solutions, and are not compared.

No task is exempt: the test fails for any task whose solution matches.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]-*.py"))
NOTEBOOKS = sorted((ROOT / "exercises" / "source").glob("*/*.py"))
MIN_NODES = 60
SAME = 0.8
# the new lessons' tasks, and the tasks rewritten because they retyped lessons 5, 6 and 10
NEW_TASKS = ("softmax_in_parts", "matmul_bias_relu_cores", "int8_matmul_per_channel",
             "w8a8_matmul", "kv_cache_append", "column_softmax", "matmul", "matmul_tuned",
             "rms_norm", "embedding_bag")


class _Canonical(ast.NodeTransformer):
    """Local names renamed by order of first appearance."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(self._name(node.id), node.ctx), node)

    def visit_arg(self, node):
        node.arg = self._name(node.arg)
        node.annotation = None
        return node


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)


def statements(fn: ast.FunctionDef) -> collections.Counter:
    """The canonical form of every statement inside ``fn`` (nested functions' too, not the
    ``def`` lines themselves), counted."""
    found = collections.Counter()
    for node in ast.walk(fn):
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef) \
                and not _is_docstring(node):
            copy = ast.parse(ast.unparse(node)).body[0]
            found[ast.dump(_Canonical().visit(copy), annotate_fields=False)] += 1
    return found


def functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and sum(1 for _ in ast.walk(n)) >= MIN_NODES]


def lesson_functions() -> dict[str, collections.Counter]:
    """'lesson:function' -> its statements, for every function the lessons define."""
    return {f"{path.stem}:{fn.name}": statements(fn)
            for path in LESSONS for fn in functions(ast.parse(path.read_text()))}


def solutions() -> dict[str, ast.Module]:
    """task id -> the code of its solution cell (between the solution markers)."""
    found = {}
    for path in NOTEBOOKS:
        for cell in jupytext.read(path).cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if cell.cell_type == "code" and grade_id.endswith("_solution"):
                source = re.sub(r"^\s*### (BEGIN|END) SOLUTION\s*$", "", cell.source,
                                flags=re.MULTILINE)
                found[grade_id.removesuffix("_solution")] = ast.parse(source)
    return found


def closest(tree: ast.AST, lessons: dict[str, collections.Counter]) -> tuple[float, str]:
    """The largest share of one solution function's statements found in one lesson
    function, and which pair."""
    best = (0.0, "")
    for fn in functions(tree):
        own = statements(fn)
        total = sum(own.values())
        for name, theirs in lessons.items():
            share = sum((own & theirs).values()) / total if total else 0.0
            if share > best[0]:
                best = (share, f"{fn.name} ~ {name}")
    return best


@pytest.fixture(scope="module")
def shares() -> dict[str, tuple[float, str]]:
    lessons = lesson_functions()
    return {task: closest(tree, lessons) for task, tree in solutions().items()}


def test_the_comparison_sees_a_renamed_lesson_kernel():
    """A lesson kernel with its names changed is found; a different kernel is not."""
    source = (ROOT / "lessons" / "08-flash-attention.py").read_text()
    fn = next(n for n in ast.parse(source).body
              if isinstance(n, ast.FunctionDef) and n.name == "flash_kernel")
    renamed = ast.unparse(fn)
    for old, new in (("q_ref", "queries"), ("m_ref", "run_max"), ("flash_kernel", "mine")):
        renamed = renamed.replace(old, new)
    lessons = lesson_functions()
    assert closest(ast.parse(renamed), lessons)[0] == 1.0
    other = (ROOT / "lessons" / "13-kernel-api.py").read_text()
    assert closest(ast.parse(other), {"08": lessons["08-flash-attention:flash_kernel"]})[0] \
        < SAME


def test_no_solution_retypes_a_lesson(shares):
    same = {t: f"{s:.2f}: {pair}" for t, (s, pair) in shares.items() if s >= SAME}
    assert not same, (
        f"solutions that retype lesson code (modulo names): {same}; change the task so the "
        "learner writes what the lesson motivates but does not show")


@pytest.mark.parametrize("task", NEW_TASKS)
def test_new_tasks_are_strict(task, shares):
    assert task in shares
    assert shares[task][0] < SAME, shares[task]
