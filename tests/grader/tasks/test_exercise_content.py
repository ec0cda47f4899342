"""What every exercise notebook under ``exercises/source/`` must hold (issue 16).

Per graded task (every id in ``grader.tasks`` of that assignment):

- a ``<task>_solution`` cell exists;
- the cell right before it is the hint cell, in exactly the form ``exercises/README.md`` gives:
  "Hint 1: the approach", then "Hint 2: the key line", each a collapsible ``<details>`` block
  with text in it;
- no line of the solution (stripped of indentation and a trailing comma, 25 characters or more)
  appears in any hint of the notebook: a hint points the way, it never hands over the code;
- "Hint 2: the key line" names the line to write or change and what it must express, never the
  line itself: it holds no code line of the notebook's solution regions (``### BEGIN SOLUTION``
  to ``### END SOLUTION``; 12 characters or more, whitespace ignored, so a re-wrapped or
  re-spaced copy counts), no ``lambda`` or ``def`` of them, and no code span that *is* one of
  their lambdas' bodies or the value a solution line assigns or returns (the line without its
  name). In a "find the bug" task (one with a ``<task>_buggy`` cell) the fix is one line, so
  its key hint quotes only the buggy cell: every code span beyond a bare name is text of that
  cell, and at least one is, to point at the line to change;
- the solution cell makes the kernel itself: it calls ``pl.pallas_call`` (or
  ``pltpu.emit_pipeline``, ``pl.kernel`` or ``plgpu.kernel``), and it calls no function of a
  setup cell (a locked, non-graded cell) that does. A "predict, then run" task (its id starts
  with ``predict_``) returns a number and makes no kernel; it needs no call.

Every assignment folder is checked, so a new assignment is held to the same rules the moment it
lands. The last tests plant each kind of violation in a copy of a notebook and show the checks
catch it, naming the notebook, the cell and the task.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from pathlib import Path

import jupytext
import pytest

from grader import tasks

REPO = Path(__file__).resolve().parents[3]
SOURCE = REPO / "exercises" / "source"
NOTEBOOKS = sorted(p for p in SOURCE.glob("*/*.py") if p.stem == p.parent.name[3:])
HINTS = re.compile(
    r"<details><summary>Hint 1: the approach</summary>\n\n(?P<approach>\S.*?)\n\n</details>\n\n"
    r"<details><summary>Hint 2: the key line</summary>\n\n(?P<key>\S.*?)\n\n</details>",
    re.DOTALL)
MAKES_KERNEL = re.compile(
    r"\bpl\.pallas_call\b|\bpltpu\.emit_pipeline\b|\bpl\.kernel\b|\bplgpu\.kernel\b")
SHORTEST_COPIED_LINE = 25
SHORTEST_KEY_LINE_COPY = 12  # Hint 2 is held closer: the fix of a bug can be a short line
SOLUTION_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION[ \t]*\n(.*?)^[ \t]*### END SOLUTION",
                             re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`]+)`")
BARE_NAME = re.compile(r"[\w.]+")  # `x_ref`, `pl.when`, `_prefetch_next`, `0`: naming, not code
BUGGY_SUFFIX = "_buggy"
OPENER = {")": "(", "]": "[", "}": "{"}
PREDICTION_PREFIX = "predict_"  # these tasks return a number (grader/tasks: a04's example)


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _where(path: Path, index: int, cell) -> str:
    first = cell.source.strip().splitlines()[0] if cell.source.strip() else "(empty)"
    return f"{_name(path)}: cell {index + 1} ({first[:50]!r})"


def _is_setup(cell) -> bool:
    meta = cell.metadata.get("nbgrader")
    return cell.cell_type == "code" and meta is not None and not meta.get("grade") and \
        not meta.get("solution")


def _code_lines(source: str) -> list[str]:
    """The solution's lines as a hint could copy them: stripped, no trailing comma, long."""
    lines = (line.strip().rstrip(",").strip() for line in source.splitlines())
    return [line for line in lines
            if len(line) >= SHORTEST_COPIED_LINE and not line.startswith("###")]


