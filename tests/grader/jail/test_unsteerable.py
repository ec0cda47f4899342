"""The grader's run cannot be steered (issue 25): nothing learner code can reach holds a
secret, an expectation or a decision.

Threat model (exercises/README.md, "How grading is protected"): learner code runs with every
power Python gives inside the notebook's process. Each test below is one way in, written
from that model and run through the real jail (``trusted.FreshRun``): call-stack and gc walks,
patches of modules and builtins, file APIs and /proc, inherited descriptors, mutation after
the fact, partial and forged frames, and a check that never ends. What must hold: the walk
finds no key and no input value, a forged or partial frame ends ``tampered``, a wrong
answer stays wrong, and a hung check costs its own cell only.
"""

from __future__ import annotations

import hashlib

import nbformat
import numpy as np
import pytest
from test_replay import HONEST_ADD, LIMITS, SETUP, _cells, _fresh, _verdict

from grader.jail import exchange, sandbox, trusted
from grader.verdict import refs, verdict

# disarm the notebook process's tamper alarm through a stack walk, as an attacker would
DISARM = ("import sys\n_f = sys._getframe()\nwhile _f is not None:\n"
          "    _h = _f.f_locals.get('self')\n"
          "    if hasattr(_h, 'guard') and hasattr(_h, 'snapshot'):\n"
          "        _h.guard.armed = False\n        _h.tampering = lambda: []\n"
          "        HARNESS = _h\n        break\n    _f = _f.f_back\n")
# every array, 32-byte string and 64-digit hex string the garbage collector's objects hold,
# as digests (arrays and bytes are not tracked themselves: their holders are)
WALK = (DISARM + "import gc, hashlib, numpy\nSEEN = set()\n"
        "def _note(o):\n    try:\n        if isinstance(o, numpy.ndarray):\n"
        "            o = numpy.ascontiguousarray(o).tobytes()\n"
        "        elif isinstance(o, str) and len(o) == 64:\n            o = bytes.fromhex(o)\n"
        "        elif not (isinstance(o, bytes) and len(o) == 32):\n            return\n"
        "        SEEN.add(hashlib.sha256(o).hexdigest())\n    except Exception:\n"
        "        pass\nfor _o in gc.get_objects():\n    _note(_o)\n"
        "    for _r in gc.get_referents(_o):\n        _note(_r)\n"
        "print('DIGESTS', len(SEEN))\nprint(' '.join(sorted(SEEN)))\n")


def _inputs(task: str, hidden: bool) -> list[np.ndarray]:
    refdir = refs.REPO / "exercises" / "refs"
    manifest = refs.load_manifest(refdir)
    return [a for e in manifest["cases"].values() if e["task"] == task and e["hidden"] == hidden
            for a in refs.load_case(refdir, e)[0].values()]


def _text(got) -> str:
    return "".join(str(p.get("text", "")) for pieces in got.outputs.values() for p in pieces)


def test_a_stack_and_gc_walk_finds_no_key_and_no_input(slot):
    cells = _cells(WALK)
    run = trusted.FreshRun(cells, slot, LIMITS, lambda cell: 60)
    key = run.key
    got = run.finish()
    out = _text(got)
    assert "DIGESTS" in out, out[:2000]
    seen = set(out.split("DIGESTS", 1)[1].split())
    for a in _inputs("add", False) + _inputs("add", True):
        assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() not in seen
    assert hashlib.sha256(key).hexdigest() not in seen
    assert _verdict(got, run.loaded).passed  # and the honest add is still judged right


def test_a_forged_answer_written_with_the_harness_s_own_send_is_tampering(slot):
    forged = DISARM + ("HARNESS.send({'kind': 'check', 'cell': 4, 'task': 'add', "
                       "'hidden': False, 'failed': None, 'errors': {}, 'dtypes': {}})\n")
    got, _ = _fresh(slot, forged)
    assert any("out of order" in t for t in got.tampered), got.tampered
    assert got.answers == {}


def test_a_wrong_add_stays_wrong_whatever_is_patched_in_the_notebook(slot):
    patched = DISARM + (
        "import kernelsim, builtins, numpy.testing\n"
        "_right = add\nadd = lambda x, y: _right(x, y) * 2\n"
        "kernelsim.run = lambda *a, **k: None\nkernelsim.trace = lambda *a, **k: None\n"
        "numpy.testing.assert_allclose = lambda *a, **k: None\n"
        "builtins.isinstance = isinstance\n")
    got, loaded = _fresh(slot, patched)
    assert got.tampered == [], got.tampered  # the alarm was switched off ...
    v = _verdict(got, loaded)  # ... and the checker, which none of it reached, judged
    assert not v.passed and "wrong values" in v.message, v.message


