"""The house rules a newcomer relies on: ARCHITECTURE.md names real paths, only kernelsim's
adapter reaches into JAX's internals, no module of kernelsim/ or grader/ outgrows a reading,
grader/'s modules import each other in one direction, and no private name crosses a file."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ADAPTER = REPO / "kernelsim" / "adapter.py"


def _tracked_python() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    return [REPO / p for p in out]


def architecture_paths(text: str) -> list[str]:
    """Every code span of ARCHITECTURE.md that names a path in the repository."""
    spans = re.findall(r"`([^`\s]+)`", text)
    return [s for s in spans if "/" in s and not s.startswith(("http", "python"))
            and re.fullmatch(r"[\w./-]+", s)]


def test_architecture_names_only_paths_that_exist():
    text = (REPO / "ARCHITECTURE.md").read_text()
    paths = architecture_paths(text)
    assert len(paths) > 20, "the page should name the entry file of every room"
    missing = [p for p in paths if not (REPO / p.rstrip("/")).exists()]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_architecture_path_check_can_fail():
    assert architecture_paths("see `kernelsim/nowhere.py` and `x`") == ["kernelsim/nowhere.py"]


def unmapped(files: list[str], text: str, room: str = "kernelsim") -> list[str]:
    """The folders (``room/find/``) and modules (``room/find/calls.py``) of ``files`` (paths in
    the repository) under ``room`` that ``text`` (ARCHITECTURE.md) never names as a path. A
    package's ``__init__.py`` is named by its folder."""
    named = {p.rstrip("/") for p in architecture_paths(text)}
    under = [Path(f) for f in files if Path(f).parts[0] == room and f.endswith(".py")]
    folders = {str(f.parent) for f in under if f.name == "__init__.py"}
    modules = {str(f) for f in under if f.name != "__init__.py"}
    return [f"{p}/" if p in folders else p for p in sorted(folders | modules) if p not in named]


def test_architecture_maps_every_room_and_module_of_kernelsim():
    """ARCHITECTURE.md's map follows kernelsim's folders: every package folder and every module
    under kernelsim/ is named there (and every path it names exists, the test above)."""
    files = [str(p.relative_to(REPO)) for p in _tracked_python()]
    assert sum(f.startswith("kernelsim/") for f in files) > 30
    missing = unmapped(files, (REPO / "ARCHITECTURE.md").read_text())
    assert not missing, f"ARCHITECTURE.md's kernelsim map leaves out: {missing}"


def test_unmapped_check_can_fail():
    files = ["kernelsim/__init__.py", "kernelsim/trace.py", "kernelsim/find/__init__.py",
             "kernelsim/find/calls.py", "kernelsim/find/flops.py", "kernelsim/cost/__init__.py",
             "kernelsim/viewer.js", "grader/cli.py"]
    text = "`kernelsim/` `kernelsim/trace.py` `kernelsim/find/` and `kernelsim/find/calls.py`"
    assert unmapped(files, text) == ["kernelsim/cost/", "kernelsim/find/flops.py"]
    assert not unmapped(files[:4], text)


def test_readme_counts_the_graded_assignments():
    """README.md's count of graded assignments is the number of exercises/source/ folders."""
    counted = re.search(r"nbgrader course of (\d+) graded assignments",
                        (REPO / "README.md").read_text())
    assert counted, "README.md should say how many graded assignments the course has"
    folders = [d for d in (REPO / "exercises" / "source").glob("[0-9][0-9]_*") if d.is_dir()]
    assert int(counted[1]) == len(folders), f"README.md says {counted[1]}, " \
        f"exercises/source/ has {len(folders)}"


