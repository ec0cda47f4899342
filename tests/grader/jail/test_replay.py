"""The grader's own run of a notebook (issue 14, class 3): facts made where the learner's
kernel cannot reach, and learner code in that run unable to change how they are made.

The channel, snapshot, guard and run-time Python checks are tested in isolation; then small
notebooks (one ``add`` task, its visible check) go through ``trusted.FreshRun`` in the jail,
each trying one way to forge the facts.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import jupytext
import nbformat
import pytest
from jax.experimental import pallas as pl

from grader import integrity
from grader.jail import checker, exchange, sandbox, trusted, wire
from grader.verdict import refs, verdict

KEY = b"k" * 32


# ----------------------------------------------------------------------------- the channel
def test_channel_frames_round_trip_and_refuse_what_the_harness_did_not_write():
    blob, dtypes, errors = exchange.encode_outputs(
        {"v0": jnp.ones((8, 128), jnp.bfloat16), "v1": [[object()]]})
    assert errors.keys() == {"v1"} and "sensible size" in errors["v1"]
    data = exchange.frame(KEY, {"kind": "check", "dtypes": dtypes}, blob) + \
        exchange.frame(KEY, {"kind": "done"})
    frames, at, problem = exchange.read_frames(data, KEY)
    assert problem is None and at == len(data)
    assert [m["kind"] for m, _ in frames] == ["check", "done"]
    answer = exchange.answer_of(frames[0][0], frames[0][1])
    assert str(answer["outputs"]["v0"].dtype) == "bfloat16"
    # another key (learner code that does not hold the harness's), a cut, trailing junk
    assert "wrong tag" in exchange.read_frames(data, b"x" * 32)[2]
    cut = exchange.read_frames(data[:-3], KEY)  # the rest of a frame may still come
    assert (cut[0], cut[2]) == (frames[:1], None) and cut[1] < len(data) - 3
    forged = exchange.read_frames(data + b"\0\0\0\4" + b"0" * 36, KEY)
    assert len(forged[0]) == 2 and "wrong tag" in forged[2]
    # frames as a pipe delivers them, one by one; the end of the pipe; a cut
    stream = io.BytesIO(data)
    assert [exchange.read_frame(stream, KEY)[0]["kind"] for _ in frames] == ["check", "done"]
    with pytest.raises(EOFError):
        exchange.read_frame(stream, KEY)
    cut_stream = io.BytesIO(data[:-3])
    assert exchange.read_frame(cut_stream, KEY)[0]["kind"] == "check"
    with pytest.raises(exchange.AnswerError):
        exchange.read_frame(cut_stream, KEY)


def test_the_notebook_gets_shapes_and_never_an_input_s_values():
    cells = [{"index": 3, "id": "add_hidden", "source": "", "timeout": 5,
              "checks": [["add", True, "add"], ["embedding_bag", False, "embedding_bag"]]}]
    described, arrays, loaded = exchange.load_checks(cells, refs.REPO / "exercises" / "refs")
    entries, cases = loaded[("add", True)]
    assert [c["case"] for c in described["add/hidden"]] == [e["case"] for e in entries]
    assert not any("expected" in k for k in arrays)
    assert len(arrays) == sum(len(inputs) for _, inputs, _, _ in cases) + \
        sum(len(inputs) for _, inputs, _, _ in loaded[("embedding_bag", False)][1])
    visible, host = exchange.signatures(described, arrays, {"embedding_bag": 1}, hidden=False)
    assert set(visible) == {"embedding_bag/visible"} and host  # its ids: a host input
    assert all(key is None for c in visible["embedding_bag/visible"]
               for _, _, _, key in c["inputs"][:-1])
    hidden, host = exchange.signatures(described, arrays, {}, hidden=True)
    assert set(hidden) == {"add/hidden"} and host == {}


# ----------------------------------------------------------------------------- the snapshot
def test_snapshot_notices_replaced_added_and_removed_code(monkeypatch):
    from grader.facts import work

    shell = types.SimpleNamespace(events=types.SimpleNamespace(callbacks={"pre_run_cell": []}))
    snap = integrity.Snapshot(shell)
    assert snap.changes() == []
    monkeypatch.setattr(work, "facts", lambda program: {})
    monkeypatch.setattr(work, "LAYOUT", frozenset())  # a constant of the course counts too
    monkeypatch.setattr(work, "len", lambda x: 0, raising=False)  # shadows a builtin there
    monkeypatch.setattr(verdict.Verdict, "__init__", lambda self, *a: None)
    monkeypatch.setattr(json, "dumps", lambda *a, **k: "{}")
    monkeypatch.setitem(sys.modules, "grader.verdict.refs", types.ModuleType("grader.verdict.refs"))
    monkeypatch.setitem(sys.modules, "jax._lazy", types.ModuleType("jax._lazy"))
    monkeypatch.setitem(sys.modules, "learners_own", types.ModuleType("learners_own"))
    monkeypatch.setattr(shell, "showtraceback", lambda *a: None, raising=False)
    shell.events.callbacks["pre_run_cell"].append(lambda info: None)
    monkeypatch.setattr(signal, "getsignal", lambda s: "learner" if s == signal.SIGVTALRM
                        else signal.Handlers.SIG_DFL)
    found = snap.changes()
    for line in ("grader.facts.work.facts was replaced",
                 "grader.facts.work.LAYOUT was replaced", "grader.facts.work.len was added",
                 "grader.verdict.verdict.Verdict.__init__ was replaced",
                 "json.dumps was replaced", "sys.modules['grader.verdict.refs'] was replaced",
                 "sys.modules['jax._lazy'] is not a module of the installed packages",
                 "the shell's showtraceback was replaced",
                 "an IPython pre_run_cell hook (",
                 "a handler for SIGVTALRM was installed"):
        assert any(f.startswith(line) for f in found), (line, found)
    assert not any("learners_own" in f for f in found)
    monkeypatch.undo()
    shell.events.callbacks["pre_run_cell"].clear()
    assert snap.changes() == []


def test_snapshot_refuses_learner_functions_in_a_module_loaded_later(monkeypatch):
    snap = integrity.Snapshot()
    late = types.ModuleType("kernelsim._late")
    late.__file__ = str(refs.REPO / "kernelsim" / "_late.py")
    exec(compile("def honest():\n    pass\n", late.__file__, "exec"), vars(late))  # noqa: S102
    late.forged = eval("lambda: 0")  # noqa: S307 - compiled from "<string>": not the course's
    monkeypatch.setitem(sys.modules, "kernelsim._late", late)
    assert snap.changes() == ["kernelsim._late.forged is defined outside the installed packages"]
    late.forged = late.honest  # taken into the snapshot at first sight: compared from then on
    assert snap.changes() == ["kernelsim._late.forged was replaced"]


PYPLOT_SCRIPT = r"""
import json, sys, types
import jax, xml  # loaded before learner code, as the harness's imports load them
from grader import integrity
assert "matplotlib.pyplot" not in sys.modules and "pyexpat" not in sys.modules
snap = integrity.Snapshot()
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2], [3, 4]); plt.savefig(sys.argv[1])
honest = snap.changes()
fake = types.ModuleType("pyexpat.fake")  # an alias that names no real submodule of pyexpat
sys.modules["pyexpat.fake"] = sys.modules["jax.fake"] = fake
print(json.dumps([honest, snap.changes()]))
"""


def test_pyplot_is_no_tampering(tmp_path):
    """Issue 36: any notebook that drew with pyplot scored 0 as ``tampered``: importing it has
    xml.parsers.expat register pyexpat's C-made submodules under a second name. Those pass; a
    forged alias does not."""
    out = subprocess.run([sys.executable, "-c", PYPLOT_SCRIPT, str(tmp_path / "f.png")],
                         capture_output=True, text=True, check=True, cwd=refs.REPO)
    honest, forged = json.loads(out.stdout.splitlines()[-1])
    assert honest == []
    assert forged == ["sys.modules['jax.fake'] is not a module of the installed packages"]


# ----------------------------------------------------------------------------- the guard
GUARD_SCRIPT = r"""
import ctypes, gc, json, os, sys, threading
from grader import integrity
guard = integrity.Guard()
sys.addaudithook(guard)
guard.armed = True
out = {}
def attempt(name, f):
    try:
        f()
        out[name] = "allowed"
    except RuntimeError as e:
        out[name] = str(e)
