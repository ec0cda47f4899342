"""Autograde with the learner's code in a jail and the verdict outside it.

``TrustedExecute`` replaces nbgrader's ``Execute`` (see ``exercises/nbgrader_config.py``). The
grader (this process) drives the notebook cell by cell as nbgrader does, but the kernel runs in
``grader.sandbox``'s jail: its own namespaces, a uid of its own, a filesystem that holds no
references, no instructor notebooks, no gradebook and no other submission, and limits on CPU
seconds, memory, processes, file size, disk and output. Test cells (restored from the gradebook
by nbgrader before this runs) are graded here:

1. an integrity probe runs in the kernel (``grader.integrity``); a difference from the
   fingerprints it took when the kernel started (a replaced function, a learner-defined IPython
   event hook) marks the submission ``tampered`` and fails the cell;
2. the cell's cases (inputs only) are written where the jail can read them;
3. the cell runs; ``course.check`` in the kernel runs the learner's function once per case
   (``grader.work.run_case``) and writes the outputs, the trace and the work facts of that run;
4. the inputs are deleted and the probe runs again (a change made during the cell voids its
   answer); the answer is read once and deleted, without trusting it (no links, no pickle,
   size limits), and ``grader.verdict`` decides; a failing verdict is added to the cell as an
   error, and ``VerdictGrades`` scores the cell from the verdict alone, so nothing the kernel
   prints, displays or writes to stderr changes a score.

Each notebook's findings (tampering, a dead kernel, a limit) are appended to ``REPORTS`` for
the worker, which turns them into the submission's status.
"""

from __future__ import annotations

import ast
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

from grader import exchange, integrity, messages, refs, sandbox, verdict

REPORTS: list[dict] = []  # one per executed notebook, read and cleared by grader.worker


def checks_in(cell) -> list[tuple[str, bool]]:
    """The ``course.check("task", fn[, hidden=True])`` calls of a test cell, in order."""
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
            out.append((node.args[0].value, bool(hidden)))
    return out


@dataclass
class JailRun:
    """The folders and identity of one jailed kernel (one notebook)."""

    slot: int
    limits: sandbox.Limits
    workdir: Path
    requests: Path
    uid: int | None = None
    pid: int | None = None
    killed: str | None = None  # why the watcher killed the kernel
    stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def create(cls, slot: int, limits: sandbox.Limits) -> JailRun:
        base = Path(tempfile.gettempdir()) / "pallas-course-jails"
        base.mkdir(mode=0o711, exist_ok=True)
        st = os.lstat(base)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise RuntimeError(f"{base} is not a directory owned by this user and writable by "
                               "it alone; remove it and grade again")
        name = f"{slot}-{secrets.token_hex(6)}"
        requests = base / f"{name}.requests"
        requests.mkdir(mode=0o755)  # the grader's; the jail sees it read-only
        return cls(slot, limits, base / name, requests)

    def readable(self) -> list[Path]:
        # the code the kernel imports, and nothing else of the repository
        return [*sandbox.default_readable(), refs.REPO / "grader", refs.REPO / "kernelsim",
                self.requests]

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
        shutil.rmtree(self.requests, ignore_errors=True)


# what a grading kernel imports: without it every test cell would fail, and every grade be 0
PREFLIGHT = ("import ipykernel, jax, jax.experimental.pallas, numpy, kernelsim, grader.course, "
             "grader.exchange, grader.tasks")


def preflight(limits: sandbox.Limits, slot: int = 0) -> str | None:
    """None when a jailed Python, set up as a grading kernel is, imports the course; else why.

    Run once before a batch: a jail that cannot see the venv or the course would otherwise
    grade every submission 0 with status ``graded``.
    """
    run = JailRun.create(slot, limits)
    try:
        out = sandbox.run([sys.executable, "-c", PREFLIGHT], run.workdir, limits, slot=slot,
                          readable=run.readable(),
                          env={"PALLAS_COURSE_EXCHANGE": str(run.requests)})
    finally:
        run.cleanup()
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
                                              self.jail.slot, self.jail.readable())
        return argv

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        kw["env"] = {**sandbox.child_env(self.jail.workdir),
                     "PALLAS_COURSE_EXCHANGE": str(self.jail.requests),
                     "NBGRADER_EXECUTION": "autograde"}
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


