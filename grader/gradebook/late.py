"""The course's late policy: points off per started hour and per started day past the due date.

nbgrader calls the plugin once per notebook of a late submission (``AssignLatePenalties`` in
``nbgrader_config.py``), with the notebook's score and how late the submission was by the
server's clock (``grader.logistics.inbound`` stamps it). The due date is the assignment's in the
gradebook (formgrader: Manage Assignments, or ``nbgrader db assignment add A --duedate ...``),
plus the student's extension (``pallas-course extend``): the extensions are kept in the course
folder (``EXTENSIONS``) and written into the student's gradebook row before each grading of the
submission, where nbgrader's lateness counts them; one granted after grading updates the graded
submission's penalty and feedback at once (``batch.extend``). The penalty never exceeds the
notebook's score. ``late_by`` is what ``pallas-course export`` shows.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timedelta
from pathlib import Path

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


EXTENSIONS = "extensions.json"  # in the course folder: {assignment: {student: hours}}


def extensions(root: Path) -> dict[str, dict[str, float]]:
    """Every extension granted in the course ``root``: hours by assignment and student."""
    path = root / EXTENSIONS
    return json.loads(path.read_text()) if path.exists() else {}


def grant_extension(root: Path, student: str, assignment: str, hours: float) -> None:
    """Give ``student`` ``hours`` more on ``assignment`` (0 takes an extension back). Extensions
    do not add up: the last one granted counts. ``batch.extend`` applies it to a graded
    submission; the submission's next grading applies it too."""
    if hours < 0:
        raise ValueError(f"an extension of {hours:g} hours: give 0 or more (0 takes it back)")
    granted = extensions(root)
    granted.setdefault(assignment, {})[student] = float(hours)
    tmp = root / f".{EXTENSIONS}.tmp"
    tmp.write_text(json.dumps(granted, indent=1, sort_keys=True))
    os.replace(tmp, root / EXTENSIONS)


def late_by(timestamp: str, duedate: str, extension_hours: float = 0.0) -> str:
    """How late a submission was, ``"1 d 2 h 5 min"``, from the export's two columns (nbgrader
    writes them as ``str(datetime)``) and the student's extension; ``""`` when on time, not
    submitted or without a due date."""
    try:
        due = datetime.fromisoformat(duedate) + timedelta(hours=extension_hours)
        seconds = (datetime.fromisoformat(timestamp) - due).total_seconds()
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
