"""The courses the grading tests grade in, each built once per session (tests/grader/conftest.py)
and read by several test modules; a module name no other test folder uses (test modules cannot
import from ``conftest``).

- ``graded_course``: a copy of every assignment released (tests/conftest.py's
  ``released_course``, which tests/workspace copies too) and one batch graded with real
  nbgrader: the instructor's, the blank and a wrong notebook of every assignment, broken and
  stuck ones (tests/grader/logistics/test_grading.py), and answers computed with the grader's own
  code (``JAIL_ATTACKS``, tests/grader/jail/test_jail_imports.py). One batch: the instructor
  notebooks both modules need full marks for are graded once.
- ``release_01``: assignment 01 released with small limits, the course the hostile and trust
  batches copy (tests/grader/jail/test_hostile.py, test_trust.py): nbgrader's release runs once,
  not once per batch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat

from grader import tasks
from grader.logistics import batch as grading
from grader.logistics import collect

REPO = Path(__file__).resolve().parents[2]
# every assignment is graded with a wrong answer to its first task
FIRST_TASK = {a: next(t.id for t in tasks.TASKS if t.assignment == a) for a in tasks.ASSIGNMENTS}
# learner cells get this many seconds in the test batch instead of 60: short, so that the
# looping submission ends soon, but above what a heavy cell of a real notebook takes on CI's
# two loaded cores (at 5 s, assignment 14's kernelsim.trace demo cell of the blank notebook
# ran out of time in one clean-clone run, and the blank scored `timeout`, not `graded`)
LEARNER_CELL_TIMEOUT = 15
# student: (assignment, the task it attacks, what is added to that task's solution cell)
JAIL_ATTACKS = {
    # the tuning task's blocks from the grader's own block search
    "block_search": ("06_performance", "matmul_tuned",
                     "_mine = matmul_tuned\ndef matmul_tuned(a, b, vmem_budget):\n"
                     "    from grader.tasks.a06_performance import best_blocks\n"
                     "    best_blocks(a.shape[0], a.shape[1], b.shape[0], str(a.dtype), "
                     "vmem_budget)\n    return _mine(a, b, vmem_budget)\n"),
    # the prediction from the grader's own byte count
    "byte_count": ("04_memory_spaces", "predict_matmul_reads",
                   "def predict_matmul_reads(m, k, n, bm, bk, bn, itemsize):\n"
                   "    from grader.tasks import a04_memory_spaces\n"
                   "    return a04_memory_spaces.matmul_read_bytes(m, k, n, bm, bk, bn, "
                   "itemsize)\n"),
    # the task's own reference, through its kernel
    "reference": ("01_first_kernel", "add",
                  "_mine = add\ndef add(x, y):\n    from grader import tasks\n"
                  "    return _mine(x, y) + 0 * tasks.get('add').reference(x, y)\n"),
}


def append_to_solution(nb, grade_id: str, code: str):
    """``nb`` with ``code`` appended to the cell ``grade_id``."""
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source += "\n" + code
            return nb
    raise AssertionError(grade_id)


def notebook_path(root: Path, assignment: str) -> Path:
    """The instructor notebook of ``assignment`` in the course ``root`` (built by its release)."""
    (path,) = (root / "source" / assignment).glob("*.ipynb")
    return path


def _submit(subs: Path, student: str, assignment: str, nb, name: str) -> None:
    (subs / student / assignment).mkdir(parents=True)
    nbformat.write(nb, subs / student / assignment / name)


def _submissions(root: Path, subs: Path) -> None:
    """Every submission of the graded course, under ``subs/<student>/<assignment>/``."""
    for a, task in FIRST_TASK.items():
        source = notebook_path(root, a)
        _submit(subs, "inst", a, nbformat.read(source, as_version=4), source.name)
        _submit(subs, "blank", a, nbformat.read(root / "release" / a / source.name,
                                                as_version=4), source.name)
        # a wrong first task: values off by a factor of two
        _submit(subs, "wrong", a,
                append_to_solution(nbformat.read(source, as_version=4), f"{task}_solution",
                                   f"_orig = {task}\n{task} = lambda *a, **k: "
                                   f"_orig(*a, **k) * 2\n"), source.name)
    first = notebook_path(root, "01_first_kernel")
    # right values without a kernel: must fail the structural check
    _submit(subs, "numpy", "01_first_kernel",
            append_to_solution(nbformat.read(first, as_version=4), "add_solution",
                               "add = lambda x, y: np.asarray(x) + np.asarray(y)"), first.name)
    # a solution cell that never ends (the per-cell timeout interrupts it) and one that kills
    # its kernel: statuses timeout and crashed, the rest of the batch unaffected
    for student, code in [("loop", "while True:\n    pass\n"),
                          ("dies", "import os\nos._exit(1)\n")]:
        _submit(subs, student, "01_first_kernel",
                append_to_solution(nbformat.read(first, as_version=4), "add_solution", code),
                first.name)
    (subs / "junk" / "01_first_kernel").mkdir(parents=True)
    (subs / "junk" / "01_first_kernel" / first.name).write_text("{not a notebook")
    (subs / "README.txt").write_text("stray")
    # answers from the grader's own code, each on the instructor's notebook
    for student, (a, task, code) in JAIL_ATTACKS.items():
        source = notebook_path(root, a)
        _submit(subs, student, a, append_to_solution(nbformat.read(source, as_version=4),
                                                     f"{task}_solution", code), source.name)


def graded_course(released: Path, root: Path, subs: Path) -> dict:
    """In ``root``, a copy of the course ``released`` (every assignment released: the session's
    ``released_course``, tests/conftest.py), submit, collect and grade one batch (2 workers,
    learner cells limited to ``LEARNER_CELL_TIMEOUT`` s); the root, collect's report and the
    results by (student, assignment)."""
    shutil.copytree(released, root)
    _submissions(root, subs)
    collected = collect.collect(root, subs, log=lambda *a: None)
    old = os.environ.get("PALLAS_COURSE_CELL_TIMEOUT")
    os.environ["PALLAS_COURSE_CELL_TIMEOUT"] = str(LEARNER_CELL_TIMEOUT)
    try:
        results = grading.autograde(root, workers=2, progress=None, log=lambda *a: None)
    finally:
        if old is None:
            os.environ.pop("PALLAS_COURSE_CELL_TIMEOUT", None)
        else:
            os.environ["PALLAS_COURSE_CELL_TIMEOUT"] = old
    return {"root": root, "collected": collected,
            "results": {(r["student"], r["assignment"]): r for r in results}}


# ----------------------------------------------------------------------------- assignment 01
A = "01_first_kernel"
NB = "first_kernel.ipynb"


def release_01(root: Path) -> None:
    """A course in ``root`` with assignment 01 released, and small limits: the disk attacks end
    quickly, the per-cell timeout keeps a loop short."""
    shutil.copytree(REPO / "exercises" / "source" / A, root / "source" / A,
                    ignore=shutil.ignore_patterns("*.ipynb"))
    shutil.copytree(REPO / "exercises" / "refs", root / "refs")
    config = (REPO / "exercises" / "nbgrader_config.py").read_text()
    (root / "nbgrader_config.py").write_text(
        config + "\nc.TrustedExecute.file_bytes = 32 << 20\n"
        "c.TrustedExecute.disk_bytes = 96 << 20\nLEARNER_TIMEOUT = 5\n")
    grading.release(root, A, log=lambda *a: None)
