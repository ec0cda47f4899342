"""A class as ``deploy/setup-class.sh --demo 2`` makes it on this machine (root, Debian): PAM
logins over the hub's HTTP API, each server as its user's own Unix account, nbgrader's exchange,
grading on the TLS Dask cluster as the grading account, the gradebook in Debian's PostgreSQL.
Learner 2, a real Unix account, then attacks learner 1's work; every attack must fail and
learner 1's grade stay what it was. ``--remove`` undoes everything at the end, pass or fail."""

from __future__ import annotations

import json
import marshal
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
from clustertools import (
    COURSE_ID,
    ENV_FILE,
    L1,
    L2,
    NEEDS_ROOT_AND_CLASS_PACKAGES,
    PASSWORDS,
    REPO,
    RUN_FROM,
    SETUP,
    TEACHER,
    A,
    Class,
    as_user,
    free_port,
    hand_in,
    setup_class,
)

from grader.jail import pids_cgroup

pytestmark = [pytest.mark.slow, NEEDS_ROOT_AND_CLASS_PACKAGES]

# What learner 2 runs while the instructor reruns the script (README, step 3): every command
# line and environment that /proc lets her read, until her standard input closes.
PROC_POLLER = """
import glob, json, select, sys
seen = set()
while not select.select([sys.stdin], [], [], 0)[0]:
    for path in glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ"):
        try:
            seen.add(open(path, "rb").read().decode(errors="replace"))
        except OSError:
            pass
json.dump(sorted(seen), sys.stdout)
"""


# What learner 2 reads of the grading account's processes until her standard input closes:
# their command lines, and which of their environments, memory maps, memory, open files and
# folders she read anything of (none; a process that is ending has no memory left, and its
# maps read empty to anyone).
PROC_OF_GRADING = """
import glob, json, os, pwd, select, sys
grader = pwd.getpwnam("pallas-grader").pw_uid
seen, opened = set(), set()
while not select.select([sys.stdin], [], [], 0)[0]:
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            if os.stat(proc).st_uid != grader:
                continue
            seen.add(open(proc + "/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            continue
        for name in ("environ", "maps", "mem", "fd", "cwd", "root"):
            try:
                if os.path.isdir(proc + "/" + name) and name != "mem":
                    got = os.listdir(proc + "/" + name)
                else:
                    got = open(proc + "/" + name, "rb").read(1)
            except OSError:
                continue
            if got:
                opened.add(proc.rsplit("/", 1)[1] + "/" + name)
json.dump([sorted(seen), sorted(opened)], sys.stdout)
"""


