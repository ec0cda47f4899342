"""A sandboxed run's own pids cgroup: the kernel refuses every fork past its ``pids.max``.

A field test ran 530 processes in a jail whose limit was 512 (issue 35, item 8). RLIMIT_NPROC
counts the processes of a uid: it binds only where a run has a uid of its own (root's slot
uids), and it leaves out the jail's own processes (bubblewrap's, which are root's); a grading
account without root (deploy/setup-class.sh) runs its jails in user namespaces as its own uid
outside them, where none can be set at all. A cgroup counts every process and thread of the
run, whoever it runs as, and nothing else.

Runs' cgroups live in one folder per account at the top of the pids hierarchy: ``pallas-course/``
for root (mode 0755: only root writes it), ``pallas-course/<account>/`` for a grading account,
which only root can make and hand over (deploy/setup-class.sh does). Cgroup v1 (a hierarchy of
the ``pids`` controller) and v2 (``pids`` among the unified hierarchy's controllers) alike. Under
v2 the kernel moves a process only where the mover may write the common ancestor's
``cgroup.procs``, so a grading account's own processes must live in its folder too, in a leaf
(a cgroup that hands a controller down holds no process): setup-class.sh starts them in
``daemons/`` there. Where none of this holds,
``parent`` is None, runs get no cgroup, and their outcome says what binds instead.

A run's processes live in a cgroup below the one that holds its limit (``RunCgroup``): a run
can mount the pids hierarchy in user and cgroup namespaces of its own, where the cgroup it is
in is the root it sees, and a grading account's run owns those files (they are its account's)
and can write them. The limit above is out of its sight.
"""

from __future__ import annotations

import errno
import functools
import os
import pwd
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

FOLDER = "pallas-course"  # the folder of runs' cgroups at the top of the pids hierarchy

# A command run with JOIN + [cgroup.procs, *argv] enters that cgroup, then becomes argv. The
# process moves itself before it runs anything else, so every process of the run is forked
# inside: no fork can happen before the move. (The grader writing the child's pid after Popen
# would race the child, which bwrap forks at once.)
JOIN = ["sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh"]

ROUNDS = 100  # rounds of killing (or removing) before a cgroup is left for a later run's sweep


