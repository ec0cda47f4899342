"""Shared helper for the lessons: run a kernel, compare it with its plain-JAX reference, say
where it ran, and (for bench/on_device.py) record timings.

Each lesson calls ``check(...)`` once per kernel. When the environment variable
``PALLAS_COURSE_RECORD`` names a file, ``check`` appends one JSON line per kernel to that file:
lesson, kernel, execution label, whether the kernel compiled or fell back to interpret mode
(the compiler's error, the kernel's declared reason), whether it passed, and for a kernel
that passed the median seconds of kernel and reference.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np

# NeedsNewerJax and newer_api: what a cell raises and calls where the running JAX lacks an API
from kernelsim.backend import Execution, NeedsNewerJax, newer_api, platform  # noqa: F401
from kernelsim.views.figure import DPI, FONT, WIDTH

# readable_ink: the colour lessons give a label drawn on a coloured cell
from kernelsim.views.readability import readable_ink, unreadable_text  # noqa: F401

RECORD_ENV = "PALLAS_COURSE_RECORD"

# The one place that names the JAX release the lessons' version-specific statements (lowering
# details, defaults, error messages, source citations) were checked against. It must equal the
# pin in pyproject.toml; tests/lessons/test_versions.py checks both. lessons/CHECKED.md lists
# each statement with the source lines it was checked against.
CHECKED_JAX = "0.12.0.1"

# No process-wide matmul precision: each dot says its own. A float32 dot passes
# precision="highest" (at JAX's default a TPU multiplies float32 in one bf16 pass and a GPU in
# TF32: a kernel and its reference would differ by ~1e-3 relative there and agree on a CPU); a
# bfloat16 dot passes none, as Mosaic refuses a bf16 dot at "highest" ("Bad lhs type", measured
# on a TPU v5e), and asks for a float32 result with preferred_element_type. Lesson 7 says why.


@contextlib.contextmanager
def on_host():
    """Run what is inside on the host's CPU device: where interpret mode belongs on a TPU.
    There ``pl.kernel``'s TPU lowering drops its ``interpret=`` argument
    (``mpmd_map_tpu_lowering_rule`` in jax/_src/pallas/mosaic/pallas_call_registration.py,
    ``del interpret``) and Mosaic is handed the interpreter's callbacks, which it cannot lower
    ("Lowering rule for `mpmd_map` needs to set `tokens_out`", on a TPU v5e); lowered for the
    CPU, the same call is interpreted. Arrays made on the TPU and not placed by hand move."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def pinned_claim(holds: bool, what: str) -> None:
    """Hold the lesson to a statement about the pinned release (a lowering's error, a warning;
    lessons/CHECKED.md): on it, a statement that no longer holds stops the lesson; on another
    release (a TPU runtime's jax 0.10.2) the cell says it differs there, and the lesson goes on."""
    if holds:
        return
    if jax.__version__ == CHECKED_JAX:
        raise AssertionError(what)
    print(f"  (JAX {jax.__version__} differs here from JAX {CHECKED_JAX}, which this lesson "
          f"describes: {what})")


def versions() -> None:
    """Print the running JAX release and backend, and the release the lessons were checked
    against; say so when the two differ."""
    print(f"JAX {jax.__version__} on {jax.default_backend()}; the pinned release, which the "
          f"lessons were checked against: JAX {CHECKED_JAX}")
    if jax.__version__ != CHECKED_JAX:
        print("  (a different release: statements about lowering details, defaults and error "
              "messages may no longer hold)")


# A lesson's own figures follow kernelsim's figure rules (kernelsim/views/figure.py): at most
# FIGURE_WIDTH inches wide at 72 dpi, so the site's ~570 px output column shows them at their
# natural size, never scaled down, and no text below FONT points.
FIGURE_WIDTH = WIDTH

# Starts each line a cell prints to stderr about a figure it shows that cannot be read
# (``_report_unreadable``): the learner sees it under the figure, tests/lessons looks for it.
UNREADABLE_MARK = "unreadable figure:"


def _report_unreadable(fig) -> None:
    """Print each problem ``unreadable_text`` finds in ``fig`` (overlapping or clipped text,
    text too faint on its fill) to stderr, on a line of its own after ``UNREADABLE_MARK``."""
    for problem in unreadable_text(fig):
        print(UNREADABLE_MARK, problem, file=sys.stderr)


