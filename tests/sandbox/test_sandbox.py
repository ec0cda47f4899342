"""grader.jail.sandbox: each way a submission can try to kill or starve the grader ends as
data."""

import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grader.jail import sandbox

PY = sys.executable
FAST = sandbox.Limits(cpu_seconds=5, wall_seconds=8, memory_bytes=1 << 30, processes=32,
                      file_bytes=1 << 20, disk_bytes=4 << 20, output_bytes=4096)


@pytest.fixture(scope="module", autouse=True)
def held():
    """Three slots claimed for this module's runs: graders beside this suite (the class tests,
    a Dask cluster) claim others, and never kill these runs by their slot's uid."""
    with contextlib.ExitStack() as stack:
        HELD[:] = [stack.enter_context(sandbox.claimed_slot()) for _ in range(3)]
        yield


HELD: list[int] = []


def _run(tmp_path, code, limits=FAST, slot=None, **kw):
    """``code`` run in the sandbox, in the module's first held slot unless ``slot`` names
    another."""
    return sandbox.run([PY, "-c", code], tmp_path / "work", limits,
                       slot=HELD[0] if slot is None else slot, **kw)


def test_ok_and_failed(tmp_path):
    ok = _run(tmp_path, "print('hi')")
    assert (ok.status, ok.stdout) == ("ok", b"hi\n")
    bad = _run(tmp_path, "import sys; sys.exit(3)")
    assert (bad.status, bad.returncode) == ("failed", 3)


def test_infinite_loop_hits_the_cpu_or_wall_limit(tmp_path):
    out = _run(tmp_path, "while True: pass")
    assert out.status == "timeout"
    assert out.wall_seconds < FAST.wall_seconds + 3


def test_sleeping_forever_hits_the_wall_limit(tmp_path):
    limits = sandbox.Limits(**{**FAST.__dict__, "wall_seconds": 1.5})
    out = _run(tmp_path, "import time; time.sleep(60)", limits)
    assert out.status == "timeout" and "wall-clock" in out.reason


def test_hanging_on_input_gets_end_of_file(tmp_path):
    out = _run(tmp_path, "import sys; print(repr(sys.stdin.read()))")
    assert (out.status, out.stdout) == ("ok", b"''\n")


def test_memory_bomb(tmp_path):
    out = _run(tmp_path, "x = bytearray(4 << 30)")
    assert out.status == "memory" and "memory limit" in out.reason


def test_huge_file_and_disk_filling(tmp_path):
    big = _run(tmp_path, "open('f', 'wb').write(b'x' * (8 << 20))")
    assert big.status == "disk"
    many = _run(tmp_path, "import time\nfor i in range(100):\n"
                          "    open(f'f{i}', 'wb').write(b'x' * (900 << 10)); time.sleep(0.01)\n"
                          "time.sleep(30)")
    assert many.status == "disk" and "disk" in many.reason


def test_output_flood_is_capped(tmp_path):
    out = _run(tmp_path, "import sys\nfor _ in range(10000): sys.stdout.write('y' * 1000)")
    assert out.status == "ok" and len(out.stdout) == FAST.output_bytes
    assert "dropped" in out.reason


def test_os_exit_and_self_kill_are_reported(tmp_path):
    assert _run(tmp_path, "import os; os._exit(7)").returncode == 7
    killed = _run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert killed.status == "crashed" and "SIGSEGV" in killed.reason


@pytest.mark.skipif(sandbox.isolation() != "jail", reason="the jail needs root and bubblewrap")
def test_fork_bomb_is_contained_and_cleaned_up(tmp_path):
    code = ("import os, time\n"
            "for _ in range(200):\n"
            "    try:\n        os.fork()\n    except OSError:\n        pass\n"
            "time.sleep(30)")
    out = _run(tmp_path, code, slot=HELD[1])
    assert out.status == "timeout"
    time.sleep(0.2)
    assert sandbox.pids_of_uid(sandbox.sandbox_uid(HELD[1])) == []