def jax_internal_imports(source: str) -> list[str]:
    """Module names under ``jax._src`` that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("jax._src")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("jax._src") or (
                    node.module == "jax" and any(a.name == "_src" for a in node.names)):
                found.append(node.module)
    return found


def test_only_the_adapter_imports_jax_internals():
    offenders = {str(p.relative_to(REPO)): names for p in _tracked_python() if p != ADAPTER
                 and (names := jax_internal_imports(p.read_text()))}
    assert not offenders, f"jax._src is kernelsim/adapter.py's alone: {offenders}"


@pytest.mark.parametrize("source", ["import jax._src.core", "from jax._src import core",
                                    "from jax import _src", "from jax._src.pallas import x"])
def test_internal_import_check_sees(source):
    assert jax_internal_imports(source)


MAX_LINES = 600  # a module a newcomer reads in one sitting


def long_modules(paths: list[Path], limit: int = MAX_LINES) -> dict[str, int]:
    """The modules among ``paths`` over ``limit`` lines, with their line counts."""
    counts = {p: len(p.read_text().splitlines()) for p in paths}
    return {str(p.relative_to(REPO) if p.is_relative_to(REPO) else p): n
            for p, n in counts.items() if n > limit}


def test_no_module_of_kernelsim_or_grader_is_over_600_lines():
    rooms = [p for p in _tracked_python()
             if p.relative_to(REPO).parts[0] in ("kernelsim", "grader")]
    assert len(rooms) > 40
    assert not (long := long_modules(rooms)), f"split by what the code does: {long}"


def test_long_module_check_can_fail(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "short.py").write_text("x = 1\n" * 600)
    assert list(long_modules(sorted(tmp_path.glob("*.py")))) == [str(tmp_path / "long.py")]


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run when a module is imported: its top level, and the blocks of
    ``if``/``try``/``with`` there, less ``if TYPE_CHECKING:`` (only a type checker runs it)."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            test = node.test
            if not (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"):
                out += _module_level(node.body)
            out += _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                out += _module_level(block)
        elif isinstance(node, ast.With):
            out += _module_level(node.body)
    return out


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module a ``from ... import`` in ``module`` imports from."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parts = parts[:len(parts) - node.level + is_package]
    return ".".join(parts + ([node.module] if node.module else []))


# functions that load a sibling module by its name: site/ is no package (it would shadow the
# stdlib's), so site/hooks.py loads site/content.py as site_module("content")
SIBLING_LOADERS = {"site_module"}


def _resolve(name: str, module: str, is_package: bool, sources: dict) -> str:
    """``name`` as imported by ``module``: a sibling's in a folder that is no package."""
    folder = module.rpartition(".")[0]
    sibling = f"{folder}.{name}"
    in_scripts = not is_package and folder not in sources  # a folder that is no package
    return sibling if in_scripts and name not in sources and sibling in sources else name


def _imported(node: ast.AST, module: str, is_package: bool, sources: dict) -> set[str]:
    """The modules of ``sources`` that ``node`` (a statement or call of ``module``) imports."""
    names: set[str] = set()
    if isinstance(node, ast.Import):
        names = {_resolve(a.name, module, is_package, sources) for a in node.names}
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(_from_base(node, module, is_package), module, is_package, sources)
        names = {f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base
                 for a in node.names}
    elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in SIBLING_LOADERS
          and node.args and isinstance(node.args[0], ast.Constant)):
        names = {_resolve(str(node.args[0].value), module, is_package, sources)}
    return {n for n in names if n in sources and n != module}


def imports(sources: dict[str, tuple[str, bool]], every_depth: bool = False
            ) -> dict[str, dict[str, list[int]]]:
    """Which of ``sources`` (module name -> (source, is a package)) each one imports, with the
    lines that import it. ``every_depth``: every import statement, also inside functions,
    methods and ``if TYPE_CHECKING:`` (what the module depends on); else only those that run
    when it is imported. ``from p import m`` of a submodule ``m`` imports ``p.m`` (``p`` is under
    way already). In a folder that is no package (site/), a bare name imports the sibling
    module of that name, and so does a call of one of ``SIBLING_LOADERS``."""
    out: dict[str, dict[str, list[int]]] = {}
    for module, (source, is_package) in sources.items():
        tree = ast.parse(source)
        found: dict[str, list[int]] = {}
        for node in ast.walk(tree) if every_depth else _module_level(tree.body):
            for name in _imported(node, module, is_package, sources):
                found.setdefault(name, []).append(node.lineno)
        out[module] = {name: sorted(lines) for name, lines in found.items()}
    return out


