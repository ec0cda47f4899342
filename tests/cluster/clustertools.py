"""Real services on 127.0.0.1 for the tests and the benchmark: a PostgreSQL server (Debian's
package, temporary data folder), a Dask scheduler and workers (separate processes), JupyterHub;
and a fresh course folder to grade in.

Each service is started by its constructor and stopped, with every process it started, by
``close()``. (A module name of its own: test modules cannot import from ``conftest``, whose name
every test folder shares.)
"""

from __future__ import annotations

import copy
import csv
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import requests
from sitetools import free_port

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
A = "01_first_kernel"
# the Dask settings a class's scheduler and workers run with (deploy/setup-class.sh installs them)
DASK_GRADING_CONFIG = REPO / "deploy" / "dask" / "grading.yaml"
# learner cells get this many seconds instead of 60: a dying or looping submission ends sooner
LEARNER_CELL_TIMEOUT = "5"


def new_course(dest: Path) -> Path:
    """A course folder like exercises/ (config, sources, reference cases), not yet released."""
    dest.mkdir(parents=True)
    for name in ("source", "refs"):
        shutil.copytree(REPO / "exercises" / name, dest / name,
                        ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", dest)
    return dest


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}:\n"
                               f"{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s:\n"
                       f"{log.read_text()[-3000:]}")


def spawn(argv: list, log: Path, **kw) -> subprocess.Popen:
    """A service process in a session of its own, its output in ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **kw)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL, grace: float = 10) -> None:
    """Signal ``proc``'s process group, wait for it, then SIGKILL whatever it started that is
    still alive (a child in a session of its own, a reparented grandchild)."""
    kids = descendants(proc.pid)
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for p in kids:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(kids, timeout=10)


class Postgres:
    """A PostgreSQL server in a temporary data folder, on 127.0.0.1, trusting local logins.

    initdb refuses root: run as root, the server runs as the ``postgres`` account (made by
    Debian's package), else as ``nobody``.
    """

    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not bins:
            raise RuntimeError("PostgreSQL is not installed (make system-packages installs it)")
        self.bin = Path(bins[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="pallas-course-pg-"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            name = "postgres" if _has_user("postgres") else "nobody"
            pw = pwd.getpwnam(name)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.as_user = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                            "--clear-groups", "--"]
        data = self.dir / "data"
        self._run(self.bin / "initdb", "-D", data, "-U", "pallas", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        self._run(self.bin / "pg_ctl", "-D", data, "-l", self.dir / "server.log", "-w", "-t", "60",
                  "-o", f"-h 127.0.0.1 -p {self.port} -k {self.dir} -F", "start")

    def _run(self, *argv) -> None:
        res = subprocess.run([*self.as_user, *map(str, argv)], capture_output=True, text=True,
                             cwd=self.dir, check=False)
        if res.returncode:
            log = self.dir / "server.log"
            raise RuntimeError(f"{argv[0]} failed ({res.returncode}): {res.stderr}{res.stdout}"
                               + (log.read_text()[-2000:] if log.exists() else ""))

    def database(self, name: str) -> str:
        """Create database ``name``; its URL (nbgrader's db_url)."""
        self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", self.port, "-U", "pallas", name)
        return f"postgresql://pallas@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        try:
            self._run(self.bin / "pg_ctl", "-D", self.dir / "data", "-m", "immediate", "-w",
                      "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def tls_certificates(d: Path) -> dict[str, str]:
    """A certificate authority and one key pair it signed, as deploy/setup-class.sh makes them;
    Dask's client settings for them (``dask.config.set``)."""
    d.mkdir(parents=True, exist_ok=True)
    ca, cert, key = d / "ca.pem", d / "dask.pem", d / "dask.key"
    for argv in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca",
             "-keyout", d / "ca.key", "-out", ca],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=dask", "-keyout", key,
             "-out", d / "dask.csr"],
            ["x509", "-req", "-in", d / "dask.csr", "-CA", ca, "-CAkey", d / "ca.key",
             "-CAcreateserial", "-days", "2", "-out", cert]):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
    return {"distributed.comm.require-encryption": True,
            "distributed.comm.tls.ca-file": str(ca),
            "distributed.comm.tls.client.cert": str(cert),
            "distributed.comm.tls.client.key": str(key)}


