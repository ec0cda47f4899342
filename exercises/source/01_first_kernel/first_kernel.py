# %% [markdown]
# # Assignment 1 — your first kernel
#
# A `pallas_call` without a grid runs the kernel once, with every operand's *whole array* as a
# `Ref`. Read from input refs with `x_ref[...]`, write the output with `o_ref[...] = value`.
#
# Each task has a cell that checks your function on small visible cases (and prints what
# kernelsim sees), and a cell whose hidden tests run other shapes, bfloat16 and more seeds when
# the assignment is graded. Every answer must be a Pallas kernel: a function that never reaches
# `pl.pallas_call` fails the structural check even when its values are right.
#
# **Check every task:** *Kernel > Restart Kernel and Run All Cells* runs each task's check (a
# failing check shows its message and the run goes on) and the last cell lists what passed
# and failed. From a terminal (in JupyterLab: *File > New > Terminal*), in your workspace or
# this folder: `pallas-course check first_kernel.ipynb`.

# %% nbgrader={"grade_id": "setup", "locked": true}
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from grader.learner import course
from kernelsim.backend import choose

# Compiled on a GPU or TPU, interpreted on a CPU. TPU_INTERPRET is for kernels that use
# TPU-only features (VMEM/SMEM scratch, scalar prefetch).
INTERPRET = choose().interpret
TPU_INTERPRET = choose(tpu_features=True).interpret

# %% [markdown]
# ## Task 1 — `add(x, y)` (3 points)
#
# Return `x + y` computed by one `pallas_call` with no grid. The output has the shape and dtype
# of `x`.
#
# The kernel body is given: it is the one shipped body "kernels are your own" accepts in this
# task, `o_ref[...] = x_ref[...] + y_ref[...]`, as the course's examples write it. The
# `pallas_call` around it is your work.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# The kernel receives one Ref per input and one for the output, in that order. Without a grid
# it runs once and every Ref holds a whole array: load both inputs, add, store the result.
# `out_shape` tells `pl.pallas_call` the output's shape and dtype (a `jax.ShapeDtypeStruct`).
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# Read a whole input with `x_ref[...]`, write the output with `o_ref[...] = value`; the value
# is the sum of the two reads.
#
# </details>

# %% nbgrader={"grade_id": "add_solution", "solution": true}
def add(x, y):
    ### BEGIN SOLUTION
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET
    )(x, y)
    ### END SOLUTION


# %% nbgrader={"grade_id": "add_visible", "grade": true, "points": 1}
course.check("add", add)

# %% nbgrader={"grade_id": "add_hidden", "grade": true, "points": 2}
# Hidden tests: other shapes, bfloat16 and more seeds run when the assignment is graded.
### BEGIN HIDDEN TESTS
course.check("add", add, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 2 — a kernel factory, `make_elementwise(op)` (3 points)
#
# `op` is a function of two arrays, such as `lambda a, b: a * b` or `jnp.maximum`. Return a
# function `f(x, y)` that applies `op` elementwise inside one grid-less `pallas_call`.
#
# The kernel body is given: `o_ref[...] = op(x_ref[...], y_ref[...]).astype(o_ref.dtype)`. A
# lesson ships the same body for one `op`; in this task it is the one shipped body "kernels
# are your own" accepts. The closure and the `pallas_call` are your work.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# Write the kernel inside `make_elementwise`, so it closes over `op`, and return a function
# `f(x, y)` that builds the `pallas_call` for the shapes it receives. `op` is applied to the
# loaded values inside the kernel, never to the arrays outside it.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# The kernel is one store into `o_ref[...]`: the captured `op` applied to the two loaded inputs,
# then `.astype(o_ref.dtype)`, since `op` may return a dtype other than the output's.
#
# </details>

# %% nbgrader={"grade_id": "elementwise_solution", "solution": true}
def make_elementwise(op):
    ### BEGIN SOLUTION
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = op(x_ref[...], y_ref[...]).astype(o_ref.dtype)

    def f(x, y):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET
        )(x, y)

    return f
    ### END SOLUTION


# %% nbgrader={"grade_id": "elementwise_visible", "grade": true, "points": 1}
course.check("elementwise", make_elementwise)

# %% nbgrader={"grade_id": "elementwise_hidden", "grade": true, "points": 2}
# Hidden tests: other ops (max, 2a+b, a-b), shapes and dtypes.
### BEGIN HIDDEN TESTS
course.check("elementwise", make_elementwise, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Task 3 — `leaky_relu(x, slope)` (3 points)
#
# `x` where `x >= 0`, else `slope * x`, in the dtype of `x`. `slope` is a Python float: it can be
# captured by the kernel as a constant.

# %% [markdown]
# <details><summary>Hint 1: the approach</summary>
#
# One input Ref, one output Ref, no grid. Load the block, choose between `v` and `slope * v`
# elementwise, and cast back to the input's dtype (`slope * v` is float32 when `v` is bfloat16).
# `slope` is a Python float, so the kernel can simply close over it.
#
# </details>
#
# <details><summary>Hint 2: the key line</summary>
#
# `jnp.where(condition, a, b)` takes `a` where the condition holds and `b` elsewhere, elementwise.
# With `v` the loaded block, the condition is that `v` is not negative; cast the result with
# `.astype(o_ref.dtype)`.
#
# </details>

# %% nbgrader={"grade_id": "leaky_relu_solution", "solution": true}
def leaky_relu(x, slope):
    ### BEGIN SOLUTION
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.where(v >= 0, v, slope * v).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET
    )(x)
    ### END SOLUTION


# %% nbgrader={"grade_id": "leaky_relu_visible", "grade": true, "points": 1}
course.check("leaky_relu", leaky_relu)

# %% nbgrader={"grade_id": "leaky_relu_hidden", "grade": true, "points": 2}
# Hidden tests: other slopes, shapes and bfloat16.
### BEGIN HIDDEN TESTS
course.check("leaky_relu", leaky_relu, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## What kernelsim sees
#
# `kernelsim.trace` evaluates index maps only; with no grid there is a single step.

# %%
x = jnp.ones((8, 128), jnp.float32)
try:
    print(kernelsim.trace(add, x, x))
except NotImplementedError:
    print("implement add first")

# %% [markdown]
# ## What passed
#
# In the notebook, its last cell (`course.summary()`) lists every task as passed, failed (with
# the first line of its message), still to write or not checked in this kernel.

# %%
course.summary()
