"""The lessons name the JAX release they were checked against in one place.

``lessons/_course.py`` holds it as ``CHECKED_JAX``; the lessons' text says "the pinned release"
instead of a number. This file fails when a lesson names a JAX version itself, when
``CHECKED_JAX`` differs from the installed JAX or from the ``jax[cpu]==`` pin in pyproject.toml,
and when lessons/README.md or the header of lessons/CHECKED.md names a different release. After
a JAX upgrade it keeps failing until someone re-checks the statements listed in CHECKED.md and
moves the number.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS_DIR = ROOT / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]-*.py"))

# "jax 0.10.2", "JAX 0.12", "jax==0.12.0.1", "jax[cpu]==0.12", "jaxlib 0.12.0", "JAX v0.12",
# "JAX version 0.12", "JAX release 0.12"
NAMED_VERSION = re.compile(
    r"\bjax(?:lib)?(?:\[\w+\])?(?:\s*(?:version|release|==|>=|<=|~=|=))*\s*v?\d+\.\d+",
    re.IGNORECASE)
# A bare release number such as "0.10.2" or "0.12.0.1" (JAX has not reached 1.0).
BARE_RELEASE = re.compile(r"(?<![\w.])0\.\d+\.\d+(?:\.\d+)?(?![\w.])")


def _version_mentions(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in (NAMED_VERSION, BARE_RELEASE):
            found += [f"line {number}: {m.group(0)!r} in {line.strip()!r}"
                      for m in pattern.finditer(line)]
    return found


def _course():
    spec = importlib.util.spec_from_file_location("_course", LESSONS_DIR / "_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pinned_jax() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d.split("==", 1)[1].strip() for d in deps
            if re.match(r"jax\[cpu\]\s*==", d.replace(" ", ""))]
    assert len(pins) == 1, f"expected one jax[cpu]==... pin in pyproject.toml, found {deps}"
    return pins[0]


@pytest.mark.parametrize("text", ["in jax 0.10.2 the lowering", "JAX 0.12 removed it",
                                  "pin jax[cpu]==0.12.0.1", "jaxlib 0.12.0", "JAX v0.11",
                                  "JAX version 0.12", "since 0.10.2,"])
def test_the_check_sees_a_version(text):
    assert _version_mentions(text), text


@pytest.mark.parametrize("text", ["format_version: '1.3'", "a rounding step of 0.125",
                                  "jax.numpy as jnp", "import jax", "jax.lax.fori_loop(0, 8)",
                                  "JAX 2-D blocks", "the pinned release"])
def test_the_check_ignores_other_numbers(text):
    assert not _version_mentions(text), text


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_names_no_jax_version(path: Path):
    found = _version_mentions(path.read_text())
    assert not found, (f"{path.name} names a JAX version; say 'the pinned release' (the number "
                       "lives in _course.CHECKED_JAX):\n" + "\n".join(found))


def test_checked_jax_is_the_installed_and_pinned_release():
    checked = _course().CHECKED_JAX
    assert checked == jax.__version__, (
        f"lessons were checked against JAX {checked} but {jax.__version__} is installed: "
        "re-check the statements in lessons/CHECKED.md, then update _course.CHECKED_JAX")
    assert checked == _pinned_jax(), (
        f"_course.CHECKED_JAX is {checked}, pyproject.toml pins jax[cpu]=={_pinned_jax()}")
    # the release a NeedsNewerJax error names (kernelsim.backend.newer_api)
    from kernelsim.adapter import SUPPORTED_JAX
    assert SUPPORTED_JAX[-1] == checked, (
        f"kernelsim.adapter.SUPPORTED_JAX ends with {SUPPORTED_JAX[-1]}, not {checked}")


def test_readme_names_the_checked_release():
    checked = _course().CHECKED_JAX
    named = {m.group(0) for m in BARE_RELEASE.finditer((LESSONS_DIR / "README.md").read_text())}
    assert named == {checked}, f"lessons/README.md names {sorted(named)}, CHECKED_JAX is {checked}"


def test_checked_md_is_for_the_checked_release():
    """CHECKED.md's header names the release its source citations are for; when CHECKED_JAX
    moves, the table must be redone."""
    checked = _course().CHECKED_JAX
    text = (LESSONS_DIR / "CHECKED.md").read_text()
    header = re.search(r"checked against JAX (\d+(?:\.\d+)+)", text, re.IGNORECASE)
    assert header, "lessons/CHECKED.md: no 'checked against JAX <version>' header"
    assert header.group(1) == checked, (
        f"lessons/CHECKED.md was checked against JAX {header.group(1)}, CHECKED_JAX is {checked}")
