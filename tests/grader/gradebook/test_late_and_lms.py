"""The late policy (grader/gradebook/late.py): penalty per started hour and day, capped by the
score; "late by" as the export shows it; the gradebook import tables for Canvas and Moodle."""

from grader.gradebook.late import LatePenalty, late_by


def test_penalty_per_started_hour_and_day_capped_by_the_score():
    p = LatePenalty(points_per_hour=0.5, points_per_day=2.0)
    assert p.late_submission_penalty("s", 9.0, 0) == 0.0
    assert p.late_submission_penalty("s", 9.0, 1) == 2.5  # one started hour, one started day
    assert p.late_submission_penalty("s", 20.0, 3600 * 25) == 0.5 * 25 + 2.0 * 2
    assert p.late_submission_penalty("s", 9.0, 3600 * 3) == 3.5
    assert p.late_submission_penalty("s", 3.0, 86400 * 10) == 3.0  # never below zero
    assert LatePenalty().late_submission_penalty("s", 9.0, 86400) == 0.0  # the default: none


def test_late_by_reads_the_exports_columns():
    due = "2026-12-01 10:00:00"
    assert late_by("2026-12-01 09:59:00", due) == ""
    assert late_by("2026-12-01 10:00:01", due) == "1 min"
    assert late_by("2026-12-02 12:04:00.250000", due) == "1 d 2 h 5 min"  # started minutes
    assert late_by("", due) == "" and late_by("2026-12-02 12:05:00", "None") == ""


def test_lms_tables_have_one_row_per_student_and_a_column_per_assignment():
    from grader.logistics.batch import lms_table

    rows = [{"assignment": "a1", "student_id": "ana", "score": 9.0, "max_score": 9.0},
            {"assignment": "a1", "student_id": "ben", "score": 6.0, "max_score": 9.0},
            {"assignment": "a2", "student_id": "ana", "score": 0, "max_score": 4.0}]
    canvas = lms_table(rows, "canvas")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "a1", "a2"]
    assert canvas[1][-2:] == ["9", "4"]
    assert canvas[2] == ["ana", "", "", "ana", "", "9.0", "0"]
    assert canvas[3] == ["ben", "", "", "ben", "", "6.0", "0"]
    assert lms_table(rows, "moodle") == [["Username", "a1", "a2"], ["ana", "9.0", "0"],
                                         ["ben", "6.0", "0"]]


def test_an_infrastructure_fault_is_no_grade_in_either_lms_table():
    """Issue 52: an ``error`` (the gradebook or the cluster out of reach) was exported as 0.0."""
    from grader.logistics.batch import lms_table

    why = "the gradebook could not be reached: grade it again with autograde --resume"
    rows = [{"assignment": "a1", "student_id": "ana", "score": 9.0, "max_score": 9.0,
             "status": "graded", "reason": ""},
            {"assignment": "a1", "student_id": "ben", "score": 0.0, "max_score": 9.0,
             "status": "error", "reason": why}]
    assert lms_table(rows, "canvas")[3] == ["ben", "", "", "ben", "", ""]
    assert lms_table(rows, "moodle") == [["Username", "a1", "a1 feedback"],
                                         ["ana", "9.0", ""], ["ben", "", why]]


