"""nbgrader's hidden-test region of a test cell: what a release leaves out, what grading
compares a submission's locked cells without, and what ``pallas-course check`` never runs.

The markers are put together here so that a student copy, which ships this file (the check
command imports it), holds none of them (tests/workspace/test_dist.py searches it for them).
"""

from __future__ import annotations

import re

_MARKER = "### {} HIDDEN TESTS"
HIDDEN_RE = re.compile(re.escape(_MARKER.format("BEGIN")) + ".*?" +
                       re.escape(_MARKER.format("END")), re.S)