def import_graph(sources: dict[str, tuple[str, bool]], every_depth: bool = False
                 ) -> dict[str, set[str]]:
    """Which of ``sources`` each one imports (``imports``: module-level imports only unless
    ``every_depth``; an import inside a function runs later)."""
    return {m: set(found) for m, found in imports(sources, every_depth).items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            group.append(v)
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _package_sources(room: str) -> dict[str, tuple[str, bool]]:
    out = {}
    for p in _tracked_python():
        rel = p.relative_to(REPO)
        if rel.parts[0] == room:
            parts = list(rel.with_suffix("").parts)
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            out[name] = (p.read_text(), package)
    return out


def test_grader_modules_import_each_other_in_one_direction():
    graph = import_graph(_package_sources("grader"))
    assert len(graph) > 30 and sum(map(len, graph.values())) > 30
    assert not (cycles := import_cycles(graph)), f"grader/ imports in a circle: {cycles}"


def test_import_cycle_check_can_fail():
    graph = import_graph({
        "pkg": ("", True), "pkg.a": ("from pkg import b", False),
        "pkg.b": ("from . import c\nimport json", False),
        "pkg.c": ("try:\n    from pkg.a import x\nexcept ImportError:\n    pass", False),
        "pkg.d": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n"
                  "def f():\n    from pkg import e", False),
        "pkg.e": ("from pkg.d import f", False)})
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == set()
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


# rooms whose modules never import one another in a circle, at any depth
ROOMS = ("grader", "kernelsim", "site")
# (importer, imported): arrows against the data's direction. The learner's tools and the tasks
# read the course, the site's build presents it; grading takes a learner's notebook and never
# the learner's tools; a view draws what the tracer made and is handed it; kernelsim's rooms
# follow a trace (jaxpr <- body <- find; cost reads neither the finder nor the body), and
# kernelsim knows neither its users nor the site.
WRONG_WAY = (("grader.tasks", "grader.website"), ("grader.learner", "grader.website"),
             ("grader.logistics", "grader.learner"), ("grader.jail", "grader.learner"),
             ("grader.facts", "grader.learner"), ("grader.verdict", "grader.learner"),
             ("grader.gradebook", "grader.learner"), ("kernelsim.views", "kernelsim.trace"),
             ("kernelsim.jaxpr", "kernelsim.body"), ("kernelsim.jaxpr", "kernelsim.find"),
             ("kernelsim.body", "kernelsim.find"), ("kernelsim.cost", "kernelsim.find"),
             ("kernelsim.cost", "kernelsim.body"),
             ("kernelsim", "grader"), ("kernelsim", "site"), ("grader", "site"))


