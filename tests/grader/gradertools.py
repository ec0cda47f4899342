"""The instructor notebooks of ``exercises/source/``, read and run the way the grader tests need.

An assignment's notebook is ``exercises/source/<assignment>/<name>.py`` (jupytext); its code
cells carry nbgrader's ``grade_id``: ``setup``, ``<task>_solution``, ``<task>_visible``,
``<task>_hidden`` and, in "find the bug" assignments, ``<task>_buggy``.
"""

from __future__ import annotations

from pathlib import Path

import jupytext

SOURCE = Path(__file__).resolve().parents[2] / "exercises" / "source"


def notebook(assignment: str) -> Path:
    """The instructor notebook of ``assignment`` (e.g. "08_manual_dma")."""
    return SOURCE / assignment / f"{assignment[3:]}.py"


def cells(assignment: str) -> dict[str, str]:
    """grade_id -> source of every code cell with nbgrader metadata, in notebook order."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source
            for c in jupytext.read(notebook(assignment)).cells
            if c.cell_type == "code" and "nbgrader" in c.metadata}


def _execute(assignment: str, kinds: tuple[str, ...], settings: dict, namespace: dict):
    """Run the setup cell, then every cell whose grade_id ends with one of ``kinds``, in
    notebook order into ``namespace``; yields (grade_id, names the cell bound)."""
    path = notebook(assignment)
    for grade_id, source in cells(assignment).items():
        if grade_id == "setup" or grade_id.endswith(kinds):
            before = set(namespace)
            exec(compile(source, f"{path.name}:{grade_id}", "exec"), namespace)  # noqa: S102
            if grade_id == "setup":
                namespace.update(settings)
            yield grade_id, set(namespace) - before


def run(assignment: str, kinds: tuple[str, ...] = ("_solution",), **settings) -> dict:
    """The setup cell, then every cell whose grade_id ends with one of ``kinds``, executed in
    notebook order into one namespace; ``settings`` replace names the setup cell defines (e.g.
    ``**COMPILED`` to compile every kernel)."""
    namespace: dict = {}
    for _ in _execute(assignment, kinds, settings, namespace):
        pass
    return namespace


def solutions(assignment: str, **settings) -> dict[str, object]:
    """task id -> the function its solution cell defines for the task: the one named as the
    task, or else the one function the cell binds (``make_elementwise`` for ``elementwise``);
    the cells run as ``run`` runs them."""
    found, namespace = {}, {}
    for grade_id, new in _execute(assignment, ("_solution",), settings, namespace):
        task = grade_id.removesuffix("_solution")
        if grade_id == "setup":
            continue
        functions = [n for n in new if callable(namespace[n])]
        name = task if task in functions else None
        if name is None:
            assert len(functions) == 1, f"{grade_id} defines {sorted(new)}: which is {task}?"
            (name,) = functions
        found[task] = namespace[name]
    return found


COMPILED = {"INTERPRET": False, "TPU_INTERPRET": False}  # ``run(..., **COMPILED)``


def planted(assignment: str, namespace: dict, cell: str, *edits: tuple[str, str]):
    """The function of solution ``cell`` with a mistake planted: each ``(old, new)`` edit made to
    the notebook's own source (``old`` must be there), run in a copy of ``namespace``."""
    source = cells(assignment)[cell]
    for old, new in edits:
        assert old in source, (cell, old)
        source = source.replace(old, new)
    scope = dict(namespace)
    exec(compile(source, f"planted {cell}", "exec"), scope)  # noqa: S102
    return scope[cell.removesuffix("_solution")]


def as_the_checker_reads(program, what: str = "the program"):
    """``program`` as grading hands it to the checker: pickled, read back through the checker's
    allow-list (``grader.jail.wire``), and asserted to run no Python there."""
    from grader.jail import wire
    from grader.jail.checker import known_primitives, python_at_run_time

    wired = wire.loads(wire.dumps(program))
    assert (why := python_at_run_time(wired, known_primitives())) is None, f"{what}: {why}"
    return wired


def fails(task: str, fn, expected: str, hidden: bool = False) -> str:
    """``course.check`` of ``fn`` fails with a message holding ``expected``; the message."""
    import pytest

    from grader.learner import course

    with pytest.raises(course.CheckFailed) as failed:
        course.check(task, fn, hidden=hidden, quiet=True)
    message = str(failed.value)
    assert expected in message, message
    return message


def precision_for(dtype):
    """The precision a planted kernel's dot passes, as the course's kernels do: HIGHEST for
    float32 operands (exact on a TPU), none for bfloat16 (Mosaic refuses HIGHEST there)."""
    import jax
    import jax.numpy as jnp

    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
