"""A traced program as bytes: from the notebook's process to the checker
(``grader.jail.checker``).

The notebook's process traces the learner's function into a program (``jax.make_jaxpr``); the
checker, a process learner code never runs in, executes and analyses it. The program crosses
as a pickle, and the checker reads it with an allow-list unpickler, because the bytes are the
learner's to choose:

- a class is taken only from a module of JAX, jaxlib, NumPy or ml_dtypes that the checker has
  already imported (nothing is imported to unpickle), and only a class (or one of ``FUNCTIONS``,
  which those libraries' own pickles call); never a function, a module or a learner class;
- a primitive travels as the name of a module attribute that holds it, and is the checker's
  own primitive of that name (a primitive the learner made is in no such module: refused);
- a Python callable in an equation's parameters (a callback) travels as a ``Callback`` marker
  with its name: it never runs in the checker (``grader.jail.checker`` refuses host callbacks; a
  ``jax.debug.print`` of the installed packages becomes a no-op);
- a device is the checker's device of that number; tracebacks and leaked tracers are dropped.
"""

from __future__ import annotations

import functools
import io
import pickle
import sys
import types
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Primitive, jaxprs_in_params

from kernelsim.adapter import prng_impl_functions, typed_ndarray_type

# where a class may come from: JAX's own modules and its extension, NumPy's arrays and dtypes,
# ml_dtypes (bfloat16); not NumPy's memmap, ctypes or file helpers
ALLOWED_ROOTS = ("jax", "jaxlib", "ml_dtypes")
NUMPY = {("numpy", "dtype"), ("numpy", "ndarray")}
SETS = {("builtins", "set"), ("builtins", "frozenset")}  # a set's members in a fixed order
# functions the allowed libraries' own pickles call to rebuild their objects
FUNCTIONS = {("jax._src.named_sharding", "_unpickle_named_sharding"),
             ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.numeric", "_frombuffer"),
             ("numpy.core.multiarray", "_reconstruct")}
# functions a key's type names, its PRNG implementation's (a kernel drawing jax.random bits)
FUNCTIONS |= prng_impl_functions()
# objects (not classes) the allowed libraries' pickles name: pytree registries
OBJECTS = {("jax._src.tree_util", "default_registry"), ("jax._src.tree_util", "tracing_registry")}


def _allowed_module(module: str, name: str) -> bool:
    return (module.partition(".")[0] in ALLOWED_ROOTS
            or (module, name) in NUMPY | SETS | FUNCTIONS or module == "numpy.dtypes")


class NotAProgram(Exception):
    """The bytes are not a program the notebook's pickler writes (or name what the checker
    does not allow); the message says what."""


class Callback:
    """A Python callable of an equation's parameters, by name; ``installed``: the notebook's
    process says it is defined in the installed packages. Calling it does nothing (only a
    ``debug_callback`` the checker lets through is ever called: a print)."""

    def __init__(self, name: str, installed: bool):
        self.name, self.installed = name, installed

    def __call__(self, *args, **kwargs):
        return None


FUNCTION_TYPES = (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                  functools.partial)


def eqns(jaxpr):
    """Every equation of a program, nested jaxprs (kernel bodies, index maps) included."""
    for eqn in getattr(jaxpr, "eqns", None) or jaxpr.jaxpr.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from eqns(sub)
        mapping = eqn.params.get("grid_mapping")
        for block in getattr(mapping, "block_mappings", ()) or ():
            index_map = getattr(block, "index_map_jaxpr", None)
            if index_map is not None:
                yield from eqns(index_map)


def functions_in(obj, depth: int = 4):
    """Python functions reachable from a callback (through partials, closures, bound methods
    and plain objects' attributes, as JAX wraps a callback)."""
    if depth < 0 or obj is None:
        return
    if isinstance(obj, types.FunctionType):
        yield obj
        for cell in obj.__closure__ or ():
            try:
                yield from functions_in(cell.cell_contents, depth - 1)
            except ValueError:  # an empty cell
                continue
    elif isinstance(obj, types.MethodType):
        yield from functions_in(obj.__func__, depth - 1)
        yield from functions_in(obj.__self__, depth - 1)
    elif isinstance(obj, list | tuple):
        for x in obj:
            yield from functions_in(x, depth - 1)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from functions_in(x, depth - 1)
    elif not isinstance(obj, type | types.ModuleType | str | bytes | int | float):
        slots = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())
                 if isinstance(name, str)]
        yield from functions_in([*getattr(obj, "__dict__", {}).values(),
                                 *(getattr(obj, name, None) for name in slots)], depth - 1)
        if hasattr(obj, "func"):  # functools.partial: func, args and keywords are members
            yield from functions_in([obj.func, obj.args, obj.keywords], depth - 1)


def _primitive_names() -> dict[int, tuple[str, str]]:
    names: dict[int, tuple[str, str]] = {}
    for module in sorted(sys.modules):
        for attr, value in sorted(vars(sys.modules[module]).items()
                                  if hasattr(sys.modules[module], "__dict__") else ()):
            if isinstance(value, Primitive):
                names.setdefault(id(value), (module, attr))
    return names


