"""Shared helper for the lessons: run a kernel, compare it with its plain-JAX reference, say
where it ran, and (for bench/lessons_gpu.py) record timings.

Each lesson calls ``check(...)`` once per kernel. When the environment variable
``PALLAS_COURSE_RECORD`` names a file, ``check`` also times the kernel and the reference and
appends one JSON line per kernel to that file: lesson, kernel, execution label, whether the
kernel compiled or fell back to interpret mode, seconds (median) for both.
"""

from __future__ import annotations

import ast
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np

from kernelsim.backend import Execution, platform
from kernelsim.views.figure import DPI, FONT, WIDTH

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


def _figures() -> None:
    """Set the lessons' figure style, and let a bare matplotlib ``Figure`` (what kernelsim's
    views return) display as a PNG when it ends a notebook cell.

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


_figures()


def definitions(lesson: str, *names: str, **constants: Any) -> SimpleNamespace:
    """The functions ``names`` as lesson ``lesson`` (a file stem such as
    ``"08-flash-attention"``) defines them, without running any of its cells.

    Executes only that file's top-level imports and the ``def`` statements named, with
    ``constants`` as extra globals (module constants the functions read, such as a scale), and
    returns the functions as attributes. Tracebacks point at the other lesson's lines.
    """
    path = Path(__file__).with_name(f"{lesson}.py")
    if not path.is_file():
        raise FileNotFoundError(f"no lesson {path.name} beside {Path(__file__).name}")
    tree = ast.parse(path.read_text(), filename=str(path))
    defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [n for n in names if n not in defs]
    if missing:
        raise KeyError(f"{path.name} defines no top-level function {', '.join(missing)}; "
                       f"it defines {', '.join(defs)}")
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    module = ast.Module(body=[*imports, *(defs[n] for n in names)], type_ignores=[])
    namespace: dict[str, Any] = {"__name__": f"lesson_{lesson.replace('-', '_')}", **constants}
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - the course's own file
    return SimpleNamespace(**{n: namespace[n] for n in names})


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
          execution: Execution, rtol: float, atol: float) -> None:
    """Run ``kernel(*args, interpret=execution.interpret)``, compare it with
    ``reference(*args)`` and print how the kernel ran. Returns nothing, so a cell that ends
    with ``check(...)`` shows the verdict, not a dump of the output array.

    A kernel meant to compile that the present backend rejects is rerun in interpret mode, and
    the label says so; a wrong result always raises.
    """
    def jitted(ran: Execution) -> Callable:
        # a new function per execution: jit caches by function, and would hand the fallback
        # the executable that just failed
        return jax.jit(lambda *a: kernel(*a, interpret=ran.interpret))

    ran = execution
    fn = jitted(ran)
    try:
        out = _run(fn, args)
    except Exception as err:  # noqa: BLE001 - any lowering error means "fall back"
        if execution.interpret is not False:
            raise
        reason = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}" if str(err) else \
            type(err).__name__
        ran = Execution(True, f"interpret mode on {platform().upper()} "
                              f"(compiling failed: {reason})")
        fn = jitted(ran)
        out = _run(fn, args)
    ref_fn = jax.jit(reference)
    expected = _run(ref_fn, args)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=rtol, atol=atol, err_msg=f"kernel {name!r}")
    print(f"{name}: matches the plain-JAX reference (rtol={rtol:g}, atol={atol:g}); "
          f"this kernel ran: {ran.label}")
    path = os.environ.get(RECORD_ENV)
    if path:
        record = {"lesson": lesson, "kernel": name, "backend": platform(), "label": ran.label,
                  "compiled": ran.interpret is False,
                  "fell_back": ran is not execution,
                  "kernel_seconds": _median_seconds(fn, args),
                  "reference_seconds": _median_seconds(ref_fn, args)}
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
