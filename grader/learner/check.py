"""``pallas-course check NOTEBOOK``: the learner's command, in a checkout and in a student copy.

It runs a notebook's visible checks in a fresh kernel (never its hidden tests) and prints one
line per passing check and, for a failing one, its message (every failure of the check: wrong
values and each structural rule it broke); ``--verbose`` adds every rule checked and kernelsim's
summary of each task. ``NOTEBOOK`` is found where a learner types it: relative to the current
folder, then to the workspace (``$PALLAS_COURSE_WORKSPACE``, which ``pallas-course serve`` sets
for JupyterLab's terminals, else the workspace around the current folder or a checkout's
``workspace/``, else the nearest folder holding ``exercises/``), then by name among
``exercises/*/`` there, so ``pallas-course check first_kernel.ipynb`` works from the workspace
and from the exercise's own folder alike.

In a student copy (``pallas-course dist``) ``main`` is the ``pallas-course`` command itself;
in a checkout, ``grader.cli`` hands its ``check`` subcommand here. Nothing here imports the
instructor's side (nbgrader, the grading machinery) but the hidden-test region's pattern
(``grader.logistics.hidden_tests``), which it never runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from grader.devices import DEVICES, assignment_of_notebook, cpu_devices_env, devices_of
from grader.logistics.hidden_tests import HIDDEN_RE

WORKSPACE_ENV = "PALLAS_COURSE_WORKSPACE"
# the check's kernel logs errors only (ipykernel warns on every start that its local TCP
# sockets are unencrypted, which a learner can do nothing about)
KERNEL_LOG_LEVEL = "--IPKernelApp.log_level=ERROR"
# what marks a workspace (grader.learner.workspace)
WORKSPACE_LEDGER = ".pallas-course-workspace.json"


class NotebookNotFound(FileNotFoundError):
    pass


def workspace_root(cwd: Path) -> Path | None:
    """``$PALLAS_COURSE_WORKSPACE``; else the workspace at or above ``cwd`` (or a checkout's
    ``workspace/`` when ``cwd`` is the checkout); else the nearest folder at or above ``cwd``
    holding ``exercises/`` (a student copy); None when there is none."""
    env = os.environ.get(WORKSPACE_ENV)
    if env:
        return Path(env)
    for d in (cwd, *cwd.parents):
        if (d / WORKSPACE_LEDGER).is_file():
            return d
    if (cwd / "workspace" / WORKSPACE_LEDGER).is_file():
        return cwd / "workspace"
    return next((d for d in (cwd, *cwd.parents) if (d / "exercises").is_dir()), None)


def find_notebook(name: Path, cwd: Path) -> Path:
    """The notebook ``name`` names, seen from ``cwd`` (the rules in the module's docstring);
    ``.ipynb`` may be left off. Raises NotebookNotFound saying where it looked."""
    names = [name] if name.suffix else [name.with_suffix(".ipynb"), name.with_suffix(".py")]
    root = workspace_root(cwd)
    bases = [cwd, *([root] if root else [])]
    for n in names:
        for base in bases:
            if (base / n).is_file():
                return (base / n).resolve()
    if root is not None and len(name.parts) == 1:
        for n in names:
            found = sorted(p for p in (root / "exercises").glob(f"*/{n.name}") if p.is_file())
            if len(found) == 1:
                return found[0].resolve()
            if found:
                raise NotebookNotFound(
                    f"{name}: several notebooks of that name: "
                    + ", ".join(str(p.relative_to(root)) for p in found) + "; name one of them")
    where = ", ".join(str(b) for b in bases) + (f" or {root / 'exercises'}/*/" if root else "")
    example = "exercises/01_first_kernel/first_kernel.ipynb"
    raise NotebookNotFound(f"no notebook {name} in {where}: give its path, e.g. "
                           f"`pallas-course check {example}` from your workspace")


def devices_of_notebook(path: Path) -> int:
    """How many devices the checks of the notebook at ``path`` run on: its assignment's, by
    its folder (``exercises/13_across_chips/``) or else its name (``across_chips.ipynb``)."""
    if path.parent.name in DEVICES:
        return devices_of(path.parent.name)
    assignment = assignment_of_notebook(path.stem)
    return 1 if assignment is None else devices_of(assignment)


def _first_error(cell) -> str | None:
    """``ename: evalue`` of the first error a cell's run printed; None when it printed none."""
    errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return f"{errs[0].get('ename')}: {errs[0].get('evalue')}" if errs else None


def check_notebook(path: Path, timeout: int = 300, log=print, verbose: bool = False) -> int:
    """Run a notebook's visible checks in a fresh kernel; print per test cell pass or fail (a
    failure with its whole message) and, with ``verbose``, every rule checked and kernelsim's
    summary of each task; 0 when every check passed, 1 when one failed, 2 when it cannot be
    read."""
    # seconds to import: the command's help and its notebook search start without them
    import nbclient
    import nbformat

    path = Path(path).resolve()
    if path.suffix == ".py":
        import jupytext  # seconds to import: a lesson's .py only

        nb = jupytext.read(path)
    else:
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception as e:  # noqa: BLE001
            log(f"{path}: not a readable notebook ({e}); re-download it from the course")
            return 2
    for cell in nb.cells:
        if cell.cell_type == "code":
            # never run hidden tests here, even from an instructor copy
            cell.source = HIDDEN_RE.sub("", cell.source)
            # outputs saved by the learner's own run must not read as this run's verdict
            cell.outputs, cell.execution_count = [], None
    graded = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")
              and "course.check(" in c.source]
    # a check takes seconds to tens of seconds, the kernel's start a few: say what runs as it
    # starts, not only when all is done
    log(f"checking {path.name} in a fresh kernel: {len(graded)} check(s); starting the kernel")

    def starting(cell, cell_index, **_):
        if any(cell is g for g in graded):
            log(f"  running {cell.metadata['nbgrader']['grade_id']} ...")

    dead = False
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "report.jsonl"
        # the kernel inherits these: where checks report, and as many CPU devices as the
        # assignment's checks run on (XLA counts them once, when the kernel's JAX starts)
        changed = {**cpu_devices_env(os.environ, devices_of_notebook(path)),
                   "PALLAS_COURSE_REPORT": str(report)}
        before = {k: os.environ.get(k) for k in changed}
        os.environ.update(changed)
        try:
            client = nbclient.NotebookClient(nb, timeout=timeout, allow_errors=True,
                                             interrupt_on_timeout=True, kernel_name="python3",
                                             resources={"metadata": {"path": str(path.parent)}},
                                             extra_arguments=[KERNEL_LOG_LEVEL],
                                             on_cell_start=starting)
            try:
                client.execute()
            except nbclient.exceptions.DeadKernelError:
                # the cells after the one that killed the kernel never ran: they count as failed
                dead = True
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        records = [json.loads(x) for x in report.read_text().splitlines()] \
            if report.exists() else []
    log("")
    failures = 0
    # an error before the checks (an import in the setup cell, a typo in a solution) is the
    # cause of every check's failure after it: say where it happened first
    for number, cell in enumerate(nb.cells, 1):
        error = _first_error(cell)
        if cell.cell_type == "code" and error and not any(cell is g for g in graded):
            name = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            log(f"ERROR in cell {number}{f' ({name})' if name else ''}: {error}")
    for cell in graded:
        gid = cell.metadata["nbgrader"]["grade_id"]
        if error := _first_error(cell):
            failures += 1
            log(f"FAIL  {gid}: {error}")
        elif cell.get("execution_count") is None:
            failures += 1
            log(f"FAIL  {gid}: not run (the kernel died or the notebook stopped before it)")
        else:
            log(f"pass  {gid}")
    for line in speed_lines(records):
        log(line)
    # a passing check is its one line above and a failing one its message: the rules that held
    # and kernelsim's table only when asked for
    for r in records if verbose else []:
        if r.get("rules"):
            log(f"\n{r['task']}: structural check")
            for line in r["rules"]:
                log(f"  {line}")
        if r.get("kernelsim"):
            log(f"{r['task']}: kernelsim\n{r['kernelsim']}")
    if dead:
        log("\nthe kernel died while the notebook ran (os._exit, a crash or out of memory)")
    # the stubs as released: what is left to write, rather than broken
    to_write = list(dict.fromkeys(r["task"] for r in records if r.get("to_write")))
    still = f"; still to write: {', '.join(to_write)}" if to_write else ""
    log(f"\n{len(graded) - failures} passed, {failures} failed{still}")
    return 1 if failures else 0


