"""Grades an instructor can trust (issue 14): one batch of assignment 01 with real nbgrader.

Each submission starts from the instructor's solution (9 points: add, elementwise,
leaky_relu, each 1 visible + 2 hidden) and adds one thing that used to change its grade:

1. scoring hijack: a wrong ``add`` that emits an ``execute_result`` while test cells run;
2. the kernel only copies what jnp computed;
2b. a right ``add`` that prints, warns, logs and plots while checks call it (full marks);
2c. the check's job rewritten in the harness's memory (only that task is lost);
3. the work facts forged by IPython hooks around each cell; the writer of the answers patched;
5. correct work marked down: stderr during test cells; one oversized wrong output;
6. a learner-raised ``metadata.timeout`` on a test cell;
8. feedback: learner script and event-handler HTML; the page's scores against the gradebook.
"""

from __future__ import annotations

import csv
import html.parser
import re

import nbformat
import pytest
from test_hostile import NB, WRONG_ADD, A, _after, _cell, _course

from grader.jail import sandbox, trusted
from grader.logistics import batch as grading
from grader.logistics import collect, submission

LEARNER_HTML = ('<script>alert("md")</script> <img src=x onerror="alert(1)"> '
                '\n\n[click](javascript:alert(2)) [also](jav&#x61;script:alert(5))')


# walks up from the solution cell to the grader's harness and points add's checks at the
# right add the cell kept: what the job says is evaluated, on which cases, is the notebook's data
REWRITE_ADDS_CHECKS = (
    "import sys\n_f = sys._getframe()\n"
    "while _f is not None and type(_f.f_locals.get('self')).__name__ != 'Harness':\n"
    "    _f = _f.f_back\n"
    "for _cell in [] if _f is None else _f.f_locals['self'].job['cells']:\n"
    "    for _check in _cell['checks']:\n"
    "        if _check[0] == 'add':\n"
    "            _check[2] = '_right_add'\n")


NOISY_ADD = ("import logging\nimport warnings\nimport matplotlib.pyplot as plt\n"
             "_plain_add = add\ndef add(x, y):\n    print('add called on', x.shape)\n"
             "    warnings.warn('a learner warning')\n"
             "    logging.getLogger('learner').warning('a learner log line')\n"
             "    plt.figure()\n    plt.plot([0, 1], [1, 0])\n    return _plain_add(x, y)\n")


def _raise_timeout(nb, paths):
    _cell(nb, "add_hidden")[1].metadata["timeout"] = 3000
    return nb


def _learner_html(nb, paths):
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(LEARNER_HTML))
    nb.cells.insert(2, nbformat.v4.new_code_cell(
        "from IPython.display import HTML, display\n"
        "display(HTML('<script>alert(3)</script><b onclick=\"alert(4)\">hi</b>'))"))
    return nb


# name: (mutation, expected score, expected status, a word the reason contains)
SUBMISSIONS = {
    "honest": (lambda nb, paths: nb, 9, "graded", ""),
    # 1: nbgrader would score each add cell from this output (its first execute_result)
    "display_hook_hijack": (_after("add_solution", WRONG_ADD + "_wrong_add = add\n"
                                   "def add(x, y):\n    get_ipython().displayhook(9)\n"
                                   "    return _wrong_add(x, y)\n"), 6, "graded", ""),
    # 5: a warning on stderr while a passing test runs costs nothing
    "stderr_noise": (_after("add_solution", "import sys\n_quiet_add = add\n"
                            "def add(x, y):\n    print('UserWarning: slow path', file=sys.stderr)"
                            "\n    return _quiet_add(x, y)\n"), 9, "graded", ""),
    # a right add that prints, warns, logs and draws with pyplot each time a check calls it:
    # output and ordinary imports are never a signal (issue 36)
    "noisy_but_right": (_after("add_solution", NOISY_ADD), 9, "graded", ""),
    # 5: a wrong output too large to read fails add alone, not every later test cell
    "oversized_output": (_after("add_solution", "add = lambda x, y: jnp.zeros((4096, 4096))\n"),
                         6, "graded", ""),
    # 6: the test cell's time limit comes back from the release, and the change is reported
    "raised_timeout": (_raise_timeout, 9, "tampered", "timeout"),
    # 8: right answers; the learner's HTML must reach the feedback page inert
    "learner_html": (_learner_html, 9, "graded", ""),
    # 2: right values, but jnp adds and the kernel only copies: add's points are lost
    "sum_outside_kernel": (_after("add_solution", "def add(x, y):\n    def copy(s_ref, o_ref):\n"
                                  "        o_ref[...] = s_ref[...]\n    return pl.pallas_call("
                                  "copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), "
                                  "interpret=INTERPRET)(x + y)\n"), 6, "graded", ""),
    # 3: forge the work facts during each cell and restore them before the next probe
    "patch_in_hooks": (_after("add_solution", "import kernelsim\n_real = kernelsim.trace\n"
                              "def _forge(info):\n    kernelsim.trace = lambda *a, **k: None\n"
                              "def _restore(result):\n    kernelsim.trace = _real\n"
                              "get_ipython().events.register('pre_run_cell', _forge)\n"
                              "get_ipython().events.register('post_run_cell', _restore)\n"),
                       0, "tampered", "pre_run_cell hook"),
    # the harness's job rewritten in the notebook's memory (issue 36): add's checks made to
    # evaluate another function of the notebook; add alone loses its points
    "rewritten_check": (_after("add_solution", WRONG_ADD + REWRITE_ADDS_CHECKS), 6, "tampered",
                        "evaluated '_right_add', not 'add'"),
    # 3: a writer the answers once went through: the grader's run of the notebook sees it
    # replaced before it makes any fact
    "patch_json_dump": (_after("add_solution", "import json\njson.dump = lambda *a, **k: None\n"),
                        0, "tampered", "json.dump was replaced"),
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory, released_01):
    root = tmp_path_factory.mktemp("trust-course") / "course"
    source = _course(root, released_01)
    subs = tmp_path_factory.mktemp("trust-subs")
    for student, (mutate, *_) in SUBMISSIONS.items():
        (subs / student / A).mkdir(parents=True)
        nb = mutate(nbformat.read(source, as_version=4), {})
        nbformat.write(nb, subs / student / A / NB)
    collect.collect(root, subs, log=lambda *a: None)
    grading.autograde(root, workers=2, timeout=240, progress=None, log=lambda *a: None)
    grading.feedback(root, A, log=lambda *a: None)
    grades = root / "grades.csv"
    grading.export(root, grades, log=lambda *a: None)
    with grades.open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return {"root": root, "rows": rows}


