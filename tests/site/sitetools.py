"""Helpers shared by the site tests (a module name no other test folder uses)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import http.server
import importlib.util
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE_DIR = REPO / "build" / "site"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def load_site(name: str = "hooks"):
    """``site/NAME.py`` as a module, the one copy site/hooks.py's ``site_module`` loads too
    (``site`` is not a package, and would shadow the stdlib's)."""
    key = f"pallas_course_site_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "site" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def load_hooks():
    return load_site("hooks")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve_folder(root: Path):
    """``root``'s files over HTTP on 127.0.0.1 (a free port) while the block runs; yields the
    base URL, ending in ``/``."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# A port found by binding port 0 is free only until it is released: before the server a test
# starts binds it, another process may take it (`make test`'s other pytest process, a Jupyter
# kernel's sockets, a hub's spawner: all bind port 0). So a test's ports come from below the
# kernel's ephemeral range, which binding port 0 never hands out, and each is claimed across
# processes by a lock on a file, held until this process exits (the kernel drops it then).
PORT_CLAIMS = Path(tempfile.gettempdir()) / "pallas-course-test-ports"
_port_claims: list[int] = []  # the claims' file descriptors, open for the process's life


def free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1, claimed for this process."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    PORT_CLAIMS.mkdir(exist_ok=True)
    first_ports = list(range(max(1024, ephemeral_low - 12_000), ephemeral_low - count))
    random.shuffle(first_ports)
    for first in first_ports:
        claims = []
        for port in range(first, first + count):
            fd = os.open(PORT_CLAIMS / str(port), os.O_CREAT | os.O_RDWR, 0o600)
            claims.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            except OSError:
                break
        else:
            _port_claims.extend(claims)
            return first
        for fd in claims:
            os.close(fd)
    raise RuntimeError(f"no {count} free consecutive ports below {ephemeral_low}")


class Watched:
    """A playwright page plus what it saw: console errors, page errors, foreign requests."""

    def __init__(self, page):
        self.page = page
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.failed: list[str] = []

    def problems(self) -> list[str]:
        """What it saw that no page of the site may do, in words; empty when all is well."""
        return ([f"requests to other hosts: {self.foreign}"] if self.foreign else []) + \
            ([f"console errors: {self.errors}"] if self.errors else []) + \
            ([f"failed requests: {self.failed}"] if self.failed else [])

    def check(self) -> None:
        assert not self.problems(), "; ".join(self.problems())


# Every pre and every output box of a lesson where text is hidden: [what, client width, scroll
# width] of a box whose text scrolls out of it, and the wrapped lines' rows clipped by their box.
HIDDEN = """() => {
  const out = [];
  for (const b of document.querySelectorAll(
      'article pre, article .jp-OutputArea-output, article .highlight-ipynb')) {
    if (b.closest('.ks-viewer-host')) continue;  // the viewer: tests of its own
    if (b.scrollWidth > b.clientWidth + 1)
      out.push([b.textContent.trim().slice(0, 50), b.clientWidth, b.scrollWidth]);
  }
  for (const ln of document.querySelectorAll('article .ks-ln:not(.ks-trow)')) {
    const box = ln.getBoundingClientRect(), range = document.createRange();
    range.selectNodeContents(ln);
    for (const r of range.getClientRects())
      if (r.width && (r.right > box.right + 1 || r.bottom > box.bottom + 1)) {
        out.push(['clipped: ' + ln.textContent.slice(0, 50), box.right, r.right]);
        break;
      }
  }
  return out; }"""
PAGE_WIDTH = "() => document.scrollingElement.scrollWidth"
# a lesson's figures (notebook outputs drawn as img, svg or canvas): [how many, the first one's
# width and height in px]
FIGURES = """() => {
  const figures = document.querySelectorAll('.jp-OutputArea-output img, '
    + '.jp-OutputArea-output svg, .jp-OutputArea-output canvas');
  const box = figures.length ? figures[0].getBoundingClientRect() : null;
  return [figures.length, box ? box.width : 0, box ? box.height : 0]; }"""

# the lesson figures (notebook outputs drawn as img) narrower than they could be: shown smaller
# than drawn while the notebook's column had room for more (a hint beside one in its output's
# row squeezed it to half a phone's width, issue 50): [alt text, shown px, drawn px, column px]
SQUEEZED_FIGURES = """() => [...document.querySelectorAll('article .jp-OutputArea-output img')]
  .map(img => [img.alt.slice(0, 40), img.getBoundingClientRect().width, img.naturalWidth,
               img.closest('.jp-OutputArea').clientWidth])
  .filter(([, shown, drawn, column]) => shown < Math.min(drawn, column) - 2)"""


@dataclasses.dataclass
class PageSeen:
    """One page as a browser opened it: the HTTP status, what each measure (a JavaScript
    function, by name) returned once it had loaded, and the problems it showed
    (``Watched.problems``) while it did."""

    status: int | None
    measured: dict[str, object]
    problems: list[str]


def visit_each(browser, base_url: str, paths: list[str], viewport: dict, measures: dict[str, str],
               before: str | None = None) -> dict[str, PageSeen]:
    """Open every page of ``paths`` (relative to ``base_url``) once, one after another in one
    watched context of ``viewport``, and measure it there: after it loaded and its requests
    (mkdocs-material's search worker) went quiet, and ``before`` ran (a JavaScript function).
    The tests that assert on a page's measures read them from here: each page is laid out once
    per width, not once per test."""
    context = browser.new_context(viewport=viewport)
    w = watch(context)
    seen = {}
    try:
        for path in paths:
            w.errors, w.foreign, w.failed = [], [], []
            response = w.page.goto(base_url + path, wait_until="load")
            w.page.wait_for_load_state("networkidle")
            if before:
                w.page.evaluate(before)
            seen[path] = PageSeen(response.status if response else None,
                                  {name: w.page.evaluate(js) for name, js in measures.items()},
                                  w.problems())
    finally:
        context.close()
    return seen


def watch(context) -> Watched:
    page = context.new_page()
    w = Watched(page)

    def route(r):
        url = r.request.url
        if url.startswith(("http://127.0.0.1:", "data:", "blob:", "about:")):
            r.continue_()
        else:
            w.foreign.append(url)
            r.abort()

    context.route("**/*", route)
    page.on("console", lambda m: w.errors.append(f"{m.text} ({m.location.get('url')})")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: w.errors.append(f"page error: {e}"))
    # net::ERR_ABORTED is the browser cancelling a request (the page navigated on while
    # mkdocs-material's search worker loaded: one clean-clone run), not a server failing one
    page.on("requestfailed", lambda r: w.failed.append(f"{r.url}: {r.failure}")
            if r.url.startswith("http://127.0.0.1:") and r.failure != "net::ERR_ABORTED"
            else None)
    return w


def start_lab(root, log):
    """JupyterLab serving ``root`` on a free port, as `pallas-course serve` starts it;
    returns (process, base URL, token). Stop it with os.killpg(process.pid, SIGTERM)."""
    from grader.website import site

    port = free_port()
    settings, token = site.lab_settings(root, Path(tempfile.gettempdir()) / "pallas-course-labs")
    proc = subprocess.Popen(site.lab_command(port, root), cwd=REPO, stdout=log,
                            env=site.lab_env(root, settings),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, "JupyterLab exited"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}",
                                   timeout=2)
            return proc, f"http://127.0.0.1:{port}", token
        except OSError:
            time.sleep(0.3)
    raise AssertionError("JupyterLab did not answer")


def notebook(path, *cells: str) -> None:
    """A python3 notebook at ``path`` holding the code ``cells``."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def open_notebook(page, url: str) -> None:
    """Open the notebook at ``url`` in JupyterLab and wait for its kernel."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url)
    page.locator(".jp-NotebookPanel .jp-CodeCell").first.wait_for(timeout=60_000)
    # JupyterLab asks for a kernel when the notebook's session is new: take the python3 default
    accept = page.locator(".jp-Dialog .jp-mod-accept")
    try:
        accept.wait_for(timeout=10_000)
        accept.click()
    except PlaywrightTimeout:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=60_000)


def run_cell(page, index: int) -> None:
    """Run code cell ``index`` of the open notebook (Shift+Enter in its editor)."""
    page.locator(".jp-NotebookPanel .jp-CodeCell").nth(index).locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