class DaskCluster:
    """``dask scheduler`` and ``dask worker --nthreads 1`` processes, as deploy/README.md
    starts them on a class's machines, with its Dask settings (``DASK_GRADING_CONFIG``);
    ``env`` is added to the workers' environment. With
    ``tls``, they speak TLS only (certificates of ``tls_certificates``); ``client_config`` is
    what a client needs (``dask.config.set``)."""

    def __init__(self, workers: int, logs: Path, env: dict[str, str] | None = None,
                 tls: bool = False):
        environ = {**os.environ, "DASK_CONFIG": str(DASK_GRADING_CONFIG)}
        self.logs, self.env = logs, {**environ, **(env or {})}
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.tls_args: list = []
        self.client_config: dict = {}
        if tls:
            self.client_config = tls_certificates(logs / "tls")
            self.tls_args = ["--tls-ca-file", self.client_config["distributed.comm.tls.ca-file"],
                             "--tls-cert", self.client_config["distributed.comm.tls.client.cert"],
                             "--tls-key", self.client_config["distributed.comm.tls.client.key"]]
        self.address = f"{'tls' if tls else 'tcp'}://127.0.0.1:{port}"
        self.scheduler = spawn([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", port,
                                "--no-dashboard", *(["--protocol", "tls"] if tls else []),
                                *self.tls_args], logs / "scheduler.log", env=environ)
        self.workers: list[subprocess.Popen] = []
        try:
            wait_for_port(port, self.scheduler, logs / "scheduler.log")
            for _ in range(workers):
                self.add_worker(wait=False)
            self.wait_for_workers(workers)
        except BaseException:
            self.close()
            raise

    def add_worker(self, wait: bool = True, wrapper: list[str] = ()) -> subprocess.Popen:
        """One more worker; ``wrapper`` is a command line it runs under (``wrapper + argv``)."""
        n = len(self.workers)
        proc = spawn([*wrapper, BIN / "dask", "worker", self.address, "--host", "127.0.0.1",
                      "--nthreads", "1", "--no-dashboard", "--name", f"w{n}", *self.tls_args],
                     self.logs / f"worker{n}.log", env=self.env)
        self.workers.append(proc)
        if wait:
            self.wait_for_workers(sum(p.poll() is None for p in self.workers))
        return proc

    def wait_for_workers(self, n: int, timeout: float = 120) -> None:
        import dask
        from distributed import Client

        with dask.config.set(self.client_config), Client(self.address, timeout="30s") as client:
            client.wait_for_workers(n, timeout=timeout)

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            kill_tree(proc, signal.SIGTERM)


class Hub:
    """JupyterHub on 127.0.0.1 with deploy/jupyterhub/jupyterhub_config.py, a test login
    (DummyAuthenticator), servers as local processes (SimpleLocalProcessSpawner: one Unix account
    for all, a home folder each) and an admin API token for the test."""

    def __init__(self, workdir: Path, course: Path, learners: list[str],
                 instructors: list[str], deploy_config: Path):
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port, hub_port, api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = os.urandom(16).hex()
        (workdir / "jupyterhub_config.py").write_text(f"""
c = get_config()
load_subconfig({str(deploy_config)!r})
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home" / "{username}")!r}
c.Spawner.ip = "127.0.0.1"
c.Spawner.args = {["--allow-root"] if os.geteuid() == 0 else []!r}  # one account for all here
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.JupyterHub.bind_url = {self.url!r}
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.JupyterHub.services = [{{"name": "test-driver", "api_token": {self.token!r}}}]
c.JupyterHub.load_roles = [{{"name": "test-driver", "services": ["test-driver"],
                            "scopes": ["admin:users", "admin:servers", "tokens", "list:users",
                                       "read:users", "read:groups"]}}]
""")
        env = {**os.environ, "PALLAS_COURSE_ROOT": str(course),
               "PALLAS_COURSE_INSTRUCTORS": ",".join(instructors),
               "PALLAS_COURSE_LEARNERS": ",".join(learners),
               "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.proc = spawn([BIN / "jupyterhub", "-f", workdir / "jupyterhub_config.py"],
                          workdir / "hub.log", cwd=workdir, env=env)
        try:
            wait_for_port(self.port, self.proc, workdir / "hub.log")
            deadline = time.monotonic() + 60
            while True:  # the proxy answers before the hub has added its route
                try:
                    self.api("GET", "/hub/api/")
                    break
                except RuntimeError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.5)
        except BaseException:
            self.close()
            raise

    def api(self, method: str, path: str, token: str | None = None, **kw):
        """A request to the hub (``/hub/api/...``) or, through its proxy, a user's server."""
        import requests

        headers = {"Authorization": f"token {token or self.token}"}
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.request(method, self.url + path, headers=headers, timeout=120, **kw)
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:2000]}")
        try:  # nbgrader's handlers answer JSON without saying so
            return r.json()
        except ValueError:
            return r

    def close(self) -> None:
        kill_tree(self.proc, signal.SIGTERM, grace=30)