def _within(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def wrong_way_imports(found: dict[str, dict[str, list[int]]],
                      rules: tuple[tuple[str, str], ...] = WRONG_WAY) -> list[str]:
    """``importer -> imported (lines)`` for every import (``imports``'s answer) that one of
    ``rules`` forbids."""
    return [f"{a} -> {b} (lines {lines})" for a in sorted(found)
            for b, lines in sorted(found[a].items())
            if any(_within(a, src) and _within(b, dst) for src, dst in rules)]


def circles_with_lines(found: dict[str, dict[str, list[int]]]) -> list[str]:
    """Each circle of ``found`` (``imports``'s answer) with the imports that close it."""
    graph = {m: set(d) for m, d in found.items()}
    return [", ".join(f"{a} -> {b} {found[a][b]}" for a in group
                      for b in sorted(graph[a] & set(group)))
            for group in import_cycles(graph)]


def _room_sources() -> dict[str, tuple[str, bool]]:
    return {m: src for room in ROOMS for m, src in _package_sources(room).items()}


def test_no_import_circle_at_any_depth():
    """No module of grader/, kernelsim/ or site/ reaches itself through imports, counting
    those inside functions and under ``TYPE_CHECKING`` (a deliberate lazy import says why on
    its line; it still must not close a circle)."""
    found = imports(_room_sources(), every_depth=True)
    assert {"grader.logistics.batch", "kernelsim.trace", "site.hooks"} <= set(found)
    assert sum(map(len, found.values())) > 200
    assert not (circles := circles_with_lines(found)), "modules that need each other: move " \
        "the shared part to a module both stand on:\n" + "\n".join(circles)


def test_imports_go_the_way_the_data_goes():
    found = imports(_room_sources(), every_depth=True)
    assert found["grader.verdict.verdict"] and found["kernelsim.views.viewer"]
    assert not (wrong := wrong_way_imports(found)), "imports against the data's direction " \
        "(tests/test_house.py's WRONG_WAY):\n" + "\n".join(wrong)


def test_every_depth_checks_can_fail():
    """Circles closed inside a function, under ``TYPE_CHECKING`` and through a site/ module
    loaded by name, and a wrong-way arrow, each planted and found."""
    sources = {
        "pkg": ("", True),
        "pkg.views": ("", True),
        "pkg.views.plot": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from pkg.tracer import Trace\n", False),
        "pkg.tracer": ("class Trace:\n    def plot(self):\n"
                       "        from pkg.views import plot\n", False),
        "pkg.a": ("def f():\n    from . import b\n", False),
        "pkg.b": ("import pkg.a\n", False),
        "pkg.c": ("import json\n", False),
        "site.hooks": ("import os\npages = site_module('pages')\n", False),
        "site.pages": ("def f():\n    from hooks import x\n", False),
    }
    found = imports(sources, every_depth=True)
    assert found["pkg.views.plot"] == {"pkg.tracer": [3]}
    assert found["site.hooks"] == {"site.pages": [2]}
    assert import_cycles(import_graph(sources, every_depth=True)) == [
        ["pkg.a", "pkg.b"], ["pkg.tracer", "pkg.views.plot"], ["site.hooks", "site.pages"]]
    assert import_cycles(import_graph(sources)) == []  # none of them runs at import
    assert circles_with_lines(found)[0] == "pkg.a -> pkg.b [2], pkg.b -> pkg.a [1]"
    assert wrong_way_imports(found, (("pkg.views", "pkg.tracer"),)) == [
        "pkg.views.plot -> pkg.tracer (lines [3])"]
    assert not wrong_way_imports(found, (("pkg.tracer", "pkg.c"),))


def unexplained_lazy_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``module:line`` of each import of one of ``sources`` made inside a function without a
    comment on its line or the line above: a lazy import keeps a start fast or an optional
    dependency optional, and says which."""
    found = []
    for module, (source, is_package) in sources.items():
        commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                     if tok.type == tokenize.COMMENT}
        functions = [n for n in ast.walk(ast.parse(source))
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        lazy = {node for f in functions for node in ast.walk(f)
                if isinstance(node, ast.Import | ast.ImportFrom)}
        found += [f"{module}:{node.lineno}" for node in sorted(lazy, key=lambda n: n.lineno)
                  if _imported(node, module, is_package, sources)
                  and not {node.lineno, node.lineno - 1} & commented]
    return found


def test_a_lazy_import_says_why():
    assert not (bare := unexplained_lazy_imports(_room_sources())), \
        f"import these at the top, or say on the line why not (a start, an extra): {bare}"


def test_lazy_import_check_can_fail():
    sources = {"pkg": ("", True), "pkg.a": ("", False), "pkg.b": (
        "def f():\n    from pkg import a\n\n\ndef g():\n    from pkg import a  # an extra\n"
        "\n\ndef h():\n    import json\n", False)}
    assert unexplained_lazy_imports(sources) == ["pkg.b:2"]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(source: str, module: str, is_package: bool, repo_modules: set[str]
                    ) -> list[str]:
    """``from m import _name`` and private modules (``kernelsim._x``) that ``source`` (module
    ``module``) imports from this repository's packages (``repo_modules``: their top-level
    names). A script folder's helper imported by its bare name (``import _course`` in
    lessons/) is not one: its underscore keeps it out of the folder's own listing."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in repo_modules
                      and any(map(_private, a.name.split(".")[1:]))]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
            if node.level == 0 and base.split(".")[0] not in repo_modules:
                continue
            found += [f"{base}.{a.name}" for a in node.names if _private(a.name)]
            if any(map(_private, base.split(".")[1:])):
                found.append(base)
    return found