def _by_reference(fn) -> bool:
    """A function or class pickle can name (its module's attribute of its name is itself)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    found = module
    for part in str(getattr(fn, "__qualname__", "")).split("."):
        found = getattr(found, part, None)
    return module is not None and found is fn


class _Pickler(pickle._Pickler):
    """Python's own pickler, not the C one: only this one offers sets to ``reducer_override``,
    which writes a set's members (a jaxpr's effects) in an order that does not depend on the
    process's hashes. The same program then pickles to the same bytes in every run, which is
    what the checker's kept answers are keyed by (``grader.jail.answer_cache``)."""

    def __init__(self, file, installed, callbacks: set[int]):
        super().__init__(file, protocol=5)
        self.names: dict[int, tuple[str, str]] | None = None
        self.installed, self.callbacks = installed, callbacks

    def persistent_id(self, obj):
        if isinstance(obj, Primitive):
            if self.names is None or id(obj) not in self.names:
                self.names = _primitive_names()
            return ("primitive", *self.names.get(id(obj), ("", obj.name)))
        kind = type(obj).__name__
        if kind == "Traceback" or isinstance(obj, jax.core.Tracer):
            return ("none",)
        if kind == "Device":
            return ("device", int(obj.id))
        if id(obj) in self.callbacks or isinstance(obj, FUNCTION_TYPES) and \
                not _by_reference(obj):
            functions = list(functions_in(obj))
            mine = [f for f in functions if not self.installed(f)]
            named = (mine or functions or [obj])[0]
            return ("callback", str(getattr(named, "__qualname__", type(named).__qualname__)),
                    not mine)
        return None

    def reducer_override(self, obj):
        typed = typed_ndarray_type()  # its ndarray pickle loses the JAX type
        if typed is not None and type(obj) is typed:
            return (typed, (np.asarray(obj), obj.aval))
        if type(obj) in (set, frozenset) and len(obj) > 1:
            return type(obj), (sorted(obj, key=self._member_order),)
        return NotImplemented

    def _member_order(self, member) -> tuple:
        """A set member's place: its class, then each field by what this pickle already
        holds of it (a jaxpr's variables are pickled before its effects name them)."""
        kind = type(member)
        fields = getattr(member, "__dict__", None) or {
            name: getattr(member, name) for cls in kind.__mro__
            for name in getattr(cls, "__slots__", ()) if isinstance(name, str)
            and hasattr(member, name)}
        held = tuple((name, f"memo {self.memo[id(v)][0]}" if id(v) in self.memo else repr(v))
                     for name, v in sorted(fields.items()))
        return kind.__module__, kind.__qualname__, held, repr(member)


def dumps(program: Any, installed=lambda fn: False) -> bytes:
    """``program`` (a closed jaxpr) as bytes; ``installed(fn)``: whether a callable of its
    parameters is defined in the installed packages (said by the notebook's process, and
    only ever trusted to make a print a no-op)."""
    callbacks = {id(e.params["callback"]) for e in eqns(program) if "callback" in e.params}
    buf = io.BytesIO()
    _Pickler(buf, installed, callbacks).dump(program)
    return buf.getvalue()


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or not all(isinstance(x, str | bool | int)
                                                            for x in pid):
            raise NotAProgram(f"an unknown reference {pid!r:.80}")
        if pid[0] == "primitive" and len(pid) == 3:
            found = getattr(sys.modules.get(pid[1]), pid[2], None) if pid[1] else None
            if not isinstance(found, Primitive):
                raise NotAProgram(f"it uses a primitive the course does not know ({pid[2]})")
            return found
        if pid == ("none",):
            return None
        if pid[0] == "device" and len(pid) == 2 and isinstance(pid[1], int):
            devices = jax.devices()
            return devices[pid[1]] if 0 <= pid[1] < len(devices) else devices[0]
        if pid[0] == "callback" and len(pid) == 3:
            return Callback(str(pid[1]), bool(pid[2]))
        raise NotAProgram(f"an unknown reference {pid!r:.80}")

    def find_class(self, module: str, name: str):
        if not _allowed_module(module, name) or module not in sys.modules:
            raise NotAProgram(f"it holds an object of {module}.{name}, which is not JAX's, "
                              "NumPy's or Pallas's")
        found = sys.modules[module]
        for part in name.split("."):
            found = getattr(found, part, None)
        if (module, name) in FUNCTIONS | OBJECTS or (
                isinstance(found, type) and not issubclass(found, BaseException)):
            return found
        raise NotAProgram(f"it names {module}.{name}, which is not a class of JAX's or NumPy's")


def loads(data: bytes) -> Any:
    """The program in ``data``; ``NotAProgram`` when it is not one (a truncated or forged
    pickle, a class or primitive outside the allow-list)."""
    try:
        program = _Unpickler(io.BytesIO(data)).load()
    except NotAProgram:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the bytes make the unpickler raise
        raise NotAProgram(f"the bytes are not a pickled program ({type(e).__name__}: "
                          f"{str(e)[:200]})") from None
    if not isinstance(program, ClosedJaxpr):
        raise NotAProgram(f"the bytes hold a {type(program).__name__}, not a program")
    return program