def test_an_extension_and_a_roster_reach_the_grade_and_every_export(released_01, tmp_path,
                                                                    monkeypatch):
    """Issue 35: per-student extensions and a roster. Two submissions 3 h past the due date,
    1 point off per started hour: the one whose learner has 4 h more loses nothing, and the
    export says why (the extension, and late_by counted from the extended due date); the
    roster's names and e-mails reach the CSV and the Canvas and Moodle tables."""
    import csv
    import os
    import shutil
    import sys
    from pathlib import Path

    import nbformat
    from coursetools import A, notebook_path
    from nbgrader.api import Gradebook

    from grader import cli
    from grader.logistics import batch

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PALLAS_COURSE_DB", raising=False)
    root = tmp_path / "course"
    shutil.copytree(released_01, root)
    with (root / "nbgrader_config.py").open("a") as f:
        f.write("\nc.LatePenalty.points_per_hour = 1.0\n")
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "pallas-course") as gb:
        gb.update_or_create_assignment(A, duedate="2026-12-01 10:00:00")
    source = notebook_path(root, A)
    for student in ("ada", "alan"):
        d = root / "submitted" / student / A
        d.mkdir(parents=True)
        nbformat.write(nbformat.read(source, as_version=4), d / source.name)
        (d / "timestamp.txt").write_text("2026-12-01 13:00:00.000000 UTC")
    roster = tmp_path / "roster.csv"
    roster.write_text("id,first_name,last_name,email\nada,Ada,Lovelace,ada@example.org\n"
                      "alan,Alan,Turing,alan@example.org\n")
    assert cli.main(["--course", str(root), "roster", str(roster)]) == 0
    assert cli.main(["--course", str(root), "extend", "ada", A, "--hours", "4"]) == 0
    results = batch.autograde(root, workers=1, progress=None, log=lambda *a: None)
    assert {r["student"]: r["status"] for r in results} == {"ada": "graded", "alan": "graded"}

    rows = {r["student_id"]: r for r in csv.DictReader(batch.export(
        root, tmp_path / "grades.csv", log=lambda *a: None).open())}
    assert (float(rows["ada"]["late_submission_penalty"]), rows["ada"]["extension_hours"],
            rows["ada"]["late_by"]) == (0.0, "4", "")
    assert (float(rows["alan"]["late_submission_penalty"]), rows["alan"]["extension_hours"],
            rows["alan"]["late_by"]) == (3.0, "", "3 h")
    assert (rows["ada"]["first_name"], rows["ada"]["last_name"], rows["ada"]["email"]) == (
        "Ada", "Lovelace", "ada@example.org")
    canvas = list(csv.reader(batch.export(root, tmp_path / "canvas.csv", lms="canvas",
                                          log=lambda *a: None).open()))
    assert [row[0] for row in canvas[2:]] == ["Lovelace, Ada", "Turing, Alan"]
    moodle = list(csv.reader(batch.export(root, tmp_path / "moodle.csv", lms="moodle",
                                          log=lambda *a: None).open()))
    assert moodle[0][:2] == ["Username", "Email address"]
    assert moodle[1][:2] == ["ada", "ada@example.org"]

    # issue 52: an extension granted after grading changes the grade and the feedback at once
    # (the feedback stayed stale until the instructor ran feedback again)
    batch.feedback(root, A, log=lambda *a: None)
    (page,) = (root / "feedback" / "alan" / A).glob("*.html")
    assert "Late submission penalty (Score: -3.0)" in page.read_text()
    assert cli.main(["--course", str(root), "extend", "alan", A, "--hours", "4"]) == 0
    assert "Late submission penalty" not in page.read_text()
    rows = {r["student_id"]: r for r in csv.DictReader(batch.export(
        root, tmp_path / "grades.csv", log=lambda *a: None).open())}
    assert (float(rows["alan"]["late_submission_penalty"]), rows["alan"]["late_by"]) == (0.0, "")


def test_a_roster_line_without_an_id_is_named(tmp_path):
    import pytest

    from grader.gradebook import roster

    bad = tmp_path / "roster.csv"
    bad.write_text("id,first_name\nada,Ada\n,Nobody\n")
    with pytest.raises(ValueError, match=r"line 3: '' is not a learner id"):
        roster.read(bad)
    bad.write_text("first_name,email\nAda,ada@example.org\n")
    with pytest.raises(ValueError, match="no id column"):
        roster.read(bad)


def test_a_crash_of_nbgrader_exports_this_submissions_time_and_no_grade(released_01, tmp_path,
                                                                        monkeypatch):
    """Issue 52: when nbgrader's autograde of a resubmission failed (``crashed``), the export
    showed the gradebook's row: the earlier submission's time and score."""
    import csv
    import os
    import shutil
    import sys
    from pathlib import Path

    import nbformat
    from coursetools import A, notebook_path
    from nbgrader.api import Gradebook

    from grader.logistics import batch
    from grader.logistics.submission import grade_one

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PALLAS_COURSE_DB", raising=False)
    root = tmp_path / "course"
    shutil.copytree(released_01, root)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "pallas-course") as gb:
        gb.update_or_create_student("ada")  # her first submission's row, graded earlier
        gb.update_or_create_submission(A, "ada", timestamp="2026-12-01 09:00:00")
    source = notebook_path(root, A)
    d = root / "submitted" / "ada" / A
    d.mkdir(parents=True)
    nbformat.write(nbformat.read(source, as_version=4), d / source.name)
    (d / "timestamp.txt").write_text("2026-12-02 11:30:00.000000 UTC")  # the resubmission

    class NbgraderFails:  # the grading worker's answer when nbgrader's autograde raised
        def run(self, *args, timeout=None):
            return {"success": False, "error": "nbgrader autograde failed",
                    "log": "KeyError: 'grade_id'"}

    rec = grade_one(root, "ada", A, 60, NbgraderFails())
    assert (rec["status"], rec["in_gradebook"]) == ("crashed", False)
    rows = {r["student_id"]: r for r in csv.DictReader(batch.export(
        root, tmp_path / "grades.csv", log=lambda *a: None).open())}
    assert (rows["ada"]["timestamp"], rows["ada"]["score"], rows["ada"]["status"]) == (
        "2026-12-02 11:30:00", "", "crashed")
