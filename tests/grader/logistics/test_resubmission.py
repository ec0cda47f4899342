"""A malformed resubmission replaces the earlier submission's grade in every output (issue 35,
item 11: it scored 0 with its reason, but the CSV kept the earlier timestamp, raw score and
penalty, the autograde table printed "9 / 9 malformed" and the feedback still said 9/9)."""

from __future__ import annotations

import csv
import shutil

import nbformat
import pytest
from coursetools import NB, A

from grader.logistics import batch as grading
from grader.logistics import collect

pytestmark = pytest.mark.slow


def _hand_in(root, subs, text: str) -> None:
    shutil.rmtree(subs, ignore_errors=True)
    (subs / "re" / A).mkdir(parents=True)
    (subs / "re" / A / NB).write_text(text)
    collect.collect(root, subs, log=lambda *a: None)


def test_a_malformed_resubmission_replaces_the_earlier_grade_everywhere(released_01, tmp_path):
    root, subs = tmp_path / "course", tmp_path / "subs"
    shutil.copytree(released_01, root)
    source = next((root / "source" / A).glob("*.ipynb"))
    _hand_in(root, subs, nbformat.writes(nbformat.read(source, as_version=4)))
    (first,) = grading.autograde(root, A, progress=None, log=lambda *a: None)
    assert (first["status"], first["score"]) == ("graded", 9.0)
    grading.feedback(root, A, log=lambda *a: None)
    assert (root / "feedback" / "re" / A).is_dir()

    _hand_in(root, subs, "{not a notebook")
    table = []
    (again,) = grading.autograde(root, A, students=["re"], progress=None, log=table.append)
    assert again["status"] == "malformed" and again["score"] == 0
    assert "9 / 9" not in table[0], table[0]
    grading.feedback(root, A, log=lambda *a: None)
    assert not (root / "autograded" / "re" / A).exists()
    assert not (root / "feedback" / "re" / A).exists()  # no feedback of the earlier grade
    out = grading.export(root, tmp_path / "grades.csv", log=lambda *a: None)
    (row,) = [r for r in csv.DictReader(out.open()) if r["student_id"] == "re"]
    submitted = (root / "submitted" / "re" / A / "timestamp.txt").read_text()
    assert row["timestamp"] == submitted.removesuffix(".000000 UTC").replace(" UTC", "")
    assert (row["status"], float(row["score"]), float(row["raw_score"] or 0),
            float(row["late_submission_penalty"] or 0)) == ("malformed", 0, 0, 0), row
