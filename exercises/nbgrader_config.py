"""nbgrader configuration of the pallas-course exercises (this folder is the course root).

Run nbgrader through ``pallas-course`` (release, collect, autograde, feedback, export); it
starts nbgrader with this folder as the working directory.
"""

import os
from pathlib import Path

from grader.gradebook.feedback_css import FeedbackCSS
from grader.gradebook.feedback_pp import ClearHiddenOutputs, InertHtml
from grader.gradebook.late import LatePenalty
from grader.logistics.shared import share_with_group
from nbconvert.preprocessors import ClearMetadataPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearHiddenTests,
    ClearOutput,
    DeduplicateIds,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
)

c = get_config()  # noqa: F821 - provided by traitlets when this file is loaded

ROOT = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "pallas-course"
c.CourseDirectory.root = ROOT
# a class's course folder (setgid, deploy/setup-class.sh): what nbgrader writes here, in the
# formgrader's server or a grading worker, stays writable for the other instructors
share_with_group(Path(ROOT))
# SQLite in this folder, with a busy timeout: concurrent autograde workers wait for the gradebook
# lock instead of failing; or a server's URL, e.g. PostgreSQL for graders on several machines
# (`pallas-course --db postgresql://...` sets $PALLAS_COURSE_DB for every nbgrader it starts)
c.CourseDirectory.db_url = (os.environ.get("PALLAS_COURSE_DB")
                            or "sqlite:///" + os.path.join(ROOT, "gradebook.db") + "?timeout=120")
# the jupytext twins (*.py) hold the solutions: never copy them into release/ or autograded/
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py",
                            "*.ipynb.tmp"]
c.Exchange.path_includes_course = True
# feedback is released for every learner it can be, also beside work collected from a folder
c.ExchangeFactory.release_feedback = "grader.logistics.inbound.ReleaseFeedbackWhereSubmitted"
# A class on one machine (deploy/setup-class.sh) names its exchange, outside this folder, which
# learners cannot enter; the course's files are then the instructors' group's (groupshared), and
# an inbound entry is collected only when the student it names owns it
# (grader/logistics/inbound.py). The hub's default exchange, this folder's exchange/, keeps
# nbgrader's own collect: there every server may run as one account (tests/cluster/test_hub.py), and
# owners cannot tell learners apart.
CLASS_EXCHANGE = os.environ.get("PALLAS_COURSE_EXCHANGE")
if CLASS_EXCHANGE and os.path.realpath(CLASS_EXCHANGE) != os.path.realpath(
        os.path.join(ROOT, "exchange")):
    c.Exchange.root = CLASS_EXCHANGE
    c.CourseDirectory.groupshared = True
    c.ExchangeFactory.collect = "grader.logistics.inbound.OwnedCollect"
else:
    c.Exchange.root = os.path.join(ROOT, "exchange")

# A deleted test cell is put back from the gradebook (and scores what it scores).
c.OverwriteCells.add_missing_cells = True
c.Autograde.create_student = True

# grader/jail/trusted.py's preprocessors are named, not imported: nbconvert imports them when
# autograde registers them, so that every other job (release, collect, feedback, export) and an
# instructor's Jupyter server, which read this file too, do not start JAX and load the tasks
# (1-1.5 s of CPU each).
TRUSTED = "grader.jail.trusted."
# Edited test-cell metadata is put back before nbgrader's OverwriteCells, which fails on it
# (RestoreTestCells). Otherwise nbgrader's default list.
c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, TRUSTED + "RestoreTestCells",
                                      OverwriteKernelspec, OverwriteCells, CheckCellMetadata]
# Learner code runs in the grader's own jailed run of the notebook; test cells are judged in the
# grader's process and scored from those verdicts, never from what the cell printed
# (TrustedExecute, VerdictGrades). Same list as nbgrader's default with Execute and
# SaveAutoGrades replaced.
c.Autograde.autograde_preprocessors = [TRUSTED + "TrustedExecute", IgnorePattern,
                                       ClearMetadataPreprocessor, LimitOutput,
                                       TRUSTED + "VerdictGrades", AssignLatePenalties,
                                       CheckCellMetadata]

# Late policy (grader/gradebook/late.py): points off per started hour and per started day past the
# assignment's due date (set it in the formgrader), by the server's clock; `pallas-course
# export` shows the penalty and "late by". 0 and 0: late work is marked late but not penalised.
c.AssignLatePenalties.plugin_class = LatePenalty
c.LatePenalty.points_per_hour = 0.0
c.LatePenalty.points_per_day = 0.0

# Feedback wraps long messages instead of clipping them (grader/gradebook/feedback_css.py); it
# must not show the hidden tests (nbgrader#917, #1156, #1363), nor run the learner's
# HTML: scripts, event handlers, javascript: links (grader/gradebook/feedback_pp.py).
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenOutputs, ClearHiddenTests, InertHtml,
                                    FeedbackCSS]
# nbgrader's feedback template cleans InertHtml's cells again with nbconvert's clean_html, whose
# short list of tags lacks headings and paragraphs: tasks and hints showed a literal </p>. The
# course's own clean (the same list InertHtml applied) does that second pass instead.
c.HTMLExporter.filters = {"clean_html": "grader.gradebook.feedback_pp.clean"}

# Per-cell timeouts. Test cells are locked and restored from the gradebook at autograde, so their
# "timeout" metadata comes from the instructor's source; a learner's own cells get the learner
# timeout and their metadata is ignored. $PALLAS_COURSE_CELL_TIMEOUT (set by whoever runs the
# grader, e.g. the tests) can only lower the learner timeout, never raise it.
DEFAULT_TIMEOUT = 60
MAX_TIMEOUT = 300


def _learner_timeout():
    try:
        return max(1, min(int(os.environ.get("PALLAS_COURSE_CELL_TIMEOUT", DEFAULT_TIMEOUT)),
                          DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT


LEARNER_TIMEOUT = _learner_timeout()


def cell_timeout(cell):
    meta = cell.get("metadata", {})
    nb = meta.get("nbgrader", {})
    if nb.get("locked") or nb.get("grade"):
        try:
            return max(1, min(int(meta.get("timeout", DEFAULT_TIMEOUT)), MAX_TIMEOUT))
        except (TypeError, ValueError):
            return DEFAULT_TIMEOUT
    return LEARNER_TIMEOUT


c.Execute.timeout = DEFAULT_TIMEOUT
c.Execute.timeout_func = cell_timeout
c.Execute.interrupt_on_timeout = True
# the grading kernel finds the hidden references through this variable (grader.verdict.refs)
os.environ.setdefault("PALLAS_COURSE_ROOT", ROOT)
