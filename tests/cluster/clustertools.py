"""Real services on 127.0.0.1 for the tests and the benchmark: a PostgreSQL server (Debian's
package, temporary data folder), a Dask scheduler and workers (separate processes), JupyterHub;
and a fresh course folder to grade in.

Each service is started by its constructor and stopped, with every process it started, by
``close()``. (A module name of its own: test modules cannot import from ``conftest``, whose name
every test folder shares.)
"""

from __future__ import annotations

import copy
import glob
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
