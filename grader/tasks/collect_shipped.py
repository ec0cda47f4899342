"""``python -m grader.tasks.collect_shipped``: the corpus of kernel bodies a learner did not write
(``grader.tasks.shipped``), collected again and stored with the digest of what it was made from.

Every kernel the course ships is traced and fingerprinted (``grader.facts.fingerprint``):
``kernelsim.examples`` and the grader's own kernels, every kernel the lessons run, and JAX's
bundled Pallas ops that compute what a task asks, at any size. The instructor's solution of
every task is traced too: a solution body the course ships is stored as its task's given body
where the task's text and solution both hold ``Task.given_body`` verbatim, and refused otherwise
(an honest learner would lose marks for it).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from grader import devices, sources, tasks
from grader.calling import kernel_bodies, trace_case
from grader.facts.fingerprint import fingerprint
from grader.tasks.core import tiled_matmul_call
from grader.tasks.shipped import STORE
from kernelsim import examples

REPO = sources.REPO


def _zeros(*shapes, dtype=jnp.float32):
    return [jnp.zeros(s, dtype) for s in shapes]


def shipped_calls() -> Iterator[tuple[str, Callable, list]]:
    """(where, function, arguments) for the course's own kernels and JAX's ops."""
    yield "kernelsim.examples.add", functools.partial(examples.add, block=(8, 128),
                                                      interpret=True), _zeros((16, 256),
                                                                              (16, 256))
    yield "kernelsim.examples.matmul", functools.partial(
        examples.matmul, bm=16, bk=128, bn=128, interpret=True), _zeros((32, 256), (256, 128))
    yield "kernelsim.examples.transpose", functools.partial(
        examples.transpose, interpret=True), _zeros((256, 256))
    counts, rows, cols = examples.block_band_pattern(2, 1)
    yield "kernelsim.examples.block_sparse_matmul", functools.partial(
        examples.block_sparse_matmul, interpret=True), \
        [*map(jnp.asarray, (counts, rows, cols)), *_zeros((256, 256), (256, 128))]
    # made when called, so that a recording of the calls it makes sees its pallas_call
    yield "grader.tasks.core.tiled_matmul_call", \
        lambda a, b: tiled_matmul_call(32, 256, 128, 16, 128, 128, jnp.float32)(a, b), \
        _zeros((32, 256), (256, 128))

    # JAX's bundled ops load when they are traced: the import takes a fifth of a second
    from jax.experimental.pallas.ops.gpu import attention, layer_norm, rms_norm, softmax
    from jax.experimental.pallas.ops.tpu import flash_attention, matmul

    yield "jax...ops.tpu.matmul", functools.partial(
        matmul.matmul, block_shape=(128, 128)), _zeros((256, 256), (256, 256))
    yield "jax...ops.tpu.flash_attention", functools.partial(
        flash_attention.flash_attention, causal=False), _zeros(*[(1, 1, 128, 128)] * 3)
    yield "jax...ops.tpu.flash_attention (causal)", functools.partial(
        flash_attention.flash_attention, causal=True), _zeros(*[(1, 1, 128, 128)] * 3)
    yield "jax...ops.gpu.softmax", functools.partial(softmax.softmax, axis=-1, interpret=True), \
        _zeros((16, 128))
    yield "jax...ops.gpu.layer_norm", functools.partial(layer_norm.layer_norm, interpret=True), \
        _zeros((1, 16, 128), (128,), (128,))  # two batch axes, vmapped over
    yield "jax...ops.gpu.rms_norm", functools.partial(rms_norm.rms_norm, interpret=True), \
        _zeros((1, 16, 128), (128,), (128,))
    for causal in (False, True):
        yield f"jax...ops.gpu.attention{' (causal)' * causal}", functools.partial(
            attention.mha, segment_ids=None, causal=causal, interpret=True), \
            _zeros(*[(1, 128, 1, 64)] * 3)


def _recording(found: list):
    """A stand-in for ``pl.pallas_call`` or ``plgpu.kernel`` (``original``) that adds
    (kernel function, body) to ``found`` for each call it makes, traced once."""
    def wrap(original):
        def make(*args, **kwargs):
            call = original(*args, **kwargs)
            kernel = args[0] if args else kwargs.get("kernel", kwargs.get("body"))

            @functools.wraps(call)
            def run(*operands):
                try:
                    program = jax.make_jaxpr(call)(*operands)
                    found.extend((kernel, body) for body in kernel_bodies(program))
                except Exception:  # noqa: BLE001 - a lesson showing an error keeps its error
                    pass
                return call(*operands)

            return run

        return make

    return wrap


def _recorded(run: Callable[[], object], found: list):
    """Runs ``run`` with every ``pallas_call`` and Mosaic GPU kernel it makes recorded in
    ``found``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # about a second, for this walk only

    originals = {pl: pl.pallas_call, plgpu: plgpu.kernel}
    wrap = _recording(found)
    jax.clear_caches()  # a jitted op traced before would not make its pallas_call again
    pl.pallas_call, plgpu.kernel = wrap(pl.pallas_call), wrap(plgpu.kernel)
    try:
        run()
    finally:
        pl.pallas_call, plgpu.kernel = originals[pl], originals[plgpu]