def test_no_private_name_is_imported_across_modules():
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert {"grader", "kernelsim"} <= packages
    offenders = {}
    for p in _tracked_python():
        rel = p.relative_to(REPO)
        if rel.parts[0] == "tests":  # a test may reach into what it tests
            continue
        parts = list(rel.with_suffix("").parts)
        package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if package else parts)
        if names := private_imports(p.read_text(), module, package, packages):
            offenders[str(rel)] = names
    assert not offenders, f"make these names public where other modules use them: {offenders}"


@pytest.mark.parametrize("source", ["from kernelsim.trace import _analyse",
                                    "from kernelsim import _jax", "import kernelsim._jax",
                                    "from kernelsim._jax import open_jaxpr",
                                    "from . import _helper", "from .tasks import _f32"])
def test_private_import_check_sees(source):
    assert private_imports(source, "grader.work", False, {"grader", "kernelsim"})


@pytest.mark.parametrize("source", ["from grader import course as _course", "import _course",
                                    "from jax._src import core", "from jax import _src",
                                    "from kernelsim.adapter import open_jaxpr"])
def test_private_import_check_passes(source):
    assert not private_imports(source, "grader.work", False, {"grader", "kernelsim"})


def test_ci_time_reads_a_junit_file(tmp_path):
    spec = importlib.util.spec_from_file_location("ci_time", REPO / "bench" / "ci_time.py")
    ci_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ci_time)
    junit = tmp_path / "suite.xml"
    junit.write_text('<testsuites><testsuite name="pytest">'
                     '<testcase classname="tests.grader.test_a" name="t1" time="2.5"/>'
                     '<testcase classname="tests.site.test_b" name="t2" time="7.0"/>'
                     '</testsuite></testsuites>')
    cases = ci_time.test_times(junit)
    assert cases == [("tests/site/test_b::t2", 7.0), ("tests/grader/test_a::t1", 2.5)]
    assert ci_time.folder_of(cases[0][0]) == "tests/site"


