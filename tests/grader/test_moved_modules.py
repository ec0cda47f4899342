"""A notebook released before grader/ had rooms (its locked set-up cell reads ``from grader
import course`` and ``from grader.calling import ...``) still runs: a learner's copy is never
rewritten, so the old names must stay the modules the new names are."""

import subprocess
import sys

OLD_SETUP = ("from grader import course\n"
             "from grader.calling import softmax_rows, traced_as_tpu\n")


def test_a_notebook_released_before_the_rooms_imports_its_modules():
    check = ("import grader.grading.calling as calling, grader.learner.course as new\n"
             "assert course is new and traced_as_tpu is calling.traced_as_tpu\n"
             "assert course.__name__ == 'grader.learner.course'\n")
    out = subprocess.run([sys.executable, "-c", OLD_SETUP + check], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
