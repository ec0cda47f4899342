"""The class report (grader/logistics/report.py)."""

from __future__ import annotations

from collections import Counter

from grader.logistics import report


def test_grading_time_is_called_wall_clock_time_not_cpu_time():
    """Issue 35, item 13: the status files record each submission's wall-clock seconds; the
    report called their sum "CPU-minutes"."""
    page = report.render("01_first_kernel", {"tasks": [], "statuses": Counter(graded=2),
                                             "seconds": [60.0, 120.0]})
    assert "3.0 minutes in all (wall-clock time" in page and "CPU" not in page
