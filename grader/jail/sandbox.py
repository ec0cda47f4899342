"""Run untrusted code (a student's submission) in a separate process under hard limits.

Limits: CPU seconds (each process's, and all the run's processes' together), the cores it may
use at once, wall seconds, address space, processes, size of any one file, total bytes written
under the work folder, and bytes of captured output.

Isolation ("jail", when running as root with bubblewrap installed): the child gets its own
mount, pid, network, ipc and uts namespaces and sees only a read-only whitelist of folders (the
system, the Python installation, the virtual environment, the packages it needs, and folders
shown at another path: the notebook's view of ``grader/``) plus its work folder; reference
outputs, hidden inputs, instructor notebooks, the gradebook, other submissions and the
repository's history are simply not there. It then drops to an unprivileged uid of its own (one
per concurrent slot, via ``setpriv``), so it cannot signal the grader, the process limit binds,
and whatever it leaves behind is found by uid and killed. Without root (a grading account,
deploy/setup-class.sh) the same jail is built in a user namespace of the run's own, as
``nobody`` there, without the uid switch: the pid namespace ends every process of the run with
it. Without bubblewrap, or where user namespaces are off, the run falls back to limits only
("rlimits"), and says so.

The process limit: each run gets a pids cgroup of its own (grader/jail/pids_cgroup.py), which
counts every process of the run exactly; root's jails keep RLIMIT_NPROC on the slot's uid as
well. Where no cgroup can be made, RLIMIT_NPROC alone binds (root's jail) or nothing does (a
grading account's), and each outcome says which (``process_limit``).

CPU: RLIMIT_CPU counts one process's seconds, and a fork bomb's many processes each stayed under
it (issue 52: both cores busy for 337 s). The run's cgroup holds it to ``Limits.cpu_cores`` cores
at once and counts its CPU seconds, all its processes together; past ``Limits.cpu_seconds`` the
run is stopped (``timeout``, and the reason says so). Each outcome says whether a cgroup held its
CPU (``cpu_limit``).

The outcome is data, never an exception: a batch goes on whatever one submission does.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grader.jail import pids_cgroup

Status = Literal["ok", "failed", "timeout", "memory", "disk", "crashed"]
Isolation = Literal["jail", "rlimits"]
ProcessLimit = Literal["cgroup", "rlimit", "none"]

SANDBOX_UID_BASE = 61000  # uid SANDBOX_UID_BASE + slot runs slot's submission when root
SLOTS = 256  # uid SANDBOX_UID_BASE + SLOTS + slot runs slot's checker (grader.jail.checker)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run (bytes, seconds, counts)."""

    cpu_seconds: int = 300  # each process's, and the run's processes' together (its cgroup)
    cpu_cores: float = 1.0  # cores the run's processes may use at once (its cgroup)
    wall_seconds: float = 600.0
    memory_bytes: int = 4 << 30
    processes: int = 64
    file_bytes: int = 64 << 20
    disk_bytes: int = 256 << 20
    output_bytes: int = 1 << 20


@dataclass(frozen=True)
class Outcome:
    """What a sandboxed run did.

    status: ``ok`` (exit 0), ``failed`` (non-zero exit), ``timeout`` (wall or CPU limit),
        ``memory`` (address-space limit), ``disk`` (file-size or disk limit) or ``crashed``
        (killed by a signal).
    reason: one sentence for the feedback: what happened and which limit.
    process_limit: what held the run's processes to ``Limits.processes``: ``cgroup`` (its own
        pids cgroup, every process of the run), ``rlimit`` (RLIMIT_NPROC alone, on the slot's
        uid) or ``none`` (a grading account without a cgroup folder of its own).
    cpu_limit: whether the run's cgroup held its cores and its CPU seconds, all its processes
        together (else RLIMIT_CPU held each process's alone).
    """

    status: Status
    returncode: int | None
    stdout: bytes
    stderr: bytes
    wall_seconds: float
    reason: str
    isolation: Isolation
    process_limit: ProcessLimit
    cpu_limit: bool


def is_root() -> bool:
    return os.geteuid() == 0


NOBODY = 65534  # who a jailed run is inside its user namespace, without root


def isolation() -> Isolation:
    """``jail`` when this process can build namespaces (as root, switching to a slot's uid; or
    without root, in a user namespace of its own), else ``rlimits``."""
    if shutil.which("bwrap") and shutil.which("setpriv") and (is_root() or user_namespaces()):
        return "jail"
    return "rlimits"