def _check_shown_figures(shell) -> None:
    """Have IPython ``shell`` check every figure a cell shows (``_report_unreadable``): the
    pyplot figures still open when the cell ends, before the inline backend's ``post_execute``
    callback shows and closes them (so this one goes first), and a bare ``Figure`` the cell
    returns (kernelsim's views), unless it was one of those."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    checked: list = []  # this cell's pyplot figures

    def before_showing() -> None:
        checked[:] = [plt.figure(n) for n in plt.get_fignums()]
        for fig in checked:
            _report_unreadable(fig)

    def after_cell(result) -> None:
        fig = getattr(result, "result", None)
        if isinstance(fig, Figure) and not any(fig is f for f in checked):
            _report_unreadable(fig)
        checked.clear()

    shell.events.callbacks["post_execute"].insert(0, before_showing)
    shell.events.register("post_run_cell", after_cell)


def _figures() -> None:
    """Set the lessons' figure style, let a bare matplotlib ``Figure`` (what kernelsim's views
    return) display as a PNG when it ends a notebook cell, and check each figure a cell shows
    (``_check_shown_figures``).

    The inline backend registers its PNG formatter for ``Figure`` only once pyplot has loaded
    the backend module, which normally happens at the first ``plt.subplots()``. Load it now.
    Outside a notebook (a script, the Agg backend) only the style is set.
    """
    import matplotlib

    matplotlib.rcParams.update({
        "figure.dpi": DPI, "font.size": FONT, "axes.titlesize": FONT + 1,
        "axes.labelsize": FONT, "xtick.labelsize": FONT, "ytick.labelsize": FONT,
        "legend.fontsize": FONT, "figure.titlesize": FONT + 1})
    backend = matplotlib.get_backend()
    if "inline" in backend:
        import matplotlib.pyplot as plt

        plt.switch_backend(backend)
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            _check_shown_figures(shell)


_figures()


def _lesson_path(lesson: str) -> Path:
    path = Path(__file__).with_name(f"{lesson}.py")
    if not path.is_file():
        raise FileNotFoundError(f"no lesson {path.name} beside {Path(__file__).name}")
    return path


def _run_with_imports(path: Path, defs: list[ast.stmt], constants: Mapping[str, Any],
                      lesson: str) -> dict[str, Any]:
    """Execute the lesson file's top-level imports, then ``defs``; return the namespace."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    module = ast.Module(body=[*imports, *defs], type_ignores=[])
    namespace: dict[str, Any] = {"__name__": f"lesson_{lesson.replace('-', '_')}", **constants}
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - the course's own file
    return namespace


def definitions(lesson: str, *names: str, **constants: Any) -> SimpleNamespace:
    """The functions ``names`` as lesson ``lesson`` (a file stem such as
    ``"08-flash-attention"``) defines them, without running any of its cells.

    Executes only that file's top-level imports and the ``def`` statements named, with
    ``constants`` as extra globals (module constants the functions read, such as a scale), and
    returns the functions as attributes. Tracebacks point at the other lesson's lines.
    """
    path = _lesson_path(lesson)
    tree = ast.parse(path.read_text(), filename=str(path))
    defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [n for n in names if n not in defs]
    if missing:
        raise KeyError(f"{path.name} defines no top-level function {', '.join(missing)}; "
                       f"it defines {', '.join(defs)}")
    namespace = _run_with_imports(path, [defs[n] for n in names], constants, lesson)
    return SimpleNamespace(**{n: namespace[n] for n in names})


# the line before a fresh process's JSON result (``in_fresh_process``)
RESULT_MARK = "--- in_fresh_process result ---"


