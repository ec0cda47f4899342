"""Hostile and broken submissions, graded in one batch with honest ones (real nbgrader, jail).

Assignment 01 has three tasks (add, elementwise, leaky_relu), each worth 1 visible + 2 hidden
points: 9 in all. Each hostile submission below starts from the instructor's solution, so its
correct grade follows from which tasks its attack breaks: a wrong ``add`` forfeits 3 points,
tampering with the grading code forfeits every test cell run after it. A notebook is executed
once, by the grader's own run of it (``grader.jail.replay``), which makes the facts, so code that
forges only where a Jupyter kernel runs it changes nothing (``kernel_only_forgery``).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from coursetools import NB, A

from grader.jail import sandbox
from grader.logistics import batch as grading
from grader.logistics import collect

REPO = Path(__file__).resolve().parents[3]
WRONG_ADD = "_right_add = add\nadd = lambda x, y: _right_add(x, y) * 2\n"
# a Jupyter kernel (the learner's own JupyterLab; grading starts none), or the grader's run
IN_KERNEL = "import sys\nif 'ipykernel' in sys.modules:\n"
IN_FRESH_RUN = "import sys\nif 'ipykernel' not in sys.modules:\n"
# class 3: attempts to forge the facts, each with a wrong add that the forgery would pass
TRACE_TIME_PATCH = (  # installed while add is traced; it removes itself once used
    "import kernelsim\n_run = kernelsim.run\n"
    "def _forged(*a, **k):\n    kernelsim.run = _run\n    return _run(*a, **k)\n"
    "_right_add = add\ndef add(x, y):\n    kernelsim.run = _forged\n"
    "    return _right_add(x, y) * 2\n")
PATCH_FROM_THREAD = (  # the honest kernel traced in place of the wrong one, now and then
    WRONG_ADD + "import threading, time, grader.calling\n"
    "_real = grader.calling.trace_case\n"
    "def _honest(task, fn, arrays, params):\n    return _real(task, _right_add, arrays, params)\n"
    "def _flip():\n    while True:\n        grader.calling.trace_case = _honest\n"
    "        time.sleep(0.001)\n        grader.calling.trace_case = _real\n"
    "threading.Thread(target=_flip, daemon=True).start()\n")
FORGE_CHANNEL = (IN_FRESH_RUN + "    import os, struct\n    for fd in range(3, 64):\n"
                 "        try:\n            os.write(fd, struct.pack('>I32s', 17, b'0' * 32) + "
                 "b'{{\"kind\": \"done\"}}\\0')\n        except OSError:\n            pass\n")
KERNEL_ONLY_FORGERY = (  # forges course.check where a kernel runs it: grading runs none
    WRONG_ADD + IN_KERNEL + "    import json, pathlib\n    from grader.learner import course\n"
    "    course.check = lambda *a, **k: print(a[0] + ': 1 visible case(s) passed')\n"
    "    json.dump = lambda *a, **k: None\n"
    "    pathlib.Path.write_text = lambda self, *a, **k: 0\n")
LEFTOVER_ANSWERS = (  # an old grading kernel's answer files, handed in again
    WRONG_ADD + "import json\nfor kind in ('visible', 'hidden'):\n"
    "    open(f'answer-add-{{kind}}.json', 'w').write(json.dumps({{'nonce': 'x', 'errors': {{}},"
    " 'traces': {{}}, 'work': {{}}}}))\n    open(f'answer-add-{{kind}}.npz', 'wb').write(b'')\n")
TRACED_DECOY = (  # a kernel for the tracer, the right answer in plain jnp otherwise
    "def add(x, y):\n    if type(x).__name__.endswith('Tracer'):\n"
    "        def zeros(x_ref, y_ref, o_ref):\n            o_ref[...] = jnp.zeros_like(x_ref)\n"
    "        return pl.pallas_call(zeros, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),"
    " interpret=INTERPRET)(x, y)\n    return x + y\n")


def _cell(nb, gid):
    for i, c in enumerate(nb.cells):
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid:
            return i, c
    raise AssertionError(gid)


def _after(gid: str, code: str):
    """A mutation: append ``code`` to the solution cell ``gid``."""
    def mutate(nb, paths):
        _cell(nb, gid)[1].source += "\n" + code.format(**paths)
        return nb
    return mutate


def _edit_test_cells(kind: str):
    def mutate(nb, paths):
        if kind != "reordered":
            nb = _after("add_solution", WRONG_ADD)(nb, paths)
        i, cell = _cell(nb, "add_hidden")
        if kind == "edited":
            cell.source = "pass  # nothing to see"
        elif kind == "deleted":
            del nb.cells[i]
            del nb.cells[_cell(nb, "add_visible")[0]]
        elif kind == "duplicated":
            nb.cells.insert(i, nbformat.from_dict(json.loads(json.dumps(cell))))
        elif kind == "metadata":
            cell.metadata.nbgrader.update(points=100, grade=False, checksum="0" * 32)
        elif kind == "reordered":  # right answers, tests swapped: full marks, still flagged
            j, visible = _cell(nb, "add_visible")
            nb.cells[i], nb.cells[j] = visible, cell
        return nb
    return mutate


# name: (mutation, expected score, expected status (or statuses), a word the reason contains)
CORPUS = {
    # patching the checks
    "patch_assert_allclose": (_after("add_solution", WRONG_ADD + "import numpy.testing\n"
                                     "numpy.testing.assert_allclose = lambda *a, **k: None\n"),
                              0, "tampered", "numpy.testing.assert_allclose"),
    "patch_jax": (_after("add_solution", "jax.device_get = lambda x: x\n"), 0, "tampered",
                  "jax.device_get"),
    "patch_course_check": (_after("add_solution", WRONG_ADD + "course.check = lambda *a, **k: "
                                  "print(a[0] + ': 1 visible case(s) passed')\n"),
                           0, "tampered", "grader.learner.course.check was replaced"),
    "patch_kernelsim": (_after("add_solution", "kernelsim.trace = lambda *a, **k: None\n"),
                        0, "tampered", "kernelsim.trace"),
    "patch_builtins": (_after("add_solution", "import builtins\n"
                              "builtins.print = lambda *a, **k: None\n"), 0, "tampered",
                       "builtins.print"),
    # a builtin the kernel's own message loop needs: the kernel stops answering
    "break_the_kernel": (_after("add_solution", "import builtins\n"
                                "builtins.isinstance = lambda *a: True\n"), 0, "crashed",
                         "died while running add_solution"),
    "patch_sys_modules": (_after("add_solution", "import sys, types\n"
                                 "sys.modules['numpy.testing'] = types.ModuleType('numpy.testing')"
                                 "\n"), 0, "tampered", "numpy.testing"),
    "patch_traceback": (_after("add_solution", WRONG_ADD + "get_ipython().showtraceback = "
                               "lambda *a, **k: None\n"), 0, "tampered", "showtraceback"),
    "fake_passed_output": (_after("add_solution", WRONG_ADD + "print('add: 1 visible case(s) "
                                  "passed; structure: pallas_call reached ok')\n"),
                           6, "graded", ""),
    # reading what it must not, or answering without a kernel
    "read_secrets": (_after("add_solution", WRONG_ADD + "import os\n"
                            "print('SECRETS', [p for p in {secrets} if os.path.exists(p)], "
                            "[f for _, _, fs in os.walk({root!r}) for f in fs])\n"),
                     6, "graded", ""),
    "plain_jax": (_after("add_solution", "add = lambda x, y: x + y\n"), 6, "graded", ""),
    # the grader's run has no grader.tasks (tests/grader/jail/test_jail_imports.py): the import,
    # when add is traced, raises ImportError
    "course_reference": (_after("add_solution", "def add(x, y):\n    from grader import tasks\n"
                                "    return tasks.get('add').reference(x, y)\n"),
                         6, "graded", ""),
    # editing the test cells
    "edited_test": (_edit_test_cells("edited"), 6, "tampered", "add_hidden was edited"),
    "deleted_tests": (_edit_test_cells("deleted"), 6, "tampered", "deleted"),
    "duplicated_test": (_edit_test_cells("duplicated"), 6, "tampered", "appears 2 times"),
    "altered_metadata": (_edit_test_cells("metadata"), 6, "tampered", "metadata"),
    "reordered_tests": (_edit_test_cells("reordered"), 9, "tampered", "reordered"),
    # killing the grading
    "sys_exit": (_after("add_solution", "import sys\nsys.exit(0)\n"), 9, "graded", ""),
    "os_exit": (_after("add_solution", "import os\nos._exit(3)\n"), 0, "crashed",
                "died while running add_solution: it exited with status 3"),
    # every process it may signal: its parent and, with pid -1, all others it can reach
    "signal_everyone": (_after("leaky_relu_solution",
                               "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                               "os.kill(-1, signal.SIGKILL)\n"), 9, "graded", ""),
    "infinite_loop": (_after("leaky_relu_solution", "del leaky_relu\nwhile True:\n    pass\n"),
                      6, "timeout", "leaky_relu_solution"),
    "memory_bomb": (_after("leaky_relu_solution", "del leaky_relu\nx = bytearray(64 << 30)\n"),
                    6, "limit", "memory"),
    # forks until the process limit stops it. What the kernel can still do with a full
    # process table depends on timing: the cell fails (graded), the kernel stops answering
    # (crashed) or the forking outlasts the cell's time (timeout). The score is the same.
    "fork_bomb": (_after("leaky_relu_solution",
                         "import os\ndel leaky_relu\nwhile True:\n    if os.fork() == 0:\n"
                         "        os.execv('/bin/sleep', ['sleep', '600'])\n"),
                  6, ("graded", "crashed", "timeout"), ""),
    "huge_file": (_after("leaky_relu_solution", "del leaky_relu\n"
                         "open('big', 'wb').write(b'x' * (40 << 20))\n"), 6, "limit",
                  "larger than"),
    "fill_disk": (_after("leaky_relu_solution", "import time\nfor i in range(50):\n"
                         "    open(f'f{{i}}', 'wb').write(b'x' * (15 << 20)); time.sleep(0.05)\n"),
                  6, "limit", "to disk"),
    # issue 52: processes a cell leaves behind (os.fork is refused in the notebook's process,
    # a subprocess is not) spun on every core while later cells ran, and nothing was flagged;
    # they end with the cell, and the reason names it
    "cpu_left_running": (_after("leaky_relu_solution", "import subprocess, sys\n"
                                "for _ in range(4):\n"
                                "    subprocess.Popen([sys.executable, '-c', 'while True: pass'],"
                                " start_new_session=True)\n"),
                         9, "graded", "leaky_relu_solution (4) were ended after their cell"),
    "fork_bomb_left_running": (_after("leaky_relu_solution", "import subprocess, sys\n"
                                      "subprocess.Popen([sys.executable, '-c', 'import os\\n"
                                      "while True:\\n    try:\\n        os.fork()\\n"
                                      "    except OSError:\\n        pass'])\n"),
                               9, "graded", "were ended after their cell"),
    "output_flood": (_after("add_solution", "for _ in range(20000):\n    print('y' * 1000)\n"),
                     9, "graded", ""),
    "hang_on_input": (_after("leaky_relu_solution", "del leaky_relu\ninput('password? ')\n"),
                      6, "graded", ""),
    # class 3: forging the facts the grader judges
    "trace_time_patch": (_after("add_solution", TRACE_TIME_PATCH), 0, "tampered",
                         "kernelsim.run was replaced"),
    "patch_from_thread": (_after("add_solution", PATCH_FROM_THREAD), 6, "graded", ""),
    "forge_answer_channel": (_after("add_solution", FORGE_CHANNEL), 0, "tampered",
                             "bytes its harness did not write"),
    "kernel_only_forgery": (_after("add_solution", KERNEL_ONLY_FORGERY), 6, "graded", ""),
    "leftover_answer_files": (_after("add_solution", LEFTOVER_ANSWERS), 6, "graded", ""),
    "patch_json_and_pathlib": (_after("add_solution", WRONG_ADD + "import json, pathlib\n"
                                      "json.dump = lambda *a, **k: None\n"
                                      "pathlib.Path.read_text = lambda self, *a, **k: ''\n"),
                               0, "tampered", "json.dump was replaced"),
    "traced_decoy": (_after("add_solution", TRACED_DECOY), 6, "graded", ""),
    # legal content the grader must write: a lone surrogate (not UTF-8), a display nested
    # 800 levels deep (nbformat's validator recursed once per level)
    "lone_surrogate": (_after("add_solution", "s = '\\ud800'\nprint(s, repr(s))\ns\n"),
                       9, "graded", ""),
    "deep_display": (_after("add_solution", "from IPython.display import display\nv = 0\n"
                            "for _ in range(800):\n    v = [v]\n"
                            "display({{'application/json': {{'v': v}}}}, raw=True)\n"),
                     9, "graded", ""),
    "walk_the_harness": (_after("add_solution", "import gc\n_right_add = add\n"
                                "def add(x, y):\n    gc.get_objects()\n"
                                "    return _right_add(x, y)\n"), 0, "tampered",
                         "listed every object"),
}
HONEST = ("honest_1", "honest_2")
# without the jail these would reach the grader's own processes (kill -1 as root, no process
# limit for root): they only run where the jail exists
JAIL_ONLY = {"signal_everyone", "fork_bomb", "cpu_left_running", "fork_bomb_left_running"}
BROKEN_FILES = {
    "invalid_json": b"{not json",
    "nbformat_99": json.dumps({"nbformat": 99, "nbformat_minor": 0, "metadata": {},
                               "cells": []}).encode(),
    "no_cells": json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}}).encode(),
    "not_utf8": b"\xff\xfe\x00{\x00\x80\x81",
    "python_file": b"def add(x, y):\n    return x + y\n",
    "empty_file": b"",
    # valid JSON, but a lone UTF-16 surrogate no file can hold as UTF-8 (issue 36: crashed)
    "surrogate_in_markdown": json.dumps(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("\ud800")])).encode(),
}


def _course(root: Path, released: Path) -> Path:
    """A course with assignment 01 released: a copy of the session's ``released`` (the
    ``released_01`` fixture, coursetools.release_01: small limits keep the disk attacks
    quick; the per-cell timeout keeps the loop short); returns the instructor notebook."""
    shutil.copytree(released, root)
    return root / "source" / A / NB


@pytest.fixture(scope="session")
def hostile(tmp_path_factory, released_01):
    root = tmp_path_factory.mktemp("hostile-course") / "course"
    source = _course(root, released_01)
    subs = tmp_path_factory.mktemp("hostile-subs")
    paths = {"root": str(root),
             "secrets": repr([str(root / "refs" / "manifest.json"), str(root / "gradebook.db"),
                              str(source), str(root / "submitted" / "honest_1" / A / NB),
                              str(REPO / "exercises" / "refs" / "manifest.json")])}

    def put(student: str, data: bytes, name: str = NB) -> None:
        d = subs / student / A
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)

    for student, (mutate, *_rest) in CORPUS.items():
        if student in JAIL_ONLY and sandbox.isolation() != "jail":
            continue
        nb = mutate(nbformat.read(source, as_version=4), paths)
        put(student, nbformat.writes(nb).encode())
    for student in HONEST:
        put(student, source.read_bytes())
    for student, data in BROKEN_FILES.items():
        put(student, data)
    # layout errors: a notebook one level too high, and a second copy next to the real one
    (subs / "no_assignment_folder").mkdir()
    (subs / "no_assignment_folder" / NB).write_bytes(source.read_bytes())
    put("honest_2", source.read_bytes(), "first_kernel-copy.ipynb")
    collected = collect.collect(root, subs, log=lambda *a: None)
    results = grading.autograde(root, workers=2, timeout=240, progress=None,
                                log=lambda *a: None)
    grades = root / "grades.csv"
    grading.export(root, grades, log=lambda *a: None)
    with grades.open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return {"root": root, "collected": collected, "rows": rows,
            "results": {r["student"]: r for r in results}}


def _autograded(hostile, student: str) -> str:
    return (hostile["root"] / "autograded" / student / A / NB).read_text()


@pytest.mark.parametrize("student", sorted(CORPUS))
def test_hostile_submission_gets_its_grade_and_status(hostile, student):
    _, score, status, word = CORPUS[student]
    if student in JAIL_ONLY and sandbox.isolation() != "jail":
        pytest.skip(f"{student} needs the jail (root and bubblewrap); it was not submitted")
    row = hostile["rows"][student]
    statuses = status if isinstance(status, tuple) else (status,)
    assert float(row["score"]) == score and row["status"] in statuses, row
    assert word in row["reason"], row["reason"]


def test_honest_submissions_keep_full_marks(hostile):
    for student in HONEST:
        row = hostile["rows"][student]
        assert (float(row["score"]), float(row["max_score"]), row["status"]) == (9, 9, "graded")


@pytest.mark.parametrize("student", sorted(BROKEN_FILES))
def test_broken_file_is_malformed_with_a_reason(hostile, student):
    row = hostile["rows"][student]
    assert (float(row["score"]), row["status"]) == (0, "malformed"), row
    assert NB in row["reason"]


def test_layout_errors_are_skipped_with_reasons(hostile):
    skipped = dict(hostile["collected"]["skipped"])
    assert "laid out" in skipped[f"no_assignment_folder/{NB}"]
    assert "not a notebook of this assignment" in skipped[f"honest_2/{A}/first_kernel-copy.ipynb"]
    assert "no_assignment_folder" not in hostile["rows"]


def test_every_submission_has_a_row(hostile):
    expected = set(CORPUS) | set(HONEST) | set(BROKEN_FILES)
    if sandbox.isolation() != "jail":
        expected -= JAIL_ONLY
    assert set(hostile["rows"]) == expected
    assert all(r["status"] for r in hostile["rows"].values())


def _text(cell) -> str:
    return "".join("".join(o["text"]) if isinstance(o.get("text"), list) else o.get("text", "")
                   for o in cell.get("outputs", []))


def test_secrets_were_not_readable(hostile):
    if sandbox.isolation() != "jail":  # only limits apply without root and bubblewrap
        pytest.skip("the jail needs root and bubblewrap; ran with rlimits only")
    cells = json.loads(_autograded(hostile, "read_secrets"))["cells"]
    out = next(_text(c) for c in cells if "SECRETS" in _text(c))
    assert "SECRETS [] []" in out, out


def test_verdicts_come_from_the_grader_s_own_run(hostile):
    # the forgery waits for a Jupyter kernel, which grading never starts: the grader's run
    # judged the wrong add, and nothing printed "passed"
    forged = _autograded(hostile, "kernel_only_forgery")
    assert "add: wrong values for case" in forged and "add: 1 visible case(s)" not in forged
    # the thread was refused in the grader's run: the failing check says so
    assert "starting a thread is not allowed" in _autograded(hostile, "patch_from_thread")


def test_flooded_output_is_capped(hostile):
    assert len(_autograded(hostile, "output_flood")) < 3 << 20
    assert "was dropped by the grader" in _autograded(hostile, "output_flood")


def test_no_process_of_a_sandbox_uid_survives(hostile):
    """After the hostile batches, no slot that no grader holds has a process left, under the
    submission's uid or the checker's. A slot another grader holds is skipped: `make test` runs
    a second pytest process beside this one, whose sandbox tests and Dask workers hold slots
    with runs in them (this test once failed on one of those)."""
    for slot in range(sandbox.SLOTS):
        with sandbox.slot_if_free(slot) as free:
            for checker in (False, True) if free else ():
                uid = sandbox.sandbox_uid(slot, checker)
                assert uid is None or sandbox.pids_of_uid(uid) == [], (slot, checker)


def _kill_processes_mentioning(text: str) -> int:
    """SIGKILL every process whose command line contains ``text`` (a power cut, in effect)."""
    killed = 0
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if entry.name.isdigit() and text in cmd and int(entry.name) != os.getpid():
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def test_interrupted_batch_resumes_without_regrading(tmp_path, released_01):
    root = tmp_path / "course"
    source = _course(root, released_01)
    subs = tmp_path / "subs"
    students = [f"s{i}" for i in range(4)]
    for s in students:
        (subs / s / A).mkdir(parents=True)
        shutil.copy(source, subs / s / A / NB)
    collect.collect(root, subs, log=lambda *a: None)
    batch = subprocess.Popen([sys.executable, "-m", "grader.cli", "--course", str(root),
                              "autograde", "--workers", "1"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    status = root / "status" / A
    deadline = time.monotonic() + 300
    while not (status.is_dir() and any(status.glob("*.json"))):
        assert batch.poll() is None and time.monotonic() < deadline, "no submission finished"
        time.sleep(0.2)
    assert _kill_processes_mentioning(str(root)) >= 1
    batch.wait()
    done = {p.stem: p.stat().st_mtime_ns for p in status.glob("*.json")}
    assert 1 <= len(done) < len(students), done
    results = grading.autograde(root, resume=True, progress=None, log=lambda *a: None)
    assert sorted(r["student"] for r in results) == sorted(set(students) - set(done))
    for s, mtime in done.items():  # finished before the cut: not graded again
        assert (status / f"{s}.json").stat().st_mtime_ns == mtime
    scores = grading._scores(root)  # the gradebook opens and holds every submission's score
    assert {s: scores[(s, A)] for s in students} == {s: (9.0, 9.0) for s in students}
