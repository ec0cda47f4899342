"""The late policy (grader/grading/late.py): penalty per started hour and day, capped by the score;
"late by" as the export shows it; the gradebook import tables for Canvas and Moodle."""

from grader.grading.late import LatePenalty, late_by


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
    from grader.grading.batch import lms_table

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
