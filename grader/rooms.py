"""grader/'s rooms, and which of its modules a module brings with it.

Two places hold only part of grader/: the student copy ships what the learner's commands and
the notebooks' checks import (``grader.learner.dist``), and the notebook's process of the
grader's run sees what its harness and the notebooks import (``grader.jail.trusted``'s
``notebook_view``). Both ask ``imported_modules``; this module imports nothing of the grader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

# grader/'s folders of modules: a module there is named with its room ("calling"), and
# the room's own __init__ goes with it, not the room's other modules
ROOMS = ("logistics", "jail", "facts", "verdict", "gradebook", "learner", "website")


def _grader_module(dotted: str) -> str:
    """``grader.calling.trace_case`` -> ``calling``; ``grader.tasks.core`` ->
    ``tasks``: the module or package of grader/ that an import of ``dotted`` loads."""
    parts = dotted.split(".")[1:]
    return ".".join(parts[:2]) if parts[0] in ROOMS and len(parts) > 1 else parts[0]


def module_files(grader_dir: Path, name: str) -> list[Path]:
    """The files of one of ``imported_modules``'s names: a module's file, a room's __init__.py,
    or every module of a package."""
    path = grader_dir / name.replace(".", "/")
    if name in ROOMS:
        return [path / "__init__.py"]
    # a package ships whole, so every one of its modules' imports ships with it
    return sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def data_files(grader_dir: Path, name: str) -> list[Path]:
    """The data a package of ``imported_modules``'s names reads beside its modules (its JSON
    files: the tasks' ``shipped_kernels.json``), which goes wherever the package goes."""
    path = grader_dir / name.replace(".", "/")
    return sorted(path.glob("*.json")) if name not in ROOMS and path.is_dir() else []


def imported_modules(grader_dir: Path, starts: Iterable[str]) -> list[str]:
    """The modules of grader/ (at ``grader_dir``) that ``starts`` (names as ``"learner.course"``)
    are and import at module level, transitively (imports inside functions, such as the jail's
    exchange, stay out), with the rooms they are in. A package (``tasks``) is named once and
    goes whole."""
    seen: list[str] = []
    todo = list(starts)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        if name.partition(".")[0] in ROOMS:
            todo.append(name.partition(".")[0])  # importing grader.room.m imports grader.room
        for node in (n for path in module_files(grader_dir, name)
                     for n in ast.parse(path.read_text()).body):
            if isinstance(node, ast.ImportFrom) and node.module == "grader":
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module in {f"grader.{r}" for r in ROOMS}:
                todo += [f"{node.module.split('.')[1]}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grader."):
                todo.append(_grader_module(node.module))
            elif isinstance(node, ast.Import):
                todo += [_grader_module(a.name) for a in node.names
                         if a.name.startswith("grader.")]
    return sorted(seen)
