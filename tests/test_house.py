"""The house rules a newcomer relies on: ARCHITECTURE.md names real paths, and only
kernelsim's adapter reaches into JAX's internals."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
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
