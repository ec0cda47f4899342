"""``_course.definitions`` gives one lesson another lesson's functions without running it.

Lesson 12 compares JAX's bundled flash attention with lesson 8's kernel; it loads that kernel
from lesson 8's file instead of keeping a copy. Only the imports and the named ``def``s may run.
"""

from __future__ import annotations

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
    owners = course.in_fresh_process("13-kernel-api", "two_core_block_owners", "which_core",
                                     "traced_for_tpu", "tensorcore_mesh")
    assert owners == [[0, 0], [0, 0], [1, 1], [1, 1]]
