# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 2 — A first kernel
#
# **Learning objectives.** After this lesson you can
#
# 1. write a kernel as a function of Refs and run it with `pl.pallas_call`;
# 2. describe the output with `out_shape`;
# 3. read from and write to Refs, whole or by slice;
# 4. split work over a 1-D grid with `pl.program_id`;
# 5. run the same kernel interpreted or compiled, and check it against a plain-JAX reference.
#
# Rules used here are in the [Pallas quickstart](https://docs.jax.dev/en/latest/pallas/quickstart.html).
# Matching exercises: [`../exercises/`](../exercises/).

# %%
import functools

import _course
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from kernelsim.backend import choose

LESSON = "02-first-kernel"
_course.versions()

# %% [markdown]
# ## A kernel receives Refs
#
# A Pallas kernel does not receive arrays and does not return anything. It receives one Ref
# per input and one per output, in that order, and its only effect is writing to the output
# Refs. `x_ref[...]` loads everything the Ref points to as an ordinary `jax.Array`;
# `o_ref[...] = value` stores.

# %%
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


# %% [markdown]
# ## `pallas_call` turns the kernel into a JAX function
#
# The kernel cannot tell Pallas what it produces, because it returns nothing. `out_shape`
# supplies that: a `jax.ShapeDtypeStruct` (or a pytree of them for several outputs). The
# result of `pl.pallas_call(...)` is a function you call on arrays, jit, or use inside a
# larger JAX program.

# %%
def add(x, y, *, interpret):
    # No grid: a single program sees both arrays in full; nothing is reused.
    return pl.pallas_call(
        add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, y)


kx, ky = jax.random.split(jax.random.key(0))
x = jax.random.normal(kx, (8, 512), jnp.float32)
y = jax.random.normal(ky, (8, 512), jnp.float32)

run = choose(tpu_features=False, gpu_ok=True)
print("this machine:", run.label)
_course.check(LESSON, "add", add, lambda a, b: a + b, (x, y), run, rtol=0, atol=0)

# %% [markdown]
# `choose` (from `kernelsim.backend`) returns `interpret=False` on a TPU, and on a GPU when
# its flags say the GPU lowering takes the kernel (`gpu_ok=True`, `tpu_features=False`: it
# trusts them and looks at no kernel), so that Pallas compiles it; on a CPU, where Pallas has
# no compiler, it returns `interpret=True`.
# `_course.check` runs the kernel, compares it with the reference using
# `np.testing.assert_allclose`, and prints where it ran. Each output element is a single
# `float32` addition, the same one the reference performs, so the tolerance here is zero.

# %% [markdown]
# ## The kernel body is traced once
#
# `pallas_call` traces the kernel with Ref placeholders, exactly as `jax.jit` traces a
# function with abstract arrays. A `print` in the body therefore runs at trace time, once,
# whatever the grid size — and shows shapes, not values.

# %%
def noisy_copy_kernel(x_ref, o_ref):
    print("tracing the kernel; x_ref has shape", x_ref.shape, "and dtype", x_ref.dtype)
    o_ref[...] = x_ref[...]


_ = pl.pallas_call(noisy_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                   grid=(4,), interpret=True)(x)

# %% [markdown]
# ## A 1-D grid and `program_id`
#
# `grid=(4,)` runs the kernel four times. Inside, `pl.program_id(0)` is the index of the
# current run along grid axis 0: `0, 1, 2, 3`. Without BlockSpecs (next lesson) every program
# sees the *whole* arrays, so each one must pick its own part. `pl.ds(start, size)` is a
# slice whose start may be a traced value.

# %%
CHUNK = 128


def scaled_add_kernel(x_ref, y_ref, o_ref):
    i = pl.program_id(0)
    cols = pl.ds(i * CHUNK, CHUNK)
    # Program i handles columns [i*128, (i+1)*128) and scales them by (i + 1).
    scale = (i + 1).astype(jnp.float32)
    o_ref[:, cols] = scale * (x_ref[:, cols] + y_ref[:, cols])


def scaled_add(x, y, *, interpret):
    # Every program sees the whole of x and y; each reads only its own 128 columns.
    return pl.pallas_call(
        scaled_add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[1] // CHUNK,),
        interpret=interpret,
    )(x, y)


