"""Helpers shared by the site tests (a module name no other test folder uses)."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE_DIR = REPO / "build" / "site"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def load_hooks():
    """site/hooks.py as a module (``site`` is not a package, and would shadow the stdlib's)."""
    name = "pallas_course_site_hooks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "site" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watched:
    """A playwright page plus what it saw: console errors, page errors, foreign requests."""

    def __init__(self, page):
        self.page = page
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.failed: list[str] = []

    def check(self) -> None:
        assert not self.foreign, f"requests to other hosts: {self.foreign}"
        assert not self.errors, f"console errors: {self.errors}"
        assert not self.failed, f"failed requests: {self.failed}"


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
    page.on("requestfailed", lambda r: w.failed.append(f"{r.url}: {r.failure}")
            if r.url.startswith("http://127.0.0.1:") else None)
    return w