def key_hints(cells) -> dict[str, tuple[int, str]]:
    """task -> (index of its hint cell, text of its "Hint 2: the key line"), for every solution
    cell whose previous cell is a well-formed hint cell."""
    found = {}
    for i, cell in enumerate(cells):
        task = _grade_id(cell).removesuffix("_solution")
        if task == _grade_id(cell) or i == 0 or cells[i - 1].cell_type != "markdown":
            continue
        match = HINTS.fullmatch(cells[i - 1].source.strip())
        if match:
            found[task] = (i - 1, match["key"])
    return found


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _without_unmatched_closers(line: str) -> str:
    """A continuation line as a hint could copy it: no trailing comma, nor the brackets that
    close what earlier lines opened (``pl.BlockSpec(memory_space=pltpu.SMEM)],``)."""
    line = line.rstrip(",").rstrip()
    while line and line[-1] in OPENER and line.count(line[-1]) > line.count(OPENER[line[-1]]):
        line = line[:-1].rstrip(",").rstrip()
    return line


def _comment_free_lines(source: str) -> list[str]:
    """``source``'s lines without their comments (a ``#`` inside a string stays)."""
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return lines


def solution_code(cells) -> tuple[dict[str, str], dict[str, str]]:
    """What a key-line hint must not hold, from the solution regions of every cell:
    (squashed text -> the line, def or lambda as written; AST dump -> the lambda, lambda body
    or value of a solution line, unparsed)."""
    texts, trees = {}, {}
    for cell in cells:
        if cell.cell_type != "code":
            continue
        for match in SOLUTION_REGION.finditer(cell.source):
            region = textwrap.dedent(match[1])
            for line in _comment_free_lines(region):
                line = _without_unmatched_closers(line.strip())
                if len(line) >= SHORTEST_KEY_LINE_COPY:
                    texts[_squash(line)] = line
            for node in ast.walk(ast.parse(region)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    header = f"def {node.name}({ast.unparse(node.args)})"
                    texts[_squash(header)] = header
                elif isinstance(node, ast.Lambda):
                    texts[_squash(ast.unparse(node))] = ast.unparse(node)
                    trees[ast.dump(node)] = ast.unparse(node)
                    if len(ast.unparse(node.body)) >= SHORTEST_KEY_LINE_COPY:
                        trees[ast.dump(node.body)] = ast.unparse(node.body)
                if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Return |
                              ast.Expr) and node.value is not None and \
                        len(ast.unparse(node.value)) >= SHORTEST_KEY_LINE_COPY:
                    trees[ast.dump(node.value)] = ast.unparse(node.value)
    return texts, trees


def _span_trees(span: str) -> list[ast.AST]:
    """The expressions a code span is, as a whole (a statement's value for ``x = ...``), and
    every lambda inside it; nothing where the span is not Python."""
    try:
        body = [ast.parse(span.strip(), mode="eval").body]
    except SyntaxError:
        try:
            body = [getattr(node, "value", None) for node in ast.parse(span.strip()).body]
        except SyntaxError:
            return []
    body = [node for node in body if node is not None]
    return body + [node for top in body for node in ast.walk(top)
                   if isinstance(node, ast.Lambda) and node is not top]


def key_hint_copies(key: str, texts: dict[str, str], trees: dict[str, str]) -> list[str]:
    """The solution code that the key hint ``key`` holds (see ``solution_code``)."""
    squashed = _squash(key.replace("`", ""))
    found = [line for text, line in texts.items() if text in squashed]
    for span in CODE_SPAN.findall(key):
        found += [trees[ast.dump(node)] for node in _span_trees(span)
                  if ast.dump(node) in trees]
    return list(dict.fromkeys(found))