@pytest.mark.skipif(sandbox.isolation() != "jail", reason="the jail needs root and bubblewrap")
def test_jail_hides_secrets_and_the_grader(tmp_path):
    secret = tmp_path / "references" / "task1.npy"
    secret.parent.mkdir()
    secret.write_bytes(b"reference")
    repo_file = Path(__file__)  # the repository is not on the whitelist
    code = (f"import os\n"
            f"for p in [{str(secret)!r}, {str(repo_file)!r}, '/root/.bash_history']:\n"
            f"    print(p, os.path.exists(p))\n"
            f"print('uid', os.getuid())\n"
            f"try:\n    os.kill({os.getpid()}, 15)\nexcept OSError as e:\n"
            f"    print('kill', type(e).__name__)\n")
    out = _run(tmp_path, code)
    assert out.status == "ok", out.stderr
    lines = out.stdout.decode().splitlines()
    assert lines[:3] == [f"{secret} False", f"{repo_file} False", "/root/.bash_history False"]
    assert lines[3] == f"uid {sandbox.sandbox_uid(HELD[0])}"  # its slot's, never root's
    assert lines[4] in ("kill ProcessLookupError", "kill PermissionError")
    assert out.isolation == "jail"


def test_escaped_background_process_is_killed(tmp_path):
    code = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " start_new_session=True)\nprint('left')")
    out = _run(tmp_path, code, slot=HELD[2])
    assert out.status == "ok"
    if sandbox.isolation() == "jail":
        time.sleep(0.2)
        assert sandbox.pids_of_uid(sandbox.sandbox_uid(HELD[2])) == []


# ----------------------------------------------------------------------------- slots and folders
def test_a_slot_is_free_only_where_no_grader_holds_it():
    """``slot_if_free`` tells a held slot (this module's) from one it can hold itself, which
    no grader can claim while it is held."""
    with sandbox.slot_if_free(HELD[0]) as free:
        assert not free
    with sandbox.claimed_slot() as slot:  # the lowest slot nobody holds
        pass
    with sandbox.slot_if_free(slot) as free:
        assert free
        with sandbox.claimed_slot() as other:
            assert other != slot


def test_a_folder_squatted_in_tmp_blocks_nothing_and_a_bad_private_one_is_refused(
        tmp_path, monkeypatch):
    """Issue 35, item 7: a learner's ``mkdir /tmp/pallas-course-slots-<uid>`` blocked every
    command of that instructor. Slot locks and jails live in a folder of this account's own:
    a squatted name in the temp folder changes nothing, and a private folder that is not
    this account's alone is refused with what to do."""
    squats = [Path(tempfile.gettempdir()) / f"{name}-{os.geteuid()}"
              for name in ("pallas-course-slots", "pallas-course-jails")]
    made = [p for p in squats if not p.exists()]
    for p in made:  # as another account would leave them
        p.mkdir()
        p.chmod(0o777)
    try:
        with sandbox.claimed_slot() as slot:
            assert 0 <= slot < sandbox.SLOTS
        jails = sandbox.private_folder("pallas-course-jails", 0o711)
        assert not jails.is_relative_to(tempfile.gettempdir())
    finally:
        for p in made:
            p.rmdir()
    monkeypatch.setattr(sandbox, "private_base", lambda: tmp_path / "base")
    mine = sandbox.private_folder("pallas-course-slots")
    assert mine == tmp_path / "base" / "pallas-course-slots"
    assert mine.stat().st_mode & 0o777 == 0o700
    squatted = tmp_path / "base" / "pallas-course-jails"
    squatted.mkdir()
    squatted.chmod(0o777)
    with pytest.raises(RuntimeError, match="remove it and grade again"):
        sandbox.private_folder("pallas-course-jails", mode=0o711)


