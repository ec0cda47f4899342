"""The first install's minutes of pip are not silent (issue 50: `make start` printed one line,
then nothing for about 5 minutes): .ci/pip_progress.py logs all of pip's output and prints a
line every few packages; its exit status is pip's. And `make start` says what it does first."""

from __future__ import annotations

import subprocess
import sys

from wstools import REPO

SCRIPT = REPO / ".ci" / "pip_progress.py"
FAKE_PIP = """
import sys
for i in range(25):
    print(f"Collecting package{i}>=1.0")
print("Installing collected packages: a, b, c")
print("Successfully installed a-1 b-2 c-3")
sys.exit(int(sys.argv[1]))
"""


def _run(tmp_path, status: int):
    log = tmp_path / "logs" / "pip.log"
    ran = subprocess.run([sys.executable, str(SCRIPT), str(log), "--", sys.executable, "-c",
                          FAKE_PIP, str(status)], capture_output=True, text=True)
    return ran, log


def test_pip_is_logged_whole_and_summarised_as_it_goes(tmp_path):
    ran, log = _run(tmp_path, 0)
    assert ran.returncode == 0, ran.stderr
    said = [line.split(": ", 1)[1] for line in ran.stdout.splitlines()]
    assert said == ["collected 10 packages (latest: package9>=1.0)",
                    "collected 20 packages (latest: package19>=1.0)",
                    "installing 3 packages (a few minutes without a line)",
                    "installed 3 packages"], ran.stdout
    assert log.read_text().count("Collecting ") == 25


def test_a_failing_pip_fails_and_shows_the_end_of_its_log(tmp_path):
    ran, _ = _run(tmp_path, 1)
    assert ran.returncode == 1
    assert "Successfully installed a-1 b-2 c-3" in ran.stderr


def test_make_start_says_what_it_does_before_anything_slow():
    plan = subprocess.run(["make", "-n", "start"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert plan[0].startswith("echo \"make start: checking the course's environment"), plan[:3]
    workspace = next(i for i, line in enumerate(plan) if "grader.cli workspace" in line)
    assert "copying the lessons and exercises into workspace/" in " ".join(plan[:workspace])