@pytest.mark.parametrize("student", sorted(SUBMISSIONS))
def test_submission_gets_its_grade_and_status(batch, student):
    _, score, status, word = SUBMISSIONS[student]
    row = batch["rows"][student]
    assert (float(row["score"]), row["status"]) == (score, status), row
    assert word in row["reason"], row["reason"]


def _page(batch, student: str) -> str:
    return (batch["root"] / "feedback" / student / A / NB.replace(".ipynb", ".html")).read_text()


def _gradebook_scores(batch, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{batch['root'] / 'gradebook.db'}", "pallas-course") as gb:
        sub = gb.find_submission_notebook(NB.removesuffix(".ipynb"), A, student)
        return {g.name: float(g.score) for g in sub.grades}


@pytest.mark.parametrize("student", ["display_hook_hijack", "stderr_noise", "oversized_output"])
def test_page_scores_are_the_gradebook_scores(batch, student):
    page = _page(batch, student)
    shown = {gid: float(score) for gid, score in
             re.findall(r'href="#([\w-]+)">Test cell</a> \(Score: ([\d.]+) /', page)}
    assert shown and shown == _gradebook_scores(batch, student)
    if student != "stderr_noise":
        assert shown["add_visible"] == shown["add_hidden"] == 0
        assert shown["elementwise_hidden"] == 2


def test_raised_timeout_is_restored(batch):
    autograded = nbformat.read(batch["root"] / "autograded" / "raised_timeout" / A / NB,
                               as_version=4)
    released = nbformat.read(batch["root"] / "release" / A / NB, as_version=4)
    assert _cell(autograded, "add_hidden")[1].metadata["timeout"] == \
        _cell(released, "add_hidden")[1].metadata["timeout"] != 3000


def test_oversized_output_is_named_in_the_verdict(batch):
    assert "sensible size" in _page(batch, "oversized_output")


def test_work_outside_the_kernel_is_named_in_the_verdict(batch):
    assert "computed outside the kernel by add" in _page(batch, "sum_outside_kernel")


class _Active(html.parser.HTMLParser):
    """Collects what a browser would run: script bodies, on* handlers, javascript: links."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self._in_script = tag == "script"
        for name, value in attrs:
            if name.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value!r}>")

    def handle_data(self, data):
        if self._in_script and "alert" in data:
            self.found.append(f"<script>{data.strip()[:60]}")

    def handle_endtag(self, tag):
        self._in_script = False


def test_feedback_runs_no_learner_html(batch):
    page = _page(batch, "learner_html")
    assert "alert(3)" in page or "alert(4)" in page, "the learner's output is shown (escaped)"
    parser = _Active()
    parser.feed(page)
    assert parser.found == []


# 5: a jail that cannot import the course stops the batch before anything is graded
def test_preflight_passes_with_the_course_in_the_jail():
    assert trusted.preflight(trusted.TrustedExecute().limits()) is None


def test_preflight_names_what_the_jail_cannot_import(monkeypatch):
    if sandbox.isolation() != "jail":
        pytest.skip("without the jail every folder is readable")
    readable = trusted.readable
    monkeypatch.setattr(trusted, "readable",
                        lambda: [p for p in readable() if p.name != "kernelsim"])
    why = trusted.preflight(trusted.TrustedExecute().limits())
    assert "cannot import the course" in why and "kernelsim" in why, why


def test_batch_fails_before_grading_when_the_jail_check_fails(tmp_path, monkeypatch):
    root = tmp_path / "course"
    (root / "submitted" / "alice" / A).mkdir(parents=True)
    (root / "submitted" / "alice" / A / NB).write_text("{}")
    jobs = []

    def run(self, *args, timeout=None):
        jobs.append(args)
        return {"success": False, "error": "the grading jail cannot import the course"}

    monkeypatch.setattr(submission.Worker, "run", run)
    with pytest.raises(RuntimeError, match="not grading: the grading jail cannot import"):
        grading.autograde(root, progress=None, log=lambda *a: None)
    assert jobs == [("preflight",)]
    assert not (root / "status").exists()
