"""Tamper evidence: fingerprints of the code a grade depends on, taken inside the kernel.

The grader runs ``fingerprints`` in the jailed kernel (sent as source text, so replacing this
module in the kernel changes nothing) once when the kernel starts, before any learner code, and
again before each test cell, and compares the two. A learner cell that replaced a function of
numpy, jax, Pallas, kernelsim or the course's checks, a builtin, a module in ``sys.modules``
or IPython's error display shows up as a difference, and the submission's status becomes
``tampered``. Values never depend on this: they are compared outside the kernel; this catches
the attempts to fake the structural check or hide an error.
"""

from __future__ import annotations

import inspect

from grader.tasks import MODULES as TASK_MODULES

# modules whose every function and method is fingerprinted
MODULES = ("grader.course", "grader.exchange", "grader.tasks", "grader.tasks.core",
           *(f"grader.tasks.{name}" for name in TASK_MODULES), "grader.refs", "grader.verdict",
           "grader.work",
           "kernelsim", "kernelsim._jax", "kernelsim.model", "kernelsim.schedule",
           "kernelsim.cost", "kernelsim.trace", "kernelsim.errors", "kernelsim.lint")
# single objects elsewhere that checks and error reporting go through
OBJECTS = (
    "builtins.print", "builtins.isinstance", "builtins.open", "builtins.__import__",
    "builtins.getattr", "builtins.len", "builtins.repr", "builtins.compile", "builtins.exec",
    "builtins.AssertionError", "builtins.Exception",
    "numpy.asarray", "numpy.array", "numpy.allclose", "numpy.isclose", "numpy.array_equal",
    "numpy.testing.assert_allclose", "numpy.testing.assert_array_equal", "numpy.save",
    "numpy.load", "numpy.savez", "numpy.lib.format.write_array", "json.dumps", "json.dump",
    "json.loads", "os.replace", "os.open", "os.write", "zipfile.ZipFile.writestr",
    "pathlib.Path.write_text", "pathlib.Path.write_bytes", "pathlib.Path.read_text",
    "pathlib.Path.open",
    "jax.device_get", "jax.jit", "jax.numpy.asarray", "jax.numpy.array", "jax.make_jaxpr",
    "jax.extend.core.jaxpr_as_fun", "jax.extend.core.jaxprs_in_params",
    "jax.experimental.pallas.pallas_call", "jax.experimental.pallas.BlockSpec",
    "IPython.core.interactiveshell.InteractiveShell.showtraceback",
    "IPython.core.interactiveshell.InteractiveShell.run_cell",
    "ipykernel.zmqshell.ZMQInteractiveShell._showtraceback",
)
SHELL_METHODS = ("showtraceback", "_showtraceback", "showsyntaxerror", "run_cell",
                 "run_cell_async", "run_code", "_run_cell")