def test_a_partial_frame_is_tampering_not_a_crash(slot):
    partial = ("import os, struct\nfor fd in range(3, 64):\n    try:\n"
               "        os.write(fd, struct.pack('>I32s', 1000, b'0' * 32) + b'{\"kind\"')\n"
               "    except OSError:\n        pass\nos._exit(0)\n")
    got, _ = _fresh(slot, partial)
    assert got.tampered and got.died is None, (got.tampered, got.died)


def test_bytes_on_every_descriptor_are_tampering_and_reach_no_checker(slot):
    scribble = ("import os\nfor fd in range(64):\n    try:\n"
                "        os.write(fd, b'\\0\\0\\0\\4' + b'1' * 36)\n    except OSError:\n"
                "        pass\n")
    got, _ = _fresh(slot, scribble)
    assert any("did not write" in t for t in got.tampered), got.tampered


def test_the_checker_is_out_of_sight(slot):
    if sandbox.isolation() != "jail":
        pytest.skip("the checker's own uid and namespaces need the jail (root and bubblewrap)")
    look = ("import os\nmine = os.getpid()\n"
            "print('PROCS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
            "print('UID', os.getuid())\nprint('FILES', sorted(os.listdir('.')))\n")
    got, loaded = _fresh(slot, look)
    out = _text(got)
    procs = eval(out.split("PROCS", 1)[1].splitlines()[0])  # noqa: S307 - our own print
    assert len(procs) <= 3, procs  # bwrap's init, the notebook, nothing of the checker's
    assert f"UID {sandbox.sandbox_uid(slot)}" in out
    assert _verdict(got, loaded).passed


def test_a_hung_check_costs_its_own_cell_only(slot):
    hang = ("def add(x, y):\n    s = jax.lax.while_loop(lambda c: c[0] == c[0], "
            "lambda c: (c[0] + 1, c[1]), (0, x))[1]\n    return _honest(s, y)\n")
    test = nbformat.v4.new_code_cell('course.check("add", add)', metadata={
        "nbgrader": {"grade": True, "grade_id": "add_visible", "points": 1}})
    again = nbformat.v4.new_code_cell('course.check("add", add)', metadata={
        "nbgrader": {"grade": True, "grade_id": "add_again", "points": 1}})
    cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(HONEST_ADD),
             nbformat.v4.new_code_cell("_honest = add\n" + hang), test,
             nbformat.v4.new_code_cell("add = _honest\n"), again]
    run = trusted.FreshRun(cells, slot, LIMITS,
                           lambda cell: 8 if trusted.checks_in(cell) else 30)
    got = run.finish()
    hung, honest = got.answers[(3, "add", False)][0], got.answers[(5, "add", False)]
    assert hung["timeout"] is True and got.tampered == [] and got.died is None, hung
    answer = exchange.answer_of(*honest)
    _, cases = run.loaded[("add", False)]
    assert verdict.decide("add", [verdict.case_result(
        e, i, x, p, answer["outputs"].get(e["case"]), answer["errors"].get(e["case"]),
        answer["traces"].get(e["case"]), answer["trace_errors"].get(e["case"]),
        answer["work"].get(e["case"])) for e, i, x, p in cases]).passed


def test_hidden_shapes_reach_no_cell_output(slot):
    """The learner's function keeps the shapes it is traced on; a later cell prints them. The
    hidden cases are traced after the last cell, so only visible shapes can be printed, and
    what the function prints while a hidden check runs is not kept."""
    stash = ("SHAPES = []\n_right = add\ndef add(x, y):\n    SHAPES.append(x.shape)\n"
             "    print('TRACED', x.shape)\n    return _right(x, y)\n")
    hidden_test = nbformat.v4.new_code_cell('course.check("add", add, hidden=True)', metadata={
        "nbgrader": {"grade": True, "grade_id": "add_hidden", "points": 2}})
    cells = [*_cells(stash), hidden_test, nbformat.v4.new_code_cell("print('LATER', SHAPES)")]
    run = trusted.FreshRun(cells, slot, LIMITS, lambda cell: 60)
    got = run.finish()
    out = _text(got)
    assert "LATER" in out and (4, "add", True) in got.answers, out
    visible = {a.shape for a in _inputs("add", False)}
    for shape in {a.shape for a in _inputs("add", True)} - visible:
        assert str(shape) not in out, (shape, out)


def test_legal_outputs_are_written_whatever_they_hold():
    """A lone surrogate (legal in a Python string and in JSON, not in UTF-8) and a display
    nested 800 levels deep reach a notebook file nbformat writes and validates."""
    deep = 0
    for _ in range(800):
        deep = [deep]
    pieces = [{"output_type": "stream", "name": "stdout", "text": "\ud800 lone\n"},
              {"output_type": "display_data", "metadata": {},
               "data": {"application/json": {"v": deep}, "text/plain": "\udfff"}}]
    outputs = exchange.notebook_outputs(pieces, 1 << 20, {})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=outputs)])
    text = nbformat.writes(nb)
    text.encode("utf-8")
    assert "\ufffd lone" in text and "nested deeper than" in text