attempt("thread", lambda: threading.Thread(target=print).start())
attempt("fork", os.fork)
attempt("settrace", lambda: sys.settrace(None))
attempt("gc", gc.get_objects)
attempt("ctypes", lambda: ctypes.string_at(id(out), 8))
def f():
    pass
attempt("code", lambda: setattr(f, "__code__", (lambda: 1).__code__))
attempt("mem", lambda: open("/proc/self/mem", "rb"))
attempt("hook", lambda: sys.addaudithook(lambda *a: None))  # refused, silently
attempt("open", lambda: open(os.devnull).close())
print(json.dumps({"out": out, "found": guard.found}))
"""


def test_guard_refuses_threads_fork_and_tracing_and_reports_attacks():
    got = json.loads(subprocess.run([sys.executable, "-c", GUARD_SCRIPT], capture_output=True,
                                    text=True, check=True, cwd=refs.REPO).stdout)
    out, found = got["out"], got["found"]
    for name in ("thread", "fork", "settrace"):
        assert "not allowed while the grader runs your notebook" in out[name], out
    assert out["open"] == "allowed" and out["hook"] == "allowed"
    assert found[0] == "listed every object (gc.get_objects)" and \
        found[1].startswith("used ctypes (ctypes.") and \
        found[-3:] == ["replaced the code of f", "opened /proc/self/mem", "added an audit hook"], \
        found


# ----------------------------------------------------------------------------- run-time Python
def _program(fn):
    return jax.make_jaxpr(fn)(jnp.ones((8, 128)))


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _double(x):
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=True)(x)


def test_programs_that_would_run_learner_python_are_refused():
    from jax.extend.core import Primitive

    known, roots = checker.known_primitives(), integrity.trusted_roots()

    def at_run_time(fn):
        """The program, as the notebook's process sends it, refused by the checker: why."""
        try:
            data = wire.dumps(_program(fn), lambda f: integrity.defined_in(f, roots))
            return checker.python_at_run_time(wire.loads(data), known)
        except (wire.NotAProgram, pickle.PicklingError, AttributeError) as e:
            return str(e)

    assert at_run_time(_double) is None
    assert at_run_time(lambda x: (jax.debug.print("x {}", x), _double(x))[1]) is None
    learner = types.FunctionType(compile("def numpy_double(x):\n    return x * 2\n",
                                         "<ipython-input-1>", "exec").co_consts[0], {})
    callback = at_run_time(lambda x: jax.pure_callback(
        learner, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
    assert "numpy_double" in callback and "pure_callback" in callback
    assert "numpy_double" in at_run_time(lambda x: (jax.debug.callback(learner, x), x)[1])
    truthy = type("Truthy", (), {"__bool__": types.FunctionType(compile(
        "def __bool__(self):\n    return True\n", "<ipython-input-2>", "exec").co_consts[0], {})})
    found = at_run_time(lambda x: pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=truthy())(x))
    assert "Truthy" in found, found  # a class of the learner's cannot reach the checker
    mine = Primitive("my_add")
    mine.def_impl(lambda x: x)
    mine.def_abstract_eval(lambda x: x)
    assert "my_add" in at_run_time(mine.bind)


def test_the_checker_compiles_a_kernel_once_for_every_case_it_runs(tmp_path):
    """Two cases of one shape, traced apart as the notebook's process traces them: the
    checker's second run of the kernel is XLA's first executable, from the folder of its own
    that ``compile_each_program_once`` keeps in its /tmp (kernelsim runs a kernel as JAX runs
    a pallas_call outside jit, which would compile it again)."""
    script = (
        "import os, stat, tempfile, jax, jax.numpy as jnp\n"
        "from jax.experimental import pallas as pl\n"
        "from grader.jail import checker\n"
        "from grader.calling import Traced\n"
        "from grader.facts.work import run_traced\n"
        "checker.compile_each_program_once()\n"
        "hits = []\n"
        "jax.monitoring.register_event_listener(\n"
        "    lambda event, **kw: hits.append(event) if event.endswith('cache_hits') else None)\n"
        "def kernel(x_ref, o_ref):\n"
        "    o_ref[...] = x_ref[...] * 2\n"
        "def double(x):\n"
        "    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),\n"
        "                          interpret=True)(x)\n"
        "for case in range(2):\n"
        "    x = jnp.full((8, 128), case, jnp.float32)\n"
        "    run = run_traced(Traced(jax.make_jaxpr(double)(x), [x]))\n"
        "    assert run.error is None and float(run.output[0, 0]) == 2 * case, run\n"
        "    print(case, len(hits))\n"
        "folder = jax.config.jax_compilation_cache_dir\n"
        "assert folder.startswith(tempfile.gettempdir()), folder\n"
        "print(oct(stat.S_IMODE(os.stat(folder).st_mode)))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE",
                                                                     "JAX_PERSISTENT_CACHE"))}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**env, "TMPDIR": str(tmp_path)}, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second, mode = done.stdout.split("\n")[:3]
    assert int(first.split()[1]) == 0 < int(second.split()[1]), done.stdout
    assert mode == "0o700"  # the checker's uid alone writes what it will load