@functools.cache
def user_namespaces() -> bool:
    """Can this (unprivileged) process run bubblewrap in a user namespace of its own?"""
    try:
        return subprocess.run(["bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
                              capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# root's slot locks and jails: a folder only root can create in, which slot uids may traverse
ROOT_STATE = Path("/var/cache/pallas-course")


def private_base() -> Path:
    """Where this account keeps its slot locks and jails: ``ROOT_STATE`` for root, else
    ``$XDG_CACHE_HOME/pallas-course`` (``~/.cache/pallas-course``). Never a shared temp folder:
    there anyone can make the name first, and a learner who did blocked every command of the
    instructor whose uid it named (issue 35, item 7)."""
    if is_root():
        return ROOT_STATE
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "pallas-course"
    if Path.home().is_dir():
        return Path.home() / ".cache" / "pallas-course"
    # an account without a home (a system account): the temp folder, where private_folder
    # refuses a name someone else made first
    return Path(tempfile.gettempdir()) / f"pallas-course-{os.geteuid()}"


def private_folder(name: str, mode: int = 0o700) -> Path:
    """``private_base()/NAME``: a folder of this account's own, made with ``mode`` when missing.

    Per account, because root's grading and an instructor's own account on one machine must not
    share it (a folder root made is closed to the other). Refused when it is not a directory
    this account owns and alone can write: whoever made it could otherwise swap what is in it."""
    base = private_base()
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    folder = base / name
    folder.mkdir(mode=mode, exist_ok=True)
    for path in (base, folder):
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise RuntimeError(f"{path} is not a directory owned by this user and writable by "
                               "it alone; remove it and grade again (or set XDG_CACHE_HOME to "
                               "a folder of your own)")
    return folder


def claim_slot() -> tuple[int, int]:
    """A sandbox slot (a uid of its own) that no other grader of this account on this machine
    holds, and the fd whose lock holds it until closed or until this process ends, however it
    ends: concurrent batches and Dask workers on one machine never kill each other's runs.
    (Only root switches to a slot's uids, so only root's slots must be machine-wide.)"""
    locks = private_folder("pallas-course-slots")
    for slot in range(SLOTS):
        fd = os.open(locks / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    raise RuntimeError(f"all {SLOTS} grading slots of this machine are taken")


@contextlib.contextmanager
def claimed_slot() -> Iterator[int]:
    """A slot of ``claim_slot``'s, held for the ``with`` block: its lock is released on leaving
    the block, however it is left."""
    slot, lock = claim_slot()
    try:
        yield slot
    finally:
        os.close(lock)


@contextlib.contextmanager
def slot_if_free(slot: int) -> Iterator[bool]:
    """Hold ``slot``'s lock for the block when no grader holds it (True: none of its runs can
    start meanwhile), else hold nothing (False)."""
    locks = private_folder("pallas-course-slots")
    fd = os.open(locks / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


# the environment variable in which a grading worker names the slot it claimed for its runs
SLOT_ENV = "PALLAS_COURSE_SLOT"


@contextlib.contextmanager
def slot_for_this_run() -> Iterator[int]:
    """The slot a grading run uses: the one its worker claimed and named in ``SLOT_ENV``, or,
    where nbgrader runs by hand (its own ``autograde`` command, formgrader's button), one
    claimed for this block: an unclaimed slot 0 may hold another grader's run, and the two
    would kill each other's processes (a slot's runs are killed by its uid)."""
    named = os.environ.get(SLOT_ENV)
    if named is not None:
        yield int(named)
        return
    with claimed_slot() as slot:
        yield slot


def sandbox_uid(slot: int, checker: bool = False) -> int | None:
    """The uid a jailed run in ``slot`` uses (``checker``: the slot's checker, a uid of its
    own, so that the notebook's process can neither signal it nor read its memory); None
    without a jail, or in a user namespace (the run keeps this account's uid outside it; its
    pid namespace ends with it)."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"sandbox slot {slot} is outside 0..{SLOTS - 1}")
    if isolation() != "jail" or not is_root():
        return None
    return SANDBOX_UID_BASE + SLOTS * checker + slot


def _held_by(cgroup: bool, uid: int | None) -> ProcessLimit:
    """What holds a run with (or without) a cgroup of its own, as ``uid``, to its limit."""
    return "cgroup" if cgroup else "rlimit" if uid is not None else "none"


def process_limit() -> ProcessLimit:
    """What holds this grader's runs to their process limit (``Outcome.process_limit``)."""
    return _held_by(pids_cgroup.parent() is not None, sandbox_uid(0))


def cgroup_name(slot: int, checker: bool = False) -> str:
    """The name of a run's cgroup in ``slot`` (its checker's with ``checker``), before its
    random token: the slot's next run of that kind removes what an earlier one left."""
    return f"slot{slot}-{'checker' if checker else 'run'}"


def default_readable() -> list[Path]:
    """What a Python child needs to see: the interpreter's installation and the venv."""
    return [Path(sys.base_prefix).resolve(), Path(sys.prefix)]


def _jail_argv(argv: Sequence[str], workdir: Path, readable: Sequence[Path], uid: int | None,
               limits: Limits, views: Mapping[Path, Path]) -> list[str]:
    """bwrap + setpriv in front of ``argv``: namespaces, a whitelisted filesystem (``views``:
    a host folder shown read-only at another path), a new uid (``uid``; None: not root, so
    ``nobody`` in a user namespace of its own, capabilities dropped by bwrap)."""
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
           "--unshare-ipc", "--unshare-uts", "--dev", "/dev", "--proc", "/proc",
           "--size", str(limits.disk_bytes), "--tmpfs", "/tmp"]
    if uid is None:
        cmd += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    for system in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"):
        if os.path.exists(system):
            cmd += ["--ro-bind", system, system]
    made: set[Path] = set()
    for path in [*readable, *views, workdir]:
        # Parents that bwrap would create copy the host's modes (/root is 0700): make them
        # traversable so the unprivileged uid reaches what is bound below them.
        for parent in reversed(path.parents[:-1]):
            if parent not in made and str(parent) not in ("/tmp",):
                cmd += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
    for path in readable:
        cmd += ["--ro-bind", str(path), str(path)]
    for path, source in views.items():
        cmd += ["--ro-bind", str(source), str(path)]
    cmd += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir), "--"]
    if uid is not None:
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--"]
    return cmd + list(argv)


def _limits_argv(limits: Limits, nproc: bool) -> list[str]:
    """``prlimit`` in front of the command: limits set without a preexec_fn (fork-safe)."""
    cmd = ["prlimit", f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 5}",
           f"--as={limits.memory_bytes}", f"--fsize={limits.file_bytes}", "--core=0"]
    if nproc:
        # Counts the processes of the real uid; it binds once setpriv switches to the slot's
        # uid (root is exempt), and per-slot uids keep concurrent runs apart. Kept beside the
        # run's cgroup: a second bound, should the cgroup's ever be lifted.
        cmd.append(f"--nproc={limits.processes}")
    return [*cmd, "--"]


