"""The checker's answers kept by what decides them (grader/jail/answer_cache.py): a key that
changes with every input of an answer, files that read back only whole and under their own
name, the oldest pruned first, and programs that pickle to the same bytes in every process.
The graded course shows the rest on real submissions (tests/grader/logistics/test_grading.py)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grader.jail import answer_cache, sandbox, wire

REPO = Path(__file__).resolve().parents[3]
CASES = [{"case": "v0", "inputs": [["x", "add/visible/0/x", "float32"]], "params": {}}]
ARRAYS = {"add/visible/0/x": np.arange(8, dtype=np.float32)}
CODE = b"grader digest"
REQUEST = {"kind": "check", "cell": 4, "task": "add", "hidden": False, "failed": None,
           "timeout": False, "programs": {"v0": [0, 5]}, "errors": {}}


def test_the_key_changes_with_each_input_of_an_answer_and_not_with_the_cell():
    cases = answer_cache.cases_digest(CASES, ARRAYS)
    base = answer_cache.key(CODE, cases, REQUEST, b"prog1")
    assert answer_cache.key(CODE, cases, {**REQUEST, "cell": 9}, b"prog1") == base
    other_input = {**ARRAYS, "add/visible/0/x": ARRAYS["add/visible/0/x"] + 1}
    other_dtype = {**ARRAYS, "add/visible/0/x": ARRAYS["add/visible/0/x"].astype(np.float64)}
    changed = [
        answer_cache.key(CODE, cases, REQUEST, b"prog2"),  # one byte of a program
        answer_cache.key(CODE, cases, {**REQUEST, "hidden": True}, b"prog1"),
        answer_cache.key(CODE, cases, {**REQUEST, "task": "elementwise"}, b"prog1"),
        answer_cache.key(CODE, cases, {**REQUEST, "errors": {"v0": "TypeError"}}, b"prog1"),
        answer_cache.key(CODE, answer_cache.cases_digest(CASES, other_input), REQUEST, b"prog1"),
        answer_cache.key(CODE, answer_cache.cases_digest(CASES, other_dtype), REQUEST, b"prog1"),
        answer_cache.key(CODE, answer_cache.cases_digest(
            [{**CASES[0], "params": {"block": [8, 128]}}], ARRAYS), REQUEST, b"prog1"),
        answer_cache.key(CODE, cases, REQUEST, b"prog1", sandbox.Limits(memory_bytes=1 << 30)),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_the_key_changes_with_the_graders_code(tmp_path, monkeypatch):
    """A changed line of grader/ or kernelsim/ is a different checker: nothing kept before."""
    for name in ("grader", "kernelsim"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rules.py").write_text("LIMIT = 1\n")
    monkeypatch.setattr(answer_cache.refs, "REPO", tmp_path)
    before = answer_cache.code_digest()
    (tmp_path / "kernelsim" / "rules.py").write_text("LIMIT = 2\n")
    cases = answer_cache.cases_digest(CASES, ARRAYS)
    assert answer_cache.code_digest() != before
    assert answer_cache.key(answer_cache.code_digest(), cases, REQUEST, b"prog1") != \
        answer_cache.key(before, cases, REQUEST, b"prog1")


def test_an_answer_reads_back_whole_and_under_its_own_key_only(tmp_path):
    cache = answer_cache.AnswerCache(tmp_path / "answers")
    cases = answer_cache.cases_digest(CASES, ARRAYS)
    first, second = (answer_cache.key(CODE, cases, REQUEST, p) for p in (b"prog1", b"prog2"))
    message = {"kind": "check", "task": "add", "errors": {}, "work": {"v0": {"calls": 1}}}
    assert cache.get(first) is None
    cache.put(first, message, b"outputs")
    assert cache.get(first) == (message, b"outputs")
    path = next((tmp_path / "answers").glob("*/*"))
    # copied under another key's name (by hand, or a bug): not that key's answer
    moved = tmp_path / "answers" / second.hex()[:2] / second.hex()
    moved.parent.mkdir(exist_ok=True)
    moved.write_bytes(path.read_bytes())
    assert cache.get(second) is None
    # cut short (a full disk, a crash while copying the course): the check runs again
    path.write_bytes(path.read_bytes()[:-3])
    assert cache.get(first) is None


def test_prune_keeps_the_newest_answers(tmp_path):
    cache = answer_cache.AnswerCache(tmp_path / "answers")
    keys = [bytes([i]) * 32 for i in range(4)]
    for i, k in enumerate(keys):
        cache.put(k, {"n": i}, b"x" * 1000)
        (path,) = (tmp_path / "answers").glob(f"*/{k.hex()}")
        os.utime(path, (1000 + i, 1000 + i))
    cache.get(keys[0])  # used now: the newest
    size = path.stat().st_size
    assert cache.prune(max_bytes=2 * size) == 2
    assert [cache.get(k) is not None for k in keys] == [True, False, False, True]


def test_a_program_pickles_to_the_same_bytes_in_every_process():
    """A jaxpr's effects are a set, whose order follows each process's hashes: the pickler
    writes them in a fixed order, else no answer would ever be found again."""
    probe = (
        "import hashlib, jax, jax.numpy as jnp\n"
        "from jax.experimental import pallas as pl\n"
        "from jax.experimental.pallas import tpu as pltpu\n"
        "from grader.jail import wire\n"
        "def body(x_ref, o_ref, acc):\n"
        "    acc[...] = x_ref[...] * 2\n"
        "    o_ref[...] = acc[...]\n"
        "f = lambda x: pl.pallas_call(body, out_shape=x, interpret=True,\n"
        "    scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])(x)\n"
        "program = jax.make_jaxpr(f)(jnp.zeros((8, 128)))\n"
        "body = program.jaxpr.eqns[0].params['jaxpr']\n"
        "assert len(body.effects) > 2, body.effects\n"
        "data = wire.dumps(program)\n"
        "loaded = wire.loads(data).jaxpr.eqns[0].params['jaxpr']\n"
        "assert len(loaded.effects) == len(body.effects)\n"
        "print(hashlib.sha256(data).hexdigest())\n")
    digests = {subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip() for _ in range(3)}
    assert len(digests) == 1, digests


class _Reduced:
    """Pickles as a call of ``builtin`` on ``args``."""

    def __init__(self, builtin, *args):
        self.call = builtin, args

    def __reduce__(self):
        return self.call


def test_the_unpickler_takes_sets_but_no_other_builtin():
    """The fixed order pickles a set as ``builtins.set(list)``: the checker's unpickler now
    names that class, and still refuses every other builtin."""
    with pytest.raises(wire.NotAProgram, match="hold a set, not a program"):
        wire.loads(pickle.dumps(_Reduced(set, [1, 2])))
    for builtin in (eval, exec, open, getattr, __import__):
        with pytest.raises(wire.NotAProgram, match=f"it holds an object of .*{builtin.__name__}"):
            wire.loads(pickle.dumps(_Reduced(builtin, "1")))
