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

CPU: a fork bomb held to 499 processes kept both cores busy for 337 s (issue 52), since
RLIMIT_CPU counts one process's seconds. A run's cgroup also holds its CPU: at most
``cpu_cores`` cores at a time (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), and its CPU seconds,
all its processes together (v2 ``cpu.stat``, v1 ``cpuacct.usage``), for the sandbox's budget.
Under v1 ``cpu`` and ``cpuacct`` are hierarchies of their own (or one, mounted together): the run
gets a cgroup of the same name in each, made, joined and removed with its pids cgroup. Where a
controller is missing, or its folder not this account's, the run goes without that part and
``RunCgroup.cpu_limited`` says so.
"""

from __future__ import annotations

import contextlib
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


def hierarchy(controller: str = "pids") -> tuple[Path, bool] | None:
    """Where ``controller`` is mounted, and whether that is cgroup v2; None when it is not
    mounted at all. (Under v2, ``cpuacct`` is ``cpu``: its seconds are every cgroup's
    ``cpu.stat``.)"""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        _, where, kind, options = line.split()[:4]
        if kind == "cgroup" and controller in options.split(","):
            return Path(where), False
        if kind == "cgroup2":
            try:
                v2_name = "cpu" if controller == "cpuacct" else controller
                if v2_name in (Path(where) / "cgroup.controllers").read_text().split():
                    return Path(where), True
            except OSError:
                continue
    return None


# the v1 hierarchies a run's cgroup has beside its pids one: its CPU share and its CPU seconds
CPU_CONTROLLERS = ("cpu", "cpuacct")


def cpu_folders() -> list[Path]:
    """This account's folders of runs' cgroups in the v1 ``cpu`` and ``cpuacct`` hierarchies
    that are not the pids one (none under v2, where one hierarchy holds them all), made for
    root, proven writable by this account alone; one it may not use is left out."""
    pids = hierarchy()
    found: list[Path] = []
    for controller in CPU_CONTROLLERS:
        where = hierarchy(controller)
        if where is None or where[1] or (pids and where[0] == pids[0]):
            continue
        folder = account_folder(where[0])
        if folder in found:  # cpu,cpuacct mounted together
            continue
        try:
            if os.geteuid() == 0:
                folder.mkdir(mode=0o755, exist_ok=True)
            st = os.lstat(folder)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            found.append(folder)
    return found


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
    """Under cgroup v2: ``pids``, and ``cpu`` where the hierarchy has it, enabled for the
    children of ``folder`` and of each folder above it (a controller reaches a cgroup only
    through its parent's ``subtree_control``). Raises OSError where one lacks ``pids`` and this
    account may not enable it; ``cpu`` is left out where it may not (the run then has no CPU
    limit, and says so)."""
    for level in [*reversed(folder.parents), folder]:
        if level.is_relative_to(mount):
            control = level / "cgroup.subtree_control"
            if "pids" not in control.read_text().split():
                control.write_text("+pids")
            if "cpu" not in control.read_text().split() and "cpu" in (
                    level / "cgroup.controllers").read_text().split():
                with contextlib.suppress(OSError):  # a process in ``level`` refuses it
                    control.write_text("+cpu")


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
        probe = RunCgroup.make([folder / f"probe-{secrets.token_hex(4)}"], 4)
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
    """One run's cgroups, one per hierarchy (``paths``: the pids one first, then v1's cpu and
    cpuacct ones), which hold its limits, and the run's processes in ``<path>/jail`` below each
    (see the module's docstring), made by ``make``; ``remove`` ends what is in them."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.path = paths[0]

    @classmethod
    def make(cls, paths: list[Path], max_pids: int, cpu_cores: float | None = None
             ) -> RunCgroup:
        """New cgroups at ``paths`` whose processes (threads included) together may number
        ``max_pids`` and use ``cpu_cores`` cores at a time (None: no CPU limit), where each
        hierarchy has the controller. Raises OSError where the pids one cannot be made, and
        leaves nothing then."""
        cgroup = cls(list(paths))
        try:
            for path in paths:
                path.mkdir()
                (path / "jail").mkdir()
            (cgroup.path / "pids.max").write_text(str(max_pids))
        except OSError:
            cgroup.remove()
            raise
        if cpu_cores is not None:
            period = 100_000  # µs: the kernel's default period
            quota = max(1000, int(cpu_cores * period))
            for path in paths:
                with contextlib.suppress(OSError):  # no cpu controller in this hierarchy
                    if (path / "cpu.max").exists():
                        (path / "cpu.max").write_text(f"{quota} {period}")
                    elif (path / "cpu.cfs_quota_us").exists():
                        (path / "cpu.cfs_period_us").write_text(str(period))
                        (path / "cpu.cfs_quota_us").write_text(str(quota))
        return cgroup

    def cpu_limited(self) -> bool:
        """Whether a CPU limit holds the run (a quota below ``max``) and its CPU seconds can be
        read."""
        for path in self.paths:
            try:
                if (path / "cpu.max").exists():
                    limited = not (path / "cpu.max").read_text().startswith("max")
                else:
                    limited = int((path / "cpu.cfs_quota_us").read_text()) > 0
            except (OSError, ValueError):
                continue
            if limited:
                return self.cpu_seconds() is not None
        return False

    def cpu_seconds(self) -> float | None:
        """CPU seconds the run's processes have used, all together (threads, processes that
        ended, and cgroups it made below); None where no hierarchy counts them."""
        for path in self.paths:
            try:
                if (path / "cpuacct.usage").exists():
                    return int((path / "cpuacct.usage").read_text()) / 1e9
                if (path / "cpu.stat").exists():
                    for line in (path / "cpu.stat").read_text().splitlines():
                        if line.startswith("usage_usec "):
                            return int(line.split()[1]) / 1e6
            except (OSError, ValueError):
                continue
        return None

    def join(self) -> list[str]:
        """What goes in front of a run's command line so that it starts in these cgroups."""
        return [arg for path in self.paths for arg in (*JOIN, str(path / "jail" / "cgroup.procs"))]

    def pids(self) -> list[int]:
        """The processes in these cgroups and in any below them (a run may make some)."""
        found = []
        for path in self.paths:
            for folder, _, _ in os.walk(path):
                try:
                    found += [int(p) for p in (Path(folder) / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    continue
        return sorted(set(found))

    def kill(self) -> None:
        """SIGKILL every process in them until none is left. Under v2 ``cgroup.kill`` does it at
        once, forks in flight included; under v1 what a fork bomb forks while it is killed is
        found in the next round, and the limit bounds how many there can be."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            pass  # v1, or a kernel before 5.14: the rounds below do it
        kill_until_gone(self.pids)

    def remove(self) -> None:
        """Kill what is in them, then remove them and any cgroup a run made below them. One
        still busy after ``ROUNDS`` tries (a process that will not die) is left for the next
        run of its name (``remove_left``)."""
        self.kill()
        for path in self.paths:
            for _ in range(ROUNDS):
                try:
                    for folder, _, _ in os.walk(path, topdown=False):
                        os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:  # busy: a process still exiting, for a moment
                        break
                time.sleep(0.02)


def create(name: str, max_pids: int, cpu_cores: float | None = None) -> RunCgroup | None:
    """New cgroups ``<folder>/<name>-<random token>`` in the pids hierarchy and in v1's cpu and
    cpuacct ones (``cpu_folders``) whose processes (threads included) together may number
    ``max_pids`` and use ``cpu_cores`` cores at a time; None where runs get no pids cgroup."""
    folder = parent()
    if folder is None:
        return None
    leaf = f"{name}-{secrets.token_hex(6)}"
    try:
        return RunCgroup.make([folder / leaf, *(f / leaf for f in cpu_folders())], max_pids,
                              cpu_cores)
    except OSError:
        return None


def left(name: str) -> list[Path]:
    """The pids cgroups of runs named ``name`` that are still there."""
    folder = parent()
    return [] if folder is None else sorted(folder.glob(f"{name}-*"))


def remove_left(name: str) -> None:
    """End and remove the cgroups of earlier runs named ``name``: a grader killed before its
    run ended leaves its cgroups behind."""
    for path in left(name):
        RunCgroup([path, *(f / path.name for f in cpu_folders())]).remove()


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
    # delegated cgroup is run; never the folder's limits. Under v1 the account's folders in
    # the cpu and cpuacct hierarchies too (v1 moves a process wherever its mover may write).
    folders = [folder, *(where[0] / FOLDER / account for where in map(hierarchy, CPU_CONTROLLERS)
                         if where is not None and not where[1] and where[0] != mount)]
    for other in folders[1:]:
        other.parent.mkdir(mode=0o755, exist_ok=True)
        other.mkdir(mode=0o755, exist_ok=True)
    for each in folders:
        for path in (each, *(each / name for name in ("cgroup.procs", "cgroup.subtree_control",
                                                      "cgroup.threads"))):
            if path.exists():
                os.chown(path, owner.pw_uid, owner.pw_gid)
    return folder / "daemons" / "cgroup.procs"


def undelegate(account: str) -> None:
    """As root: ``account``'s folder removed, with whatever still runs in it."""
    for controller in ("pids", *CPU_CONTROLLERS):
        found = hierarchy(controller)
        if found is not None:
            RunCgroup([found[0] / FOLDER / account]).remove()


if __name__ == "__main__":  # deploy/setup-class.sh, as root: delegate|undelegate ACCOUNT
    action, name = sys.argv[1:3]
    if action == "delegate":
        print(delegate(name) or "")
    elif action == "undelegate":
        undelegate(name)
    else:
        sys.exit(f"unknown action {action!r}: delegate or undelegate")