def pids_of_uid(uid: int) -> list[int]:
    """The processes running as ``uid`` now."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    if int(line.split()[1]) == uid:
                        pids.append(int(entry.name))
                    break
        except (OSError, ValueError):
            continue
    return pids


def kill_all(pgid: int, uid: int | None, cgroup: pids_cgroup.RunCgroup | None) -> None:
    """SIGKILL the run's process group, every process in its cgroup and, with a sandbox uid,
    every process of that uid."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if cgroup is not None:
        cgroup.kill()
    if uid is not None:
        kill_uid(uid)


def kill_slot(slot: int) -> None:
    """End whatever runs of ``slot`` a killed grader left: the processes of both its uids and
    its cgroups."""
    for checker in (False, True):
        uid = sandbox_uid(slot, checker)
        if uid is not None:
            kill_uid(uid)
        pids_cgroup.remove_left(cgroup_name(slot, checker))


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` until none is left."""
    pids_cgroup.kill_until_gone(lambda: pids_of_uid(uid), rounds=20, pause=0.05)


def _walk_opened(root: Path) -> Iterator[tuple[str, list[str]]]:
    """``(folder, its files)`` under ``root`` (links not followed), each folder first given its
    owner's read, write and search bits back where this process may: a run can lock a folder it
    made (``chmod 0300``; without root, the run's files are this account's), which hid what it
    holds from the disk limit and left it behind after the run."""
    with contextlib.suppress(OSError):
        os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) | stat.S_IRWXU)
    for dirpath, dirnames, files in os.walk(root):
        for name in dirnames:  # before os.walk lists them
            with contextlib.suppress(OSError):
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
        yield dirpath, files


def disk_usage(root: Path) -> int:
    """Bytes in files under ``root`` (links not followed), locked folders included."""
    total = 0
    for dirpath, files in _walk_opened(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def prepare_workdir(workdir: Path, uid: int | None) -> None:
    """Make ``workdir`` (and everything in it) writable by the sandbox uid only."""
    workdir.mkdir(parents=True, exist_ok=True)
    if uid is None:
        return
    for path in [workdir, *workdir.rglob("*")]:
        os.lchown(path, uid, uid)
    workdir.chmod(0o700)


class _Reader(threading.Thread):
    """Drain a pipe, keeping at most ``cap`` bytes, so a flood of output cannot block or bloat."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap, self.data, self.dropped = stream, cap, bytearray(), 0

    def run(self) -> None:
        while chunk := self.stream.read1(65536):  # what is there: the caller may read as it comes
            room = self.cap - len(self.data)
            self.data += chunk[:max(room, 0)]
            self.dropped += max(len(chunk) - max(room, 0), 0)


def confine(argv: Sequence[str], workdir: Path, limits: Limits, slot: int = 0,
            readable: Sequence[Path] | None = None, checker: bool = False,
            views: Mapping[Path, Path] | None = None
            ) -> tuple[list[str], int | None, pids_cgroup.RunCgroup | None]:
    """``argv`` behind prlimit (and the jail, when available), ready to start in ``workdir``.

    Prepares ``workdir`` for the slot's uid (its checker's with ``checker``), kills what an
    earlier run of that uid left and makes the run's cgroup. Returns the command line, the uid
    it will run as (None without a jail or in a user namespace) and its cgroup (None where
    runs get none), which the command line enters before anything else runs.
    """
    uid = sandbox_uid(slot, checker)
    prepare_workdir(workdir, uid)
    if uid is not None:
        kill_uid(uid)  # leftovers of an earlier run in this slot must not count against it
    pids_cgroup.remove_left(cgroup_name(slot, checker))
    cgroup = pids_cgroup.create(cgroup_name(slot, checker), limits.processes, limits.cpu_cores)
    if isolation() == "jail":
        argv = _jail_argv(argv, workdir, default_readable() if readable is None else readable,
                          uid, limits, views or {})
    joined = cgroup.join() if cgroup is not None else []
    return joined + _limits_argv(limits, uid is not None) + list(argv), uid, cgroup


def child_env(workdir: Path) -> dict[str, str]:
    """The whole environment a confined child gets: nothing of the grader's own leaks in."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
            "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1", "JAX_PLATFORMS": "cpu",
            "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(workdir)}


class Confined:
    """A confined child that is running (``start``); ``wait`` enforces the wall-clock and disk
    limits until it ends and returns its ``Outcome``."""

    def __init__(self, proc: subprocess.Popen, uid: int | None,
                 cgroup: pids_cgroup.RunCgroup | None, workdir: Path, limits: Limits,
                 stdout_bytes: int):
        self.proc, self.uid, self.cgroup = proc, uid, cgroup
        self.workdir, self.limits = workdir, limits
        self.started = time.monotonic()
        self.cpu_limited = cgroup is not None and cgroup.cpu_limited()
        self.outbox: queue.Queue | None = None
        self.readers = [_Reader(proc.stdout, stdout_bytes),
                        _Reader(proc.stderr, limits.output_bytes)]
        for r in self.readers:
            r.start()

    def send(self, data: bytes, close: bool = False) -> None:
        """Write ``data`` to the child's stdin (then close it, with ``close``), in order, from
        a thread: the child may read it only later."""
        if self.outbox is None:
            self.outbox = queue.Queue()
            threading.Thread(target=self._write, daemon=True).start()
        self.outbox.put(data)
        if close:
            self.outbox.put(None)

    def _write(self) -> None:
        while (data := self.outbox.get()) is not None:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def feed(self, stdin: bytes) -> None:
        """Write ``stdin`` and close it, from a thread: the child may read it only later."""
        self.send(stdin, close=True)

    def past_limits(self) -> tuple[Status, str] | None:
        """The wall-clock, CPU or disk limit the child is past, as (status, reason); else
        None."""
        if time.monotonic() - self.started > self.limits.wall_seconds:
            return "timeout", f"ran past the wall-clock limit of {self.limits.wall_seconds:g} s"
        used = self.cgroup.cpu_seconds() if self.cgroup is not None else None
        if used is not None and used > self.limits.cpu_seconds:
            return "timeout", (f"used more than the CPU limit of {self.limits.cpu_seconds} s, "
                               "all its processes together")
        if disk_usage(self.workdir) > self.limits.disk_bytes:
            return "disk", f"wrote more than {self.limits.disk_bytes:,} bytes to disk"
        return None

    def wait(self, verdict: tuple[Status, str] | None = None) -> Outcome:
        """Wait for the child's end, stopping it at a limit (or at once, with ``verdict``: why
        it is stopped), and return its ``Outcome``."""
        proc = self.proc
        if proc.poll() is not None:  # it ended by itself before it was stopped
            verdict = None
        while verdict is None and proc.poll() is None:
            verdict = self.past_limits()
            if verdict is None:
                time.sleep(0.1)
        kill_all(proc.pid, self.uid, self.cgroup)
        proc.wait()
        if self.cgroup is not None:
            self.cgroup.remove()  # after the wait: the run's first process is gone too
        for r in self.readers:
            r.join(timeout=5)
        wall = time.monotonic() - self.started
        stdout, stderr = bytes(self.readers[0].data), bytes(self.readers[1].data)
        jailed = isolation() == "jail"
        code = normalize_exit(proc.returncode, jailed)
        if verdict is None:
            verdict = classify(code, stderr, self.limits)
        for r, name in zip(self.readers, ("stdout", "stderr"), strict=True):
            if r.dropped:
                verdict = (verdict[0], verdict[1] + f"; {name} beyond {r.cap:,} bytes was dropped")
        return Outcome(verdict[0], code, stdout, stderr, wall, verdict[1],
                       "jail" if jailed else "rlimits",
                       _held_by(self.cgroup is not None, self.uid), self.cpu_limited)


def start(argv: Sequence[str], workdir: Path, limits: Limits = Limits(), *,
          env: Mapping[str, str] | None = None, stdin: bool = False, slot: int = 0,
          readable: Sequence[Path] | None = None,
          stdout_bytes: int | None = None, checker: bool = False,
          views: Mapping[Path, Path] | None = None) -> Confined:
    """Start ``argv`` in ``workdir`` under ``limits`` and return at once (``Confined.wait``).

    stdin: keep a pipe to the child's stdin for ``Confined.feed`` (else it reads end of file).
    stdout_bytes: how much of stdout to keep (default ``limits.output_bytes``).
    checker: run as the slot's checker uid (``sandbox_uid``).
    views: {path in the jail: host folder shown there, read-only} (only in the jail: with
        ``rlimits`` the child sees the host's files).
    """
    workdir = Path(workdir).resolve()
    argv, uid, cgroup = confine(argv, workdir, limits, slot, readable, checker, views)
    proc = subprocess.Popen(
        argv, cwd=workdir, env={**child_env(workdir), **(env or {})},
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    return Confined(proc, uid, cgroup, workdir, limits,
                    limits.output_bytes if stdout_bytes is None else stdout_bytes)


def run(argv: Sequence[str], workdir: Path, limits: Limits = Limits(), *,
        env: Mapping[str, str] | None = None, stdin: bytes | None = None,
        slot: int = 0, readable: Sequence[Path] | None = None,
        views: Mapping[Path, Path] | None = None) -> Outcome:
    """Run ``argv`` in ``workdir`` under ``limits``; never raises for what the child does.

    readable: folders the jailed child may read (default: the Python installation and venv).
    slot: which concurrent run this is (0, 1, ...): each slot has its own uid.
    """
    child = start(argv, workdir, limits, env=env, stdin=stdin is not None, slot=slot,
                  readable=readable, views=views)
    if stdin is not None:
        child.feed(stdin)
    return child.wait()


def normalize_exit(code: int | None, jailed: bool) -> int | None:
    """Exit status with signals negative, as Popen reports them outside the jail."""
    if jailed and code is not None and code > 128:
        return 128 - code  # bwrap reports a child killed by signal N as exit 128 + N
    return code


def classify(code: int, stderr: bytes, limits: Limits) -> tuple[Status, str]:
    """Status and reason of a confined child that exited with ``code`` (negative: signal)."""
    if code == 0:
        return "ok", "finished"
    if code < 0:
        sig = signal.Signals(-code)
        if sig == signal.SIGXCPU:
            return "timeout", f"used more than the CPU limit of {limits.cpu_seconds} s"
        if sig == signal.SIGXFSZ:
            return "disk", f"wrote a file larger than {limits.file_bytes:,} bytes"
        if sig == signal.SIGKILL:
            return "crashed", "was killed (SIGKILL)"
        return "crashed", f"was killed by {sig.name}"
    if b"File too large" in stderr:  # Python ignores SIGXFSZ: the write fails with EFBIG
        return "disk", f"wrote a file larger than {limits.file_bytes:,} bytes"
    if b"MemoryError" in stderr or b"std::bad_alloc" in stderr or b"RESOURCE_EXHAUSTED" in stderr:
        return "memory", f"ran out of its memory limit of {limits.memory_bytes:,} bytes"
    return "failed", f"exited with status {code}"


def remove_workdir(workdir: Path) -> None:
    """Remove a run's folder, also what the run locked in it."""
    for _ in _walk_opened(workdir):
        pass
    shutil.rmtree(workdir, ignore_errors=True)