def speed_lines(records: list[dict]) -> list[str]:
    """What the checks of performance tasks said about speed (``grader.learner.speed``): the
    chip's device time beside XLA's on a TPU, else kernelsim's estimate, named as one."""
    return [line for r in records for line in (r.get("speed") or {}).get("lines", [])]


def run(notebook: Path, verbose: bool = False) -> int:
    """``pallas-course check [--verbose] NOTEBOOK`` from the current folder: an exit code."""
    try:
        path = find_notebook(notebook, Path.cwd())
    except NotebookNotFound as e:
        print(f"pallas-course check: {e}", file=sys.stderr)
        return 2
    return check_notebook(path, verbose=verbose)


def add_command(subparsers) -> None:
    """``check NOTEBOOK`` among ``pallas-course``'s subcommands (a checkout's and a student
    copy's alike)."""
    k = subparsers.add_parser(
        "check", help="run a notebook's visible checks in a fresh kernel",
        description="Run a notebook's visible checks (never its hidden tests) in a fresh "
        "kernel and print one line per passing check and, for a failing one, every failure: "
        "wrong values and each structural rule it broke. Exit status: 0 when every check "
        "passed, 1 when one failed, 2 when the notebook cannot be found or read.")
    k.add_argument("notebook", type=Path, help="a path from here or from your workspace, or "
                   "just the notebook's name (first_kernel.ipynb)")
    k.add_argument("-v", "--verbose", action="store_true", help="also print every structural "
                   "rule checked and kernelsim's summary (blocks, traffic, time estimate) of "
                   "each task")


def main(argv: list[str] | None = None) -> int:
    """The student copy's ``pallas-course``: only ``check``."""
    parser = argparse.ArgumentParser(prog="pallas-course", description=__doc__.split("\n")[0])
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return run(args.notebook, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
