"""Fixtures of the site tests: one strict build per session, a local server, a browser.

The build executes every lesson (mkdocs-jupyter, cached in .cache/mkdocs-jupyter/), so it runs
once per session. The browser is Debian's chromium driven by playwright; every page a test
opens is watched for console errors and for requests to a host other than 127.0.0.1 (which are
aborted, so a test never waits on the network).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from sitetools import SITE_DIR, serve_folder, watch


@pytest.fixture(scope="session")
def built_site() -> Path:
    """build/site from one `mkdocs build --strict` (what `make site` runs)."""
    from grader.website import site

    start = time.perf_counter()
    site.build_site(strict=True)
    print(f"\nsite built in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return SITE_DIR


@pytest.fixture(scope="session")
def build_info(built_site) -> dict:
    return json.loads((built_site / "build-info.json").read_text())


@pytest.fixture(scope="session")
def base_url(built_site):
    with serve_folder(built_site) as url:
        yield url


@pytest.fixture
def watched(browser):
    """A fresh page at 1280 px; at the end of the test, no console error, no foreign request."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    w = watch(context)
    yield w
    context.close()
    w.check()
