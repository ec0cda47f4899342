"""Build the mkdocs site when its sources changed, and serve it beside JupyterLab.

``serve`` answers at once: the site from an in-process static server (a "being built" page
that reloads itself until ``build/site`` exists; a stale site is rebuilt behind it into
``build/site.next`` and swapped in), and JupyterLab as a child process in its own session,
rooted at the learner's workspace (``pallas-course workspace``) with nbgrader's instructor
extensions (formgrader, create assignment, course list) switched off by ``site/jupyter/``.
The two URLs are the last thing printed, in a box; JupyterLab's and the build's logs go to
``build/logs/``. On Ctrl-C (SIGINT) or SIGTERM it stops everything and returns.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from grader.learner.check import WORKSPACE_ENV
from grader.website import shipped_lessons

REPO = Path(__file__).resolve().parents[2]
SITE_DIR = REPO / "build" / "site"
SITE_SOURCES = ("mkdocs.yml", "site", "lessons", "exercises/source", "exercises/release",
                "kernelsim")
# JupyterLab reads <dir>/labconfig/*.json and <dir>/jupyter_server_config.json from
# JUPYTER_CONFIG_PATH: there ``.py`` files default to the "Jupytext Notebook" viewer, the
# Jupyter news question is answered "Never", and the instructor-only nbgrader extensions are
# disabled.
LAB_CONFIG_DIR = REPO / "site" / "jupyter"
LOG_DIR = REPO / "build" / "logs"
LAB_STATE_DIR = REPO / "build" / "lab"  # per workspace: JupyterLab's token and settings
SITE_URL = "http://127.0.0.1:8000"
LAB_URL = "http://127.0.0.1:8888"
READY_TIMEOUT_S = 90


def _newest_mtime(paths: list[Path]) -> float:
    """Latest modification time (seconds since the epoch) under `paths`; 0.0 when none exist."""
    newest = 0.0
    for path in paths:
        if path.is_file():
            newest = max(newest, path.stat().st_mtime)
        elif path.is_dir():
            for child in path.rglob("*"):
                if child.is_file() and "__pycache__" not in child.parts \
                        and ".ipynb_checkpoints" not in child.parts:
                    newest = max(newest, child.stat().st_mtime)
    return newest


def site_is_stale() -> bool:
    """True when build/site is missing or older than any of its sources."""
    index = SITE_DIR / "index.html"
    if not index.exists():
        return True
    return _newest_mtime([REPO / p for p in SITE_SOURCES]) > index.stat().st_mtime


def build_command(strict: bool = True, site_dir: Path = SITE_DIR) -> list[str]:
    """``pallas-course build-site``: the lessons executed in parallel, then mkdocs."""
    cmd = [sys.executable, "-m", "grader.cli", "build-site", "--site-dir", str(site_dir)]
    return cmd if strict else [*cmd, "--no-strict"]


BUILD_ENV = {"NO_MKDOCS_2_WARNING": "1"}


def lesson_pages_config():
    """The site's mkdocs configuration as the build has it when it renders a page (site/hooks.py
    has pinned the lessons' cache and the kernel's path, mkdocs-jupyter has set up its cache),
    and the mkdocs-jupyter plugin."""
    from mkdocs.config import load_config  # optional: mkdocs comes with the site extra

    config = load_config(str(REPO / "mkdocs.yml"))
    config = config.plugins.on_config(config)
    jupyter = config.plugins["mkdocs-jupyter"]
    jupyter.on_pre_build(config)  # the build's next event
    return config, jupyter


def lesson_cache_file(jupyter, name: str) -> Path:
    """Where mkdocs-jupyter's page hook reads and writes the page of ``lessons/<name>`` (its
    cache entry; mkdocs-jupyter 0.26's key: the notebook's bytes and the plugin's settings)."""
    from mkdocs_jupyter.plugin import _compute_cache_key, _get_cache_path  # the site extra's

    settings = jupyter.config
    return _get_cache_path(settings["cache_dir"], _compute_cache_key(
        str(REPO / "lessons" / name), settings, settings["execute"]))