def test_a_program_a_test_starts_hears_ctrl_c():
    """`make test` starts one pytest process in the background, where the shell ignores SIGINT
    and every child would inherit that (test_serve's server then never stops on Ctrl-C):
    tests/conftest.py restores it."""
    import sys

    out = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal("
                          "signal.SIGINT) is signal.default_int_handler)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


# ------------------------------------------------------- the grader's rooms (issue 49)
# grader/'s rooms a submission passes through, in the data's order: a room hands its data on by
# calling a room after it, and never imports one before it
GRADER_ROOMS = ("logistics", "jail", "facts", "verdict", "gradebook")
MAX_ROOM_MODULES = 15  # a list a newcomer reads at a glance to find their room's module
TABLES = ("grader/tasks",)  # one module per assignment: a table, not a room
# the verdict's room reads the course's refs and nothing else; these modules are where
VERDICT_FILES = ("grader.verdict.refs", "grader.verdict.write_refs")
MAX_FLOORS = 11  # grader/grading/ in one room stood 13 floors deep


def room_sizes(files: list[str], top: str = "grader") -> dict[str, int]:
    """Modules (``__init__.py`` aside) in each package folder under ``top``, from ``files``
    (paths in the repository)."""
    under = [Path(f) for f in files if Path(f).parts[0] == top and f.endswith(".py")]
    packages = {f.parent for f in under if f.name == "__init__.py"}
    sizes = {str(p): 0 for p in packages}
    for f in under:
        if f.parent in packages and f.name != "__init__.py":
            sizes[str(f.parent)] += 1
    return sizes


def test_no_room_of_the_grader_holds_more_than_15_modules():
    files = [str(p.relative_to(REPO)) for p in _tracked_python()]
    sizes = room_sizes(files)
    assert {f"grader/{r}" for r in GRADER_ROOMS} <= set(sizes)
    big = {room: n for room, n in sizes.items() if n > MAX_ROOM_MODULES and room not in TABLES}
    assert not big, f"split these rooms by what their modules guard: {big}"


def test_room_size_check_can_fail():
    files = [f"grader/big/m{i}.py" for i in range(16)] + ["grader/big/__init__.py",
                                                          "grader/__init__.py", "grader/cli.py"]
    assert room_sizes(files) == {"grader/big": 16, "grader": 1}


def against_the_data(found: dict[str, dict[str, list[int]]],
                     rooms: tuple[str, ...] = GRADER_ROOMS, top: str = "grader") -> list[str]:
    """``importer -> imported (lines)`` for every import (``imports``'s answer) of a room by a
    room after it in ``rooms``, and of any room by a module of ``top`` beside the rooms that
    stands under them (``calling``, ``integrity``)."""
    rules = [(f"{top}.{later}", f"{top}.{earlier}")
             for i, earlier in enumerate(rooms) for later in rooms[i + 1:]]
    rules += [(f"{top}.{low}", f"{top}.{room}") for low in ("calling", "integrity")
              for room in rooms]
    return wrong_way_imports(found, tuple(rules))


def test_the_grader_s_rooms_import_in_the_data_s_order():
    """logistics → jail → facts → verdict → gradebook: the jail imports nothing of the class's
    logistics, the facts nothing of the jail, ...; the tasks, which the jail's checker and the
    verdict read, import neither the jail nor the logistics."""
    found = imports(_room_sources(), every_depth=True)
    assert found["grader.jail.trusted"] and found["grader.logistics.batch"]
    wrong = against_the_data(found) + wrong_way_imports(found, tuple(
        ("grader.tasks", f"grader.{room}") for room in ("logistics", "jail")))
    assert not wrong, "imports against the data's order (tests/test_house.py's " \
        "GRADER_ROOMS):\n" + "\n".join(wrong)


def test_data_order_check_can_fail():
    found = {"grader.jail.relay": {"grader.logistics.batch": [3], "grader.verdict.refs": [4]},
             "grader.calling": {"grader.facts.work": [9]},
             "grader.logistics.batch": {"grader.jail.relay": [5]}}
    assert against_the_data(found) == ["grader.calling -> grader.facts.work (lines [9])",
                                       "grader.jail.relay -> grader.logistics.batch (lines [3])"]


# what starts a process or runs a shell: modules, and the os functions that do
PROCESS_MODULES = {"subprocess", "multiprocessing", "concurrent", "pty", "socket", "shutil",
                   "tempfile", "asyncio"}
PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "kill",
                 "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
                 "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle"}
# what reads, writes or lists a file, as a call of a name or a method
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "unlink", "mkdir",
              "rmdir", "rename", "touch", "iterdir", "glob", "rglob", "exists", "is_file",
              "is_dir", "stat", "load", "save", "savez", "listdir", "remove", "scandir", "walk"}


