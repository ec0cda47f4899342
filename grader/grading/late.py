"""The course's late policy: points off per started hour and per started day past the due date.

nbgrader calls the plugin once per notebook of a late submission (``AssignLatePenalties`` in
``nbgrader_config.py``), with the notebook's score and how late the submission was by the
server's clock (``grader.grading.inbound`` stamps it). The due date is the assignment's in the
gradebook (formgrader: Manage Assignments, or ``nbgrader db assignment add A --duedate ...``). The
penalty never exceeds the notebook's score. ``late_by`` is what ``pallas-course export`` shows.
"""

from __future__ import annotations

import math
from datetime import datetime

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float


class LatePenalty(LateSubmissionPlugin):
    """``points_per_hour`` off per started hour late plus ``points_per_day`` per started day."""

    points_per_hour = Float(0.0, help="points off per started hour late").tag(config=True)
    points_per_day = Float(0.0, help="points off per started day (24 h) late").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float,
                                total_seconds_late: float) -> float:
        if total_seconds_late <= 0:
            return 0.0
        penalty = (self.points_per_hour * math.ceil(total_seconds_late / 3600)
                   + self.points_per_day * math.ceil(total_seconds_late / 86400))
        return min(max(score, 0.0), penalty)


def late_by(timestamp: str, duedate: str) -> str:
    """How late a submission was, ``"1 d 2 h 5 min"``, from the export's two columns (nbgrader
    writes them as ``str(datetime)``); ``""`` when on time, not submitted or without a due
    date."""
    try:
        seconds = (datetime.fromisoformat(timestamp) - datetime.fromisoformat(duedate)
                   ).total_seconds()
    except (TypeError, ValueError):
        return ""
    if seconds <= 0:
        return ""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "",
             f"{minutes} min" if minutes else ""]
    return " ".join(p for p in parts if p)