def render_lessons(names: list[str], report: Path, fresh: bool = False,
                   ship: bool = False) -> None:
    """Render ``lessons/<name>`` for each name the way the site build does, through
    mkdocs-jupyter's own page hook, which executes a lesson missing from its cache (keyed by the
    lesson's content, the plugin's settings and, through site/hooks.py, the lessons' sources
    digests: ``shipped_lessons.sources_digest``) and stores it there. One process runs
    this per CPU (``prerender_lessons``); mkdocs then finds every lesson in the cache instead of
    executing them one at a time.

    A lesson missing from the cache whose shipped page is current
    (``grader.website.shipped_lessons``) gets that page, and does not execute. ``fresh``: every
    lesson executes (its cache entry is removed first). ``ship``: a lesson whose shipped page is
    stale executes and is shipped. A lesson that fails does not stop the others: ``report`` gets one
    JSON line per lesson, ``LessonRun``'s fields."""
    # optional: mkdocs comes with the site extra
    from mkdocs.structure.files import File, Files
    from mkdocs.structure.pages import Page

    config, jupyter = lesson_pages_config()
    settings = dict(jupyter.config)
    for name in names:
        lesson = REPO / "lessons" / name
        file = File(f"lessons/{name}", src_dir=str(REPO), dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"])
        page = Page(None, file, config)
        jupyter.on_pre_page(page, config, Files([file]))
        cached = lesson_cache_file(jupyter, name)
        if fresh or (ship and not shipped_lessons.is_current(lesson, settings)):
            cached.unlink(missing_ok=True)
        source = "cache" if cached.exists() else "shipped" \
            if not fresh and shipped_lessons.seed(lesson, settings, cached) else "executed"
        cwd = os.getcwd()
        os.chdir(REPO / "lessons")  # as the build does: a lesson runs in its own folder
        start, error = time.perf_counter(), None
        try:
            page.render(config, Files([file]))
        except Exception as e:  # noqa: BLE001 - reported per lesson, the others still run
            error = f"{type(e).__name__}: {e}"
        finally:
            os.chdir(cwd)
        if ship and source == "executed" and error is None:
            shipped_lessons.ship(lesson, settings, cached)
        with open(report, "a") as out:
            out.write(json.dumps({"lesson": name, "error": error, "source": source,
                                  "seconds": round(time.perf_counter() - start, 1)}) + "\n")


@dataclasses.dataclass(frozen=True)
class LessonRun:
    """One lesson's rendering for the site: seconds it took (a lesson already in the cache
    takes well under one), error (None, or the failing cell and its traceback as text) and
    source: "executed", "cache" (executed earlier on this machine) or "shipped" (its current
    page from site/executed/)."""

    lesson: str
    seconds: float
    error: str | None
    source: str = "executed"


def prerender_lessons(jobs: int | None = None, fresh: bool = False,
                      ship: bool = False) -> dict[str, LessonRun]:
    """Render the lessons into mkdocs-jupyter's cache (``render_lessons``, which ``fresh``
    and ``ship`` are passed to), ``jobs`` processes at once (default: one per CPU), the
    longest lessons (by size) first and spread evenly; cached or shipped lessons cost a hash
    each. Returns each lesson's run by file name; a lesson whose process died without a
    report has that as its error. The build and tests/lessons (``fresh``) both call this."""
    lessons = sorted((REPO / "lessons").glob("[0-9][0-9]-*.py"),
                     key=lambda p: p.stat().st_size, reverse=True)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(lessons)))
    shares: list[list[Path]] = [[] for _ in range(jobs)]
    for lesson in lessons:  # longest first, each to the least loaded process
        min(shares, key=lambda s: sum(p.stat().st_size for p in s)).append(lesson)
    code = ("import json, sys; from pathlib import Path; from grader.website import site; "
            "site.render_lessons(sys.argv[3:], Path(sys.argv[1]), **json.loads(sys.argv[2]))")
    flags = json.dumps({"fresh": fresh, "ship": ship})
    with tempfile.TemporaryDirectory() as d:
        reports = [Path(d) / f"share-{i}.jsonl" for i in range(len(shares))]
        procs = [subprocess.Popen([sys.executable, "-c", code, str(report), flags,
                                   *(p.name for p in share)],
                                  cwd=REPO, env={**os.environ, **BUILD_ENV})
                 for share, report in zip(shares, reports, strict=True) if share]
        codes = [p.wait() for p in procs]
        runs = {r["lesson"]: LessonRun(**r) for report in reports if report.exists()
                for r in map(json.loads, report.read_text().splitlines())}
    died = next((c for c in codes if c), 0)
    for lesson in lessons:
        runs.setdefault(lesson.name, LessonRun(
            lesson.name, 0.0, f"its rendering process exited with status {died} before it"))
    return runs