def reaches_outside(source: str, files_allowed: bool = False) -> list[str]:
    """``line: what`` for each process ``source`` could start and (unless ``files_allowed``)
    each file it could touch, as its imports and calls say."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""]
            found += [f"{node.lineno}: imports {n}" for n in names
                      if n.split(".")[0] in PROCESS_MODULES]
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                found += [f"{node.lineno}: imports os.{a.name}" for a in node.names
                          if a.name in PROCESS_CALLS | FILE_CALLS]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            on_os = isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "os"
            if on_os and name in PROCESS_CALLS:
                found.append(f"{node.lineno}: os.{name}()")
            elif name in FILE_CALLS and not files_allowed:
                found.append(f"{node.lineno}: {name}()")
    return found


def test_the_verdict_runs_no_process_and_touches_no_file_but_the_refs():
    """A grade is decided from data: nothing in the verdict's room starts a process, and only
    the refs' own modules (``VERDICT_FILES``) read or write a file, the course's refs."""
    sources = {m: s for m, s in _package_sources("grader").items()
               if _within(m, "grader.verdict")}
    assert "grader.verdict.verdict" in sources and set(VERDICT_FILES) <= set(sources)
    found = {m: hits for m, (source, _) in sources.items()
             if (hits := reaches_outside(source, files_allowed=m in VERDICT_FILES))}
    assert not found, f"the verdict's room reaches outside its data: {found}"


@pytest.mark.parametrize("source", ["import subprocess", "from concurrent import futures",
                                    "import os\nos.system('x')", "from os import fork",
                                    "open('x')", "p.read_text()", "np.load(path)",
                                    "from multiprocessing.pool import Pool"])
def test_reach_check_sees(source):
    assert reaches_outside(source)


def test_reach_check_lets_the_refs_read():
    assert not reaches_outside("import os, json\njson.loads(s)\nos.environ.get('X')")
    assert not reaches_outside("Path(p).read_bytes()", files_allowed=True)
    assert reaches_outside("os.popen('x')", files_allowed=True)


def floors(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports in ``graph`` (no circle in it), from the module that
    starts it down to one that imports nothing of ``graph``: its floors are its imports,
    ``len(chain) - 1``."""
    below: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in below:
            below[m] = [m] + max((chain(d) for d in sorted(graph.get(m, ()))), key=len,
                                 default=[])
        return below[m]

    return max((chain(m) for m in sorted(graph)), key=len, default=[])


def grader_tower() -> list[str]:
    """The grader's tower as ``floors`` finds it: grader/'s modules, every import at any
    depth."""
    found = import_graph(_package_sources("grader"), every_depth=True)
    return floors(found)


def test_the_grader_s_tower_is_no_deeper_than_11_floors():
    tower = grader_tower()
    assert len(tower) > 5
    assert len(tower) - 1 <= MAX_FLOORS, f"{len(tower) - 1} floors: " + " -> ".join(tower)


def test_floors_counts_the_longest_chain():
    graph = {"a": {"b", "c"}, "b": {"d"}, "c": set(), "d": {"e"}, "e": set(), "f": {"c"}}
    assert floors(graph) == ["a", "b", "d", "e"]


def test_architecture_maps_every_room_and_module_of_the_grader_s_rooms():
    files = [str(p.relative_to(REPO)) for p in _tracked_python()]
    missing = [p for p in unmapped(files, (REPO / "ARCHITECTURE.md").read_text(), "grader")
               if p.split("/")[1].removesuffix(".py") in (*GRADER_ROOMS, "calling", "integrity")]
    assert not missing, f"ARCHITECTURE.md's grader map leaves out: {missing}"


if __name__ == "__main__":  # `python tests/test_house.py floors`: the grader's tower
    import sys

    if sys.argv[1:] == ["floors"]:
        tower = grader_tower()
        print(f"{len(tower) - 1} floors: " + " -> ".join(tower))