# ----------------------------------------------------------------------------- fresh runs
SETUP = ("import jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
         "from grader.learner import course\n")
HONEST_ADD = ("def add(x, y):\n    def kernel(x_ref, y_ref, o_ref):\n"
              "        o_ref[...] = x_ref[...] + y_ref[...]\n"
              "    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, "
              "x.dtype), interpret=True)(x, y)\n")
LIMITS = sandbox.Limits(cpu_seconds=300, memory_bytes=8 << 30, processes=256)


def _cells(*learner: str):
    test = nbformat.v4.new_code_cell('course.check("add", add)', metadata={
        "nbgrader": {"grade": True, "grade_id": "add_visible", "points": 1}})
    return [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(HONEST_ADD),
            *(nbformat.v4.new_code_cell(code) for code in learner), test]


def _fresh(slot, *learner: str, timeout: int = 60):
    """The fresh run of the honest add notebook with ``learner`` cells after the solution;
    ``timeout``: the learner cells' time limit (the test cell has 60 s)."""
    cells = _cells(*learner)
    run = trusted.FreshRun(cells, slot, LIMITS,
                           lambda cell: 60 if trusted.checks_in(cell) else timeout)
    return run.finish(), run.loaded


def _verdict(got, loaded):
    (message, blob), = got.answers.values()
    assert message["failed"] is None, message
    answer = exchange.answer_of(message, blob)
    _, cases = loaded[("add", False)]
    return verdict.decide("add", [verdict.case_result(
        e, i, x, p, answer["outputs"].get(e["case"]), answer["errors"].get(e["case"]),
        answer["traces"].get(e["case"]), answer["trace_errors"].get(e["case"]),
        answer["work"].get(e["case"])) for e, i, x, p in cases])


