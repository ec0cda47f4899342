"""Assignment 01, first kernel: its tasks, cases and structural rules."""

from __future__ import annotations

import jax.numpy as jnp

from grader import calling
from grader.calling import OPS
from grader.tasks.core import Rule, _c, _struct, _task

A1 = "01_first_kernel"
def _whole_array(call, case, rules, inputs):
    rules.append(Rule("grid", "() (one kernel instance, whole arrays)", str(tuple(call.grid)),
                      tuple(call.grid) == ()))




_task(
    id="add", assignment=A1, title="Add two arrays in one kernel",
    kernel_ops=(("add",),),
    reference=lambda x, y: x + y,
    cases=(
        _c("v0", 0, "float32", {"x": (8, 128), "y": (8, 128)}),
        _c("h0", 101, "float32", {"x": (16, 256), "y": (16, 256)}, True),
        _c("h1", 102, "float32", {"x": (5, 7), "y": (5, 7)}, True),
        _c("h2", 103, "bfloat16", {"x": (8, 128), "y": (8, 128)}, True),
    ),
    structure=_struct(_whole_array),
)
_task(
    id="elementwise", assignment=A1, title="A kernel factory for elementwise ops",
    kernel_ops=(("mul", "max", "add", "sub"),),
    reference=lambda x, y, op: OPS[op](x, y),
    invoke=calling.elementwise,
    cases=(
        _c("v0", 1, "float32", {"x": (8, 128), "y": (8, 128)}, op="mul"),
        _c("h0", 111, "float32", {"x": (8, 128), "y": (8, 128)}, True, op="max"),
        _c("h1", 112, "bfloat16", {"x": (16, 128), "y": (16, 128)}, True, op="axpy"),
        _c("h2", 113, "float32", {"x": (3, 5), "y": (3, 5)}, True, op="sub"),
    ),
    structure=_struct(_whole_array),
)
_task(
    id="leaky_relu", assignment=A1, title="Leaky ReLU with a slope",
    kernel_ops=(("mul",),),
    reference=lambda x, slope: jnp.where(x >= 0, x, (slope * x).astype(x.dtype)),
    cases=(
        _c("v0", 2, "float32", {"x": (8, 128)}, slope=0.1),
        _c("h0", 121, "float32", {"x": (24, 256)}, True, slope=0.25),
        _c("h1", 122, "bfloat16", {"x": (8, 128)}, True, slope=0.01),
        _c("h2", 123, "float32", {"x": (7, 9)}, True, slope=0.5),
    ),
    structure=_struct(_whole_array),
)
