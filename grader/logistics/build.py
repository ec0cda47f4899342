"""Build the instructor notebooks from their jupytext twins and check their nbgrader metadata.

The source of truth is ``exercises/source/<assignment>/<notebook>.py`` (jupytext percent format).
A cell header carries nbgrader metadata in short form, e.g.::

    # %% nbgrader={"grade_id": "add_solution", "solution": true}
    # %% nbgrader={"grade_id": "add_visible", "grade": true, "points": 1} timeout=60

``build`` fills in the rest (``schema_version``, ``locked``, ``task``, ...), checks that ids are
unique, that graded cells have points and that solution/hidden-test markers are balanced, and
writes ``<notebook>.ipynb`` beside the ``.py`` (git-ignored). Errors name the file and cell.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_TIMEOUT = 60  # seconds per cell unless the cell says ``timeout=N``
MARKERS = [("### BEGIN SOLUTION", "### END SOLUTION"),
           ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")]


class BuildError(ValueError):
    pass


def _cell_name(path: Path, i: int, cell) -> str:
    first = cell.source.strip().splitlines()[0] if cell.source.strip() else "(empty)"
    return f"{path}: cell {i + 1} ({first[:60]!r})"


def normalise(nb, path: Path) -> list[str]:
    """Fill in nbgrader metadata in place; return the grade ids. Raises BuildError."""
    ids: list[str] = []
    for i, cell in enumerate(nb.cells):
        where = _cell_name(path, i, cell)
        for begin, end in MARKERS:
            if cell.source.count(begin) != cell.source.count(end):
                raise BuildError(f"{where}: unbalanced {begin!r}/{end!r} markers")
        meta = cell.metadata.get("nbgrader")
        has_solution = "### BEGIN SOLUTION" in cell.source
        has_hidden = "### BEGIN HIDDEN TESTS" in cell.source
        if meta is None:
            if has_solution or has_hidden:
                raise BuildError(f"{where}: has solution/hidden-test markers but no "
                                 "nbgrader={...} metadata in its '# %%' header")
            continue
        if not isinstance(meta, dict) or "grade_id" not in meta:
            raise BuildError(f"{where}: nbgrader metadata needs a grade_id, got {meta!r}")
        grade = bool(meta.get("grade", False))
        solution = bool(meta.get("solution", False))
        if grade and "points" not in meta:
            raise BuildError(f"{where}: graded cell {meta['grade_id']!r} needs points")
        if has_solution and not solution:
            raise BuildError(f"{where}: solution markers in a cell without solution: true")
        if has_hidden and not grade:
            raise BuildError(f"{where}: hidden tests in a cell without grade: true")
        full = {
            "grade": grade, "grade_id": meta["grade_id"],
            "locked": bool(meta.get("locked", not solution)),
            "schema_version": 3, "solution": solution, "task": bool(meta.get("task", False)),
        }
        if grade:
            full["points"] = meta["points"]
        cell.metadata["nbgrader"] = full
        cell.metadata.setdefault("timeout", DEFAULT_TIMEOUT)
        if full["grade_id"] in ids:
            raise BuildError(f"{where}: duplicate grade_id {full['grade_id']!r}")
        ids.append(full["grade_id"])
    return ids


def build_notebook(py: Path) -> Path:
    # imported here: they take seconds, and assignments() (make start's
    # up-to-date check) needs neither
    import jupytext
    import nbformat

    try:
        nb = jupytext.read(py)
    except Exception as e:  # noqa: BLE001
        raise BuildError(f"{py}: cannot be read as a jupytext notebook: {e}") from e
    normalise(nb, py)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    nb.metadata.pop("jupytext", None)
    out = py.with_suffix(".ipynb")
    nbformat.validate(nb)
    tmp = out.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    return out


def assignments(root: Path) -> list[str]:
    src = root / "source"
    return sorted(p.name for p in src.iterdir() if p.is_dir() and any(p.glob("*.py")))


def build_assignment(root: Path, assignment: str) -> list[Path]:
    d = root / "source" / assignment
    if not d.is_dir():
        raise BuildError(f"no assignment {assignment!r} under {root / 'source'}; "
                         f"known: {', '.join(assignments(root))}")
    return [build_notebook(py) for py in sorted(d.glob("*.py"))]
