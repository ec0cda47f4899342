"""A class's roster: ``pallas-course roster FILE.csv`` puts each learner's name and e-mail in the
gradebook, where nbgrader's export reads them, so every export (the CSV, Canvas's and Moodle's
tables) carries them. Without one the gradebook knows learners by id alone.

The file is a CSV with a header row: ``id`` (the learner's user name on the hub, which their
submissions carry; ``student_id`` or ``username`` are read as it too), and any of ``first_name``,
``last_name`` and ``email``. Importing again updates the names; a learner the file leaves out is
kept.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

ID_COLUMNS = ("id", "student_id", "username")
# what nbgrader can keep as a student id and use as a folder name
VALID_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")


@dataclass(frozen=True)
class Learner:
    id: str
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = None


def read(path: Path) -> list[Learner]:
    """The learners of the roster at ``path``; ``ValueError`` naming the line and what to fix."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = csv.DictReader(f)
        columns = {c.strip().lower(): c for c in rows.fieldnames or []}
        id_column = next((columns[c] for c in ID_COLUMNS if c in columns), None)
        if id_column is None:
            raise ValueError(f"{path}: no id column; the first row must name the columns, "
                             "e.g. id,first_name,last_name,email (id: the learner's user name "
                             "on the hub)")
        learners: dict[str, Learner] = {}
        for line, row in enumerate(rows, start=2):
            learner_id = (row.get(id_column) or "").strip()
            if not VALID_ID.match(learner_id):
                raise ValueError(f"{path}, line {line}: {learner_id!r} is not a learner id "
                                 "(letters, digits and . _ @ + -, as on the hub)")
            if learner_id in learners:
                raise ValueError(f"{path}, line {line}: {learner_id} is listed twice")

            def field(name: str, row: dict = row) -> str | None:
                value = (row.get(columns.get(name, "")) or "").strip()
                return value or None

            learners[learner_id] = Learner(learner_id, field("first_name"), field("last_name"),
                                           field("email"))
    return list(learners.values())
