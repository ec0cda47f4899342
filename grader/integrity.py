"""Tamper evidence inside the grader's own run of a notebook (``grader.jail.replay``).

The notebook's process of that run holds no secret and makes no fact (``grader.jail.checker``
does, where no learner code runs): these are an alarm, not a protection. Its harness imports
everything it uses, starts JAX, takes a ``Snapshot`` and arms a ``Guard`` before any learner
code runs; then it runs the learner's cells and traces the learner's functions. These two
report learner code that tries to change the grading code:

- ``Snapshot.changes`` compares, by identity (not by name or by a digest that a replacement
  could imitate), every attribute of every module that was loaded before learner code, every
  entry of ``sys.modules``, the attributes of those modules' classes, the shell's methods and
  event hooks, and the signal handlers, with what they are now. A module loaded later may only
  hold functions defined in the installed packages or the course. The harness calls it at
  every check, after the facts are made and before they are sent.
- ``Guard`` is an audit hook (PEP 578): it refuses what would let learner code run, or see the
  harness, while the facts are made (threads, ``fork``, trace, profile and monitoring
  callbacks) and refuses and reports what only an attack does: another audit hook, the garbage
  collector's object graph, ctypes, replacing a function's code, ``/proc/*/mem``.

Learner code can switch both off (it can reach them); it gains nothing by that
(``exercises/README.md``, "Threat model").
"""

from __future__ import annotations

import operator
import re
import signal
import sys
import types
from pathlib import Path

# attributes that honest code reassigns (IPython's last result and error, its builtins)
VOLATILE = {
    "sys": {"last_type", "last_value", "last_traceback", "last_exc", "ps1", "ps2"},
    "builtins": {"_", "__", "___", "get_ipython", "exit", "quit", "display"},
}
# events that let learner code run, or look at the harness, while the facts are made: refused
REFUSED = {
    "_thread.start_new_thread": "starting a thread",
    "os.fork": "os.fork", "os.forkpty": "os.forkpty",
    "sys.settrace": "sys.settrace", "sys.setprofile": "sys.setprofile",
    "sys.monitoring.register_callback": "sys.monitoring callbacks",
}
# events only an attack on the grading needs: refused and reported as tampering
ATTACKS = {
    "sys.addaudithook": "added an audit hook",
    "gc.get_referrers": "walked the object graph (gc.get_referrers)",
    "gc.get_referents": "walked the object graph (gc.get_referents)",
    "gc.get_objects": "listed every object (gc.get_objects)",
}
_PROC_MEM = re.compile(r"^/proc/(self|thread-self|\d+)(/task/\d+)?/mem$")


def course_roots() -> tuple[str, ...]:
    """Where the course's own code lives (``grader/``, ``kernelsim/``)."""
    repo = Path(__file__).resolve().parents[1]
    return tuple(f"{repo / name}/" for name in ("grader", "kernelsim"))


def trusted_roots() -> tuple[str, ...]:
    """Where trusted code lives: the Python installation, the venv and the course's code."""
    installed = {str(Path(r).resolve()) + "/" for r in (sys.prefix, sys.base_prefix,
                                                        sys.exec_prefix)}
    return (*sorted(installed), *course_roots())


def _frozen(filename: str) -> bool:
    """``<frozen abc>``: code of a module frozen into Python (abc, genericpath, ...)."""
    name = filename[len("<frozen "):-1] if filename.startswith("<frozen ") else None
    spec = getattr(sys.modules.get(name or ""), "__spec__", None)
    return name is not None and filename.endswith(">") and getattr(spec, "origin", None) == "frozen"


def defined_in(obj, roots: tuple[str, ...]) -> bool:
    """Whether a function (or method, or partial of one) was compiled from a file under
    ``roots`` or is frozen into Python; anything that is not a Python function counts as
    defined there."""
    while True:
        if isinstance(obj, types.MethodType):
            obj = obj.__func__
        elif hasattr(obj, "func") and hasattr(obj, "args") and hasattr(obj, "keywords"):
            obj = obj.func  # functools.partial
        else:
            break
    code = getattr(obj, "__code__", None) if isinstance(obj, types.FunctionType) else None
    return code is None or code.co_filename.startswith(roots) or _frozen(code.co_filename)