def hierarchy() -> tuple[Path, bool] | None:
    """Where the ``pids`` controller is mounted, and whether that is cgroup v2; None when it
    is not mounted at all."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        _, where, kind, options = line.split()[:4]
        if kind == "cgroup" and "pids" in options.split(","):
            return Path(where), False
        if kind == "cgroup2":
            try:
                if "pids" in (Path(where) / "cgroup.controllers").read_text().split():
                    return Path(where), True
            except OSError:
                continue
    return None


def account_folder(mount: Path) -> Path:
    """This account's folder of runs' cgroups under ``mount`` (see the module's docstring)."""
    if os.geteuid() == 0:
        return mount / FOLDER
    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        name = str(os.geteuid())
    return mount / FOLDER / name


def enable_pids(mount: Path, folder: Path) -> None:
    """Under cgroup v2: ``pids`` enabled for the children of ``folder`` and of each folder
    above it (a controller reaches a cgroup only through its parent's ``subtree_control``).
    Raises OSError where one lacks it and this account may not enable it."""
    for level in [*reversed(folder.parents), folder]:
        if level.is_relative_to(mount):
            control = level / "cgroup.subtree_control"
            if "pids" not in control.read_text().split():
                control.write_text("+pids")


@functools.cache
def parent() -> Path | None:
    """This account's folder of runs' cgroups, ready (v2: ``pids`` enabled for its children)
    and proven: a process started the way a run starts joined a cgroup made in it. None where
    runs get no cgroup: no pids controller, or no folder this account alone may write (a
    grading account that root did not hand one, or, under v2, one whose processes live
    outside it)."""
    found = hierarchy()
    if found is None:
        return None
    mount, v2 = found
    folder = account_folder(mount)
    try:
        if os.geteuid() == 0:
            folder.mkdir(mode=0o755, exist_ok=True)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        if v2:
            enable_pids(mount, folder)
        probe = RunCgroup.make(folder / f"probe-{secrets.token_hex(4)}", 4)
        try:
            joined = subprocess.run([*probe.join(), "true"], capture_output=True, timeout=30,
                                    check=False).returncode == 0
        finally:
            probe.remove()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return folder if joined else None


def kill_until_gone(processes: Callable[[], list[int]], rounds: int = ROUNDS,
                    pause: float = 0.02) -> None:
    """SIGKILL every pid ``processes()`` lists, again after ``pause`` seconds, until it lists
    none or ``rounds`` are done: a fork bomb may fork while it is killed."""
    for _ in range(rounds):
        pids = processes()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(pause)


class RunCgroup:
    """One run's cgroup (``path``), which holds its limit, and the run's processes in
    ``path/jail`` below it (see the module's docstring), made by ``make``; ``remove`` ends
    what is in it."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def make(cls, path: Path, max_pids: int) -> RunCgroup:
        """A new cgroup at ``path`` whose processes (threads included) together may number
        ``max_pids``. Raises OSError where it cannot be made, and leaves nothing then."""
        cgroup = cls(path)
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(max_pids))
            (path / "jail").mkdir()
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def join(self) -> list[str]:
        """What goes in front of a run's command line so that it starts in this cgroup."""
        return [*JOIN, str(self.path / "jail" / "cgroup.procs")]

    def pids(self) -> list[int]:
        """The processes in this cgroup and in any below it (a run may make some)."""
        found = []
        for folder, _, _ in os.walk(self.path):
            try:
                found += [int(p) for p in (Path(folder) / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return found

    def kill(self) -> None:
        """SIGKILL every process in it until none is left. Under v2 ``cgroup.kill`` does it at
        once, forks in flight included; under v1 what a fork bomb forks while it is killed is
        found in the next round, and the limit bounds how many there can be."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            pass  # v1, or a kernel before 5.14: the rounds below do it
        kill_until_gone(self.pids)

    def remove(self) -> None:
        """Kill what is in it, then remove it and any cgroup a run made below it. One still
        busy after ``ROUNDS`` tries (a process that will not die) is left for the next run of
        its name (``remove_left``)."""
        self.kill()
        for _ in range(ROUNDS):
            try:
                for folder, _, _ in os.walk(self.path, topdown=False):
                    os.rmdir(folder)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY:  # busy: a process still exiting, for a moment
                    return
            time.sleep(0.02)


def create(name: str, max_pids: int) -> RunCgroup | None:
    """A new cgroup ``<parent()>/<name>-<random token>`` whose processes (threads included)
    together may number ``max_pids``; None where runs get no cgroup."""
    folder = parent()
    if folder is None:
        return None
    try:
        return RunCgroup.make(folder / f"{name}-{secrets.token_hex(6)}", max_pids)
    except OSError:
        return None


def left(name: str) -> list[Path]:
    """The cgroups of runs named ``name`` that are still there."""
    folder = parent()
    return [] if folder is None else sorted(folder.glob(f"{name}-*"))


def remove_left(name: str) -> None:
    """End and remove the cgroups of earlier runs named ``name``: a grader killed before its
    run ended leaves its cgroup behind."""
    for path in left(name):
        RunCgroup(path).remove()


def delegate(account: str) -> Path | None:
    """As root: ``pallas-course/<account>/`` handed to ``account`` for its runs' cgroups, with
    a leaf ``daemons/`` for the account's own processes (under v2 they must live in the folder:
    see the module's docstring). Returns ``daemons/cgroup.procs``, which the account's services
    join as they start (``JOIN``); None where no pids controller is mounted."""
    found = hierarchy()
    if found is None:
        return None
    mount, v2 = found
    folder = mount / FOLDER / account
    for level in (folder.parent, folder, folder / "daemons"):
        level.mkdir(mode=0o755, exist_ok=True)
    if v2:
        enable_pids(mount, folder)
    owner = pwd.getpwnam(account)
    # the folder (to make and remove cgroups in it) and, under v2, the files through which a
    # delegated cgroup is run; never the folder's limits
    for path in (folder, *(folder / name for name in ("cgroup.procs", "cgroup.subtree_control",
                                                      "cgroup.threads"))):
        if path.exists():
            os.chown(path, owner.pw_uid, owner.pw_gid)
    return folder / "daemons" / "cgroup.procs"


def undelegate(account: str) -> None:
    """As root: ``account``'s folder removed, with whatever still runs in it."""
    found = hierarchy()
    if found is not None:
        RunCgroup(found[0] / FOLDER / account).remove()


if __name__ == "__main__":  # deploy/setup-class.sh, as root: delegate|undelegate ACCOUNT
    action, name = sys.argv[1:3]
    if action == "delegate":
        print(delegate(name) or "")
    elif action == "undelegate":
        undelegate(name)
    else:
        sys.exit(f"unknown action {action!r}: delegate or undelegate")
