"""`pallas-course check NOTEBOOK` finds the notebook where a learner types the command: from the
exercise's folder, from the workspace (by path or by name alone), from any folder below it,
and names what to do when the name is unknown or means two notebooks; what it prints: one line
per passing check, every failure of a failing one, no kernel start-up log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.learner import check


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.delenv(check.WORKSPACE_ENV, raising=False)
    for rel in ("exercises/01_first_kernel/first_kernel.ipynb",
                "exercises/02_tiling/tiling.ipynb", "exercises/03_x/common.ipynb",
                "exercises/04_y/common.ipynb", "lessons/01-why.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    return tmp_path


def test_found_from_the_folder_the_workspace_and_below(ws, monkeypatch):
    nb = ws / "exercises" / "01_first_kernel" / "first_kernel.ipynb"
    assert check.find_notebook(Path("first_kernel.ipynb"), nb.parent) == nb
    assert check.find_notebook(Path("first_kernel.ipynb"), ws) == nb
    assert check.find_notebook(Path("first_kernel"), ws / "lessons") == nb
    assert check.find_notebook(
        Path("exercises/01_first_kernel/first_kernel.ipynb"), ws / "lessons") == nb
    assert check.find_notebook(Path("lessons/01-why.py"), nb.parent) == \
        ws / "lessons" / "01-why.py"
    # a checkout's root: its workspace/, not the course's exercises/ beside it
    checkout = ws.parent / "checkout"
    (checkout / "exercises" / "source").mkdir(parents=True)
    ws.rename(checkout / "workspace")
    (checkout / "workspace" / check.WORKSPACE_LEDGER).write_text("{}")
    assert check.find_notebook(Path("first_kernel.ipynb"), checkout) == \
        checkout / "workspace" / nb.relative_to(ws)
    (checkout / "workspace").rename(ws)
    # JupyterLab's terminals are told the workspace (serve sets it)
    monkeypatch.setenv(check.WORKSPACE_ENV, str(ws))
    assert check.find_notebook(Path("tiling.ipynb"), ws.parent) == \
        ws / "exercises" / "02_tiling" / "tiling.ipynb"


def test_unknown_or_ambiguous_names_say_what_to_do(ws):
    with pytest.raises(check.NotebookNotFound, match="several notebooks of that name: "
                       "exercises/03_x/common.ipynb, exercises/04_y/common.ipynb"):
        check.find_notebook(Path("common.ipynb"), ws)
    with pytest.raises(check.NotebookNotFound, match=r"no notebook nope.ipynb in .*give its "
                       r"path, e\.g\. `pallas-course check exercises/01_first_kernel/"):
        check.find_notebook(Path("nope.ipynb"), ws)
    assert check.run(Path("nope.ipynb")) == 2


def test_an_error_before_the_checks_is_named_first(tmp_path, capfd):
    """A setup cell that cannot import makes every check fail with a NameError; the learner is
    first told which cell raised what, and nothing else: not the kernel's own start-up log."""
    import nbformat

    def code(source, grade_id, grade=False):
        return nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
            "grade": grade, "solution": False, "locked": True, "grade_id": grade_id,
            "schema_version": 3, **({"points": 1} if grade else {})}})

    nb = nbformat.v4.new_notebook(cells=[
        code("import no_such_module_for_the_course\ncourse = None", "setup"),
        code('course.check("add", None)', "add_visible", grade=True)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "task.ipynb")
    lines: list[str] = []
    assert check.check_notebook(tmp_path / "task.ipynb", log=lines.append) == 1
    report = lines[lines.index("") + 1:]  # after the progress lines of the run
    assert report[0] == ("ERROR in cell 1 (setup): ModuleNotFoundError: No module named "
                         "'no_such_module_for_the_course'")
    assert report[1].startswith("FAIL  add_visible: NameError")
    printed = capfd.readouterr()
    assert "IPKernelApp" not in printed.out + printed.err, printed.err


@pytest.mark.parametrize("main", [check.main, "checkout"])
def test_check_help_says_what_the_command_does(main, capsys):
    """`pallas-course check --help`, in a student copy and in a checkout."""
    if main == "checkout":
        from grader import cli

        main = cli.main
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal
    assert "visible checks (never its hidden tests) in a fresh kernel" in out, out
    assert "Exit status: 0" in out and "just the notebook's name" in out, out
    assert "--verbose" in out and "every structural rule checked" in out, out


def _graded(source: str, grade_id: str):
    import nbformat

    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "grade_id": grade_id,
        "schema_version": 3, "points": 1}})


def test_a_pass_is_one_line_and_a_failure_lists_every_rule_it_broke(tmp_path, capfd,
                                                                   monkeypatch):
    """A right ``add`` is one line; a ``tiled_add`` with wrong values, a wrong grid and blocks
    Mosaic rejects fails with all three in one run; ``--verbose`` adds the rules that held and
    kernelsim's table (issue 37: eleven ``[ok]`` lines per passing task, and the grid and
    block rules shown only once the values were right)."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(
            "import jax\nfrom jax.experimental import pallas as pl\n"
            "from grader.learner import course\n"
            "def add_kernel(x_ref, y_ref, o_ref):\n    o_ref[...] = x_ref[...] + y_ref[...]\n"
            "def sub_kernel(x_ref, y_ref, o_ref):\n    o_ref[...] = x_ref[...] - y_ref[...]\n"
            "def add(x, y):\n    return pl.pallas_call(add_kernel, out_shape=jax."
            "ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x, y)\n"
            "def tiled_add(x, y, block):\n    spec = pl.BlockSpec((16, 100), lambda i, j: (i, j))\n"
            "    return pl.pallas_call(sub_kernel, grid=(2, 3), in_specs=[spec, spec], "
            "out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), "
            "interpret=True)(x, y)"),
        _graded('course.check("add", add)', "add_visible"),
        _graded('course.check("tiled_add", tiled_add)', "tiled_add_visible")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "task.ipynb")
    # the kernel imports this checkout's grader
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("PALLAS_COURSE_GRADING", raising=False)
    lines: list[str] = []
    assert check.check_notebook(tmp_path / "task.ipynb", log=lines.append) == 1
    out = "\n".join(lines)
    assert "pass  add_visible" in lines and "[ok" not in out, out
    # what it does is said as it starts and before each check runs, not only once all is done
    assert lines[0].startswith("checking task.ipynb in a fresh kernel: 2 check(s)"), out
    assert lines.index("  running add_visible ...") < lines.index("pass  add_visible"), out
    assert "FAIL  tiled_add_visible: CheckFailed: tiled_add: wrong values for case v0" in out
    assert "[FAIL] grid: required (4, 2); found (2, 3)" in out, out
    assert "[FAIL] block shapes Mosaic accepts (TPU's (8, 128) tiling rule)" in out, out
    assert lines[-1].strip() == "1 passed, 1 failed", out
    printed = capfd.readouterr()
    assert "IPKernelApp" not in printed.out + printed.err, printed.err
    lines.clear()
    assert check.check_notebook(tmp_path / "task.ipynb", log=lines.append, verbose=True) == 1
    out = "\n".join(lines)
    assert "[ok  ] pallas_call reached" in out and "add: kernelsim" in out, out
