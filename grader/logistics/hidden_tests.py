"""nbgrader's hidden-test region of a test cell: what a release leaves out, what grading
compares a submission's locked cells without, and what ``pallas-course check`` never runs.

The markers are put together here so that a student copy, which ships this file (the check
command imports it), holds none of them (tests/workspace/test_dist.py searches it for them).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

_MARKER = "### {} HIDDEN TESTS"
HIDDEN_RE = re.compile(re.escape(_MARKER.format("BEGIN")) + ".*?" +
                       re.escape(_MARKER.format("END")), re.S)
# a hidden ``course.check`` call, as a test cell writes one
HIDDEN_CHECK_RE = re.compile(r"course\.check\([^()]*hidden\s*=\s*True")


def in_page(page: str) -> bool:
    """Whether a feedback page (HTML) still holds a hidden test: the region's marker or a hidden
    check, in the page's text once the highlighter's tags and entities are taken out (a page
    splits ``course.check(`` into one span per token)."""
    text = html.unescape(re.sub(r"<[^>]*>", "", page))
    return _MARKER.format("BEGIN") in text or HIDDEN_CHECK_RE.search(text) is not None


def withheld_pages(feedback: Path) -> list[Path]:
    """The feedback pages in the folder ``feedback`` that must never reach a learner: each
    still holds a hidden test (``in_page``)."""
    return [page for page in sorted(feedback.glob("*.html"))
            if in_page(page.read_text(errors="replace"))]
