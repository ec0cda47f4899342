"""``python -m grader.tasks.collect_shipped``: the corpus of kernel bodies a learner did not write
(``grader.tasks.shipped``), collected again and stored with the digest of what it was made from.

Every kernel the course ships is traced and fingerprinted (``grader.grading.fingerprint``):
``kernelsim.examples`` and the grader's own kernels, every kernel the lessons run, and JAX's
bundled Pallas ops that compute what a task asks. Bodies under ``shipped.MIN_BODY`` live
equations, and the instructor's solution of every task, are left out.
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
from grader.grading.calling import kernel_bodies, trace_case
from grader.grading.fingerprint import body_size, fingerprint
from grader.tasks.core import tiled_matmul_call
from grader.tasks.shipped import MIN_BODY, STORE
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
    yield "grader.tasks.core.tiled_matmul_call", \
        tiled_matmul_call(32, 256, 128, 16, 128, 128, jnp.float32), _zeros((32, 256), (256, 128))

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


def _lesson_calls(log) -> Iterator[tuple[str, object]]:
    """(where, kernel body) for every kernel the lessons run: each lesson's code is executed
    with ``pl.pallas_call`` and ``plgpu.kernel`` wrapped so that each call it makes is traced
    once."""
    import jupytext  # seconds to import: only the lessons' and solutions' walks read notebooks
    from jax.experimental.pallas import mosaic_gpu as plgpu  # about a second, for this walk only

    found: list = []
    originals = {pl: pl.pallas_call, plgpu: plgpu.kernel}

    def recording(original):
        def make(*args, **kwargs):
            call = original(*args, **kwargs)

            @functools.wraps(call)
            def run(*operands):
                try:
                    found.extend(kernel_bodies(jax.make_jaxpr(call)(*operands)))
                except Exception:  # noqa: BLE001 - a lesson showing an error keeps its error
                    pass
                return call(*operands)

            return run

        return make

    for path in sorted((REPO / "lessons").glob("[0-9]*.py")):
        source = "\n".join(c.source for c in jupytext.read(path).cells
                           if c.cell_type == "code" and not c.source.lstrip().startswith("%"))
        found.clear()
        pl.pallas_call, plgpu.kernel = recording(pl.pallas_call), recording(plgpu.kernel)
        sys.path.insert(0, str(path.parent))  # the lessons' own helpers (_course.py)
        try:
            exec(compile(source, str(path), "exec"), {"__name__": "__lesson__"})  # noqa: S102
        except Exception as e:  # noqa: BLE001 - what ran until then still counts
            log(f"shipped: {path.name} stopped at {type(e).__name__}: {e}"[:200])
        finally:
            pl.pallas_call, plgpu.kernel = originals[pl], originals[plgpu]
            sys.path.remove(str(path.parent))
        for body in found:
            yield f"lessons/{path.name}", body


def _solution_bodies() -> Iterator[tuple[str, object]]:
    """(task id, kernel body) for the instructor's solution of every task, traced on every
    case as grading traces it (a body's structure may change with the case's shapes): each
    notebook's setup and solution cells run in one namespace; a task's function is the one
    its solution cell names after it, or the one function that cell defines."""
    import jupytext  # seconds to import: only the lessons' and solutions' walks read notebooks

    for assignment in tasks.ASSIGNMENTS:
        path = REPO / "exercises" / "source" / assignment / f"{assignment[3:]}.py"
        namespace: dict = {"__name__": "__solution__"}
        for cell in jupytext.read(path).cells:
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
            for case in task.cases:
                arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
                traced = trace_case(task, fn, arrays, case.params)
                if traced.error is not None:
                    raise RuntimeError(f"{task_id}'s solution does not trace on case "
                                       f"{case.name}: {traced.error}")
                for body in kernel_bodies(traced.program):
                    yield task_id, body


def collect(lessons: bool = True, log=print) -> dict[str, str]:
    """fingerprint -> where, for every shipped body of at least ``MIN_BODY`` equations that is
    not an instructor's solution."""
    out: dict[str, str] = {}

    def add(where, body):
        if body_size(body) >= MIN_BODY:
            out.setdefault(fingerprint(body), where)

    for where, fn, args in shipped_calls():
        for body in kernel_bodies(jax.make_jaxpr(fn)(*args)):
            add(where, body)
    if lessons:
        for where, body in _lesson_calls(log):
            add(where, body)
    for task_id, body in _solution_bodies():
        if out.pop(fingerprint(body), None):
            log(f"shipped: left out the body of {task_id}'s solution (the honest answer)")
    return dict(sorted(out.items(), key=lambda kv: (kv[1], kv[0])))


def sources_digest() -> str:
    """A digest of everything ``collect`` reads: the lessons and what they read from the
    repository (``grader.sources.lesson_inputs``: kernelsim, the bench modules they
    import), the grader's tasks, fingerprints and tracing (``calling``), the instructor
    notebooks, and JAX's version. Equal to the stored one: the stored corpus was
    made from these."""
    lessons_read = [p for lesson in sources.lessons() for p in sources.lesson_inputs(lesson)]
    return sources.files_digest([*lessons_read, *REPO.glob("grader/tasks/*.py"),
                                 REPO / "grader" / "grading" / "fingerprint.py",
                                 REPO / "grader" / "grading" / "calling.py",
                                 *REPO.glob("exercises/source/*/*.py")],
                                f"jax {jax.__version__}".encode())


def main() -> None:
    # lesson 14 and assignment 13 run on a ring of CPU devices, which XLA counts once, when JAX
    # starts: short of them, start again with the flag (before anything imports JAX)
    most = max(devices.DEVICES.values())
    if jax.device_count("cpu") < most:
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name],
                  devices.cpu_devices_env(os.environ, most))
    kernels = collect()
    # the digest of the sources, taken after collect (which reads this very module)
    STORE.write_text(json.dumps({"min_body": MIN_BODY, "sources": sources_digest(),
                                 "kernels": kernels}, indent=1) + "\n")
    print(f"{STORE}: {len(kernels)} shipped kernel bodies", file=sys.stderr)


if __name__ == "__main__":
    main()