def build_site(strict: bool = True, site_dir: Path = SITE_DIR) -> None:
    """Build the site into ``site_dir``: the lessons into mkdocs-jupyter's cache
    (``prerender_lessons``: a lesson already there or with a current shipped page costs a hash,
    the others execute in parallel), then ``mkdocs build``; prints where the lessons came from.
    Raises CalledProcessError when a lesson or the build fails."""
    runs = prerender_lessons().values()
    print("lessons: " + ", ".join(f"{sum(r.source == source for r in runs)} {source}"
                                  for source in ("shipped", "cache", "executed"))
          + f" ({sum(r.seconds for r in runs):.0f} s in all)", flush=True)
    failed = [run for run in runs if run.error]
    if failed:
        for run in failed:
            print(f"lessons/{run.lesson} failed:\n{run.error}", file=sys.stderr)
        raise subprocess.CalledProcessError(1, "render lessons: " + ", ".join(
            run.lesson for run in failed))
    cmd = [sys.executable, "-m", "mkdocs", "build", "--clean", "--site-dir", str(site_dir)]
    subprocess.run([*cmd, "--strict"] if strict else cmd, cwd=REPO, check=True,
                   env={**os.environ, **BUILD_ENV})


BUILDING_PAGE = b"""<!doctype html><html><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5"><title>pallas-course: building the site</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 4em auto">
<h1>The site is being built</h1>
<p>The lessons' pages come as the repository ships them; a lesson changed since it was shipped
is executed now (once: later starts reuse it). This page reloads itself every 5 seconds.
JupyterLab is already running: the lessons and exercises are there.</p></body></html>"""