def _kernel_helpers(cells) -> dict[str, str]:
    """Functions that setup cells define and whose body makes a kernel: name -> cell."""
    helpers = {}
    for cell in cells:
        if not _is_setup(cell):
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    MAKES_KERNEL.search(ast.get_source_segment(cell.source, node) or ""):
                helpers[node.name] = _grade_id(cell)
    return helpers


def problems(path: Path, task_ids: list[str]) -> list[str]:
    """Every rule of the module docstring that ``path`` breaks for ``task_ids``, in words."""
    cells = jupytext.read(path).cells
    found: list[str] = []
    by_id = {_grade_id(c): i for i, c in enumerate(cells) if _grade_id(c)}
    hint_cells = [(i, c) for i, c in enumerate(cells)
                  if c.cell_type == "markdown" and "<details><summary>Hint" in c.source]
    helpers = _kernel_helpers(cells)
    keys = key_hints(cells)
    texts, trees = solution_code(cells)
    for task in task_ids:
        i = by_id.get(f"{task}_solution")
        if i is None:
            found.append(f"{_name(path)}: task {task!r} has no cell with grade_id "
                         f"'{task}_solution'")
            continue
        solution, where = cells[i], _where(path, i, cells[i])
        before = cells[i - 1] if i > 0 else None
        if before is None or before.cell_type != "markdown" or \
                not HINTS.fullmatch(before.source.strip()):
            found.append(f"{where}: task {task!r}: the cell before its solution must be the hint "
                         "cell (Hint 1: the approach, Hint 2: the key line, each in "
                         "<details>; see exercises/README.md)")
        for line in _code_lines(solution.source):
            for j, hint in hint_cells:
                if line in hint.source:
                    found.append(f"{_where(path, j, hint)}: task {task!r}: a hint copies the "
                                 f"solution line {line!r} of {where}")
        if task in keys:
            j, key = keys[task]
            for code in key_hint_copies(key, texts, trees):
                found.append(f"{_where(path, j, cells[j])}: task {task!r}: Hint 2 hands over "
                             f"solution code {code!r}: name the line and what it must express")
            if f"{task}{BUGGY_SUFFIX}" in by_id:
                found += _bug_hint_problems(path, cells, j, key, task, by_id)
        if task.startswith(PREDICTION_PREFIX):
            continue
        if not MAKES_KERNEL.search(solution.source):
            found.append(f"{where}: task {task!r}: the solution cell makes no kernel itself (no "
                         "pl.pallas_call, pltpu.emit_pipeline, pl.kernel or plgpu.kernel)")
        used = {n.id for n in ast.walk(ast.parse(solution.source)) if isinstance(n, ast.Name)}
        for name in sorted(used & set(helpers)):
            found.append(f"{where}: task {task!r}: the solution calls {name}(), a kernel that "
                         f"setup cell {helpers[name]!r} ships to every learner: make the task a "
                         "change to it, or move it into the solution")
    return found


def _bug_hint_problems(path, cells, j, key, task, by_id) -> list[str]:
    """A find-the-bug task's key hint quotes the buggy cell, and nothing but it."""
    buggy_id = f"{task}{BUGGY_SUFFIX}"
    buggy = _squash(cells[by_id[buggy_id]].source)
    spans = CODE_SPAN.findall(key)
    found = [f"{_where(path, j, cells[j])}: task {task!r}: Hint 2 writes code that cell "
             f"{buggy_id!r} does not hold, {span!r}: quote the buggy line, not the fix"
             for span in spans if not BARE_NAME.fullmatch(span) and _squash(span) not in buggy]
    if not any(_squash(span) in buggy for span in spans):
        found.append(f"{_where(path, j, cells[j])}: task {task!r}: Hint 2 quotes nothing of cell "
                     f"{buggy_id!r}: it must point at the line to change")
    return found


def _task_ids(assignment: str) -> list[str]:
    return [t.id for t in tasks.TASKS if t.assignment == assignment]