def _lesson_calls(log) -> Iterator[tuple[str, Callable, object]]:
    """(where, kernel function, kernel body) for every kernel the lessons run: each lesson's
    code is executed with ``pl.pallas_call`` and ``plgpu.kernel`` recorded."""
    import jupytext  # seconds to import: only the lessons' and solutions' walks read notebooks

    for path in sorted((REPO / "lessons").glob("[0-9]*.py")):
        source = "\n".join(c.source for c in jupytext.read(path).cells
                           if c.cell_type == "code" and not c.source.lstrip().startswith("%"))
        found: list = []

        def run(source=source, path=path):
            sys.path.insert(0, str(path.parent))  # the lessons' own helpers (_course.py)
            try:
                exec(compile(source, str(path), "exec"), {"__name__": "__lesson__"})  # noqa: S102
            except Exception as e:  # noqa: BLE001 - what ran until then still counts
                log(f"shipped: {path.name} stopped at {type(e).__name__}: {e}"[:200])
            finally:
                sys.path.remove(str(path.parent))

        _recorded(run, found)
        for kernel, body in found:
            yield f"lessons/{path.name}", kernel, body


def shipped_kernels(lessons: bool = True, log=print) -> Iterator[tuple[str, Callable, object]]:
    """(where, kernel function, kernel body) for every kernel the course ships: those of
    ``shipped_calls`` and, with ``lessons``, every one a lesson runs."""
    for where, fn, args in shipped_calls():
        found: list = []
        _recorded(lambda fn=fn, args=args: jax.make_jaxpr(fn)(*args), found)
        for kernel, body in found:
            yield where, kernel, body
    if lessons:
        yield from _lesson_calls(log)


def _given_in(body: str, cells) -> bool:
    """Whether a notebook's text gives ``body`` verbatim, and its code holds each line of it
    (indented as the code needs)."""
    code = {line.strip() for c in cells if c.cell_type == "code" for line in c.source.splitlines()}
    return any(body in c.source for c in cells if c.cell_type == "markdown") and \
        all(line.strip() in code for line in body.splitlines() if line.strip())


