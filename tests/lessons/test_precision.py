"""The lessons set no process-wide matmul precision (issue 33): importing ``lessons/_course.py``
once set JAX's default to "highest" for the whole process, so every bfloat16 matmul kernel of a
lesson lowered with ``contract_precision<fp32>``, which Mosaic refuses on a TPU ("Bad lhs
type", lessons 5 and 7 on a TPU v5e). Each dot says its own precision instead."""

import subprocess
import sys
from pathlib import Path

LESSONS = Path(__file__).resolve().parents[2] / "lessons"


def test_importing_the_lessons_helper_leaves_jax_default_precision():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import jax, _course; "
            "print(jax.config.jax_default_matmul_precision)")
    out = subprocess.run([sys.executable, "-c", code, str(LESSONS)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[-1] == "None", out