def test_a_claimed_slot_is_held_in_its_block_and_released_however_the_block_ends():
    """``claimed_slot`` serves the graders that hold a slot for one job (a release, the jail's
    preflight, a local batch): a job that fails must not keep the slot from the next one."""
    import fcntl

    def free(slot: int) -> bool:
        fd = os.open(sandbox.private_folder("pallas-course-slots") / f"{slot}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # and with it the lock this check took

    with pytest.raises(KeyError), sandbox.claimed_slot() as slot:
        assert not free(slot)
        raise KeyError("the job failed")
    assert free(slot)


def as_nobody(code: str, *args: str, join: list[str] | None = None):
    """``code`` run by /usr/bin/python3 with ``args`` as ``nobody``, a second account, as
    ``subprocess.run`` answers; it imports the sandbox's modules alone, copied where it can
    read them (pytest's tmp_path is root's), and has a folder of its own (its cache and
    ``sys.argv[1]``). ``join``: what it starts behind (``pids_cgroup.JOIN`` and a cgroup)."""
    import shutil
    import subprocess

    where = Path(tempfile.mkdtemp(dir="/tmp"))
    where.chmod(0o755)
    (where / "grader" / "jail").mkdir(parents=True)
    (where / "cache").mkdir()
    shutil.chown(where / "cache", "nobody")  # the second account's own folder
    for module in (sandbox, sandbox.pids_cgroup):
        shutil.copy(Path(module.__file__), where / "grader" / "jail")
    (where / "grader" / "__init__.py").write_text("")
    (where / "grader" / "jail" / "__init__.py").write_text("")
    try:
        return subprocess.run(
            [*(join or []), shutil.which("runuser"), "-u", "nobody", "--", "/usr/bin/python3",
             "-c", code, str(where / "cache"), *args],
            cwd=where, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(where),
                            "XDG_CACHE_HOME": str(where / "cache")},
            capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(where)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second account")
def test_an_instructor_account_claims_a_slot_while_root_holds_one():
    """Root grading on the machine must not lock an instructor's own account out of releasing
    (one machine-wide lock folder, made 0700 by whoever came first, did)."""
    with sandbox.claimed_slot() as slot:
        out = as_nobody("from grader.jail import sandbox; print(sandbox.claim_slot()[0])")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"  # its own first slot: root's locks are root's alone
    assert slot >= 0


def test_nbgrader_run_by_hand_claims_its_slot(monkeypatch):
    """A run outside a grading worker (nbgrader's own autograde, formgrader's button) names no
    slot: it claims a free one, never slot 0 unclaimed, where another grader's run may be."""
    monkeypatch.delenv(sandbox.SLOT_ENV, raising=False)
    with sandbox.slot_for_this_run() as slot:
        assert slot not in HELD
        with sandbox.slot_for_this_run() as second:
            assert second not in (*HELD, slot)
    monkeypatch.setenv(sandbox.SLOT_ENV, "7")
    with sandbox.slot_for_this_run() as slot:
        assert slot == 7  # the one its worker claimed


# a run's folder as a run without root leaves it: its files are the grading account's, and a
# folder in it locked (chmod 0300: no listing); then what the grader measures and removes
LOCKED_FOLDER = """
import os, sys
from pathlib import Path
from grader.jail import sandbox
work = Path(sys.argv[1]) / "work"
(work / "locked").mkdir(parents=True)
(work / "locked" / "big").write_bytes(b"x" * (1 << 20))
(work / "locked").chmod(0o300)
print(sandbox.disk_usage(work), flush=True)
sandbox.remove_workdir(work)
print(work.exists())
"""


def test_a_locked_folder_counts_against_the_disk_limit_and_is_removed(tmp_path):
    """Issue 35, item 8: 300 MiB written into a folder the run locked (mode 0300) passed the
    256 MiB limit, and locked folders piled up after each run."""
    import subprocess

    # root reads and removes whatever the modes say: the class's grader is an account, as root
    # without the capabilities that override modes
    as_account = (["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
                  if os.geteuid() == 0 else [])
    out = subprocess.run([*as_account, PY, "-c", LOCKED_FOLDER, str(tmp_path)],
                         capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    usage, exists = out.stdout.split()
    assert int(usage) >= 1 << 20 and exists == "False", out.stdout


# ----------------------------------------------------------------------------- the process limit
PROCESSES = FAST.processes
CGROUPS = sandbox.pids_cgroup.hierarchy() is not None
needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or not CGROUPS or sandbox.pids_cgroup.parent() is None,
    reason="needs root and a writable pids cgroup controller (v1 or v2)")

# Eight parents fork at once (each up to 12 children, held alive), then the run prints how many
# processes its jail holds: every one of the run but bubblewrap's first (outside its pid
# namespace). None has ended by then, so that is the most there were at once.
CONCURRENT_FORKS = """
import os, time
go_r, go_w = os.pipe()
done_r, done_w = os.pipe()
parents = 0
for _ in range(8):
    try:
        if os.fork() == 0:
            os.close(go_w)
            os.read(go_r, 1)  # the end of file that starts them all together
            for _ in range(12):
                try:
                    if os.fork() == 0:
                        time.sleep(60)
                        os._exit(0)
                except OSError:
                    pass
            os.write(done_w, b"x")
            time.sleep(60)
            os._exit(0)
        parents += 1
    except OSError:
        pass
os.close(go_w)
for _ in range(parents):
    os.read(done_r, 1)
print(sum(name.isdigit() for name in os.listdir("/proc")), flush=True)
"""


# The run first tries to lift its limit: in user, mount and cgroup namespaces of its own it
# mounts the pids hierarchy (v1, else v2), whose root is then its own cgroup, and writes that
# cgroup's pids.max. It prints whether the write took.
RAISE_OWN_LIMIT = """
import os, subprocess
os.mkdir("cgroups")
lift = ("mount -t cgroup -o pids none cgroups || mount -t cgroup2 none cgroups; "
        "echo 1000 > cgroups/pids.max && cat cgroups/pids.max")
raised = subprocess.run(["unshare", "-U", "-r", "-m", "-C", "sh", "-c", lift],
                        capture_output=True, text=True).stdout.strip() == "1000"
print(raised, end=" ")
"""


def alive_at_once(out: sandbox.Outcome) -> int:
    assert out.status == "ok", (out.status, out.reason, out.stderr[-2000:])
    return int(out.stdout)


@needs_cgroups
@pytest.mark.skipif(sandbox.isolation() != "jail", reason="the jail needs root and bubblewrap")
def test_concurrent_forks_never_pass_the_process_limit(tmp_path):
    """Issue 35, item 8: a jail whose limit was 512 ran 530 processes. RLIMIT_NPROC counts the
    slot uid's processes alone, and the jail's own come on top: 33 here, with 32 allowed. The
    run's pids cgroup counts each of its processes."""
    out = _run(tmp_path, CONCURRENT_FORKS, slot=HELD[1])
    assert PROCESSES // 2 < alive_at_once(out) <= PROCESSES, out.stdout
    assert out.process_limit == "cgroup"


# Four chains of processes spin on the CPU, each process for a fifth of a CPU second before it
# forks the next and ends, while the first sleeps: no process comes near RLIMIT_CPU, so only a
# limit on the run's processes together ends it before its wall-clock limit.
CPU_RELAY = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        while True:
            start = time.process_time()
            while time.process_time() - start < 0.2:
                pass
            if os.fork() != 0:
                os._exit(0)
time.sleep(3600)
"""
CPU_CGROUPS = CGROUPS and sandbox.pids_cgroup.hierarchy("cpu") is not None


@needs_cgroups
@pytest.mark.skipif(not CPU_CGROUPS, reason="needs a cpu cgroup controller (v1 or v2)")
def test_cpu_spent_across_many_processes_ends_the_run(tmp_path):
    """Issue 52: a fork bomb kept both cores busy for 337 s and was graded 9/9, since
    RLIMIT_CPU counts each process alone. The run's cgroup counts its processes' CPU seconds
    together and holds it to its cores; past its CPU limit the run ends, and says why."""
    limits = sandbox.Limits(**{**FAST.__dict__, "cpu_seconds": 3, "wall_seconds": 120})
    out = _run(tmp_path, CPU_RELAY, limits, slot=HELD[1])
    assert (out.status, out.cpu_limit) == ("timeout", True), out.reason
    assert out.reason == "used more than the CPU limit of 3 s, all its processes together"
    assert sandbox.pids_cgroup.left(sandbox.cgroup_name(HELD[1])) == []


@needs_cgroups
@pytest.mark.skipif(not CPU_CGROUPS, reason="needs a cpu cgroup controller (v1 or v2)")
def test_a_run_s_cgroup_holds_its_cores():
    """The run's cores are its cgroup's quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``)."""
    cgroup = sandbox.pids_cgroup.create(sandbox.cgroup_name(HELD[2]), 4, cpu_cores=1.5)
    try:
        quotas = []
        for path in cgroup.paths:
            if (path / "cpu.max").exists():
                quotas.append((path / "cpu.max").read_text().split())
            elif (path / "cpu.cfs_quota_us").exists():
                quotas.append([(path / f"cpu.cfs_{n}_us").read_text().strip()
                               for n in ("quota", "period")])
        assert quotas == [["150000", "100000"]]
        assert cgroup.cpu_limited() and cgroup.cpu_seconds() == 0
    finally:
        cgroup.remove()
    assert not [p for p in cgroup.paths if p.exists()]


@pytest.mark.skipif(os.geteuid() != 0 or not CGROUPS,
                    reason="needs root to act as a grading account, and a pids controller")
@pytest.mark.skipif(sandbox.isolation() != "jail", reason="the jail needs bubblewrap")
def test_a_grading_account_s_jail_holds_its_process_limit():
    """Without root (deploy/setup-class.sh's grading account) the jail runs as the account's
    own uid, where no RLIMIT_NPROC can be set: 106 processes ran at a limit of 32. In the
    cgroup folder root hands the account (``delegate``, its process started in ``daemons/``
    as setup-class.sh starts its services), each run has its limit and leaves no cgroup; and
    the run, whose cgroup's files are its account's, cannot lift its limit (it did, 1000 then
    106 processes, when the limit was on the cgroup it runs in)."""
    daemons = sandbox.pids_cgroup.delegate("nobody")
    try:
        out = as_nobody(
            "import json, sys\n"
            "from pathlib import Path\n"
            "from grader.jail import pids_cgroup, sandbox\n"
            f"limits = sandbox.Limits(cpu_seconds=5, wall_seconds=20, processes={PROCESSES})\n"
            "with sandbox.claimed_slot() as slot:\n"
            "    out = sandbox.run(['/usr/bin/python3', '-c', sys.argv[2]],\n"
            "                      Path(sys.argv[1]) / 'work', limits, slot=slot)\n"
            "    left = pids_cgroup.left(sandbox.cgroup_name(slot))\n"
            "print(json.dumps([out.status, out.reason, out.stdout.decode(), out.isolation,\n"
            "                  out.process_limit, [str(p) for p in left], out.cpu_limit]))",
            RAISE_OWN_LIMIT + CONCURRENT_FORKS, join=[*sandbox.pids_cgroup.JOIN, str(daemons)])
    finally:
        sandbox.pids_cgroup.undelegate("nobody")
    assert out.returncode == 0, out.stderr
    status, reason, stdout, isolation, process_limit, left, cpu_limit = json.loads(out.stdout)
    assert status == "ok", reason
    assert cpu_limit == CPU_CGROUPS  # its cores and CPU seconds too, in folders root handed it
    raised, alive = stdout.split()
    assert PROCESSES // 2 < int(alive) <= PROCESSES, (stdout, process_limit)
    assert (isolation, process_limit, left) == ("jail", "cgroup", [])
    # under v1 the write takes (under v2 the host's nsdelegate refuses it): the limit is above
    assert raised == "True" or sandbox.pids_cgroup.hierarchy()[1], stdout


# what a run prints first: the cgroup it runs in (the pids hierarchy's line), as the jail shows it
SHOW_CGROUP = "print(open('/proc/self/cgroup').read(), flush=True)\n"


@needs_cgroups
def test_no_cgroup_is_left_after_a_run_however_it_ends(tmp_path):
    """A run ending by itself with a process of its own left in the background, a fork bomb
    stopped at the wall-clock limit: each ran in a cgroup of its own, which is gone after."""
    slot = HELD[1]
    name = sandbox.cgroup_name(slot)
    quick = sandbox.Limits(**{**FAST.__dict__, "wall_seconds": 2})
    runs = {"ok": ("import subprocess, sys\n"
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
                   " start_new_session=True)\n"),
            "timeout": ("import os, time\n"
                        "for _ in range(200):\n    try:\n        os.fork()\n"
                        "    except OSError:\n        pass\n"
                        "time.sleep(60)")}
    seen = []
    for status, code in runs.items():
        out = _run(tmp_path, SHOW_CGROUP + code, quick, slot=slot)
        assert (out.status, out.process_limit) == (status, "cgroup"), out.reason
        seen += re.findall(rf"{name}-[0-9a-f]+", out.stdout.decode())
        assert sandbox.pids_cgroup.left(name) == []
    assert len(set(seen)) == len(runs), seen  # each run in a cgroup of its own


@needs_cgroups
def test_a_killed_grader_s_cgroups_are_removed_with_their_processes():
    """A grading worker killed mid-run (``submission.Worker``'s time limit) leaves its run's
    cgroup, maybe with processes in it: ``kill_slot`` ends both."""
    import subprocess

    slot = HELD[2]
    cgroup = sandbox.pids_cgroup.create(sandbox.cgroup_name(slot, checker=True), 4)
    proc = subprocess.Popen([*cgroup.join(), "sleep", "60"])
    while not cgroup.pids() and proc.poll() is None:  # until it has joined
        time.sleep(0.01)
    sandbox.kill_slot(slot)
    assert proc.wait() == -9
    assert not cgroup.path.exists()


def test_cgroup_v2_enables_pids_from_the_top_down_to_the_runs_folder(tmp_path):
    """Under v2 a controller reaches a cgroup only through its parent's ``subtree_control``:
    each level from the hierarchy's top down to the runs' folder gets ``+pids`` where it lacks
    it, and ``+cpu`` where the level has cpu to hand down, and nothing above the hierarchy is
    touched (a stand-in tree: the machine may have no v2 pids controller)."""
    mount = tmp_path / "cgroup"
    folder = mount / sandbox.pids_cgroup.FOLDER / "grader"
    folder.mkdir(parents=True)
    # (enabled for its children, its controllers); a stand-in file keeps the last write alone
    levels = {tmp_path: ("", ""), mount: ("pids", "cpu io pids"),
              folder.parent: ("cpu", "pids"), folder: ("", "pids")}
    for level, (enabled, controllers) in levels.items():
        (level / "cgroup.subtree_control").write_text(enabled)
        (level / "cgroup.controllers").write_text(controllers)
    sandbox.pids_cgroup.enable_pids(mount, folder)
    assert {level: (level / "cgroup.subtree_control").read_text() for level in levels} == {
        tmp_path: "", mount: "+cpu", folder.parent: "+pids", folder: "+pids"}