def _solution_bodies() -> Iterator[tuple[str, object]]:
    """(task id, kernel body) for the instructor's solution of every task, traced on every
    case as grading traces it (a body's structure may change with the case's shapes): each
    notebook's setup and solution cells run in one namespace; a task's function is the one
    its solution cell names after it, or the one function that cell defines."""
    import jupytext  # seconds to import: only the lessons' and solutions' walks read notebooks

    for assignment in tasks.ASSIGNMENTS:
        path = REPO / "exercises" / "source" / assignment / f"{assignment[3:]}.py"
        namespace: dict = {"__name__": "__solution__"}
        cells = jupytext.read(path).cells
        for cell in cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if cell.cell_type != "code" or not (grade_id == "setup"
                                                or grade_id.endswith("_solution")):
                continue
            before = set(namespace)
            exec(compile(cell.source, f"{path.name}:{grade_id}", "exec"), namespace)  # noqa: S102
            new = [n for n in set(namespace) - before if callable(namespace[n])]
            task_id = grade_id.removesuffix("_solution")
            if grade_id == "setup" or task_id not in tasks.BY_ID:
                continue
            fn = namespace[task_id] if task_id in new else namespace[new[0]]
            task = tasks.get(task_id)
            if task.given_body and not _given_in(task.given_body, cells):
                raise RuntimeError(f"{task_id}'s given body {task.given_body!r} is not "
                                   f"verbatim in {path.name}'s text and code: write it there")
            for case in task.cases:
                arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
                traced = trace_case(task, fn, arrays, case.params)
                if traced.error is not None:
                    raise RuntimeError(f"{task_id}'s solution does not trace on case "
                                       f"{case.name}: {traced.error}")
                for body in kernel_bodies(traced.program):
                    yield task_id, body


def collect(lessons: bool = True, log=print) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(fingerprint -> where, for every shipped body; task id -> the fingerprints of the
    shipped bodies its text gives). Raises where an instructor's solution runs a shipped body
    its task's text does not give: an honest learner's copy of it would fail."""
    out: dict[str, str] = {}
    for where, _, body in shipped_kernels(lessons, log):
        out.setdefault(fingerprint(body), where)
    given: dict[str, set[str]] = {}
    refused = []
    for task_id, body in _solution_bodies():
        if (found := fingerprint(body)) not in out:
            continue
        if tasks.get(task_id).given_body:
            given.setdefault(task_id, set()).add(found)
        else:
            refused.append(f"{task_id} (the body {out[found]} ships)")
    if refused:
        raise RuntimeError("instructor solutions whose kernel body the course ships: "
                           f"{', '.join(sorted(set(refused)))}. Write that solution's body "
                           "differently, or give the body in its task's text and name it in "
                           "the task's given_body")
    return (dict(sorted(out.items(), key=lambda kv: (kv[1], kv[0]))),
            {t: sorted(f) for t, f in sorted(given.items())})


def sources_digest() -> str:
    """A digest of everything ``collect`` reads: the lessons and what they read from the
    repository (``grader.sources.lesson_inputs``: kernelsim, the bench modules they
    import), the grader's tasks, fingerprints and tracing (``calling``), the instructor
    notebooks, and JAX's version. Equal to the stored one: the stored corpus was
    made from these."""
    lessons_read = [p for lesson in sources.lessons() for p in sources.lesson_inputs(lesson)]
    return sources.files_digest([*lessons_read, *REPO.glob("grader/tasks/*.py"),
                                 REPO / "grader" / "facts" / "fingerprint.py",
                                 REPO / "grader" / "calling.py",
                                 *REPO.glob("exercises/source/*/*.py")],
                                f"jax {jax.__version__}".encode())


def main() -> None:
    # lesson 14 and assignment 13 run on a ring of CPU devices, which XLA counts once, when JAX
    # starts: short of them, start again with the flag (before anything imports JAX)
    most = max(devices.DEVICES.values())
    if jax.device_count("cpu") < most:
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name],
                  devices.cpu_devices_env(os.environ, most))
    kernels, given = collect()
    # the digest of the sources, taken after collect (which reads this very module)
    STORE.write_text(json.dumps({"sources": sources_digest(), "kernels": kernels,
                                 "given": given}, indent=1) + "\n")
    print(f"{STORE}: {len(kernels)} shipped kernel bodies", file=sys.stderr)


if __name__ == "__main__":
    main()