def test_honest_notebook_is_judged_from_the_fresh_run(slot):
    got, loaded = _fresh(slot)
    assert (got.tampered, got.died, got.stopped, got.cell_errors) == ([], None, None, {})
    assert _verdict(got, loaded).passed


def test_threads_fork_and_tracing_are_refused_in_the_fresh_run(slot):
    got, loaded = _fresh(slot, "import threading\nthreading.Thread(target=print).start()",
                         "import os\nos.fork()", "import sys\nsys.settrace(lambda *a: None)")
    assert got.tampered == [] and len(got.cell_errors) == 3, got
    assert all("not allowed while the grader runs your notebook" in e
               for e in got.cell_errors.values()), got.cell_errors
    assert _verdict(got, loaded).passed  # refused, so nothing changed: add is still judged


# each: learner code after the honest add cell, and a word of the tampering found
FORGERIES = {
    # installed while the function is traced; it would remove itself when the harness calls it
    "self_restoring_patch": (
        "import kernelsim\n_run = kernelsim.run\n"
        "def _forged(*a, **k):\n    kernelsim.run = _run\n    return _run(*a, **k)\n"
        "_add = add\ndef add(x, y):\n    kernelsim.run = _forged\n    return _add(x, y) * 2\n",
        "kernelsim.run was replaced"),
    "walk_the_harness": ("import gc\n_add = add\n"
                         "def add(x, y):\n    gc.get_objects()\n    return _add(x, y)\n",
                         "listed every object"),
    "write_the_channel": (
        "import os, struct\nfor fd in range(3, 64):\n    try:\n"
        "        os.write(fd, struct.pack('>I32s', 4, b'0' * 32) + b'{}\\0x')\n"
        "    except OSError:\n        pass\n", "bytes its harness did not write"),
    "swap_code": ("import grader.calling\n"
                  "grader.calling.trace_case.__code__ = (lambda *a: None).__code__\n",
                  "replaced the code of trace_case"),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forging_the_facts_in_the_fresh_run_is_tampering(slot, name):
    code, word = FORGERIES[name]
    got, _ = _fresh(slot, code)
    assert any(word in t for t in got.tampered), got
    assert got.answers == {} and "grading code was changed" in got.stopped


def test_a_function_that_raises_on_every_case_is_answered_without_a_checker(slot):
    """A task not done yet (its function raises as it is traced) has nothing to run: the relay
    answers with the errors, as the checker would, and no checker starts (a second or more of
    CPU for each such notebook); the verdict names the error."""
    cells = _cells("def add(x, y):\n    raise NotImplementedError('add: not implemented yet')\n")
    run = trusted.FreshRun(cells, slot, LIMITS, lambda cell: 60)
    got = run.finish()
    assert run.checkers == [] and got.tampered == [], got
    found = _verdict(got, run.loaded)
    assert not found.passed and "add: not implemented yet" in str(found), found


def test_a_callback_to_learner_python_fails_the_check(slot):
    got, _ = _fresh(slot, "_add = add\ndef add(x, y):\n    return jax.pure_callback("
                          "lambda a, b: a + b, jax.ShapeDtypeStruct(x.shape, x.dtype), x, y)\n")
    (message, _), = got.answers.values()
    assert got.tampered == [] and "calls your Python function" in message["failed"]


def test_time_limits_and_a_dead_run(slot):
    got, loaded = _fresh(slot, "while True:\n    pass\n", timeout=3)
    (err,) = got.cell_errors.values()
    assert err.startswith("TimeLimit") and _verdict(got, loaded).passed
    got, _ = _fresh(slot, "import os\nos._exit(3)\n")
    assert got.answers == {} and got.died.endswith("died while running cell #2: it exited "
                                                   "with status 3"), got


def test_learner_code_cannot_read_the_job_or_print_on_the_channel(slot):
    got, loaded = _fresh(slot, "import sys\nprint('{\"kind\": \"done\"}')\n"
                               "assert sys.stdin.read() == ''\n")
    assert got.cell_errors == {} and got.tampered == []
    assert _verdict(got, loaded).passed


# ----------------------------------------------------------------------------- the notebooks
def test_every_test_cell_holds_only_checks():
    """What the fresh run runs of a test cell is its ``course.check`` calls: any other line
    would run in the kernel only."""
    import ast

    for source in sorted((refs.REPO / "exercises" / "source").glob("*/*.py")):
        for cell in jupytext.read(source).cells:
            if not trusted.checks_in(cell):
                continue
            body = ast.parse(cell.source).body
            assert len(body) == len(trusted.checks_in(cell)), (source.name, cell.source)


def test_course_check_does_nothing_in_a_grading_run(monkeypatch, capsys):
    from grader.learner import course

    monkeypatch.setenv("PALLAS_COURSE_GRADING", "1")
    assert course.check("add", None) is None
    assert capsys.readouterr().out == ""
