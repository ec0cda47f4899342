"""Autograde with the learner's code in a jail and the verdict outside it.

``TrustedExecute`` replaces nbgrader's ``Execute`` (see ``exercises/nbgrader_config.py``). The
grader (this process) drives the notebook cell by cell as nbgrader does, but the kernel runs in
``grader.sandbox``'s jail: its own namespaces, a uid of its own, a filesystem that holds no
references, no instructor notebooks, no gradebook and no other submission, and limits on CPU
seconds, memory, processes, file size, disk and output. That kernel's run is what the learner
sees (outputs, feedback); its ``course.check`` calls do nothing. The facts a grade is decided
from come from the grader's own run of the same cells (``FreshRun``, ``grader.replay``): a
fresh Python process in the same jail under another uid, started beside the kernel, where the
harness imports and fingerprints its code before any learner code runs, runs the cells, runs
each test cell's checks itself and answers over a channel the kernel never has.

When both runs have ended, each test cell's checks are decided here (``grader.verdict``),
against references the jail never sees: a failing verdict is added to the cell as an error and
``VerdictGrades`` scores the cell from the verdict alone, so nothing either run prints,
displays or writes changes a score. What the fresh run found (changed grading code, a refused
hook, bytes on its channel it did not write) marks the submission ``tampered``; checks after
it are not graded.

Each notebook's findings (tampering, a dead kernel or run, a limit) are appended to ``REPORTS``
for the worker, which turns them into the submission's status.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader import utils as nbgrader_utils
from nbgrader.preprocessors import Execute, NbGraderPreprocessor, SaveAutoGrades
from traitlets import Integer

from grader import exchange, messages, refs, replay, sandbox, verdict

REPORTS: list[dict] = []  # one per executed notebook, read and cleared by grader.worker


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


@dataclass
class JailRun:
    """The folders and identity of one jailed kernel (one notebook)."""

    slot: int
    limits: sandbox.Limits
    workdir: Path
    uid: int | None = None
    pid: int | None = None
    killed: str | None = None  # why the watcher killed the kernel
    stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def create(cls, slot: int, limits: sandbox.Limits) -> JailRun:
        return cls(slot, limits, jail_folder(slot))

    def watch(self) -> None:
        """Kill the kernel when its folder outgrows the disk limit (checked every 0.2 s)."""
        while not self.stop.wait(0.2):
            if sandbox.disk_usage(self.workdir) > self.limits.disk_bytes:
                self.killed = f"wrote more than {self.limits.disk_bytes:,} bytes to disk"
                self.kill()
                return

    def kill(self) -> None:
        if self.pid is not None:
            sandbox.kill_all(self.pid, self.uid)

    def cleanup(self) -> None:
        self.stop.set()
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def jail_folder(slot: int, suffix: str = "") -> Path:
    """A new folder name for one jailed run (created by ``sandbox``), under a base only this
    user can write to."""
    base = Path(tempfile.gettempdir()) / "pallas-course-jails"
    base.mkdir(mode=0o711, exist_ok=True)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{base} is not a directory owned by this user and writable by "
                           "it alone; remove it and grade again")
    return base / f"{slot}-{secrets.token_hex(6)}{suffix}"


def readable() -> list[Path]:
    """What a jailed run may read: the Python installation, the venv, and of the repository
    only the code the kernel imports."""
    return [*sandbox.default_readable(), refs.REPO / "grader", refs.REPO / "kernelsim"]


def grading_env(fresh: bool = False) -> dict[str, str]:
    """The environment of a grading kernel (``fresh``: of the grader's own run) on top of
    ``sandbox.child_env``: ``course.check`` does nothing in either (the fresh run checks by
    itself); the fresh run draws no figures and skips ``breakpoint()``."""
    env = {"PALLAS_COURSE_GRADING": "1", "NBGRADER_EXECUTION": "autograde"}
    return {**env, "MPLBACKEND": "Agg", "PYTHONBREAKPOINT": "0"} if fresh else env


# what a grading kernel and the fresh run import: without it every test cell would fail, and
# every grade be 0
PREFLIGHT = ("import ipykernel, jax, jax.experimental.pallas, numpy, kernelsim, grader.course, "
             "grader.replay, grader.tasks")


def preflight(limits: sandbox.Limits, slot: int = 0) -> str | None:
    """None when a jailed Python, set up as the grading runs are, imports the course; else why.

    Run once before a batch: a jail that cannot see the venv or the course would otherwise
    grade every submission 0 with status ``graded``.
    """
    workdir = jail_folder(slot, "-preflight")
    try:
        out = sandbox.run([sys.executable, "-c", PREFLIGHT], workdir, limits, slot=slot,
                          readable=readable(), env=grading_env(fresh=True))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if out.status == "ok":
        return None
    tail = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [out.reason]
    return (f"the grading jail ({out.isolation}) cannot import the course with {sys.executable}:"
            f" it {out.reason}: {tail[0][:500]}. Nothing was graded; check that the venv and "
            "the repository are readable by other users (grader/sandbox.py)")


class JailedKernelManager(AsyncKernelManager):
    """An ipykernel started behind ``sandbox.confine``, reached over Unix sockets (ipc)."""

    def __init__(self, run: JailRun, **kw):
        run.workdir.mkdir(mode=0o700)
        super().__init__(kernel_name="python3", transport="ipc",
                         ip=str(run.workdir / "kernel"), **kw)
        self.jail = run
        self.connection_file = str(run.workdir / "kernel.json")

    async def _async_pre_start_kernel(self, **kw):
        # SIGINT to the jail's outer process would kill it; ask ipykernel to interrupt itself
        self.kernel_spec.interrupt_mode = "message"
        return await super()._async_pre_start_kernel(**kw)

    def format_kernel_cmd(self, extra_arguments=None):
        # parent_handle=0: in its pid namespace the kernel's parent is pid 1, which ipykernel
        # would take for an orphaned kernel; bwrap --die-with-parent covers that case instead
        cmd = [*super().format_kernel_cmd(extra_arguments), "--IPKernelApp.parent_handle=0"]
        argv, self.jail.uid = sandbox.confine(cmd, self.jail.workdir, self.jail.limits,
                                              self.jail.slot, readable())
        return argv

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        kw["env"] = {**sandbox.child_env(self.jail.workdir), **grading_env()}
        kw["cwd"] = str(self.jail.workdir)
        if self.jail.uid is not None:
            os.chown(self.connection_file, self.jail.uid, self.jail.uid)
        await super()._async_launch_kernel(kernel_cmd, **kw)
        self.jail.pid = self.provisioner.process.pid


def _gid(cell, index: int) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"cell #{index}"


class RestoreTestCells(NbGraderPreprocessor):
    """Runs before nbgrader's OverwriteCells, which assumes well-formed nbgrader metadata.

    A cell claiming a released grade id gets the released nbgrader metadata and time limit
    (``metadata.timeout``) back (a test cell turned into ``grade: false`` or given 100 points
    makes OverwriteCells fail on checksums; a raised timeout would buy a slow kernel time); any
    other nbgrader metadata is removed: it is the learner's (OverwriteCells expects a grade id
    in every nbgrader dict, which DeduplicateIds leaves empty, and a learner cell marked
    ``locked`` would get a test cell's time limit). ``grading.test_cell_changes`` reports the
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


STARTUP_SECONDS = 120  # the fresh run's imports and JAX start, beyond its cells' time limits


@dataclass
class Replayed:
    """What the fresh run answered: per check ``(cell index, task, hidden)`` its message and
    outputs; per learner cell the error it raised there; and why checks without an answer
    were not graded (``stopped``), with ``timed_out`` when that was a time limit."""

    answers: dict[tuple[int, str, bool], tuple[dict, bytes]] = field(default_factory=dict)
    cell_errors: dict[int, str] = field(default_factory=dict)
    tampered: list[str] = field(default_factory=list)
    died: str | None = None
    stopped: str | None = None
    timed_out: bool = False


class FreshRun:
    """The grader's own run of a notebook's code cells (``grader.replay``), started at once in
    the jail under the slot's second uid; ``finish`` waits for it and reads its answers."""

    def __init__(self, cells, slot: int, limits: sandbox.Limits, timeout_of):
        last = max((i for i, c in enumerate(cells) if checks_in(c)), default=-1)
        self.cells = [{"index": i, "id": _gid(c, i), "source": c.source,
                       "timeout": timeout_of(c) or limits.cpu_seconds,
                       "checks": [list(x) for x in checks_in(c)]}
                      for i, c in enumerate(cells[:last + 1]) if c.cell_type == "code"]
        self.key = secrets.token_bytes(32)
        job, self.loaded = exchange.job_bytes(self.key, self.cells, refs.course_root() / "refs")
        wall = STARTUP_SECONDS + sum(c["timeout"] for c in self.cells)
        self.workdir = jail_folder(slot, "-fresh")
        self.child = sandbox.start(
            [sys.executable, "-m", "grader.replay"], self.workdir,
            dataclasses.replace(limits, wall_seconds=wall), env=grading_env(fresh=True),
            stdin=True, slot=slot, readable=readable(), role="replay",
            stdout_bytes=exchange.MAX_CHANNEL_BYTES)
        self.child.feed(job)

    def _expected(self) -> list[tuple]:
        """The frames the harness sends, in order, when nothing stops it."""
        out: list[tuple] = []
        for c in self.cells:
            out += [("check", c["index"], t, h) for t, h, _ in c["checks"]] if c["checks"] \
                else [("cell", c["index"])]
        return out

    def _read(self, frames: list[tuple[dict, bytes]], got: Replayed) -> tuple[int, bool, str]:
        """Fill ``got`` from the frames; returns how many of the expected frames came, whether
        the last one (``done``) did, and a frame that is out of order ('' if none)."""
        expected, position, done = self._expected(), 0, False
        for message, blob in frames:
            kind = message.get("kind")
            if done:
                return position, done, "a frame after the last one"
            if kind == "done":
                done = True
            elif kind == "tampered" and not got.tampered:
                got.tampered += [str(r) for r in message.get("reasons") or ["(no reason)"]]
            else:
                here = expected[position] if position < len(expected) else None
                key = (kind, message.get("cell"),
                       *((message.get("task"), message.get("hidden")) if kind == "check" else ()))
                if got.tampered or key != here:
                    return position, done, f"a {kind!r} frame out of order"
                position += 1
                if kind == "cell" and message.get("error"):
                    got.cell_errors[key[1]] = str(message["error"])
                elif kind == "check":
                    got.answers[key[1:]] = (message, blob)
        return position, done, ""

    def finish(self) -> Replayed:
        try:
            outcome = self.child.wait()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        frames, problem = exchange.read_channel(outcome.stdout, self.key)
        got = Replayed()
        position, done, disorder = self._read(frames, got)
        cut = problem == "the channel ends inside a frame"  # stopped while writing
        if disorder or (problem and not cut):
            got.tampered.append("the grader's run of this notebook sent bytes its harness did "
                                f"not write: {disorder or problem}")
        elif outcome.returncode == replay.CHANNEL_CLOSED:
            got.tampered.append("code in the notebook closed the grader's answer channel")
        if got.tampered:
            got.stopped = ("the grading code was changed before or while this test ran "
                           f"({'; '.join(got.tampered[:3])})")
        elif not done:
            expected = self._expected()
            running = next((c["id"] for c in self.cells if position < len(expected)
                            and c["index"] == expected[position][1]), "the end of the notebook")
            dropped = "stdout beyond" in outcome.reason
            why = (f"answered more than {exchange.MAX_CHANNEL_BYTES:,} bytes" if dropped
                   else outcome.reason)
            got.stopped = f"the grader's run of your notebook {why} while running {running}"
            got.timed_out = outcome.status == "timeout"
            if not (got.timed_out or dropped):  # its stderr is the learner's: not in a reason
                got.died = got.stopped
        return got


class TrustedExecute(Execute):
    """nbgrader's Execute with a jailed kernel, the grader's own fresh run of the notebook and
    verdicts decided in this process."""

    cpu_seconds = Integer(900, help="CPU seconds for one notebook's kernel").tag(config=True)
    memory_bytes = Integer(8 << 30, help="address space of the kernel (bytes)").tag(config=True)
    processes = Integer(512, help="processes and threads of the kernel's uid").tag(config=True)
    file_bytes = Integer(64 << 20, help="largest file the kernel may write (bytes)"
                         ).tag(config=True)
    disk_bytes = Integer(256 << 20, help="bytes the kernel may leave on disk").tag(config=True)
    output_bytes = Integer(1 << 20, help="output kept per cell (bytes)").tag(config=True)

    def limits(self) -> sandbox.Limits:
        return sandbox.Limits(cpu_seconds=self.cpu_seconds, memory_bytes=self.memory_bytes,
                              processes=self.processes, file_bytes=self.file_bytes,
                              disk_bytes=self.disk_bytes, output_bytes=self.output_bytes)

    def preprocess(self, nb, resources=None, km=None):
        slot = int(os.environ.get("PALLAS_COURSE_SLOT", "0"))
        self.jail = JailRun.create(slot, self.limits())
        notebook = (resources or {}).get("nbgrader", {}).get("notebook", "")
        self.report = {"notebook": notebook, "tampered": [], "died": None, "limit": None,
                       "isolation": sandbox.isolation()}
        self._output_sizes: dict[int, int] = {}
        watcher = threading.Thread(target=self.jail.watch, daemon=True)
        fresh = None
        try:
            # what nbconvert's ExecutePreprocessor.preprocess does, with our kernel manager
            NotebookClient.__init__(self, nb, JailedKernelManager(self.jail, config=self.config))
            self.reset_execution_trackers()
            self._check_assign_resources(resources)
            # grade id -> whether every check of that test cell passed; VerdictGrades scores it
            self.verdicts = self.resources.setdefault("pallas_course", {}).setdefault(
                "verdicts", {})
            # the grader's own run starts first and runs beside the kernel (another uid)
            fresh = FreshRun(self.nb.cells, slot, self.limits(), self._get_timeout)
            with self.setup_kernel():
                info = self.wait_for_reply(self.kc.kernel_info())
                self.nb.metadata["language_info"] = info["content"]["language_info"]
                watcher.start()
                dead = None
                for index, cell in enumerate(self.nb.cells):
                    if dead is not None:
                        self._not_run(cell, dead)
                        continue
                    try:
                        self.preprocess_cell(cell, resources, index)
                    except DeadKernelError:
                        dead = self._death(cell, index)
                        self._not_run(cell, dead)
                    except CellTimeoutError:
                        # no reply and no output within the cell's time: the kernel's message
                        # loop is broken (e.g. a patched builtin); nothing after it can run
                        dead = self.report["died"] = (
                            f"the kernel stopped answering while running {_gid(cell, index)}")
                        self._not_run(cell, dead)
            self.set_widgets_metadata()
        finally:
            self.jail.cleanup()
            if fresh is not None:
                self._judge_all(fresh.finish(), fresh.loaded)
            REPORTS.append(self.report)
        return self.nb, self.resources

    # ------------------------------------------------------------------ dead kernels
    def _death(self, cell, index: int) -> str:
        gid = _gid(cell, index)
        if self.jail.killed:
            why = self.jail.killed
            self.report["limit"] = why
        else:
            proc = self.km.provisioner.process if self.km and self.km.provisioner else None
            code = sandbox.normalize_exit(proc.poll() if proc else None, self.jail.uid is not None)
            status, why = sandbox.classify(code, b"", self.jail.limits) if code is not None \
                else ("crashed", "stopped answering")
            if status == "timeout":
                self.report["limit"] = why
        self.report["died"] = f"the kernel died while running {gid}: it {why}"
        return self.report["died"]

    @staticmethod
    def _not_run(cell, why: str) -> None:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade") and \
                cell.get("cell_type") == "code":
            cell.outputs = [*cell.get("outputs", []), _error("KernelDied", why)]

    # ------------------------------------------------------------------ outputs
    def output(self, outs, msg, display_id, cell_index):
        size = len(json.dumps(msg.get("content", {}), default=str))
        total = self._output_sizes.get(cell_index, 0) + size
        self._output_sizes[cell_index] = total
        if total > self.output_bytes:
            if total - size <= self.output_bytes:
                outs.append(NotebookNode(output_type="stream", name="stderr",
                                         text=f"[output beyond {self.output_bytes:,} bytes "
                                              "was dropped by the grader]\n"))
            return None
        return super().output(outs, msg, display_id, cell_index)

    # ------------------------------------------------------------------ test cells
    def _judge_all(self, got: Replayed, loaded) -> None:
        """Decide every test cell's checks from the fresh run's answers."""
        self.report["tampered"] = list(dict.fromkeys(got.tampered))
        if got.died:
            self.report["died"] = "; ".join(x for x in (self.report["died"], got.died) if x)
        for index, cell in enumerate(self.nb.cells):
            checks = checks_in(cell)
            if checks:
                self.verdicts[_gid(cell, index)] = self._judge(cell, index, checks, loaded, got)

    def _differences(self, got: Replayed, before: int) -> str:
        """The learner cells before cell ``before`` that raised in the fresh run but not in the
        kernel: what the learner does not see in their feedback otherwise."""
        notes = [f"{_gid(self.nb.cells[i], i)} raised {err}" for i, err in got.cell_errors.items()
                 if i < before and not any(o.get("output_type") == "error"
                                           for o in self.nb.cells[i].get("outputs", []))]
        return ("\n(in the grader's run of your notebook, " + "; ".join(notes[:3])
                + "; in your kernel it did not)") if notes else ""

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
                failures.append(("CheckFailed", f"{task_id}: {message['failed']}"
                                 + self._differences(got, index)))
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
            v = verdict.decide(task_id, results)
            if v.passed:
                notes.append(f"{task_id}: {len(entries)} {kind} case(s) passed (checked by "
                             f"the grader); structure: {'; '.join(v.checked)}\n")
            else:
                failures.append(("CheckFailed", messages.annotate(v.message)
                                 + self._differences(got, index)))
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