def fingerprints(modules, objects, shell_methods) -> dict:
    """``{name: fingerprint}`` for the functions of ``modules`` and for ``objects``.

    Self-contained (imports inside, no module globals) because the grader sends its source to
    the kernel. A Python function's fingerprint digests its bytecode, names and constants,
    nested code included; a builtin's is its module and qualified name; a module's its file.
    """
    import builtins
    import hashlib
    import importlib
    import sys
    import types

    def code_digest(code) -> str:
        h = hashlib.sha256(code.co_code)
        h.update(repr(code.co_names).encode())
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                h.update(code_digest(c).encode())
            elif isinstance(c, frozenset):
                h.update(repr(sorted(map(repr, c))).encode())
            else:
                h.update(repr(c).encode())
        return h.hexdigest()[:16]

    def fingerprint(obj) -> str:
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType):
            return "py:" + code_digest(code)
        if isinstance(obj, types.BuiltinFunctionType | type):
            return f"c:{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"
        if isinstance(obj, types.ModuleType):
            return f"module:{obj.__name__}"
        return f"other:{type(obj).__module__}.{type(obj).__qualname__}"

    def resolve(dotted):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return obj
        raise ImportError(dotted)

    out: dict[str, str] = {}
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            out[f"module {name}"] = f"missing:{type(e).__name__}"
            continue
        key = f"module {name}"  # a function may share the dotted name of its module
        out[key] = f"file:{getattr(mod, '__file__', None)}"
        if sys.modules.get(name) is not mod:
            out[key] += ":replaced"
        for attr, obj in sorted(vars(mod).items()):
            if isinstance(obj, types.ModuleType) and obj.__name__.startswith(name + "."):
                continue  # a submodule: present once something imported it
            if isinstance(obj, types.FunctionType | types.ModuleType):
                out[f"{name}.{attr}"] = fingerprint(obj)
            elif isinstance(obj, type) and obj.__module__ == name:
                for meth, fn in sorted(vars(obj).items()):
                    fn = getattr(fn, "__func__", fn)
                    if isinstance(fn, types.FunctionType):
                        out[f"{name}.{attr}.{meth}"] = fingerprint(fn)
            elif isinstance(obj, list) and attr == "TASKS":  # the course's task table
                for task in obj:
                    for field in ("invoke", "structure", "reference", "make"):
                        fn = getattr(task, field, None)
                        if fn is not None:
                            out[f"{name}.TASKS.{task.id}.{field}"] = fingerprint(fn)
    for name in objects:
        try:
            out[name] = fingerprint(resolve(name))
        except Exception as e:  # noqa: BLE001
            out[name] = f"missing:{type(e).__name__}"
    for name in ("numpy", "numpy.testing", "jax", "jax.numpy", "json", "builtins"):
        mod = sys.modules.get(name)
        out[f"sys.modules[{name}]"] = f"file:{getattr(mod, '__file__', None)}"
    out["builtins"] = "same" if sys.modules.get("builtins") is builtins else "replaced"
    shell = None
    get_ipython = getattr(builtins, "get_ipython", None)
    if get_ipython is not None:
        try:
            shell = get_ipython()
        except Exception:  # noqa: BLE001
            shell = None
    for m in shell_methods:  # ipykernel sets some on the instance itself: fingerprint them
        if shell is not None and m in vars(shell):
            out[f"shell.{m}"] = fingerprint(getattr(vars(shell)[m], "__func__", vars(shell)[m]))
    # IPython event hooks run learner code around every cell, test cells included (e.g. to
    # patch the grading code for the cell and restore it before the next probe); hooks that
    # come from installed packages (matplotlib's figure flush) are not the learner's
    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    events = getattr(getattr(shell, "events", None), "callbacks", None)
    for event, callbacks in sorted(events.items() if isinstance(events, dict) else ()):
        for cb in callbacks:
            fn = getattr(cb, "__func__", cb)
            where = getattr(getattr(fn, "__code__", None), "co_filename", "")
            if not where.startswith(installed):
                out[f"IPython {event} hook {fingerprint(fn)}"] = "registered"
    return out


def probe_source(result_path: str) -> str:
    """Code for the kernel: compute the fingerprints, write them as JSON, leave no names."""
    return (inspect.getsource(fingerprints)
            + f"\nimport json as __pc_json\nwith open({result_path!r}, 'w') as __pc_f:\n"
            f"    __pc_json.dump(fingerprints({MODULES!r}, {OBJECTS!r}, {SHELL_METHODS!r}),"
            " __pc_f)\n"
            "del fingerprints, __pc_json, __pc_f\n")


def differences(expected: dict, found: dict) -> list[str]:
    """Human-readable differences, e.g. ``numpy.testing.assert_allclose was replaced``."""
    out = []
    for name in sorted(set(expected) | set(found)):
        e, f = expected.get(name), found.get(name)
        if e == f:
            continue
        if f is None:
            out.append(f"{name} was removed")
        elif e is None:
            out.append(f"{name} was added")
        else:
            out.append(f"{name} was replaced")
    return out