class _SiteHandler(http.server.SimpleHTTPRequestHandler):
    """build/site as static files; while it does not exist yet, the page above."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        if (Path(self.directory) / "index.html").exists():
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(BUILDING_PAGE)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(BUILDING_PAGE)

    def log_message(self, *args):
        pass


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status < 500
    except urllib.error.HTTPError as err:
        return err.code < 500
    except OSError:
        return False


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each child's process group, then SIGKILL what is left after 10 s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def lab_command(lab_port: int, root: Path) -> list[str]:
    """JupyterLab's command line; its token is in ``lab_settings``' file, never in here (the
    process list shows a command line to every user of the machine)."""
    return [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
            "--port", str(lab_port), "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}", "--ServerApp.default_url=/lab/tree/lessons",
            # offline machines: no announcement feed, no update check
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])]


def _private_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable and writable by its owner only (mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def lab_settings(workspace_dir: Path, state_dir: Path | None = None) -> tuple[Path, str]:
    """This workspace's JupyterLab settings folder (mode 0700, under ``build/lab/``) and token.

    The token is made once per workspace and kept in ``token`` (mode 0600), so the URL a
    learner once opened, and the login cookie it left, still work after a restart: the site's
    JupyterLab links open their notebook without a login page. The folder's
    ``jupyter_server_config.json`` gives JupyterLab the token and a terminal that is not a login
    shell (a login shell's /etc/profile would put the course's environment off PATH)."""
    key = hashlib.sha256(str(workspace_dir.resolve()).encode()).hexdigest()[:12]
    folder = (state_dir or LAB_STATE_DIR) / key
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    token_file = folder / "token"
    token = token_file.read_text().strip() if token_file.is_file() else ""
    if not token:
        token = secrets.token_hex(16)
        _private_write(token_file, token + "\n")
    shell = next((s for s in (os.environ.get("SHELL"), "/bin/bash") if s and os.path.exists(s)),
                 "sh")
    _private_write(folder / "jupyter_server_config.json", json.dumps(
        {"IdentityProvider": {"token": token},
         "ServerApp": {"terminado_settings": {"shell_command": [shell]}}}, indent=1) + "\n")
    return folder, token


def lab_env(workspace_dir: Path, settings_dir: Path) -> dict[str, str]:
    """The environment JupyterLab, its terminals and kernels run in: ``settings_dir`` and
    site/jupyter/ first on JUPYTER_CONFIG_PATH, this Python's ``bin`` first on PATH (the
    ``pallas-course`` command in a terminal), and ``$PALLAS_COURSE_WORKSPACE`` (where
    ``pallas-course check`` looks for a notebook)."""
    config_path = os.pathsep.join(p for p in (str(settings_dir), str(LAB_CONFIG_DIR),
                                              os.environ.get("JUPYTER_CONFIG_PATH", "")) if p)
    # the venv's bin as this interpreter was started (not its symlink's target)
    path = os.pathsep.join(p for p in (str(Path(sys.executable).parent),
                                       os.environ.get("PATH", "")) if p)
    return {**os.environ, "JUPYTER_CONFIG_PATH": config_path, "PATH": path,
            WORKSPACE_ENV: str(workspace_dir)}


def url_box(lines: list[str]) -> str:
    """``lines`` framed, so the URLs stand out at the end of the output."""
    width = max(len(x) for x in lines)
    bar = "─" * (width + 2)
    return "\n".join([f"┌{bar}┐", *(f"│ {x.ljust(width)} │" for x in lines), f"└{bar}┘"])


class _BehindBuild:
    """``mkdocs build`` into build/site.next in the background, swapped into build/site when
    it succeeds; its output goes to build/logs/site-build.log."""

    def __init__(self) -> None:
        self.log = LOG_DIR / "site-build.log"
        self.next_dir = SITE_DIR.with_name("site.next")
        shutil.rmtree(self.next_dir, ignore_errors=True)
        self.t0 = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                build_command(True, self.next_dir), cwd=REPO, env={**os.environ, **BUILD_ENV},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def finish(self) -> str | None:
        """None while running; then a one-line outcome (after swapping the new site in)."""
        code = self.proc.poll()
        if code is None:
            return None
        seconds = time.monotonic() - self.t0
        if code != 0:
            tail = self.log.read_text().strip().splitlines()[-5:]
            return (f"site build FAILED after {seconds:.0f} s (exit {code}); the old site, if "
                    f"any, is still served. Last lines of {self.log}:\n  " + "\n  ".join(tail))
        old = SITE_DIR.with_name("site.old")
        shutil.rmtree(old, ignore_errors=True)
        if SITE_DIR.exists():
            SITE_DIR.rename(old)
        self.next_dir.rename(SITE_DIR)
        shutil.rmtree(old, ignore_errors=True)
        return f"site built in {seconds:.0f} s"


def serve(port: int = 8000, lab_port: int = 8888, build: bool = True,
          workspace_dir: Path | None = None) -> int:
    """Serve the site and JupyterLab (rooted at ``workspace_dir``, default workspace/) until
    Ctrl-C, rebuilding a stale site behind the running server unless ``build`` is False;
    returns an exit code (0 after Ctrl-C, JupyterLab's if it exits first)."""
    workspace_dir = (workspace_dir or REPO / "workspace").resolve()
    if not (workspace_dir / "lessons").is_dir():
        print(f"no workspace in {workspace_dir}: run `pallas-course workspace "
              f"{workspace_dir}` first (make start does)", file=sys.stderr)
        return 1
    if not build and not (SITE_DIR / "index.html").exists():
        print(f"no site in {SITE_DIR}: run `pallas-course build-site` first", file=sys.stderr)
        return 1
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    settings_dir, token = lab_settings(workspace_dir)
    # SIGTERM (from `kill`, a service manager or a test) stops us the way Ctrl-C does
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    procs: list[subprocess.Popen] = []
    server = None
    try:
        handler = functools.partial(_SiteHandler, directory=str(SITE_DIR))
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError as e:
            print(f"cannot serve the site on 127.0.0.1:{port} ({e.strerror}): is another "
                  "`make start` running? Stop it, or pass --port N", file=sys.stderr)
            return 1
        threading.Thread(target=server.serve_forever, daemon=True).start()
        lab_log = LOG_DIR / "jupyterlab.log"
        with open(lab_log, "w") as out:
            procs.append(subprocess.Popen(
                lab_command(lab_port, workspace_dir), cwd=workspace_dir,
                env=lab_env(workspace_dir, settings_dir),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        behind = _BehindBuild() if build and site_is_stale() else None
        if behind:
            procs.append(behind.proc)
        site_url = f"http://127.0.0.1:{port}/"
        lab_url = f"http://127.0.0.1:{lab_port}/lab/tree/lessons?token={token}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        status = f"http://127.0.0.1:{lab_port}/api/status?token={token}"
        while not _answers(status) and time.monotonic() < deadline:
            if procs[0].poll() is not None:
                print(f"JupyterLab exited ({procs[0].returncode}); its log, {lab_log}:\n"
                      + lab_log.read_text()[-3000:], file=sys.stderr)
                return procs[0].returncode or 1
            time.sleep(0.3)
        if not _answers(status):
            print(f"JupyterLab is not answering yet; its log: {lab_log}", file=sys.stderr)

        def box(building: bool) -> str:
            note = ("(rebuilding behind the server: the old site until then)"
                    if (SITE_DIR / "index.html").exists() else
                    "(being built: the page reloads until it is ready)")
            return url_box([f"site:       {site_url}",
                            *([f"            {note}"] if building else []),
                            f"JupyterLab: {lab_url}",
                            f"            your workspace: {workspace_dir}",
                            f"            (logs: {LOG_DIR})",
                            "Ctrl-C stops both."])

        print(box(behind is not None), flush=True)
        while procs[0].poll() is None:
            if behind and (outcome := behind.finish()) is not None:
                behind = None
                print(f"\n{outcome}\n{box(False)}", flush=True)
            time.sleep(0.3)
        print(f"JupyterLab exited ({procs[0].returncode}); see {lab_log}", file=sys.stderr)
        return procs[0].returncode or 0
    except KeyboardInterrupt:
        print("\nstopping the site server and JupyterLab...", flush=True)
        return 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        stop_processes(procs)
        signal.signal(signal.SIGTERM, previous)