def solved(nb: dict, source: dict, wrong: bool) -> dict:
    """The learner's notebook with the instructor's solutions typed in (``wrong``: the first
    task's results doubled)."""
    sol = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in source["cells"]
           if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in sol:
            cell["source"] = sol[gid]
            if wrong and gid == "add_solution":
                cell["source"] += "\n_orig = add\nadd = lambda *a, **k: _orig(*a, **k) * 2\n"
    return nb


# ---- the class deploy/setup-class.sh --demo N makes on this machine (root, Debian): real
# accounts with PAM passwords, the hub, the exchange, Dask over TLS and PostgreSQL

SETUP = REPO / "deploy" / "setup-class.sh"
ENV_FILE = Path("/etc/pallas-course/class.env")
PASSWORDS = Path("/var/lib/pallas-course/demo-passwords")
COURSE_ID = "pallas-course"
L1, L2, TEACHER = "demo-learner1", "demo-learner2", "demo-instructor"
NEEDS_ROOT_AND_CLASS_PACKAGES = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("pg_lsclusters") is None
    or shutil.which("configurable-http-proxy") is None,
    reason="needs root, Debian's PostgreSQL and configurable-http-proxy (make system-packages)")


def as_user(user: str, *argv: str, env: dict | None = None, check: bool = True,
            cwd: str = "/tmp") -> subprocess.CompletedProcess:
    """``argv`` as the Unix account ``user`` (its groups, no root)."""
    res = subprocess.run(["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin",
                          f"HOME=/home/{user}", "LANG=C.UTF-8",
                          *(f"{k}={v}" for k, v in (env or {}).items()), *argv],
                         capture_output=True, text=True, timeout=900, cwd=cwd, check=False)
    if check:
        assert res.returncode == 0, f"{argv}: {res.returncode}\n{res.stdout[-3000:]}" \
                                    f"\n{res.stderr[-3000:]}"
    return res


