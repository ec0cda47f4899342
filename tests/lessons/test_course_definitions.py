"""``_course.definitions`` gives one lesson another lesson's functions without running it.

Lesson 12 compares JAX's bundled flash attention with lesson 8's kernel; it loads that kernel
from lesson 8's file instead of keeping a copy. Only the imports and the named ``def``s may run.
"""

from __future__ import annotations

import linecache

import pytest


def test_loads_the_named_functions_and_runs_no_cell(course, capsys):
    capsys.readouterr()
    lesson8 = course.definitions("08-flash-attention", "last_kv_block", "flash_attention",
                                 SCALE=0.125)
    assert capsys.readouterr().out == ""  # lesson 8's cells print; none ran
    assert lesson8.last_kv_block(1, 256, 128) == 3
    assert lesson8.flash_attention.__code__.co_filename.endswith("08-flash-attention.py")
    assert lesson8.flash_attention.__globals__["SCALE"] == 0.125
    assert "q" not in lesson8.flash_attention.__globals__  # lesson 8's data was never made


def test_unknown_function_names_the_file_and_what_it_defines(course):
    with pytest.raises(KeyError, match=r"08-flash-attention\.py defines no top-level function "
                                       r"flash_backward.*it defines .*flash_kernel"):
        course.definitions("08-flash-attention", "flash_attention", "flash_backward")


def test_unknown_lesson(course):
    with pytest.raises(FileNotFoundError, match="no lesson 99-nothing.py"):
        course.definitions("99-nothing", "f")


def test_in_fresh_process_prints_and_returns_what_the_function_did(course, capsys):
    """Lesson 13 reads which core wrote each block from a CPU process of its own."""
    names = ("two_core_block_owners", "which_core", "traced_for_tpu", "tensorcore_mesh")
    lesson13 = course.definitions("13-kernel-api", *names)
    owners = course.in_fresh_process("13-kernel-api", *(getattr(lesson13, n) for n in names))
    assert owners == [[0, 0], [0, 0], [1, 1], [1, 1]]


def _cell(source: str, number: int) -> dict:
    """Run ``source`` as JupyterLab runs a cell: compiled under a name of its own, its lines
    kept in ``linecache`` (where ``inspect.getsource`` finds a notebook's functions)."""
    filename = f"/tmp/ipykernel_0/{number}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the test's own text
    return namespace


def test_in_fresh_process_runs_the_cells_the_learner_edited(course, capsys):
    """The learner changed a lesson's function and a helper it calls, in cells of their own,
    and ran them: the fresh process runs those versions, not the lesson file's."""
    helper = _cell("def which_core():\n    return int(jnp.int32(5))  # edited\n", 1)
    function = _cell("def two_core_block_owners():\n    print('edited')\n"
                     "    return [[which_core()]]\n", 2)
    result = course.in_fresh_process("13-kernel-api", function["two_core_block_owners"],
                                     helper["which_core"])
    assert result == [[5]]
    assert capsys.readouterr().out == "edited\n"