def test_every_assignment_with_tasks_has_a_notebook():
    have = {p.parent.name for p in NOTEBOOKS}
    assert set(tasks.ASSIGNMENTS) <= have, f"no notebook for {set(tasks.ASSIGNMENTS) - have}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_notebook_hints_and_kernels(path):
    found = problems(path, _task_ids(path.parent.name))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_every_solution_cell_belongs_to_a_task(path):
    cells = jupytext.read(path).cells
    ids = set(_task_ids(path.parent.name))
    stray = [f"{_where(path, i, c)}: {_grade_id(c)!r} names no task of grader.tasks"
             for i, c in enumerate(cells)
             if _grade_id(c).endswith("_solution") and _grade_id(c)[:-9] not in ids]
    assert not stray, "\n".join(stray)


def test_sum_all_and_scratch_kernels_run_on_the_tpu_interpreter():
    """Assignment 04's kernels keep state across grid steps (scratch, or sum_all's output
    block): on a GPU they would race or not lower, so every one runs with TPU_INTERPRET, which
    the setup cell takes from ``choose(tpu_features=True)``."""
    path = SOURCE / "04_memory_spaces" / "memory_spaces.py"
    cells = jupytext.read(path).cells
    setup = next(c for c in cells if _grade_id(c) == "setup")
    assert "TPU_INTERPRET = choose(tpu_features=True).interpret" in setup.source
    for task in _task_ids("04_memory_spaces"):
        cell = next(c for c in cells if _grade_id(c) == f"{task}_solution")
        settings = re.findall(r"interpret=(\w+)", cell.source)
        assert all(s == "TPU_INTERPRET" for s in settings), (task, settings)


# ----------------------------------------------------------------------- planted violations
A1 = SOURCE / "01_first_kernel" / "first_kernel.py"
HELPER = '''

def _add_call(x, y):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
'''


@pytest.fixture
def plant(tmp_path):
    """A copy of assignment 01's notebook (or of ``source``) with ``change`` applied to its
    text."""
    def make(change, source: Path = A1) -> Path:
        target = tmp_path / source.name
        target.write_text(change(source.read_text()))
        return target
    return make


def _add_solution_body(text: str) -> tuple[int, int]:
    start = text.index("    ### BEGIN SOLUTION\n", text.index('"add_solution"'))
    return start, text.index("    ### END SOLUTION\n", start)


def test_planted_missing_hint_is_named(plant):
    def drop_hint(text):
        hint = text.index("# %% [markdown]\n# <details><summary>Hint 1")
        return text[:hint] + text[text.index('# %% nbgrader={"grade_id": "add_solution"'):]
    found = problems(plant(drop_hint), ["add"])
    assert len(found) == 1 and "first_kernel.py: cell " in found[0] and \
        "task 'add'" in found[0] and "hint cell" in found[0], found


def test_planted_hint_with_one_summary_is_named(plant):
    found = problems(plant(lambda t: t.replace("Hint 2: the key line", "Hint 2", 1)), ["add"])
    assert any("task 'add'" in f and "hint cell" in f for f in found), found


def test_planted_copied_line_is_named(plant):
    line = "return pl.pallas_call("
    assert len(line) < SHORTEST_COPIED_LINE  # short lines are allowed; the long one below is not
    copied = "o_ref[...] = x_ref[...] + y_ref[...]"
    found = problems(plant(lambda t: t.replace("the value\n# is the sum of the two reads.",
                                               f"the value\n# is `{copied}`.", 1)), ["add"])
    assert any("task 'add'" in f and repr(copied) in f and "copies the solution line" in f
               for f in found), found


def test_planted_setup_helper_is_named(plant):
    def helper(text):
        text = text.replace("TPU_INTERPRET = choose(tpu_features=True).interpret\n",
                            "TPU_INTERPRET = choose(tpu_features=True).interpret\n" + HELPER, 1)
        start, end = _add_solution_body(text)
        return text[:start] + "    ### BEGIN SOLUTION\n    return _add_call(x, y)\n" + text[end:]
    found = problems(plant(helper), ["add"])
    assert any("task 'add'" in f and "makes no kernel itself" in f for f in found), found
    assert any("_add_call()" in f and "setup cell 'setup'" in f for f in found), found


