"""kernelsim's copies of lessons 13 and 15's kernels equal TPU interpret mode's, copy for copy.

``kernelsim.verify`` runs each kernel in TPU interpret mode, records the DMAs the interpreter
performs (the pipeline's block copies and the body's own copies) and compares them with
kernelsim's ``tpu`` model. The kernels are the lessons' own functions
(``_course.definitions``), run on small inputs; each is also checked against plain JAX in its
lesson. Lesson 14's kernels run inside ``shard_map``, which kernelsim does not trace yet.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from kernelsim.verify import verify

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
FORMATS = {"int8": (jnp.int8, 127.0), "fp8": (jnp.float8_e4m3fn, 448.0)}


@pytest.fixture(scope="module")
def course():
    import sys

    sys.path.insert(0, str(LESSONS_DIR))  # lessons import _course
    try:
        spec = importlib.util.spec_from_file_location("_course", LESSONS_DIR / "_course.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(LESSONS_DIR))


def _on_device(*args):
    # the lessons trace pl.kernel and emit_pipeline under an abstract TPU mesh, where a
    # computation needs its inputs committed to a concrete device
    return [jax.device_put(a, jax.devices()[0]) for a in args]


def _random(key, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(key), shape, dtype)


@pytest.fixture(scope="module")
def cases(course):
    l13 = course.definitions("13-kernel-api", "traced_for_tpu", "scale_shift_kernel",
                             "scale_shift", "scale_shift_halves_kernel", "scale_shift_halves",
                             "matmul_body", "matmul_specs", "matmul_call", "matmul_mesh",
                             "tensorcore_mesh")
    l15 = course.definitions("15-production-kernels", "quantize", "quantized_matmul_kernel",
                             "quantized_matmul", "last_page", "paged_decode_kernel",
                             "paged_decode", "write_pages_kernel", "write_pages",
                             FORMATS=FORMATS)
    x, a, b = _random(0, (64, 256)), _random(1, (256, 384)), _random(2, (384, 256))
    q, scales = l15.quantize(_random(3, (512, 256)), 128, "int8")
    pages = _random(5, (12, 16, 128))
    lengths = jnp.array([40, 5, 16], jnp.int32)
    table = jnp.array([[3, 7, 1, 0], [9, 0, 0, 0], [4, 0, 0, 0]], jnp.int32)
    return {
        "scale_shift (sync_copy)": (l13.scale_shift, (x,)),
        "scale_shift_halves (async_copy)": (l13.scale_shift_halves, (x,)),
        "matmul, pallas_call": (l13.matmul_call, (a, b)),
        "matmul, pl.kernel + emit_pipeline": (l13.matmul_mesh, (a, b)),
        "matmul, two cores": (functools.partial(l13.matmul_mesh, cores=2), (a, b)),
        "quantized_matmul int8": (l15.quantized_matmul, (_random(4, (128, 512)), q, scales)),
        "paged_decode": (l15.paged_decode, (_random(7, (3, 8, 128)), pages,
                                            _random(6, (12, 16, 128)), lengths, table)),
        "write_pages": (l15.write_pages, (pages, _random(8, (2, 16, 128)),
                                          jnp.array([5, 2], jnp.int32))),
    }


NAMES = ["scale_shift (sync_copy)", "scale_shift_halves (async_copy)", "matmul, pallas_call",
         "matmul, pl.kernel + emit_pipeline", "matmul, two cores", "quantized_matmul int8",
         "paged_decode", "write_pages"]


@pytest.mark.parametrize("name", NAMES)
def test_kernelsim_copies_equal_tpu_interpret_mode(cases, name):
    fn, args = cases[name]
    checked = verify(functools.partial(fn, interpret=True), *_on_device(*args))
    assert checked.ok, checked.report()