def run_sources(lesson: str, sources: list[str]) -> Any:
    """``in_fresh_process``'s other half, in the new process: the lesson's imports, then the
    functions' own sources (the first is the one to call, with no arguments)."""
    namespace = _run_with_imports(_lesson_path(lesson), [], {}, lesson)
    names = []
    for source in sources:  # each under a name of its own: tracebacks count its own lines
        tree = ast.parse(source)
        names += [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
        exec(compile(tree, f"<{names[-1]}, as last run>", "exec"), namespace)  # noqa: S102
    return namespace[names[0]]()


def in_fresh_process(lesson: str, function: Callable[[], Any], *helpers: Callable) -> Any:
    """Run ``function()``, a function of lesson ``lesson`` that takes no arguments, in a new
    Python process on the CPU, with the lesson's imports and the functions ``helpers`` it
    calls; print what it printed and return what it returned (as JSON carries it: lists,
    numbers, strings).

    The new process runs the functions as they are now, from their own source
    (``inspect.getsource``, which JupyterLab keeps for every cell it ran): a cell the learner
    edited and ran counts, not the lesson file's version of it.

    For what TPU interpret mode cannot do in a TPU machine's own process (jax 0.10.2 on a
    v5e): a demonstration that fails on purpose inside it, as its error stays with JAX's
    ordered effects for the rest of the process (every later interpreted kernel raises it
    again, and ``reset_tpu_interpret_mode_state`` does not clear it); and two simulated
    TensorCores, whose callbacks there lost the interpreter's simulated memory ("assert
    _shared_memory is not None"). A process of its own, on the CPU, has neither problem.
    """
    _lesson_path(lesson)  # a wrong name fails here, not in the other process
    sources = [textwrap.dedent(inspect.getsource(fn)) for fn in (function, *helpers)]
    code = ("import json, sys, _course\nresult = _course.run_sources(**json.load(sys.stdin))\n"
            f"print({RESULT_MARK!r}, json.dumps(result), sep='\\n')\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600,
                          input=json.dumps({"lesson": lesson, "sources": sources}))
    if done.returncode:
        raise RuntimeError(f"{function.__name__}() of {lesson} failed in its own process "
                           f"(exit status {done.returncode}):\n{done.stderr[-3000:]}")
    printed, _, result = done.stdout.rpartition(RESULT_MARK + "\n")
    print(printed, end="")
    return json.loads(result)


def _run(fn: Callable, args: tuple) -> Any:
    return jax.block_until_ready(fn(*args))


def _median_seconds(fn: Callable, args: tuple, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _run(fn, args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check(lesson: str, name: str, kernel: Callable, reference: Callable, args: tuple,
          execution: Execution, rtol: float, atol: float, *,
          cannot_compile: Mapping[str, str] | None = None) -> None:
    """Run ``kernel(*args, interpret=execution.interpret)``, compare it with
    ``reference(*args)`` and print how the kernel ran. Returns nothing, so a cell that ends
    with ``check(...)`` shows the verdict, not a dump of the output array.

    A kernel meant to compile that the present backend rejects is rerun in interpret mode: a
    *fallback*, printed as one, with the compiler's error. ``cannot_compile`` maps a backend
    (``"tpu"``, ``"gpu"``) to why the kernel cannot compile there (a GPU-only kernel, a
    deliberate mistake); a fallback on a backend it does not name is undeclared, and says so:
    the kernel should have compiled. A wrong result always raises.
    """
    here = platform()

    def jitted(ran: Execution) -> Callable:
        # a new function per execution: jit caches by function, and would hand the fallback
        # the executable that just failed
        fn = jax.jit(lambda *a: kernel(*a, interpret=ran.interpret))
        if ran.interpret is False or here != "tpu":
            return fn

        def interpreted_on_host(*args):
            with on_host():
                return fn(*args)
        return interpreted_on_host

    declared = (cannot_compile or {}).get(here)
    record: dict[str, Any] = {"lesson": lesson, "kernel": name, "backend": here,
                              "label": execution.label, "compiled": False, "fell_back": False,
                              "declared": None, "compile_error": None, "passed": False,
                              "error": None}
    try:
        ran, fn, out = _run_or_fall_back(jitted, execution, args, record)
        record.update(label=ran.label, compiled=ran.interpret is False)
        if record["fell_back"]:
            record["declared"] = declared
            print(f"{name}: FALLBACK to interpret mode: compiling for {here.upper()} failed "
                  f"({record['compile_error']}).", file=sys.stderr)
            print(f"  declared: {declared}" if declared else
                  f"  UNDECLARED: this kernel should compile on {here.upper()}. The lesson "
                  "goes on in interpret mode; if you did not change the kernel, report the "
                  "error above to the course.", file=sys.stderr)
        elif ran.interpret is not False:
            record["declared"] = declared or ran.label  # interpreted as its Execution asks
        ref_fn = jax.jit(reference)
        expected = _run(ref_fn, args)
        for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(np.asarray(got, np.float32),
                                       np.asarray(want, np.float32),
                                       rtol=rtol, atol=atol, err_msg=f"kernel {name!r}")
        record["passed"] = True
    except Exception as err:
        record["error"] = _first_line(err)
        raise
    finally:
        path = os.environ.get(RECORD_ENV)
        if path and record["passed"]:
            record.update(kernel_seconds=_median_seconds(fn, args),
                          reference_seconds=_median_seconds(ref_fn, args))
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
    kind = "FELL BACK, " if record["fell_back"] else ""
    print(f"{name}: matches the plain-JAX reference (rtol={rtol:g}, atol={atol:g}); "
          f"this kernel ran: {kind}{ran.label}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200]}" if text else type(err).__name__


def _run_or_fall_back(jitted: Callable[[Execution], Callable], execution: Execution,
                      args: tuple, record: dict[str, Any]) -> tuple[Execution, Callable, Any]:
    """(how it ran, the jitted kernel, its output): as ``execution`` says, or in interpret
    mode when compiling fails (``record`` notes the fallback and the compiler's error)."""
    fn = jitted(execution)
    try:
        return execution, fn, _run(fn, args)
    except Exception as err:  # noqa: BLE001 - any lowering error means "fall back"
        if execution.interpret is not False:
            raise
        record.update(fell_back=True, compile_error=_first_line(err))
    where = "the TPU machine's CPU" if platform() == "tpu" else platform().upper()
    ran = Execution(True, f"interpret mode on {where} "
                          f"(compiling failed: {record['compile_error'][:120]})")
    fn = jitted(ran)
    return ran, fn, _run(fn, args)