def installed_function(obj, roots: tuple[str, ...]) -> bool:
    """A Python function of an installed module, found under its own name there (pyplot's
    ``_draw_all_if_interactive``, which importing pyplot registers as an IPython hook)."""
    if not isinstance(obj, types.FunctionType) or not defined_in(obj, roots):
        return False
    where = sys.modules.get(getattr(obj, "__module__", None) or "")
    return str(getattr(where, "__file__", "")).startswith(roots) and \
        getattr(where, obj.__name__, None) is obj


def _callable(v) -> bool:
    return callable(v) and not isinstance(v, types.ModuleType)


def _code(v) -> bool:
    return callable(v) or isinstance(v, types.ModuleType)


class Snapshot:
    """The process's code as it is now (``changes`` compares later states with it).

    ``shell``: the IPython shell learner cells run in (its methods and event hooks are part of
    the snapshot); ``skip``: module names that are the learner's (``__main__``).
    """

    def __init__(self, shell=None, skip=("__main__", "__mp_main__")):
        self.shell, self.skip = shell, set(skip)
        self.roots, self.ours = trusted_roots(), course_roots()
        self.modules: dict[str, tuple[types.ModuleType, dict | None]] = {}
        self.classes: dict[str, tuple[type, dict]] = {}
        for name, mod in list(sys.modules.items()):
            self._take(name, mod)
        # top-level names of installed packages: a module the learner adds under one of them
        # would be imported in place of the real one
        self.packages = {name.partition(".")[0] for name, (mod, _) in self.modules.items()
                         if self._installed(mod)}
        self.shell_methods = {k: v for k, v in vars(shell).items() if _callable(v)} \
            if shell is not None else {}
        events = getattr(getattr(shell, "events", None), "callbacks", None) or {}
        self.hooks = {event: list(cbs) for event, cbs in events.items()}
        self.signals = {s: signal.getsignal(s) for s in signal.valid_signals()}

    def _take(self, name: str, mod) -> None:
        if name in self.skip:
            return
        attrs = getattr(mod, "__dict__", None)
        attrs = dict(attrs) if isinstance(attrs, dict) else None  # typing.io is a class
        self.modules[name] = (mod, attrs)
        if attrs is None:
            return
        for attr, value in attrs.items():
            if isinstance(value, type) and value.__module__ == name:
                self.classes[f"{name}.{attr}"] = (value, dict(vars(value)))

    def _installed(self, mod) -> bool:
        """Loaded from a file (or a namespace folder) of the installed packages or the course,
        or built into Python."""
        where = getattr(mod, "__file__", None)
        if where:
            return str(where).startswith(self.roots)
        if getattr(getattr(mod, "__spec__", None), "origin", None) in ("built-in", "frozen"):
            return True
        paths = list(getattr(mod, "__path__", None) or ())
        return bool(paths) and all(str(p).startswith(self.roots) for p in paths)

    def _extension_alias(self, key: str, mod) -> bool:
        """``sys.modules[key]`` is a submodule an installed extension made, under a second
        name: pyexpat makes ``pyexpat.model`` and ``pyexpat.errors`` (no file, no spec), and
        ``xml.parsers.expat`` registers them as ``xml.parsers.expat.model`` and ``.errors``
        (importing pyplot does this). It must be the attribute its own name says, of an
        installed module, and hold no code from outside the installed packages."""
        own = getattr(mod, "__name__", key)
        parent, _, attr = own.rpartition(".")
        holder = sys.modules.get(parent)
        return (own != key and sys.modules.get(own) is mod and holder is not None
                and self._installed(holder) and getattr(holder, attr, None) is mod
                and not any(isinstance(v, types.FunctionType | type)
                            and not defined_in(v, self.roots) for v in vars(mod).values()))

    def _ours(self, mod) -> bool:
        """A module of the course's own code, whose data is compared too (JAX keeps state in
        module globals: only its code is)."""
        return str(getattr(mod, "__file__", "")).startswith(self.ours)

    def changes(self) -> list[str]:
        """What differs from the snapshot, as ``grader.facts.work.facts was replaced``; modules
        loaded since are checked for learner-defined functions, then taken into it."""
        out: list[str] = []
        for name, (mod, attrs) in self.modules.items():
            if sys.modules.get(name) is not mod:
                out.append(f"sys.modules[{name!r}] was "
                           + ("removed" if name not in sys.modules else "replaced"))
                continue
            if attrs is not None:
                out += _compare(name, attrs, vars(mod), VOLATILE.get(name, ()),
                                self._ours(mod))
        for name, (cls, attrs) in self.classes.items():
            out += _compare(name, attrs, vars(cls), (), self._ours(sys.modules.get(
                cls.__module__)))
        for name, mod in list(sys.modules.items()):
            if name in self.modules or name in self.skip:
                continue
            if not self._installed(mod) and not self._extension_alias(name, mod):
                # the learner's own module, unless it takes the name of an installed one
                if name.partition(".")[0] in self.packages:
                    out.append(f"sys.modules[{name!r}] is not a module of the installed "
                               "packages")
                continue
            out += [f"{name}.{attr} is defined outside the installed packages"
                    for attr, value in list(getattr(mod, "__dict__", {}).items())
                    if isinstance(value, types.FunctionType)
                    and not defined_in(value, self.roots)]
            self._take(name, mod)
        if self.shell is not None:
            now = {k: v for k, v in vars(self.shell).items() if _callable(v)}
            out += [f"the shell's {k} was replaced" for k in now
                    if self.shell_methods.get(k, now) is not now[k] or k not in self.shell_methods]
            events = getattr(getattr(self.shell, "events", None), "callbacks", None) or {}
            for event, cbs in sorted(events.items()):
                for cb in cbs:
                    # hooks run around learner cells, never while a check runs: one that an
                    # installed package registers (importing pyplot does) is not tampering
                    if not any(cb is known for known in self.hooks.get(event, ())) \
                            and not installed_function(cb, self.roots):
                        out.append(f"an IPython {event} hook "
                                   f"({getattr(cb, '__qualname__', type(cb).__name__)}) was "
                                   "registered")
        for s, handler in self.signals.items():
            if signal.getsignal(s) is not handler:
                out.append(f"a handler for {signal.Signals(s).name} was installed")
        return out


