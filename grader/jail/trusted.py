"""Autograde with the learner's code in a jail and the verdict outside it.

``TrustedExecute`` replaces nbgrader's ``Execute`` (see ``exercises/nbgrader_config.py``). It
starts no kernel: a submission's notebook is executed once, by the grader's own run of it
(``FreshRun``), two fresh Python processes in ``grader.jail.sandbox``'s jail (their own
namespaces, a filesystem that holds no references, no instructor notebooks, no gradebook and no
other submission, and limits on CPU and wall seconds, memory, processes, file size, disk and output
per cell). The notebook's process (``grader.jail.replay``, a uid of the worker's slot) runs the
code cells in order under their time limits and traces each check's function on the cases'
shapes; the checker (``grader.jail.checker``, the slot's second uid) holds the cases' inputs and
makes the facts a grade is decided from out of those programs. This process relays between
them (``grader.jail.relay``): per cell what it showed (nbformat outputs, capped per cell), per
check the programs one way and the facts the other.

When the run has ended, the notebook's code cells get those outputs and execution counts (as
nbclient would have set them from a kernel), and each test cell's checks are decided here
(``grader.verdict.verdict``), against references the jail never sees: a failing verdict is added to
the cell as an error and ``VerdictGrades`` scores the cell from the verdict alone, so nothing the
run prints, displays or writes changes a score. What the run found (changed grading code, a
refused hook, bytes on its channel it did not write) marks the submission ``tampered``; checks
after it are not graded. A kernel's run gave two things this one does not: widget state (no
comm exists without a kernel: a widget shows its text form) and per-cell timing metadata
(which ``ClearMetadataPreprocessor`` removed anyway).

Each notebook's findings (tampering, a dead run, a limit) are appended to ``REPORTS`` for the
worker, which turns them into the submission's status.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import platform
import secrets
import shutil
import sys
from pathlib import Path

from nbformat.notebooknode import NotebookNode
from nbgrader import utils as nbgrader_utils
from nbgrader.preprocessors import Execute, NbGraderPreprocessor, SaveAutoGrades
from traitlets import Float, Integer

from grader import rooms, tasks
from grader.devices import cpu_devices_env
from grader.jail import answer_cache, exchange, replay, sandbox
from grader.jail.relay import STARTUP_SECONDS, Relay, Replayed
from grader.verdict import messages, refs, verdict

REPORTS: list[dict] = []  # one per executed notebook, read and cleared by grader.logistics.worker
# what ipykernel reports for this Python (the notebook's metadata.language_info)
LANGUAGE_INFO = {"name": "python", "version": platform.python_version(),
                 "mimetype": "text/x-python",
                 "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]},
                 "pygments_lexer": "ipython3", "nbconvert_exporter": "python",
                 "file_extension": ".py"}


def checks_in(cell) -> list[tuple[str, bool, str]]:
    """The ``course.check("task", fn[, hidden=True])`` calls of a test cell, in order, as
    ``(task, hidden, the source of fn)``."""
    nbg = cell.get("metadata", {}).get("nbgrader", {})
    if cell.get("cell_type") != "code" or not nbg.get("grade"):
        return []
    try:
        tree = ast.parse(cell.source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "check" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "course" and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            hidden = next((k.value.value for k in node.keywords if k.arg == "hidden"
                           and isinstance(k.value, ast.Constant)), False)
            fn = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "fn"), None)
            out.append((node.args[0].value, bool(hidden),
                        ast.unparse(fn) if fn is not None else "None"))
    return out


def jail_folder(slot: int, suffix: str = "") -> Path:
    """A new folder name for one jailed run (created by ``sandbox``), under a base only this
    user can write to."""
    # 0711: a slot's uid reaches its own run's folder, and lists none
    base = sandbox.private_folder("pallas-course-jails", mode=0o711)
    return base / f"{slot}-{secrets.token_hex(6)}{suffix}"


def readable() -> list[Path]:
    """What a jailed run may read: the Python installation, the venv, and of the repository
    only the code the run imports."""
    return [*sandbox.default_readable(), refs.REPO / "grader", refs.REPO / "kernelsim"]


def notebook_readable() -> list[Path]:
    """What the notebook's process may read: ``readable`` less grader/, which it sees as
    ``notebook_view``."""
    return [p for p in readable() if p != refs.REPO / "grader"]


# what a notebook may import of grader/ (exercises/README.md, Threat model): the notebook's
# process loads them before its snapshot (the job's ``imports``)
NOTEBOOK_IMPORTS = ("learner.course", "calling")
# what the notebook's process (grader.jail.replay) can import of grader/: the harness, what the
# notebooks import, and what those import at module level
NOTEBOOK_MODULES = tuple(rooms.imported_modules(refs.REPO / "grader",
                                                ("jail.replay", *NOTEBOOK_IMPORTS)))
NOT_IN_THE_RUN = ("{name} is the grader's own code, which the grader's run of a notebook does "
                  "not contain: a notebook may import "
                  + ", ".join(f"grader.{name}" for name in NOTEBOOK_IMPORTS)
                  + " and kernelsim (exercises/README.md, Threat model)")


def notebook_view(folder: Path) -> Path:
    """Make ``folder``: what the notebook's process sees as ``grader/`` in the jail
    (``sandbox.start``'s ``views``). ``NOTEBOOK_MODULES`` are copies; every other module or
    package of grader/ is a file that raises ``ImportError`` naming why, so a learner's cell
    that imports the tasks (their references, block searches, byte counts), the verdict or
    the checker gets no code of theirs, whatever it does in its own process. Each room of
    grader/ is a folder of copies and refusals in turn: a refusal names the module asked for."""
    _view_of(refs.REPO / "grader", folder, prefix="")
    return folder


def _view_of(source: Path, folder: Path, prefix: str) -> None:
    """``notebook_view`` of ``source``: grader/ (``prefix`` "") or one of its rooms (the
    ``NOTEBOOK_MODULES`` name of its modules starts with ``prefix``, "jail.")."""
    folder.mkdir(mode=0o755)
    for path in source.iterdir():
        name = prefix + path.name.removesuffix(".py")
        if path.name.startswith((".", "__pycache__")) or not (
                path.suffix == ".py" or (path / "__init__.py").exists()):
            continue
        if path.name == "__init__.py" or name in NOTEBOOK_MODULES and path.is_file():
            shutil.copyfile(path, folder / path.name)
        elif name in rooms.ROOMS:
            _view_of(path, folder / path.name, prefix=f"{name}.")
        else:
            message = NOT_IN_THE_RUN.format(name=f"grader.{name}")
            (folder / f"{path.name.removesuffix('.py')}.py").write_text(
                f"raise ImportError({message!r})\n")
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o644)


# the environment of the grader's run on top of ``sandbox.child_env``: ``course.check`` in a
# learner cell does nothing (the harness checks by itself), figures are drawn off screen (the
# harness shows them as PNG), ``breakpoint()`` is skipped
GRADING_ENV = {"PALLAS_COURSE_GRADING": "1", "NBGRADER_EXECUTION": "autograde",
               "MPLBACKEND": "Agg", "PYTHONBREAKPOINT": "0"}


def grading_env() -> dict[str, str]:
    """``GRADING_ENV`` with this grader's own code first on the path: the jailed run imports
    the ``grader`` and ``kernelsim`` it can see (``readable``), wherever the venv's editable
    install points."""
    return {**GRADING_ENV, "PYTHONPATH": str(refs.REPO)}


# XLA's CPU compiler without LLVM's costly optimisations, for the checker: the programs it runs
# are a check's small cases, which XLA took longer to compile than to run (a quarter of the
# checker's CPU seconds on assignment 2's cases, bench/grading.py's cost); the IEEE results are
# the same (fast math is off either way)
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def checker_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` (``run_env``'s) with ``FAST_COMPILE_FLAGS`` for the checker's XLA."""
    return {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()}


def run_env(checked: list[str]) -> dict[str, str]:
    """The environment of both processes of a run whose checks are of the tasks ``checked``:
    ``grading_env`` with as many CPU devices as those checks run on (a mesh of CPU devices,
    which XLA counts once, before the notebook's harness or the checker imports JAX)."""
    return cpu_devices_env(grading_env(), max((tasks.get(t).devices for t in checked),
                                              default=1))


# what the grader's run imports: without it every test cell would fail, and every grade be 0
PREFLIGHT = ("import jax, jax.experimental.pallas, numpy, kernelsim, grader.learner.course, "
             "grader.jail.replay, grader.jail.checker, grader.tasks")
# what the notebook's process imports, in its view of grader/ (``notebook_view``)
PREFLIGHT_NOTEBOOK = ("import jax, jax.experimental.pallas, numpy, kernelsim, "
                      "grader.jail.replay, "
                      + ", ".join(f"grader.{name}" for name in NOTEBOOK_IMPORTS))


def preflight(limits: sandbox.Limits, slot: int | None = None) -> str | None:
    """None when a jailed Python, set up as the grading runs are, imports the course; else why.

    Run once before a batch: a jail that cannot see the venv or the course would otherwise
    grade every submission 0 with status ``graded``. ``slot``: the caller's sandbox slot; None
    claims a free one for this check (slot 0 unclaimed may be another grader's).
    """
    if slot is None:
        with sandbox.claimed_slot() as slot:
            return preflight(limits, slot)
    view = notebook_view(jail_folder(slot, "-grader"))
    try:
        # the checker's view, then the notebook's process's
        for command, folders, views in ((PREFLIGHT, readable(), None),
                                         (PREFLIGHT_NOTEBOOK, notebook_readable(),
                                          {refs.REPO / "grader": view})):
            workdir = jail_folder(slot, "-preflight")
            try:
                out = sandbox.run([sys.executable, "-c", command], workdir, limits, slot=slot,
                                  readable=folders, views=views, env=grading_env())
            finally:
                sandbox.remove_workdir(workdir)
            if out.status != "ok":
                break
    finally:
        shutil.rmtree(view, ignore_errors=True)
    if out.status == "ok":
        return None
    tail = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [out.reason]
    return (f"the grading jail ({out.isolation}) cannot import the course with {sys.executable}:"
            f" it {out.reason}: {tail[0][:500]}. Nothing was graded; check that the venv and "
            "the repository are readable by other users (grader/jail/sandbox.py)")


def _gid(cell, index: int) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"cell #{index}"


class RestoreTestCells(NbGraderPreprocessor):
    """Runs before nbgrader's OverwriteCells, which assumes well-formed nbgrader metadata.

    A cell claiming a released grade id gets the released nbgrader metadata and time limit
    (``metadata.timeout``) back (a test cell turned into ``grade: false`` or given 100 points
    makes OverwriteCells fail on checksums; a raised timeout would buy a slow kernel time); any
    other nbgrader metadata is removed: it is the learner's (OverwriteCells expects a grade id
    in every nbgrader dict, which DeduplicateIds leaves empty, and a learner cell marked
    ``locked`` would get a test cell's time limit). ``submission.test_cell_changes`` reports the
    learner's changes.
    """

    def preprocess(self, nb, resources):
        info = resources.get("nbgrader", {})
        path = (refs.course_root() / "release" / str(info.get("assignment"))
                / f"{info.get('notebook')}.ipynb")
        released = {}
        if path.is_file():
            for cell in json.loads(path.read_text()).get("cells", []):
                meta = cell.get("metadata", {})
                if meta.get("nbgrader", {}).get("grade_id"):
                    released[meta["nbgrader"]["grade_id"]] = meta
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader")
            if meta is None:
                continue
            if isinstance(meta, dict) and meta.get("grade_id") in released:
                original = released[meta["grade_id"]]
                cell.metadata["nbgrader"] = NotebookNode(original["nbgrader"])
                cell.metadata.pop("timeout", None)
                if "timeout" in original:
                    cell.metadata["timeout"] = original["timeout"]
            elif released:  # the learner's own cell: its claims (locked, a timeout) count not
                del cell.metadata["nbgrader"]
        return nb, resources


def _error(ename: str, message: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=message, traceback=[message])


def _code_cells(cells) -> list[tuple[int, NotebookNode]]:
    """The cells a kernel would execute, with their indices: code with a non-empty source
    (nbclient skips the others)."""
    return [(i, c) for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip()]


class FreshRun:
    """The grader's run of a notebook: its code cells in the notebook's process
    (``grader.jail.replay``, a uid of the slot) and its checks in the checker
    (``grader.jail.checker``, the slot's checker uid), both started at once in the jail;
    ``finish`` passes the notebook's programs to the checker, and the hidden cases' shapes to the
    notebook after its last cell, stops a check at its test cell's time limit (the checker is then
    started again for the next one) and collects the answers."""

    def __init__(self, cells, slot: int, limits: sandbox.Limits, timeout_of,
                 hidden_before: int | None = None):
        self.cells = [{"index": i, "id": _gid(c, i), "source": c.source,
                       "timeout": timeout_of(c) or limits.cpu_seconds,
                       "checks": [list(x) for x in checks_in(c)]}
                      for i, c in _code_cells(cells)]
        if hidden_before is not None:  # the cells before a stop again, for the hidden checks
            self.cells = [{**c, "checks": [x for x in c["checks"] if x[1]]}
                          for c in self.cells if c["index"] < hidden_before
                          and (not c["checks"] or any(x[1] for x in c["checks"]))]
        self.again = (cells, timeout_of) if hidden_before is None else None
        self.slot, self.limits = slot, limits
        self.key = secrets.token_bytes(32)  # the checker's channel
        self.notebook_key = secrets.token_bytes(32)  # the notebook's: it holds this one
        described, arrays, self.loaded = exchange.load_checks(self.cells,
                                                              refs.course_root() / "refs")
        self.answers = answer_cache.AnswerCache(refs.course_root() / answer_cache.FOLDER)
        self.code_digest = answer_cache.code_digest()
        self.case_digests = {tag: answer_cache.cases_digest(cases, arrays)
                             for tag, cases in described.items()}
        host = {task: tasks.get(task).host_inputs for task, _ in self.loaded}
        visible, visible_host = exchange.signatures(described, arrays, host, hidden=False)
        hidden, hidden_host = exchange.signatures(described, arrays, host, hidden=True)
        # how each task calls the learner's function: the notebook's process has no tasks
        self.calls = {task: dataclasses.astuple(tasks.get(task).calling)
                      for task, _ in self.loaded}
        self.sent = {False: (visible, visible_host), True: (hidden, hidden_host)}
        self.checker_job = self.key.hex().encode() + b"\n" + exchange.frame(
            self.key, {"cases": described}, exchange.npz_bytes(arrays))
        self.hidden_frame = exchange.frame(self.notebook_key, {"hidden": hidden},
                                           exchange.npz_bytes(hidden_host))
        self.env = run_env([task for task, _ in self.loaded])
        self.wall = STARTUP_SECONDS + sum(c["timeout"] for c in self.cells)
        self.workdir = jail_folder(slot, "-fresh")
        self.view = notebook_view(jail_folder(slot, "-grader"))
        self.child = sandbox.start(
            [sys.executable, "-m", "grader.jail.replay"], self.workdir,
            dataclasses.replace(limits, wall_seconds=self.wall), env=self.env,
            stdin=True, slot=slot, stdout_bytes=exchange.MAX_CHANNEL_BYTES,
            readable=notebook_readable(),
            views={refs.REPO / "grader": self.view})
        self.child.send(self.notebook_key.hex().encode() + b"\n" + exchange.frame(
            self.notebook_key, {"cells": self.cells, "output_bytes": limits.output_bytes,
                                "visible": visible, "calls": self.calls,
                                "imports": [f"grader.{name}" for name in NOTEBOOK_IMPORTS]},
            exchange.npz_bytes(visible_host)))
        self.checkers: list[Path] = []
        self.checker: sandbox.Confined | None = None  # started by the relay when needed

    def start_checker(self) -> sandbox.Confined:
        workdir = jail_folder(self.slot, "-checker")
        self.checkers.append(workdir)
        checker = sandbox.start(
            [sys.executable, "-m", "grader.jail.checker"], workdir,
            dataclasses.replace(self.limits, wall_seconds=self.wall), env=checker_env(self.env),
            stdin=True, slot=self.slot, readable=readable(),
            stdout_bytes=exchange.MAX_CHANNEL_BYTES, checker=True)
        checker.send(self.checker_job)
        return checker

    def answer_key(self, request: dict, blob: bytes) -> bytes:
        """The key of the checker's answer to ``request`` in ``answers``."""
        tag = exchange.check_key(str(request.get("task")), bool(request.get("hidden")))
        cases = self.case_digests.get(tag) or answer_cache.cases_digest([], {})
        return answer_cache.key(self.code_digest, cases, request, blob, self.limits)

    def check_job(self, cell: int, task: str, hidden: bool) -> dict:
        """The job of one check as this process sent it (``exchange.check_job``)."""
        expr = next(x[2] for c in self.cells if c["index"] == cell for x in c["checks"]
                    if x[0] == task and x[1] == hidden)
        signatures, host = self.sent[hidden]
        return exchange.check_job(expr, self.calls[task],
                                  signatures.get(exchange.check_key(task, hidden), []), host)

    def expected_frames(self) -> list[tuple]:
        """The frames the notebook's process sends, in order, when nothing stops it."""
        out: list[tuple] = []
        for c in self.cells:
            out += [("programs", c["index"], t, False) for t, h, _ in c["checks"] if not h] \
                if c["checks"] else [("cell", c["index"])]
        out.append(("cells_done",))
        for c in self.cells:
            out += [("programs", c["index"], t, True) for t, h, _ in c["checks"] if h]
        return out

    def finish(self) -> Replayed:
        got, run = Replayed(), Relay(self)
        try:
            run.loop(got)
        finally:
            outcome = run.outcome or self.child.wait(run.stop_notebook)
            run.end_checker()
            sandbox.remove_workdir(self.workdir)  # also what the notebook locked in it
            shutil.rmtree(self.view, ignore_errors=True)
            for workdir in self.checkers:
                sandbox.remove_workdir(workdir)
        if run.leftover and outcome.status != "timeout" and not run.stop_notebook:
            # the notebook's process ended by itself in the middle of a frame: it did not
            # write that (it writes whole frames, and only a limit stops it mid-way)
            run.problem = run.problem or "the channel ends inside a frame"
        if run.problem:
            got.tampered.append("the grader's run of this notebook sent bytes its harness did "
                                f"not write: {run.problem}")
        elif outcome.returncode == replay.CHANNEL_CLOSED:
            got.tampered.append("code in the notebook closed the grader's answer channel")
        if run.died:
            got.died = got.stopped = run.died
        elif got.tampered:
            got.stopped = ("the grading code was changed before or while this test ran "
                           f"({'; '.join(got.tampered[:3])})")
        elif not run.done:
            expected = run.expected
            position = run.position
            got.stopped_at = next((e[1] for e in expected[position:] if len(e) > 1), None)
            running = next((c["id"] for c in self.cells if c["index"] == got.stopped_at),
                           "the end of the notebook")
            dropped = "stdout beyond" in outcome.reason
            why = (f"answered more than {exchange.MAX_CHANNEL_BYTES:,} bytes" if dropped
                   else outcome.reason)  # its stderr is the learner's: never in a reason
            got.timed_out = outcome.status == "timeout"
            verb = "was stopped" if got.timed_out else "died"
            got.stopped = got.died = (f"the grader's run of your notebook {verb} while running "
                                      f"{running}: it {why}")
            if outcome.status in ("timeout", "memory", "disk"):
                got.limit = outcome.reason
            self._hidden_before_the_stop(got)
        return got

    def _hidden_before_the_stop(self, got: Replayed) -> None:
        """The run stopped before its last cell, so before its hidden checks (traced after the
        last cell): they are judged from a second run of the cells before the stop, whose
        outputs are not kept. Their points count, as every check's before a stop does."""
        stop = got.stopped_at if got.stopped_at is not None else \
            max((c["index"] for c in self.cells), default=-1) + 1
        owed = [(c["index"], t) for c in self.cells if c["index"] < stop
                for t, h, _ in c["checks"] if h and (c["index"], t, True) not in got.answers]
        if self.again is None or not owed:
            return
        cells, timeout_of = self.again
        again = FreshRun(cells, self.slot, self.limits, timeout_of, hidden_before=stop).finish()
        for key, answer in again.answers.items():
            got.answers.setdefault(key, answer)
        got.rewritten += again.rewritten


class TrustedExecute(Execute):
    """nbgrader's Execute without a kernel: the grader's own run of the notebook in the jail
    executes it, its outputs fill the notebook and verdicts are decided in this process."""

    cpu_seconds = Integer(900, help="CPU seconds for one notebook's run").tag(config=True)
    memory_bytes = Integer(8 << 30, help="address space of the run (bytes)").tag(config=True)
    cpu_cores = Float(1.0, help="cores the run's processes may use at once (its cgroup's "
                      "CPU quota; without one, nothing holds it)").tag(config=True)
    processes = Integer(512, help="processes and threads of the run (its pids cgroup's "
                        "pids.max; without one, RLIMIT_NPROC of its uid)").tag(config=True)
    file_bytes = Integer(64 << 20, help="largest file the run may write (bytes)"
                         ).tag(config=True)
    disk_bytes = Integer(256 << 20, help="bytes the run may leave on disk").tag(config=True)
    output_bytes = Integer(1 << 20, help="output kept per cell (bytes)").tag(config=True)

    def limits(self) -> sandbox.Limits:
        return sandbox.Limits(cpu_seconds=self.cpu_seconds, cpu_cores=self.cpu_cores,
                              memory_bytes=self.memory_bytes,
                              processes=self.processes, file_bytes=self.file_bytes,
                              disk_bytes=self.disk_bytes, output_bytes=self.output_bytes)

    def preprocess(self, nb, resources=None, km=None):
        self.nb, self.resources = nb, resources if resources is not None else {}
        notebook = self.resources.get("nbgrader", {}).get("notebook", "")
        self.report = {"notebook": notebook, "tampered": [], "died": None, "limit": None,
                       "timed_out": False, "isolation": sandbox.isolation(),
                       "process_limit": sandbox.process_limit(), "left_running": {}}
        # grade id -> whether every check of that test cell passed; VerdictGrades scores it
        self.verdicts = self.resources.setdefault("pallas_course", {}).setdefault("verdicts", {})
        try:
            with sandbox.slot_for_this_run() as slot:
                fresh = FreshRun(nb.cells, slot, self.limits(), self._get_timeout)
                got = fresh.finish()
                self.report.update(tampered=list(dict.fromkeys(got.tampered + got.rewritten)),
                                   died=got.died, limit=got.limit, timed_out=got.timed_out,
                                   checks_from_cache=got.from_cache,
                                   left_running={_gid(nb.cells[i], i): n
                                                 for i, n in got.left_running.items()})
                self._fill(got)
                self._judge_all(got, fresh.loaded)
        finally:
            REPORTS.append(self.report)
        for cell in nb.cells:  # what the learner wrote, as a notebook file can hold it (a
            # lone surrogate in a string is legal Python and JSON, but not UTF-8)
            cell.source = exchange.writable(cell.source)
        nb.metadata["language_info"] = dict(LANGUAGE_INFO)
        return nb, self.resources

    # ------------------------------------------------------------------ outputs
    def _fill(self, got: Replayed) -> None:
        """Give every code cell the run reached its outputs and execution count, as nbclient
        does from a kernel's messages; a cell that ran past its time limit gets the error
        nbgrader adds for one, the cell the run stopped in says why."""
        displays: dict[str, list] = {}
        for cell in self.nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        for count, (index, cell) in enumerate(_code_cells(self.nb.cells), start=1):
            if index not in got.outputs:
                if index == got.stopped_at and not checks_in(cell):
                    cell.outputs.append(_error("GradingStopped", got.stopped))
                continue
            cell.execution_count = count
            cell.outputs = exchange.notebook_outputs(got.outputs[index], self.output_bytes,
                                                     displays)
            for out in cell.outputs:
                if out.output_type == "execute_result":
                    out.execution_count = count
            if index in got.timeouts:
                cell.outputs.append(_error(
                    "CellTimeoutError", f"{_gid(cell, index)} ran past its time limit of "
                    f"{self._get_timeout(cell)} s and was interrupted"))
            if got.left_running.get(index):
                cell.outputs.append(_error(
                    "ProcessesLeftRunning", f"{_gid(cell, index)} left "
                    f"{got.left_running[index]} process(es) running, which the grader ended "
                    "after it: a cell's processes end with the cell"))

    # ------------------------------------------------------------------ test cells
    def _judge_all(self, got: Replayed, loaded) -> None:
        """Decide every test cell's checks from the run's answers."""
        for index, cell in enumerate(self.nb.cells):
            checks = checks_in(cell)
            if checks:
                self.verdicts[_gid(cell, index)] = self._judge(cell, index, checks, loaded, got)

    def _judge(self, cell, index: int, checks, loaded, got: Replayed) -> bool:
        """Decide every check of a test cell; add the grader's messages; True when all pass."""
        failures, notes = [], []
        for task_id, hidden, _ in checks:
            kind = "hidden" if hidden else "visible"
            entries, cases = loaded[(task_id, hidden)]
            message, blob = got.answers.get((index, task_id, hidden), (None, b""))
            if message is None:
                failures.append(("CellTimeoutError" if got.timed_out else "CheckFailed",
                                 f"{task_id}: not graded: {got.stopped or 'no answer'}"))
                continue
            if message.get("timeout"):
                failures.append(("CellTimeoutError", f"{task_id}: the {kind} check ran past the "
                                 f"test cell's time limit of {self._get_timeout(cell)} s"))
                continue
            if message.get("failed"):
                failures.append(("CheckFailed", f"{task_id}: {message['failed']}"))
                continue
            try:
                answer = exchange.answer_of(message, blob)
                results = [verdict.case_result(
                    e, inputs, expected, params, answer["outputs"].get(e["case"]),
                    answer["errors"].get(e["case"]) or (None if e["case"] in answer["outputs"]
                                                        else "no result for this case"),
                    answer["traces"].get(e["case"]), answer["trace_errors"].get(e["case"]),
                    answer["work"].get(e["case"])) for e, inputs, expected, params in cases]
            except (exchange.AnswerError, ValueError) as e:
                # the harness wrote this frame (its tag is right): a harness that sends what
                # it cannot have made was changed
                self.report["tampered"].append(f"the {kind} check of {task_id} sent an answer "
                                               f"the harness does not write ({e})")
                failures.append(("CheckFailed", f"{task_id}: the {kind} check's answer could "
                                 f"not be read ({e})"))
                continue
            v = verdict.decide(task_id, results, hidden=hidden)
            if v.passed:
                notes.append(f"{task_id}: {len(entries)} {kind} case(s) passed (checked by "
                             f"the grader); structure: {'; '.join(v.checked)}\n")
            else:
                failures.append(("CheckFailed", messages.annotate(v.message)))
        if notes:
            cell.outputs.append(NotebookNode(output_type="stream", name="stdout",
                                             text="".join(notes)))
        for ename, message in failures:
            cell.outputs.append(_error(ename, message))
        return not failures


class VerdictGrades(SaveAutoGrades):
    """nbgrader's SaveAutoGrades with test cells scored from the grader's verdicts alone.

    nbgrader scores a test cell from its outputs (an error or any stderr: 0; the first
    ``execute_result`` that reads as a number: that many points), which learner code writes.
    Here a test cell gets the gradebook's points for it when ``TrustedExecute`` judged every
    check in it passed, and 0 otherwise (failed, never judged, or the kernel died first).
    Solution cells that carry points are left to nbgrader (manual grading).
    """

    def _add_score(self, cell, resources):
        if nbgrader_utils.is_solution(cell) or cell.cell_type != "code":
            return super()._add_score(cell, resources)
        gid = cell.metadata["nbgrader"]["grade_id"]
        grade = self.gradebook.find_grade(gid, self.notebook_id, self.assignment_id,
                                          self.student_id)
        passed = resources.get("pallas_course", {}).get("verdicts", {}).get(gid, False)
        grade.auto_score = grade.max_score if passed else 0.0
        grade.needs_manual_grade = grade.manual_score is not None
        self.gradebook.db.commit()
