"""Assignment 01, first kernel: its tasks, cases and structural rules."""

from __future__ import annotations

import jax.numpy as jnp

from grader import calling
from grader.calling import OPS
from grader.tasks.core import Rule, make_case, register_task, single_call

A1 = "01_first_kernel"
def _whole_array(call, case, rules, inputs):
    rules.append(Rule("grid", "() (one kernel instance, whole arrays)", str(tuple(call.grid)),
                      tuple(call.grid) == ()))




register_task(
    id="add", assignment=A1, title="Add two arrays in one kernel",
    given_body="o_ref[...] = x_ref[...] + y_ref[...]",
    kernel_ops=(("add",),),
    reference=lambda x, y: x + y,
    cases=(
        make_case("v0", 0, "float32", {"x": (8, 128), "y": (8, 128)}),
        make_case("h0", 101, "float32", {"x": (16, 256), "y": (16, 256)}, True),
        make_case("h1", 102, "float32", {"x": (5, 7), "y": (5, 7)}, True),
        make_case("h2", 103, "bfloat16", {"x": (8, 128), "y": (8, 128)}, True),
    ),
    structure=single_call(_whole_array),
)
register_task(
    id="elementwise", assignment=A1, title="A kernel factory for elementwise ops",
    given_body="o_ref[...] = op(x_ref[...], y_ref[...]).astype(o_ref.dtype)",
    kernel_ops=(("mul", "max", "add", "sub"),),
    reference=lambda x, y, op: OPS[op](x, y),
    invoke=calling.elementwise,
    cases=(
        make_case("v0", 1, "float32", {"x": (8, 128), "y": (8, 128)}, op="mul"),
        make_case("h0", 111, "float32", {"x": (8, 128), "y": (8, 128)}, True, op="max"),
        make_case("h1", 112, "bfloat16", {"x": (16, 128), "y": (16, 128)}, True, op="axpy"),
        make_case("h2", 113, "float32", {"x": (3, 5), "y": (3, 5)}, True, op="sub"),
    ),
    structure=single_call(_whole_array),
)
register_task(
    id="leaky_relu", assignment=A1, title="Leaky ReLU with a slope",
    kernel_ops=(("mul",),),
    reference=lambda x, slope: jnp.where(x >= 0, x, (slope * x).astype(x.dtype)),
    cases=(
        make_case("v0", 2, "float32", {"x": (8, 128)}, slope=0.1),
        make_case("h0", 121, "float32", {"x": (24, 256)}, True, slope=0.25),
        make_case("h1", 122, "bfloat16", {"x": (8, 128)}, True, slope=0.01),
        make_case("h2", 123, "float32", {"x": (7, 9)}, True, slope=0.5),
    ),
    structure=single_call(_whole_array),
)
