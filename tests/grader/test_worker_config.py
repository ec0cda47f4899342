"""A long-lived grading worker reads the course's ``nbgrader_config.py`` for every job (issue
35, item 3: workers kept the configuration they started with, so a late policy changed between
batches penalised equally late work differently depending on the worker)."""

from __future__ import annotations

from grader.grading import sandbox, submission

CONFIG = """c = get_config()
c.CourseDirectory.course_id = "pallas-course"
c.CourseDirectory.db_url = "sqlite:///{db}"
"""


def test_a_worker_reads_the_configuration_changed_between_its_jobs(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    (root / "nbgrader_config.py").write_text(CONFIG.format(db=root / "before.db"))
    with sandbox.claimed_slot() as slot:
        worker = submission.Worker(root, slot)
        try:
            assert worker.run("export", str(tmp_path / "1.csv"))["success"]
            (root / "nbgrader_config.py").write_text(CONFIG.format(db=root / "after.db"))
            assert worker.run("export", str(tmp_path / "2.csv"))["success"]
        finally:
            worker.close()
    # each export opened the gradebook that the configuration of its moment named
    assert (root / "before.db").exists() and (root / "after.db").exists()