class Class:
    """The class set up on this machine (``ENV_FILE``): its hub, course, exchange and the demo
    accounts' passwords; a hub API token for each account that logged in."""

    def __init__(self):
        self.env = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines())
        self.url = self.env["PALLAS_COURSE_HUB"]
        self.venv = Path(self.env["PALLAS_COURSE_VENV"])
        self.course = Path(self.env["PALLAS_COURSE_ROOT"])
        self.exchange = Path(self.env["PALLAS_COURSE_EXCHANGE"]) / COURSE_ID
        self.passwords = dict(line.split() for line in PASSWORDS.read_text().splitlines())
        self.tokens: dict[str, str] = {}

    def login(self, user: str) -> str:
        """Log in through PAM (the hub's login form), then take an API token with the password."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=60)
        r = s.post(f"{self.url}/hub/login", timeout=120, allow_redirects=False,
                   data={"username": user, "password": self.passwords[user],
                         "_xsrf": s.cookies.get("_xsrf")})
        assert r.status_code == 302, (r.status_code, r.text[:500])
        r = requests.post(f"{self.url}/hub/api/users/{user}/tokens", timeout=120,
                          json={"auth": {"username": user, "password": self.passwords[user]},
                                "note": "test", "expires_in": 3600})
        assert r.status_code == 201, (r.status_code, r.text[:500])
        self.tokens[user] = r.json()["token"]
        return self.tokens[user]

    def start_servers(self, *users: str) -> None:
        """Log each of ``users`` in and start their servers; wait until all are ready."""
        deadline = time.monotonic() + 60  # the proxy answers before the hub has added its route
        while requests.get(f"{self.url}/hub/api/", timeout=60).status_code != 200:
            assert time.monotonic() < deadline, "the hub does not answer"
            time.sleep(0.5)
        for u in users:
            self.login(u)
            self.api("POST", f"/hub/api/users/{u}/server", u)
        deadline = time.monotonic() + 240
        for u in users:
            while not self.api("GET", f"/hub/api/users/{u}", u)["servers"].get("", {}).get("ready"):
                assert time.monotonic() < deadline, f"{u}'s server did not start"
                time.sleep(1)

    def api(self, method: str, path: str, user: str, **kw):
        r = requests.request(method, self.url + path, timeout=300,
                             headers={"Authorization": f"token {self.tokens[user]}"}, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:2000]}")
        try:
            return r.json()
        except ValueError:
            return r

    def pallas(self, user: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        keys = ("PALLAS_COURSE_ROOT", "PALLAS_COURSE_EXCHANGE", "PALLAS_COURSE_DB", "DASK_CONFIG")
        return as_user(user, str(self.venv / "bin" / "pallas-course"), *args, check=check,
                       env={k: self.env[k] for k in keys} | {"PALLAS_COURSE_CELL_TIMEOUT": "5"})

    def exported(self, name: str) -> dict[str, dict]:
        """The instructor's ``pallas-course export`` by student id, through a CSV file in /tmp
        (which the instructor can write) named for ``name`` and removed after."""
        out = Path("/tmp") / f"pallas-{name}-{os.getpid()}.csv"
        try:
            self.pallas(TEACHER, "export", "--to", str(out))
            return {r["student_id"]: r for r in csv.DictReader(out.open())}
        finally:
            out.unlink(missing_ok=True)


# where the script is run from: a folder only root may enter, as root's home is (issue 52: psql,
# as postgres, said "could not change directory" on every run from one)
RUN_FROM = tempfile.mkdtemp(prefix="pallas-setup-cwd-")  # mode 0700


def setup_class(*args: str) -> subprocess.CompletedProcess:
    """``deploy/setup-class.sh *args`` as root, the course's environment from this venv."""
    return subprocess.run(["bash", str(SETUP), *args], capture_output=True, text=True,
                          timeout=900, check=False, cwd=RUN_FROM,
                          env={**os.environ, "PALLAS_COURSE_SOURCE_VENV": sys.prefix})


def hand_in(k: Class, learner: str, wrong: bool) -> None:
    """``learner`` fetches assignment A (first time only), types in the solutions (``wrong``:
    the first task's wrong) and submits, all through the hub."""
    base = f"/user/{learner}"
    folder = f"{base}/api/contents/{COURSE_ID}/{A}"
    if not Path(f"/home/{learner}/{COURSE_ID}/{A}").is_dir():
        k.api("POST", f"{base}/assignments/fetch", learner,
              json={"course_id": COURSE_ID, "assignment_id": A})
    source = json.loads(next((k.course / "source" / A).glob("*.ipynb")).read_text())
    (name,) = [f["name"] for f in k.api("GET", folder, learner)["content"]
               if f["name"].endswith(".ipynb")]
    nb = k.api("GET", f"{folder}/{name}", learner)["content"]
    k.api("PUT", f"{folder}/{name}", learner, json={"type": "notebook", "format": "json",
                                                    "content": solved(nb, source, wrong)})
    res = k.api("POST", f"{base}/assignments/submit", learner,
                json={"course_id": COURSE_ID, "assignment_id": A})
    assert "success" not in res or res["success"], res
