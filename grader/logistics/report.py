"""``pallas-course report ASSIGNMENT``: one HTML page on how the class did on an assignment.

Per task (a graded test cell): how many submissions passed it, and the failure seen most often
in the autograded notebooks (the first line of the verdict's error: which rule or hint);
per status how many submissions; the time grading took (from the status files). Read from the
gradebook, ``autograded/`` and ``status/``; nothing is graded or changed.
"""

from __future__ import annotations

import html
import json
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grader.logistics.submission import DB_ENV


@dataclass
class Task:
    """One graded cell across the class: submissions that passed it, of how many."""

    grade_id: str
    passed: int = 0
    graded: int = 0
    failures: Counter = field(default_factory=Counter)


def _failure(cell: dict) -> str | None:
    """The first line of a test cell's error in an autograded notebook, if it failed."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            first = (str(out.get("evalue") or "").strip().splitlines() or [""])[0]
            return f"{out.get('ename', 'Error')}: {first}"[:200]
    return None


def gather(root: Path, assignment: str) -> dict:
    """The report's numbers: ``tasks`` (list of Task), ``statuses`` (Counter), ``seconds`` (each
    submission's grading time by the wall clock, from its status file)."""
    from nbgrader.api import Gradebook  # nbgrader takes seconds to import

    tasks: dict[str, Task] = {}
    url = os.environ.get(DB_ENV) or f"sqlite:///{root / 'gradebook.db'}?timeout=120"
    with Gradebook(url, "pallas-course") as gb:
        for sub in gb.find_assignment(assignment).submissions:
            for nb in sub.notebooks:
                for grade in nb.grades:
                    if grade.max_score:
                        t = tasks.setdefault(grade.name, Task(grade.name))
                        t.graded += 1
                        t.passed += float(grade.score) >= float(grade.max_score)
    for path in sorted((root / "autograded").glob(f"*/{assignment}/*.ipynb")):
        try:
            cells = json.loads(path.read_text()).get("cells", [])
        except (OSError, ValueError):
            continue
        for cell in cells:
            gid = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
            why = _failure(cell) if gid in tasks else None
            if why:
                tasks[gid].failures[why] += 1
    statuses: Counter = Counter()
    seconds: list[float] = []
    for path in sorted((root / "status" / assignment).glob("*.json")):
        rec = json.loads(path.read_text())
        statuses[rec["status"]] += 1
        if isinstance(rec.get("seconds"), int | float):
            seconds.append(float(rec["seconds"]))
    return {"tasks": sorted(tasks.values(), key=lambda t: t.grade_id), "statuses": statuses,
            "seconds": seconds}


def render(assignment: str, data: dict) -> str:
    e = html.escape
    rows = []
    for t in data["tasks"]:
        top = t.failures.most_common(1)
        most = f"{e(top[0][0])} ({top[0][1]}×)" if top else "—"
        pct = 100 * t.passed / t.graded if t.graded else 0
        rows.append(f"<tr><td>{e(t.grade_id)}</td><td>{t.passed} / {t.graded}</td>"
                    f"<td><meter min='0' max='100' value='{pct:.0f}'></meter> {pct:.0f} %</td>"
                    f"<td>{most}</td></tr>")
    secs = data["seconds"]
    timing = (f"{len(secs)} submission(s): median {statistics.median(secs):.1f} s, slowest "
              f"{max(secs):.1f} s, {sum(secs) / 60:.1f} minutes in all (wall-clock time, summed "
              "over submissions; graded side by side, a batch takes less)" if secs
              else "no submission graded yet")
    statuses = ", ".join(f"{e(k)} {v}" for k, v in sorted(data["statuses"].items())) or "none"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Class report: {e(assignment)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1rem; max-width: 60rem; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ccc; padding: .4rem; text-align: left;
          overflow-wrap: anywhere; vertical-align: top; }}
</style></head><body>
<h1>Class report: {e(assignment)}</h1>
<p>Statuses: {statuses}. Grading time: {timing}.</p>
<table><thead><tr><th>task</th><th>passed</th><th></th><th>most frequent failure</th></tr>
</thead><tbody>
{"".join(rows)}
</tbody></table></body></html>
"""


def write(root: Path, assignment: str, to: Path, log=print) -> Path:
    to = Path(to)
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_text(render(assignment, gather(root, assignment)))
    log(f"class report for {assignment}: {to}")
    return to