def test_planted_missing_solution_cell_is_named(plant):
    path = plant(lambda t: t.replace('"add_solution"', '"add_answer"'))
    assert problems(path, ["add"]) == [f"{path}: task 'add' has no cell with grade_id "
                                       "'add_solution'"]


ADD_KEY_HINT = "the value\n# is the sum of the two reads."


def test_planted_short_or_rewrapped_solution_line_in_the_key_hint_is_named(plant):
    short = "v = x_ref[...]"  # leaky_relu's solution: shorter than the rule for every hint
    assert len(short) < SHORTEST_COPIED_LINE
    found = problems(plant(lambda t: t.replace(ADD_KEY_HINT, f"the value\n# is `{short}`.")),
                     ["add"])
    assert any("task 'add'" in f and "Hint 2 hands over solution code" in f and repr(short) in f
               for f in found), found
    rewrapped = "the value\n# is `o_ref[...]=x_ref[...]\n# + y_ref[...]`."
    found = problems(plant(lambda t: t.replace(ADD_KEY_HINT, rewrapped)), ["add"])
    assert any("Hint 2 hands over" in f and "'o_ref[...] = x_ref[...] + y_ref[...]'" in f
               for f in found), found


def test_planted_line_without_its_name_in_the_key_hint_is_named(plant):
    value = "op(x_ref[...], y_ref[...]).astype(o_ref.dtype)"  # elementwise's store, unassigned
    found = problems(plant(lambda t: t.replace(ADD_KEY_HINT, f"the value\n# is `{value}`.")),
                     ["add"])
    assert any("Hint 2 hands over" in f and repr(value) in f for f in found), found


def test_planted_lambda_in_the_key_hint_is_named(plant):
    tiling = SOURCE / "02_tiling" / "tiling.py"
    hint = "gives them back,\n# unchanged, as the block index."
    assert hint in tiling.read_text()
    found = problems(plant(lambda t: t.replace(hint, "is\n# `lambda i,j:(i, j)`."), tiling),
                     ["tiled_add"])
    assert any("task 'tiled_add'" in f and "Hint 2 hands over" in f and
               "'lambda i, j: (i, j)'" in f for f in found), found


def test_planted_fix_in_a_find_the_bug_key_hint_is_named(plant):
    """Assignment 09's roll_rows: a fix written out is caught although the reference solution
    spells it differently, and so is a hint that quotes nothing of the buggy cell."""
    debugging = SOURCE / "09_debugging" / "debugging.py"
    text = debugging.read_text()
    start = text.index("# The input's index map, `lambda i: ((i + shift)")
    end = text.index("\n#\n# </details>", start)
    fix = "`lambda i: ((i - shift) % n_blocks, 0)`"
    found = problems(plant(lambda t: t[:start] + f"# The input's index map: {fix}." + t[end:],
                           debugging), ["roll_rows"])
    assert any("task 'roll_rows'" in f and "does not hold" in f and fix[1:-1] in f
               for f in found), found
    assert any("task 'roll_rows'" in f and "quotes nothing of cell 'roll_rows_buggy'" in f
               for f in found), found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_notebook_says_how_to_check_every_task(path):
    """Every notebook names Run All and the check command as it works in its own folder, and
    its last cell prints what passed (issue 21: a new assignment without them left a learner
    with a notebook that stopped at the first failing task's message and no summary)."""
    cells = jupytext.read(path).cells
    intro = cells[0].source
    assert "Restart Kernel and Run All Cells" in intro, f"{path.name}: no Run All instruction"
    assert f"`pallas-course check {path.stem}.ipynb`" in intro, \
        f"{path.name}: the intro must name `pallas-course check {path.stem}.ipynb`"
    assert cells[-1].cell_type == "code" and cells[-1].source.strip() == "course.summary()", \
        f"{path.name}: the last cell must be course.summary()"