class TrustedExecute(Execute):
    """nbgrader's Execute with a jailed kernel and verdicts decided in this process."""

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
        self._tampering: list[str] = []
        watcher = threading.Thread(target=self.jail.watch, daemon=True)
        try:
            # what nbconvert's ExecutePreprocessor.preprocess does, with our kernel manager
            NotebookClient.__init__(self, nb, JailedKernelManager(self.jail, config=self.config))
            self.reset_execution_trackers()
            self._check_assign_resources(resources)
            # grade id -> whether every check of that test cell passed; VerdictGrades scores it
            self.verdicts = self.resources.setdefault("pallas_course", {}).setdefault(
                "verdicts", {})
            with self.setup_kernel():
                info = self.wait_for_reply(self.kc.kernel_info())
                self.nb.metadata["language_info"] = info["content"]["language_info"]
                watcher.start()
                self._baseline = self._fingerprints()
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
            self.report["tampered"] = list(dict.fromkeys(self._tampering))
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
    def preprocess_cell(self, cell, resources, index):
        checks = checks_in(cell)
        if not checks:
            return super().preprocess_cell(cell, resources, index)
        self._probe()
        nonce = secrets.token_hex(8)
        loaded = exchange.write_request(self.jail.requests, nonce, checks,
                                        refs.course_root() / "refs")
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        finally:
            exchange.clear_request(self.jail.requests)
        self._probe()  # again: a change made during the cell voids the answer it produced
        self.verdicts[_gid(cell, index)] = self._judge(cell, nonce, checks, loaded)
        return cell, resources

    def _fingerprints(self) -> dict | None:
        """``integrity.fingerprints`` as the kernel computes them; None if it could not."""
        name = f"probe-{secrets.token_hex(6)}.json"
        msg_id = self.kc.execute(integrity.probe_source(str(self.jail.workdir / name)),
                                 silent=True, store_history=False, allow_stdin=False)
        try:
            self.wait_for_reply(msg_id)
            return json.loads(exchange.read_no_follow(self.jail.workdir, name, 4 << 20,
                                                      consume=True))
        except DeadKernelError:
            raise
        except Exception:  # noqa: BLE001
            return None

    def _probe(self) -> None:
        """Fingerprint the grading code in the kernel again; record what learner cells changed."""
        found = self._fingerprints()
        if found is None or self._baseline is None:
            self._tampering.append("the integrity check could not run in the kernel")
            return
        self._tampering += integrity.differences(self._baseline, found)

    def _judge(self, cell, nonce: str, checks, loaded) -> bool:
        """Decide every check of a test cell; add the grader's messages; True when all pass."""
        errored = any(o.get("output_type") == "error" for o in cell.outputs)
        failures, notes = [], []
        for task_id, hidden in checks:
            kind = "hidden" if hidden else "visible"
            entries, cases = loaded[(task_id, hidden)]
            if self._tampering:
                failures.append(f"{task_id}: not graded: the grading code was changed before "
                                f"or while this test ran ({'; '.join(self._tampering[:3])})")
                continue
            try:
                answer = exchange.read_answer(self.jail.workdir, nonce, task_id, hidden)
                results = [verdict.case_result(
                    e, inputs, expected, params, answer["outputs"].get(e["case"]),
                    answer["errors"].get(e["case"]) or (None if e["case"] in answer["outputs"]
                                                        else "no result for this case"),
                    answer["traces"].get(e["case"]), answer["trace_errors"].get(e["case"]),
                    answer["work"].get(e["case"])) for e, inputs, expected, params in cases]
            except exchange.AnswerTooLarge as e:
                failures.append(f"{task_id}: the {kind} check's answer is too large to be "
                                f"right ({e})")
                continue
            except (exchange.AnswerError, ValueError) as e:
                if not errored:  # no error explains the silence: the check was bypassed
                    self._tampering.append(f"the {kind} check of {task_id} sent no valid "
                                           f"answer ({e})")
                failures.append(f"{task_id}: the {kind} check did not report to the grader "
                                f"({e})")
                continue
            v = verdict.decide(task_id, results)
            if v.passed:
                notes.append(f"{task_id}: {len(entries)} {kind} case(s) passed (checked by "
                             f"the grader); structure: {'; '.join(v.checked)}\n")
            else:
                failures.append(messages.annotate(v.message))  # + hints
        if notes:
            cell.outputs.append(NotebookNode(output_type="stream", name="stdout",
                                             text="".join(notes)))
        for message in failures:
            cell.outputs.append(_error("CheckFailed", message))
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