def setup_class_watched(trace: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``setup_class(*args)`` under strace (every program it runs, with its arguments and
    environment, into ``trace``) while learner 2 polls /proc; the run and what she read."""
    poller = subprocess.Popen(["runuser", "-u", L2, "--", "python3", "-c", PROC_POLLER],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd="/tmp")
    try:
        res = setup_class_traced(trace, *args)
    finally:
        read, _ = poller.communicate("stop", timeout=120)
    return res, json.loads(read)


def setup_class_traced(trace: Path, *args: str) -> subprocess.CompletedProcess:
    """``setup_class`` under ``strace -f``; strace lets go of a service the script started
    (which outlives it) once the script itself has ended."""
    tracer = subprocess.Popen(
        ["strace", "-f", "-v", "-s", "65536", "-e", "trace=execve", "-o", str(trace),
         "bash", str(SETUP), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=RUN_FROM, env={**os.environ, "PALLAS_COURSE_SOURCE_VENV": sys.prefix})

    def script_exit() -> int | None:  # the script's status, from the trace's first process
        lines = trace.read_text().splitlines() if trace.exists() else []
        if not lines:
            return None
        ended = re.compile(rf"{lines[0].split()[0]}\s+\+\+\+ exited with (\d+)")
        return next((int(m[1]) for line in lines if (m := ended.match(line))), None)

    deadline = time.monotonic() + 900
    while tracer.poll() is None and script_exit() is None:
        assert time.monotonic() < deadline, "setup-class.sh did not end in 900 s"
        time.sleep(0.2)
    tracer.terminate()  # detaches from whatever is still traced
    try:
        out, err = tracer.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # still detaching on a loaded machine (2 of 10 runs
        tracer.kill()  # beside a CPU hog): its tracees go on untraced, as after terminate
        out, err = tracer.communicate(timeout=60)
    rc = script_exit()
    return subprocess.CompletedProcess(tracer.args, 1 if rc is None else rc, out, err)


def test_a_port_another_program_holds_stops_the_setup_before_it_makes_anything():
    """The hub takes --hub-port and the two ports above it: a program on one of those would
    answer in the hub's place (its pages, or a 404 for the hub's login) minutes later."""
    if ENV_FILE.exists():
        pytest.skip("a class is set up on this machine: the set-up would repair it, not stop")
    made = [ENV_FILE, PASSWORDS.parent, Path("/opt/pallas-course")]
    made_before = [p.exists() for p in made]
    hub_port = free_port(3)
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", hub_port + 1))
        other_program.listen()
        res = setup_class("--demo", "2", "--hub-port", str(hub_port),
                          "--dask-port", str(free_port()))
    assert res.returncode != 0
    assert f"port {hub_port + 1} (for hub) is taken by another program" in res.stderr
    assert "choose other ports with --hub-port" in res.stderr
    assert [p.exists() for p in made] == made_before


@pytest.fixture(scope="module")
def klass():
    if Path("/var/lib/pallas-course").exists() and not Path("/var/lib/pallas-course/demo").exists():
        pytest.skip("a class set up on this machine without --demo: not touching it")
    hub_port, dask_port = free_port(3), free_port()  # the hub takes hub_port + 0, 1, 2
    uids: dict[str, int] = {}
    try:
        res = setup_class("--demo", "2", "--hub-port", str(hub_port), "--dask-port",
                          str(dask_port))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
        # issue 52: psql, as postgres, could not enter the folder the script ran in
        assert "could not change directory" not in res.stdout + res.stderr
        first_run = res.stdout
        uids = {u: pwd.getpwnam(u).pw_uid for u in (TEACHER, L1, L2, "pallas-grader")}
        # what any account leaves in a shared temp folder (issue 35, item 13: --remove left
        # them to the next account given the uid)
        as_user(L2, "mkdir", "-p", f"/tmp/pallas-course-left-by-{L2}/inside")
        # idempotent: a second run changes nothing and succeeds; learner 2 watches /proc
        trace = Path(tempfile.mkdtemp(prefix="pallas-setup-trace-")) / "execve.log"
        res, read_by_learner2 = setup_class_watched(
            trace, "--demo", "2", "--hub-port", str(hub_port), "--dask-port", str(dask_port))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
        assert "could not change directory" not in res.stdout + res.stderr
        k = Class()
        k.rerun_trace, k.read_by_learner2 = trace.read_text(), read_by_learner2
        k.first_run, k.rerun = first_run, res.stdout
        shutil.rmtree(trace.parent)
        k.start_servers(TEACHER, L1, L2)
        yield k
    finally:
        res = setup_class("--remove")
        assert res.returncode == 0, res.stdout + res.stderr
        for u in (TEACHER, L1, L2, "pallas-grader"):
            assert subprocess.run(["id", u], capture_output=True).returncode != 0, u
        left = [str(p) for d in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(d).iterdir()
                if p.lstat().st_uid in uids.values()]
        assert left == [], left


def test_no_secret_on_a_command_line_or_in_an_environment(klass):
    """Issue 35, item 1: the script handed the gradebook's password to psql as ``-v pw=...``;
    learner 2, polling /proc/*/cmdline during a rerun, read it and rewrote her grade. Every
    program the rerun started (strace: arguments and environment) and everything learner 2
    read from /proc meanwhile is free of the gradebook's password and the demo passwords."""
    secrets = {Path("/var/lib/pallas-course/pgpass").read_text().strip().rsplit(":", 1)[1],
               *klass.passwords.values()}
    programs = [line for line in klass.rerun_trace.splitlines() if "execve(" in line]
    assert any("psql" in line for line in programs)  # the trace saw the password being set
    assert len(klass.read_by_learner2) > 10  # her poller ran (other accounts' command lines)
    for secret in secrets:
        assert not [line for line in programs if secret in line]
        assert not [text for text in klass.read_by_learner2 if secret in text]


def test_homes_are_private_and_a_readable_checkout_is_named(klass):
    """Issue 35, item 4: homes were 0755 (learner 2 copied learner 1's solved notebook), and the
    checkout the README installed from let every account read the solutions."""
    for u in (TEACHER, L1, L2):
        assert Path(f"/home/{u}").stat().st_mode & 0o777 == 0o700, u
    readable = subprocess.run(["runuser", "-u", "nobody", "--", "test", "-r",
                               str(REPO / "exercises" / "source")]).returncode == 0
    warning = f"WARNING: every account can read {REPO}"
    assert (warning in klass.first_run) == readable and (warning in klass.rerun) == readable


def test_the_course_code_is_compiled_for_the_accounts_that_cannot_write_beside_it(klass):
    """The grading and hub accounts cannot write __pycache__ beside the course's code: setup
    compiles grader/ and kernelsim/ in both of its trees (the instructors' and the learners'),
    under the path they are imported from (a traceback names it)."""
    for tree in (klass.venv.parent / "grading", klass.venv.parent / "learner"):
        for module in ("grader/jail/replay.py", "grader/jail/checker.py",
                       "grader/tasks/a01_first_kernel.py", "kernelsim/trace.py"):
            source = tree / module
            (compiled,) = source.parent.glob(f"__pycache__/{source.stem}.cpython-*.pyc")
            assert marshal.loads(compiled.read_bytes()[16:]).co_filename == str(source)


# what a learner runs to list the hidden cases her environment's grader/ holds (issue 52), and
# the visible ones beside them
COUNT_CASES = ("from grader import tasks; cases = [c for t in tasks.TASKS for c in t.cases]; "
               "print(sum(c.hidden for c in cases), sum(not c.hidden for c in cases))")
# what she reads of every file under the course's installation: each readable file of a tasks
# folder, the text of a module, the co_filename of a compiled one
READ_TASK_FILES = """
import json, marshal, os, sys
got = {}
for folder, _, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(folder, name)
        if "tasks" not in path.split(os.sep):
            continue
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        got[path] = (marshal.loads(data[16:]).co_filename if name.endswith(".pyc")
                     else data.decode(errors="replace"))
json.dump(got, sys.stdout)
"""


def test_a_learner_reads_no_hidden_case(klass):
    """Issue 52: the class's venv held the full grader/tasks/, and a learner listed 185 hidden
    cases of 54 tasks (shapes, dtypes, seeds). Now a learner's Python imports grader/ with the
    hidden cases cut out as the student copy cuts them (grader/learner/dist.py), no file she can
    open under the installation holds one (source or compiled), the full tasks are closed to
    her, and the grading account and an instructor import them whole."""
    from grader import tasks
    from grader.learner.dist import strip_hidden_cases

    k = klass
    py = str(k.venv / "bin" / "python")
    cases = [c for t in tasks.TASKS for c in t.cases]
    hidden, visible = sum(c.hidden for c in cases), sum(not c.hidden for c in cases)
    assert hidden > 100
    assert as_user(L2, py, "-c", COUNT_CASES).stdout.split() == ["0", str(visible)]
    for who in (TEACHER, "pallas-grader"):
        assert as_user(who, py, "-c", COUNT_CASES).stdout.split() == [str(hidden), str(visible)]
    full = k.venv.parent / "grading" / "grader" / "tasks"
    assert full.is_dir()
    for path in (full / "a01_first_kernel.py", full / "core.py"):
        res = as_user(L2, py, "-c", f"open({str(path)!r}).read()", check=False)
        assert res.returncode != 0 and "PermissionError" in res.stderr, res
    read = json.loads(as_user(L2, py, "-c", READ_TASK_FILES, str(k.venv.parent)).stdout)
    modules = {p: text for p, text in read.items() if p.endswith(".py")}
    assert len([t for t in modules.values() if "make_case(" in t]) >= 15  # the learners' tasks
    assert [p for p, text in modules.items() if strip_hidden_cases(text)[1]] == []
    compiled = {p: name for p, name in read.items() if p.endswith(".pyc")}
    assert compiled and [p for p, name in compiled.items() if name.startswith(str(full))] == []


def entries(k: Class, user: str) -> list[Path]:
    return sorted(k.exchange.joinpath("inbound").glob(f"{user}+{A}+*"))


def test_services_run_as_whom_they_should_on_loopback(klass):
    import psutil

    for conn in psutil.net_connections("inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid:
            name = " ".join(psutil.Process(conn.pid).cmdline())
            if str(klass.venv) in name or "configurable-http-proxy" in name:
                assert conn.laddr.ip == "127.0.0.1", (conn, name)
    users = {p.info["username"] for p in psutil.process_iter(["username", "cmdline"])
             if "dask" in " ".join(p.info["cmdline"] or [])
             and str(klass.venv) in " ".join(p.info["cmdline"] or [])}
    assert users == {"pallas-grader"}, users
    assert (klass.venv / "bin" / "python").resolve().is_relative_to("/opt/pallas-course")
    assert "teacher" not in klass.env and "password" not in ENV_FILE.read_text().lower()


# learner 2 asks every port given: an HTTP answer of any status is an answer
HTTP_PROBE = """
import sys, urllib.error, urllib.request
for port in sys.argv[1:]:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/info/main/workers.html", timeout=10)
        print("answered", port)
    except urllib.error.HTTPError:
        print("answered", port)
    except OSError:
        pass
"""


def test_nothing_of_dask_answers_http(klass):
    """Issue 35, item 12: the Dask scheduler and workers served their HTTP pages (workers,
    logs, exceptions) to any account on the machine, without TLS or a login."""
    import psutil

    ports = {c.laddr.port for c in psutil.net_connections("inet")
             if c.status == psutil.CONN_LISTEN and c.pid
             and psutil.Process(c.pid).username() == "pallas-grader"}
    assert int(klass.env["PALLAS_COURSE_SCHEDULER"].rsplit(":", 1)[1]) in ports
    res = as_user(L2, "python3", "-c", HTTP_PROBE, *map(str, sorted(ports)))
    assert "answered" not in res.stdout, res.stdout


def test_the_formgrader_tab_may_frame_the_instructors_own_formgrader(klass):
    """Issue 35, item 10: the Formgrader tab of JupyterLab (a frame of the same server's
    formgrader) was blank: the hub's servers answer ``frame-ancestors 'none'``. The
    instructor's server lets its own origin frame it; a learner's still lets nobody."""
    def policy(user: str, path: str) -> str:
        r = requests.get(f"{klass.url}/user/{user}/{path}", timeout=120,
                         headers={"Authorization": f"token {klass.tokens[user]}"})
        assert r.status_code == 200, (path, r.status_code)
        return r.headers["Content-Security-Policy"]

    assert policy(TEACHER, "formgrader").startswith("frame-ancestors 'self'")
    assert "frame-ancestors 'none'" in policy(L1, "api/status")


@pytest.fixture(scope="module")
def released(klass):
    """The class with assignment A released by the instructor (every test that needs it asks
    for it, so each passes run alone)."""
    klass.pallas(TEACHER, "release", A)
    return klass


def released_to_learners(k: Class) -> None:
    """Assignment A in the exchange for learners to fetch (the formgrader's Release), once."""
    if not (k.exchange / "outbound" / A).is_dir():
        res = k.api("POST", f"/user/{TEACHER}/formgrader/api/assignment/{A}/release", TEACHER)
        assert res["success"], res


def test_a_class_end_to_end_and_learner2_attacks(released):
    k = released
    released_to_learners(k)

    for learner, wrong in ((L1, False), (L2, True)):
        hand_in(k, learner, wrong)
    (l1_entry,) = entries(k, L1)
    py = str(k.venv / "bin" / "python")

    # ---- learner 2's attacks, as the Unix account demo-learner2
    def fails(code: str) -> None:
        res = as_user(L2, py, "-c", code, check=False)
        assert res.returncode != 0, f"learner 2 succeeded: {code}\n{res.stdout}"

    scheduler = k.env["PALLAS_COURSE_SCHEDULER"]
    fails(f"from distributed import Client; Client({scheduler!r}, timeout=10)")
    fails(f"from distributed import Client; "
          f"Client({scheduler.replace('tls://', 'tcp://')!r}, timeout=10)")
    for victim in (k.course / "submitted" / L1, k.course / "source", k.course / "status",
                   k.course / "autograded", k.course / "feedback", l1_entry,
                   k.exchange / "inbound", k.exchange / "feedback",
                   Path(f"/home/{TEACHER}/.pgpass"), Path("/var/lib/pallas-course/pgpass"),
                   Path(f"/home/{L1}"), Path(f"/home/{L1}/{COURSE_ID}/{A}"),
                   Path("/var/lib/pallas-course/tls/dask.key")):
        fails(f"import os; p = {str(victim)!r}; "
              f"os.listdir(p) if os.path.isdir(p) else open(p).read()")
    nb_name = next(p.name for p in l1_entry.glob("*.ipynb"))
    fails(f"open({str(l1_entry / nb_name)!r}, 'a').write(' ')")
    fails(f"open({str(l1_entry / 'extra.ipynb')!r}, 'w').write('{{}}')")
    fails(f"import os; os.rename({str(l1_entry)!r}, {str(l1_entry) + 'x'!r})")
    # an entry in learner 1's name (a blank notebook, a forged early time) and one of learner 2's
    # own with a link to the instructor's source and a forged timestamp: all made as learner 2
    forged = k.exchange / "inbound" / f"{L1}+{A}+2000-01-01 00:00:00.000000 UTC+forged"
    as_user(L2, py, "-c", f"""
import os, shutil
os.mkdir({str(forged)!r}); os.chmod({str(forged)!r}, 0o2770)
open(os.path.join({str(forged)!r}, {nb_name!r}), 'w').write('{{"cells": []}}')
open(os.path.join({str(forged)!r}, 'timestamp.txt'), 'w').write('2099-01-01 00:00:00.000000 UTC')
""")
    (l2_entry,) = entries(k, L2)
    src_nb = next((k.course / "source" / A).glob("*.ipynb"))
    as_user(L2, "sh", "-c", f"ln -s {src_nb} '{l2_entry}/solution.ipynb'; "
            f"echo '2000-01-01 00:00:00.000000 UTC' > '{l2_entry}/timestamp.txt'")

    before = time.time()
    res = k.api("POST", f"/user/{TEACHER}/formgrader/api/assignment/{A}/collect", TEACHER)
    assert res["success"], res
    sub = k.course / "submitted"
    assert sorted(p.name for p in sub.iterdir()) == [L1, L2]
    # learner 1's own notebook, not the forged one; no link followed; the server's clock
    assert json.loads(next((sub / L1 / A).glob("*.ipynb")).read_text())["cells"]
    assert not (sub / L2 / A / "solution.ipynb").exists()
    for u in (L1, L2):
        stamp = (sub / u / A / "timestamp.txt").read_text()
        assert stamp.startswith(time.strftime("%Y-", time.gmtime(before))), stamp
    assert "names demo-learner1 but was made by demo-learner2" in res["log"], res["log"][-2000:]

    # learner 2 reads what /proc shows her of the grading account's processes while they grade
    poller = subprocess.Popen(["runuser", "-u", L2, "--", "python3", "-c", PROC_OF_GRADING],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd="/tmp")
    try:
        res = k.pallas(TEACHER, "autograde", A, "--scheduler", scheduler)
    finally:
        seen, opened = json.loads(poller.communicate("stop", timeout=120)[0])
    assert f"on the Dask cluster at {scheduler}" in res.stdout
    assert any("grader.jail.replay" in line for line in seen), seen  # she saw it grade
    assert opened == [], opened
    # the hidden checks were graded from the hidden cases (the instructors' grader/ and refs)
    graded = json.loads(next((k.course / "autograded" / L1 / A).glob("*.ipynb")).read_text())
    assert re.search(r"[1-9][0-9]* hidden case\(s\) passed", json.dumps(graded)), graded
    status = json.loads((k.course / "status" / A / f"{L1}.json").read_text())
    assert status["status"] == "graded" and status.get("isolation") == "jail", status
    # the grading account's runs count their processes in the cgroup folder the set-up handed it
    assert status.get("process_limit") == ("cgroup" if pids_cgroup.hierarchy() else "none")

    # issue 35, item 6: the instructor grades learner 1 again over what the grading account
    # wrote, without a scheduler and from the formgrader (PermissionError on its 2755 folders)
    graded_nb = k.course / "autograded" / L1 / A / nb_name
    k.pallas(TEACHER, "autograde", A, "--student", L1)
    assert graded_nb.is_file()
    assert json.loads((k.course / "status" / A / f"{L1}.json").read_text())["status"] == "graded"
    res = k.api("POST", f"/user/{TEACHER}/formgrader/api/submission/{A}/{L1}/autograde", TEACHER)
    assert res["success"], res.get("error")
    assert graded_nb.is_file()
    for p in (k.course / "autograded", k.course / "status"):
        for made in (p, *p.rglob("*")):
            assert made.stat().st_mode & 0o060 == 0o060, (made, oct(made.stat().st_mode))

    # one instructor step: the command makes the feedback and releases it to the exchange
    res = k.pallas(TEACHER, "feedback", A)
    assert "released to the exchange" in res.stdout, res.stdout
    for learner in (L1, L2):
        k.api("POST", f"/user/{learner}/assignments/fetch_feedback", learner,
              json={"course_id": COURSE_ID, "assignment_id": A})
        got = list(Path(f"/home/{learner}/{COURSE_ID}/{A}/feedback").rglob("*.html"))
        assert len(got) == 1, got
    rows = k.exported("class")
    assert {u: (float(r["score"]), r["status"]) for u, r in rows.items()} == \
        {L1: (9.0, "graded"), L2: (6.0, "graded")}, rows

    # the class report: learner 2's wrong first task shows as one of two passing it
    report = Path("/tmp") / f"pallas-class-{os.getpid()}.html"
    try:
        k.pallas(TEACHER, "report", A, "--to", str(report))
        page = report.read_text()
    finally:
        report.unlink(missing_ok=True)
    assert "graded 2" in page and "<td>1 / 2</td>" in page and "<td>2 / 2</td>" in page, page
    assert "CheckFailed: " in page  # the most frequent failure of the task learner 2 failed


def peak_memory(user: str) -> int:
    """The peak resident memory (bytes) of ``user``'s Jupyter server, the formgrader's
    process."""
    import psutil

    (server,) = [p for p in psutil.process_iter(["username", "cmdline"])
                 if p.info["username"] == user and "jupyterhub-singleuser" in
                 " ".join(p.info["cmdline"] or [])]
    status = Path(f"/proc/{server.pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)[1]) * 1024


def test_an_entry_of_20000_files_and_1_2_gb_costs_nobody_their_grading(released):
    """Issue 52, the blocker: learner 1 fills her entry with 20,000 small files and 1.2 GB beside
    her notebook. The formgrader's Collect read it all into memory and copied it, and grading
    it slowed as the square of its files, then stopped the class's grading. Collect takes her
    notebook alone, says what it left, the formgrader's memory stays where it was, and the
    batch on the Dask cluster grades her."""
    k = released
    released_to_learners(k)
    hand_in(k, L1, wrong=False)
    entry = max(entries(k, L1), key=lambda p: p.stat().st_ctime)  # the one just handed in
    as_user(L1, str(k.venv / "bin" / "python"), "-c", f"""
import os
entry = {str(entry)!r}
os.mkdir(os.path.join(entry, "junk"))
for i in range(20_000):
    with open(os.path.join(entry, "junk", f"{{i}}.txt"), "w") as f:
        f.write("x")
for i in range(40):  # 30 MB each, sparse: 1.2 GB to read, no disk used
    with open(os.path.join(entry, f"big{{i}}.ipynb"), "wb") as f:
        f.truncate(30 << 20)
""")
    before = peak_memory(TEACHER)
    res = k.api("POST", f"/user/{TEACHER}/formgrader/api/assignment/{A}/collect", TEACHER)
    assert res["success"], res
    nb_name = next((k.course / "release" / A).glob("*.ipynb")).name
    assert sorted(p.name for p in (k.course / "submitted" / L1 / A).iterdir()) == [
        nb_name, "submission_secret.txt", "timestamp.txt"]
    # the 41 planted beside what the assignment's folder held when she submitted (refs/)
    # the entry just handed in (the log names earlier tests' entries too)
    left = re.findall(r"(\d+) other file\(s\) or folder\(s\) not collected", res["log"])
    assert left and max(map(int, left)) >= 41, res["log"][-2000:]
    grew = peak_memory(TEACHER) - before
    assert grew < 100 << 20, f"the formgrader's peak memory grew by {grew:,} bytes"

    k.pallas(TEACHER, "autograde", A, "--student", L1, "--scheduler",
             k.env["PALLAS_COURSE_SCHEDULER"])
    status = json.loads((k.course / "status" / A / f"{L1}.json").read_text())
    assert status["status"] == "graded", status
    assert float(k.exported("entry-of-20000")[L1]["score"]) == 9.0


def test_gradebook_restart_mid_batch_costs_no_grade(released):
    """PostgreSQL restarts while a batch grades on the Dask cluster: a submission that could not
    reach the gradebook is retried, then ``error`` (never a 0); ``--resume`` grades the rest."""
    k = released
    src = next((k.course / "source" / A).glob("*.ipynb"))
    students = [f"restart{i}" for i in range(4)]
    for s in students:
        d = k.course / "submitted" / s / A
        d.mkdir(parents=True)
        shutil.copy(src, d / src.name)
        (d / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
        for p in (d.parent, d):
            shutil.chown(p, "root", "pallas-instructors")
            p.chmod(0o2770)
        for p in d.iterdir():
            shutil.chown(p, "root", "pallas-instructors")
            p.chmod(0o660)
    version, name = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True,
                                   check=True).stdout.split()[:2]
    scheduler = k.env["PALLAS_COURSE_SCHEDULER"]
    env = {key: k.env[key] for key in ("PALLAS_COURSE_ROOT", "PALLAS_COURSE_EXCHANGE",
                                       "PALLAS_COURSE_DB", "DASK_CONFIG")}
    batch = subprocess.Popen(
        ["runuser", "-u", TEACHER, "--", "env", "-i", "PATH=/usr/bin:/bin",
         f"HOME=/home/{TEACHER}", *(f"{a}={b}" for a, b in env.items()),
         str(k.venv / "bin" / "pallas-course"), "autograde", A, "--scheduler", scheduler],
        cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status = k.course / "status" / A
    try:
        while not any((status / f"{s}.json").exists() for s in students):
            assert batch.poll() is None, batch.communicate()
            time.sleep(0.2)
        subprocess.run(["pg_ctlcluster", version, name, "restart"], check=True, timeout=120)
        out, err = batch.communicate(timeout=900)
    finally:
        if batch.poll() is None:
            batch.kill()
    first = {s: json.loads((status / f"{s}.json").read_text()) for s in students}
    # pytest cuts a long assertion message: each record's status and reason, in full
    assert {r["status"] for r in first.values()} <= {"graded", "error"}, "\n".join(
        [f"{s}: {r['status']}: {r.get('detail')}\n{r.get('log', '')[-2000:]}"
         for s, r in first.items()] + [out[-2000:], err[-3000:]])

    res = k.pallas(TEACHER, "autograde", A, "--scheduler", scheduler, "--resume")
    assert "crashed" not in res.stdout, res.stdout
    final = {s: json.loads((status / f"{s}.json").read_text())["status"] for s in students}
    assert set(final.values()) == {"graded"}, final
    rows = k.exported("restart")
    assert {s: float(rows[s]["score"]) for s in students} == dict.fromkeys(students, 9.0)
    if L1 in rows:  # the end-to-end test ran first: learner 1's grade, after all, unchanged
        assert float(rows[L1]["score"]) == 9.0


def test_feedback_reaches_the_exchange_beside_work_collected_from_a_folder(released):
    """Issue 35, item 5: one submission collected from a folder (``pallas-course collect DIR``,
    no submission secret) made nbgrader's release of feedback stop for the whole class."""
    k = released
    papers = Path(tempfile.mkdtemp(prefix="pallas-papers-"))
    try:
        d = papers / "paper1" / A
        d.mkdir(parents=True)
        shutil.copy(next((k.course / "release" / A).glob("*.ipynb")), d)
        subprocess.run(["chown", "-R", TEACHER, str(papers)], check=True)
        k.pallas(TEACHER, "collect", str(papers))
    finally:
        shutil.rmtree(papers)
    k.pallas(TEACHER, "autograde", A, "--student", "paper1", "--scheduler",
             k.env["PALLAS_COURSE_SCHEDULER"], check=False)  # a blank notebook: 0 points
    res = k.pallas(TEACHER, "feedback", A)
    assert "released to the exchange" in res.stdout, res.stdout
    assert "not released for paper1: its submission was collected from a folder" in res.stdout
    assert str(k.course / "feedback" / "paper1" / A) in res.stdout


WATCHER_LOG = Path("/var/lib/pallas-course/log/grade-on-submit.log")


def feedback_pages(learner: str) -> set[Path]:
    """The feedback pages ``learner`` has fetched from the exchange, through the hub."""
    return set(Path(f"/home/{learner}/{COURSE_ID}/{A}/feedback").rglob("*.html"))


def watcher_steps(k: Class) -> int:
    """How many looks at the exchange the watcher has finished."""
    seen = k.course / "grade_on_submit.seen"
    return json.loads(seen.read_text())["steps"] if seen.exists() else 0


def test_grading_on_submit(released):
    """With grading on submit turned on, a learner submits through the hub and, without the
    instructor running anything, her feedback arrives in the exchange and her grade in the
    gradebook; a classmate's entry forged in another learner's name is refused; turned off, a
    submission waits for the instructor. Nothing secret on the watcher's command line or in
    its environment."""
    k = released
    released_to_learners(k)
    res = k.pallas(TEACHER, "grade-on-submit")
    assert "grading on submit is off" in res.stdout, res.stdout  # off by default
    res = k.pallas(TEACHER, "grade-on-submit", A)
    assert f"grading on submit is on for {A}" in res.stdout, res.stdout
    # learner 2 forges an entry in learner 1's name (who submits nothing here), then submits
    forged = k.exchange / "inbound" / f"{L1}+{A}+2000-01-01 00:00:00.000000 UTC+on-submit"
    as_user(L2, "sh", "-c", f"mkdir -m 2770 '{forged}' && echo '{{}}' > '{forged}/x.ipynb'")
    l1_collected = k.course / "submitted" / L1 / A / "timestamp.txt"
    l1_before = l1_collected.read_text() if l1_collected.exists() else None
    l2_collected = k.course / "submitted" / L2 / A / "timestamp.txt"
    before = feedback_pages(L2)
    hand_in(k, L2, wrong=False)
    # the watcher's deadline is a minute; this one only ends the wait for a broken one
    deadline = time.monotonic() + 60 + 120
    while True:
        k.api("POST", f"/user/{L2}/assignments/fetch_feedback", L2,
              json={"course_id": COURSE_ID, "assignment_id": A})
        if feedback_pages(L2) - before:
            break
        assert time.monotonic() < deadline, WATCHER_LOG.read_text()[-5000:]
        time.sleep(2)
    log = WATCHER_LOG.read_text()
    assert f"{L2}/{A}: collected the submission" in log, log[-5000:]
    assert f"{L2}/{A}: feedback released to the exchange for {L2}" in log, log[-5000:]
    # found, refused and left alone, in the look that took learner 2's submission
    assert f"{forged.name}' names {L1} but was made by {L2}: refused" in log, log[-5000:]
    assert not [line for line in log.splitlines() if line.split(" ", 2)[-1].startswith(
        f"{L1}/{A}: ") and "refused" not in line], log[-5000:]
    assert (l1_collected.read_text() if l1_collected.exists() else None) == l1_before
    (page,) = feedback_pages(L2) - before
    assert "(Score: 9.0 / 9.0)" in page.read_text()  # the resubmission's, solved
    rows = k.exported("on-submit")
    assert (float(rows[L2]["score"]), rows[L2]["status"]) == (9.0, "graded"), rows[L2]

    # the attacker's view of the watcher and the grading it starts: no secret in /proc
    import psutil

    secrets = {Path("/var/lib/pallas-course/pgpass").read_text().strip().rsplit(":", 1)[1],
               *k.passwords.values()}
    pid = int(Path("/var/lib/pallas-course/run/grade-on-submit.pid").read_text())
    watcher = psutil.Process(pid)
    assert watcher.username() == "pallas-grader" and "watch" in watcher.cmdline()
    for proc in (watcher, *watcher.children(recursive=True)):  # its nbgrader worker too
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_text(errors="replace")  # as root
        except FileNotFoundError:  # ended meanwhile
            continue
        assert not [s for s in secrets if s in environ]
        seen = as_user(L2, "cat", f"/proc/{proc.pid}/cmdline", check=False).stdout
        assert not [s for s in secrets if s in seen]
        assert as_user(L2, "cat", f"/proc/{proc.pid}/environ", check=False).returncode != 0

    # turned off: a new submission is not collected, whatever the watcher looks at meanwhile
    res = k.pallas(TEACHER, "grade-on-submit", A, "--off")
    assert "grading on submit is off" in res.stdout, res.stdout
    collected, handed_in = l2_collected.read_text(), len(entries(k, L2))
    hand_in(k, L2, wrong=True)
    assert len(entries(k, L2)) == handed_in + 1  # in the exchange, for the instructor
    steps = watcher_steps(k)
    deadline = time.monotonic() + 120
    while watcher_steps(k) < steps + 2:  # a whole look begun after the submission
        assert time.monotonic() < deadline, WATCHER_LOG.read_text()[-5000:]
        time.sleep(1)
    assert l2_collected.read_text() == collected


def test_an_instructor_added_later_gets_the_formgrader_after_a_rerun(klass):
    """Issue 35, item 9: the hub read the instructors' group when it started, and rerunning the
    script (README, step 3) did not restart it: a new instructor's formgrader answered 404.
    Last in this module: the rerun restarts the hub, which stops the servers running."""
    k, ta = klass, "demo-ta"
    hub_port = int(k.url.rsplit(":", 1)[1])
    dask_port = k.env["PALLAS_COURSE_SCHEDULER"].rsplit(":", 1)[1]
    subprocess.run(["useradd", "--create-home", "-K", "HOME_MODE=0700", "--shell", "/bin/bash",
                    "-G", "pallas-instructors", ta], check=True)
    k.passwords[ta] = os.urandom(12).hex()
    subprocess.run(["chpasswd"], input=f"{ta}:{k.passwords[ta]}", text=True, check=True)
    res = setup_class("--demo", "2", "--hub-port", str(hub_port), "--dask-port", dask_port)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "restarting the hub" in res.stdout and ta in res.stdout, res.stdout
    deadline = time.monotonic() + 60  # the proxy answers before the hub has added its route
    while requests.get(f"{k.url}/hub/api/", timeout=60).status_code != 200:
        assert time.monotonic() < deadline, "the restarted hub does not answer"
        time.sleep(0.5)
    k.login(ta)
    k.api("POST", f"/hub/api/users/{ta}/server", ta)
    deadline = time.monotonic() + 240
    while not k.api("GET", f"/hub/api/users/{ta}", ta)["servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"{ta}'s server did not start"
        time.sleep(1)
    assert isinstance(k.api("GET", f"/user/{ta}/formgrader/api/assignments", ta), list)
