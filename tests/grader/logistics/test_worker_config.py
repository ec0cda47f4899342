"""A long-lived grading worker reads the course's ``nbgrader_config.py`` for every job (issue
35, item 3: workers kept the configuration they started with, so a late policy changed between
batches penalised equally late work differently depending on the worker); reading it starts no
JAX, and a batch starts no more workers than it has submissions."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from coursetools import NB, A

from grader.jail import sandbox
from grader.logistics import batch, collect, submission

REPO = Path(__file__).resolve().parents[3]
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


def test_a_batch_starts_no_more_workers_than_it_has_submissions(released_01, tmp_path,
                                                                  monkeypatch):
    """Each worker costs seconds of imports (nbgrader, JAX): a regrade of one submission asked
    for with ``--workers 8``, or a batch with nothing to grade, starts one and none."""
    started = []

    class Counted(submission.Worker):
        def __init__(self, *args, **kwargs):
            started.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(batch, "Worker", Counted)
    root, subs = tmp_path / "course", tmp_path / "subs"
    shutil.copytree(released_01, root)
    assert batch.autograde(root, A, workers=3, progress=None, log=lambda *a: None) == []
    assert started == []
    (subs / "one" / A).mkdir(parents=True)
    (subs / "one" / A / NB).write_text("{not a notebook")  # quick to grade: nbgrader never runs
    collect.collect(root, subs, log=lambda *a: None)
    (graded,) = batch.autograde(root, A, workers=3, progress=None, log=lambda *a: None)
    assert (graded["status"], len(started)) == ("malformed", 1)


def test_reading_the_course_configuration_starts_no_jax():
    """Every nbgrader job and an instructor's Jupyter server read ``nbgrader_config.py``: it names
    the grader's autograde preprocessors instead of importing them, so that only autograde starts
    JAX and loads the tasks (1-1.5 s of CPU in every other worker and server)."""
    probe = ("import sys\nfrom traitlets.config.loader import PyFileConfigLoader\n"
             f"PyFileConfigLoader('nbgrader_config.py', path={str(REPO / 'exercises')!r})"
             ".load_config()\n"
             "print([m for m in ('jax', 'grader.tasks', 'grader.jail.trusted') "
             "if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
