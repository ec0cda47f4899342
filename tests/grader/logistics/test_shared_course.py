"""A class's course folder is shared by the instructors' group (issue 35, item 6): what the
grading account writes there (nbgrader's autograded/ and feedback/, status files) the
instructors must be able to replace, and a grading that fails never leaves an old "graded"."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader.logistics import submission

REPO = Path(__file__).resolve().parents[3]

# what nbgrader does in a grading worker or the formgrader's server: load the course's
# configuration, then write a folder and a file in the course
WRITE_AS_NBGRADER = """
import os, sys
from traitlets.config.loader import PyFileConfigLoader
root = sys.argv[1]
PyFileConfigLoader("nbgrader_config.py", path=root).load_config()
os.makedirs(os.path.join(root, "autograded", "learner1", "a"))
open(os.path.join(root, "autograded", "learner1", "a", "nb.ipynb"), "w").close()
"""


def test_what_nbgrader_writes_in_a_class_course_folder_the_group_may_replace(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    root.chmod(0o2770)  # deploy/setup-class.sh's course folder
    shutil.copy(REPO / "exercises" / "nbgrader_config.py", root)
    subprocess.run([sys.executable, "-c", "import os; os.umask(0o022); "
                    "exec(open(0).read())", str(root)], input=WRITE_AS_NBGRADER, text=True,
                   check=True, cwd=REPO)
    for folder in (root / "autograded", root / "autograded" / "learner1"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2770, folder
    assert stat.S_IMODE((root / "autograded" / "learner1" / "a" / "nb.ipynb").stat().st_mode) \
        == 0o660


class FailingWorker:
    def run(self, *args, timeout=None):
        raise PermissionError(13, "Permission denied", "autograded/learner1")


def test_a_grading_that_fails_leaves_no_earlier_graded_status(tmp_path):
    sub = tmp_path / "submitted" / "learner1" / "a"
    sub.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), sub / "nb.ipynb")
    submission.write_status(tmp_path, "a", "learner1", {"status": "graded"})
    with pytest.raises(PermissionError):
        submission.grade_one(tmp_path, "learner1", "a", 60, FailingWorker())
    assert submission.read_status(tmp_path, "a", "learner1") is None