def _compare(name: str, before: dict, now: dict, volatile, data: bool) -> list[str]:
    """Attributes replaced, removed or added (callables only) between ``before`` and ``now``;
    without ``data``, only attributes that hold or now hold code or a module count."""
    if now.keys() == before.keys() and all(map(operator.is_, now.values(), before.values())):
        return []  # nothing rebound (same keys, in order, same objects): checked in C
    out = []
    for attr, value in before.items():
        if attr in volatile or not (data or _code(value) or _code(now.get(attr))):
            continue
        if attr not in now:
            out.append(f"{name}.{attr} was removed")
        elif now[attr] is not value:
            out.append(f"{name}.{attr} was replaced")
    for attr in now.keys() - before.keys():
        if attr not in volatile and _callable(now[attr]):
            out.append(f"{name}.{attr} was added")
    return out


# the grader's own functions that may install a profile function while the guard is armed
# (a task's watch on what a learner's prediction calls, ``calling.predict_unaided``),
# by code object: a learner's function cannot be one of them
PROFILERS: set[types.CodeType] = set()


def may_profile(fn):
    """Let ``fn`` (grader code) call ``sys.setprofile`` while the guard is armed."""
    PROFILERS.add(fn.__code__)
    return fn


class Guard:
    """An audit hook that, once ``armed``, refuses ``REFUSED`` events (``RuntimeError``) and
    refuses and records ``ATTACKS``, ctypes, a function's code replaced and opening
    ``/proc/*/mem`` (``found``, for the report). ``sys.setprofile`` called by one of
    ``PROFILERS`` is let through."""

    def __init__(self):
        self.armed = False
        self.found: list[str] = []

    def __call__(self, event: str, args: tuple) -> None:
        if not self.armed:
            return
        if event == "sys.setprofile" and sys._getframe(1).f_code in PROFILERS:
            return
        if event in REFUSED:
            raise RuntimeError(f"{REFUSED[event]} is not allowed while the grader runs your "
                               "notebook")
        attack = ATTACKS.get(event)
        if attack is None and event.startswith("ctypes."):
            attack = f"used ctypes ({event})"
        elif attack is None and event == "object.__setattr__" and len(args) >= 2 \
                and args[1] == "__code__":
            attack = f"replaced the code of {getattr(args[0], '__qualname__', '?')}"
        elif attack is None and event == "open" and args and \
                isinstance(args[0], str | bytes) and _PROC_MEM.match(str(args[0])):
            attack = f"opened {args[0]!s}"
        if attack is not None:
            self.found.append(attack)
            raise RuntimeError(f"{attack}: not allowed while the grader runs your notebook")