def scaled_add_reference(x, y):
    scale = jnp.repeat(jnp.arange(1, x.shape[1] // CHUNK + 1, dtype=x.dtype), CHUNK)
    return scale[None, :] * (x + y)


_course.check(LESSON, "scaled_add", scaled_add, scaled_add_reference, (x, y), run,
              rtol=1e-6, atol=1e-6)

# %% [markdown]
# A picture of the same thing: kernelsim can run the kernel body at every grid step and record
# which elements of each Ref it touched (`record_access=True`). Steps count from 0, like
# `program_id`: at step 2 the program writes only columns 256–383 of the output, although its
# Ref covers all 512.

# %%
t_scaled = kernelsim.trace(functools.partial(scaled_add, interpret=True), x, y,
                           record_access=True)
writes = [a for a in t_scaled.calls[0].accesses.at(2, "o_ref") if a.kind == "write"]
assert [a.box[1][:2] for a in writes] == [(2 * CHUNK, CHUNK)]  # columns 256..383 only
t_scaled.access_figure(2, "o_ref")

# %% [markdown]
# ## A kernel that forgets to write
#
# Pallas does not initialise outputs. If some program skips its part, those elements hold
# whatever the memory held.
#
# Interpret mode makes the omission visible: `interpret=True` starts every output as NaN
# (floating point) or the dtype's minimum (integers). TPU interpret mode fills with NaN too,
# or zeros with `InterpretParams(uninitialized_memory="zero")`. One more reason to compare
# every kernel against a reference.

# %%
def half_copy_kernel(x_ref, o_ref):
    i = pl.program_id(0)

    @pl.when(i < 2)  # programs 2 and 3 write nothing
    def _():
        cols = pl.ds(i * CHUNK, CHUNK)
        o_ref[:, cols] = x_ref[:, cols]


partial = pl.pallas_call(half_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         grid=(4,), interpret=True)(x)
print("NaN in the columns nobody wrote:", bool(np.isnan(partial[:, 2 * CHUNK:]).all()))
print("written columns equal x:", bool((partial[:, :2 * CHUNK] == x[:, :2 * CHUNK]).all()))

# %% [markdown]
# `pl.when(cond)` runs the decorated function only when `cond` is true; it is the kernel's
# `if` on traced values.

# %% [markdown]
# ## Interpreted versus compiled
#
# `interpret=True` evaluates the kernel body with ordinary JAX operations, one grid step at a
# time, on whichever backend is present. `interpret=False` (the default) hands the kernel to
# the Pallas compiler for the backend
# ([quickstart](https://docs.jax.dev/en/latest/pallas/quickstart.html)):
#
# * on TPU, Mosaic;
# * on GPU, Triton (Ampere and newer). In the pinned release `pl.pallas_call` always lowers a
#   GPU kernel with Triton, as if you had passed `compiler_params=pltriton.CompilerParams()`
#   (from `jax.experimental.pallas.triton`), and issues a `DeprecationWarning`: the Triton
#   backend is to be removed in a future release.
#
# The quickstart presents Mosaic GPU (Hopper and newer) as the GPU backend. In the pinned
# release `pl.pallas_call` no longer reaches it; Mosaic GPU kernels are written with
# `plgpu.kernel` (from `jax.experimental.pallas.mosaic_gpu`), which lesson 11 introduces.
#
# Interpret mode knows nothing about the hardware's limits, so a kernel that passes here may
# still be rejected by a compiler — lesson 3 shows the TPU's block-shape rule.

# %% [markdown]
# ## Check yourself
#
# 1. Why does a Pallas kernel need `out_shape`, when a jitted function does not?
# 2. With `grid=(4,)` and no BlockSpecs, what part of `x` does each program see?
# 3. A `print` inside the kernel body ran once although the grid has four steps. Why?
# 4. You forget to write part of the output. What does interpret mode return there?
#
# <details><summary>Answer</summary>
#
# 1. The kernel returns nothing; it only writes into output Refs, so the shapes and dtypes of
#    those Refs must be given up front.
# 2. All of it. Without BlockSpecs every Ref covers the whole array, and the program picks its
#    part with `program_id`.
# 3. The body is traced once into a JAX program; the grid runs that program, not the Python.
# 4. NaN for floating-point outputs (the dtype's minimum for integers with `interpret=True`).
#    A compiled kernel returns whatever the memory held.
#
# </details>

# %% [markdown]
# ## How the assignments grade a kernel
#
# An assignment's checks compare your function's values with a plain-JAX reference on cases you
# see and cases you do not, and look at what it does (kernelsim traces it). Besides the values,
# any task can fail these rules, and each failed one prints what it wants and what it found:
#
# * your function reaches `pl.pallas_call`, and the kernels are your own, not the course's code;
# * the result comes from the kernel, and the kernel's inputs are your function's arguments or
#   an earlier kernel's outputs;
# * the work happens in the kernel: compute outside kernels and data moved outside kernels stay
#   under a tenth of the task's (a transpose in XLA is a whole pass over HBM), and the kernel
#   computes the task's operation itself;
# * every kernel input is read in the kernel body, and no host callbacks
#   (`jax.pure_callback`, `io_callback`, `jax.debug.callback`) carry arrays;
# * for a TPU (every assignment but 11's and 15's): block shapes Mosaic accepts, the (8, 128)
#   tiling rule of lesson 3; a float32 dot at `precision=jax.lax.Precision.HIGHEST` and a
#   bfloat16 dot at the default, both with `preferred_element_type=jnp.float32` (lesson 7
#   says why); strided reads, `pl.ds(..., stride=k)`, only of 32-bit data in a ref 128 lanes
#   wide; and scalar prefetch (lesson 6) that carries indices, never values computed from
#   floating-point data, which an output's index map reads only at the step's own index.
#
# Each task's text adds the rules of its own: its grid, blocks and byte budgets.

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 1 — your first
# kernel](../exercises/01_first_kernel/first_kernel.ipynb).
