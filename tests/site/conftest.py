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
from sitetools import (
    FIGURES,
    HIDDEN,
    PAGE_WIDTH,
    REPO,
    SITE_DIR,
    SQUEEZED_FIGURES,
    serve_folder,
    visit_each,
    watch,
)

LESSONS = sorted(p.stem for p in (REPO / "lessons").glob("[0-9][0-9]-*.py"))


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


@pytest.fixture(scope="session")
def site_at_1280(browser, built_site, base_url) -> dict:
    """Every page of the built site opened once at 1280 px (``sitetools.visit_each``), by its
    path (``lessons/04-index-maps/``): its headings, its wrapped lines, the boxes that hide
    text, its width and its figures, which test_browser.py's and test_readable_pages.py's
    desktop tests assert on."""
    paths = sorted(p.relative_to(built_site).as_posix().removesuffix("index.html")
                   for p in built_site.rglob("index.html"))
    return visit_each(browser, base_url, paths, {"width": 1280, "height": 900}, {
        "headings": "() => document.querySelectorAll('h1').length",
        "lines": "() => document.querySelectorAll('article .ks-ln').length",
        "hidden": HIDDEN, "width": PAGE_WIDTH, "figures": FIGURES})


@pytest.fixture(scope="session")
def lessons_at_390(browser, base_url) -> dict:
    """Every lesson opened once at 390 px, scrolled to its first viewer if it shows one: the
    page's width, its viewers and its figures shown narrower than the column allows, by the
    lesson's stem."""
    seen = visit_each(browser, base_url, [f"lessons/{stem}/" for stem in LESSONS],
                      {"width": 390, "height": 844}, {
                          "width": PAGE_WIDTH, "squeezed": SQUEEZED_FIGURES,
                          "viewers": "() => document.querySelectorAll('.ks-viewer').length"},
                      before="() => document.querySelector('.ks-viewer')?.scrollIntoView()")
    return {path.split("/")[1]: page for path, page in seen.items()}
