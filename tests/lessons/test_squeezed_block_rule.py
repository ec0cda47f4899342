"""A squeezed block dimension is linted the way JAX's TPU lowering decides (issue 22).

The pinned release's lowering counts ``pl.Squeezed()``/``None`` as a block dimension of size 1
(jax/_src/pallas/core.py, ``_get_block_dim_size``) and checks the (8, 128) rule on that shape
(jax/_src/pallas/mosaic/lowering.py, ``_check_block_mappings``). Lesson 3's kernels: a
squeezed second-to-last dimension over 64 rows is refused, a squeezed leading one is not.
kernelsim's block-shape lint must warn exactly when the lowering refuses.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import kernelsim

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"


@pytest.fixture
def lesson3(monkeypatch):
    monkeypatch.syspath_prepend(str(LESSONS_DIR))  # lessons import _course
    spec = importlib.util.spec_from_file_location("_course", LESSONS_DIR / "_course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    return course.definitions("03-tiling", "scale_rows_kernel", "scale_rows",
                              "batched_matmul_kernel", "batched_matmul", seen_shapes=[])


def _lowering_and_lint(fn, *args) -> tuple[str | None, list[str]]:
    error = kernelsim.tpu_lowering_error(functools.partial(fn, interpret=False), *args)
    call = kernelsim.trace(functools.partial(fn, interpret=True), *args).calls[0]
    return error, [w for w in call.warnings if "(8, 128) tiling rule" in w]


def test_squeezed_second_minor_dim_is_refused_by_both(lesson3):
    x = jnp.ones((64, 128), jnp.float32)
    error, lint = _lowering_and_lint(lesson3.scale_rows, x)
    assert error is not None and "divisible by 8 and 128" in error
    assert lint and all("second-to-last dim 1" in w for w in lint), lint
    # and the kernel itself is right: interpret mode against plain JAX
    assert jnp.array_equal(lesson3.scale_rows(x, interpret=True), 2.0 * x)


def test_squeezed_leading_dim_is_accepted_by_both(lesson3):
    x = jax.ShapeDtypeStruct((2, 256, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    error, lint = _lowering_and_lint(lesson3.batched_matmul, x, w)
    assert error is None and not lint, (error, lint)


def test_squeezed_dim_over_an_array_of_size_one_is_accepted_by_both(lesson3):
    x = jnp.ones((1, 128), jnp.float32)  # the block's 1 equals the array's 1
    error, lint = _lowering_and_lint(lesson3.scale_rows, x)
    assert error is None and not lint, (error, lint)
