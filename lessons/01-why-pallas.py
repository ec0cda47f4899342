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
# # Lesson 1 — Why a kernel language lives inside JAX
#
# **Learning objectives.** After this lesson you can
#
# 1. point at the exact place where XLA stops helping: it fuses operations, but it keeps the
#    algorithm you wrote, including its intermediates;
# 2. say what the escape hatches before Pallas cost, and what Triton showed;
# 3. explain why Pallas is "JAX plus Refs, a few primitives and `pallas_call`";
# 4. write a kernel factory, a Python function that returns kernels;
# 5. list what Pallas refuses on TPU, and tell a limit of the hardware from one of today's
#    lowering;
# 6. use interpret mode as the reference a compiled kernel must agree with;
# 7. say what `jax.vmap` does to a `pallas_call` (one more grid axis) and why `jax.grad` needs
#    a backward kernel of your own.
#
# Exercises for this part live in [`../exercises/`](../exercises/).

# %%
import functools
import re

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import pallas as pl

import kernelsim
from kernelsim.backend import choose

LESSON = "01-why-pallas"
_course.versions()

# %% [markdown]
# ## What the compiler does well
#
# XLA looks at the dataflow graph of a jitted function and merges a producer into its consumer
# — a *fusion* — so that a chain like `exp(x - m)` does not write each step to memory.
#
# Fusion changes *how* the program runs, not *which algorithm* it runs. An intermediate that a
# later reduction needs in full, such as a row that must be complete before its sum is known,
# is still computed whole; if it is large it goes to memory.

# %% [markdown]
# Naive attention is the standard example. For one head with `N` queries and keys of width `d`
# it forms the `N × N` score matrix, normalises each row, and multiplies by the values. Below
# we compile it for `N = 512`, `d = 64` and look for the `N × N` array in the optimised HLO.

# %%
N, D = 512, 64
kq, kk, kv = jax.random.split(jax.random.key(0), 3)
q = jax.random.normal(kq, (N, D), jnp.float32)
k = jax.random.normal(kk, (N, D), jnp.float32)
v = jax.random.normal(kv, (N, D), jnp.float32)


def naive_attention(q, k, v):
    scores = q @ k.T / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    return jax.nn.softmax(scores, axis=-1) @ v


compiled = jax.jit(naive_attention).lower(q, k, v).compile()
hlo = compiled.as_text()
square = f"f32[{N},{N}]"
lines = [line.strip() for line in hlo.splitlines() if square in line]
print(f"{len(lines)} lines of the optimised HLO mention {square}")
print("the fused kernels XLA runs, in order, with their output shapes:")
for name, shape in re.findall(r"%(\S+) = (\S+?)(?:\{[^}]*\})? fusion\(", hlo):
    print(f"   {name:28} -> {shape}")

# %% [markdown]
# The score matrix survives optimisation. On the CPU, with the JAX release this course is
# checked against (printed above), the first fusion computes `q @ k.T`, the scaling, the row
# maximum and the exponential — and still writes an `N × N` result. The next fusions read it
# for the row sums and again for the normalisation, and write a second `N × N` array that the
# product with `v` reads. (The exact list of fusions differs between backends and releases.)
#
# XLA's cost model says the same thing in bytes. `compiled.cost_analysis()` returns a
# dictionary whose `"bytes accessed"` entry is the compiler's estimate of memory traffic; we
# compare it with the bytes of the four `N × d` arrays that attention cannot avoid touching.

# %%
cost = compiled.cost_analysis()
accessed = cost["bytes accessed"]
unavoidable = 4 * N * D * 4  # q, k, v read once, the output written once, 4 bytes each
print(f"XLA estimates {accessed:,.0f} bytes accessed")
print(f"q, k, v and the output together are {unavoidable:,} bytes")
print(f"ratio: {accessed / unavoidable:.1f}x; one N x N f32 matrix alone is {N * N * 4:,} bytes")
assert accessed > 2 * unavoidable

# %% [markdown]
# Doubling `N` quadruples the square term while the unavoidable term only doubles. The plot
# asks XLA for its estimate at four sequence lengths (compiling only; nothing runs).

# %%
lengths = [256, 512, 1024, 2048]
estimated, linear, square_bytes = [], [], []
for n in lengths:
    arg = jax.ShapeDtypeStruct((n, D), jnp.float32)
    estimated.append(jax.jit(naive_attention).lower(arg, arg, arg).compile()
                     .cost_analysis()["bytes accessed"])
    linear.append(4 * n * D * 4)
    square_bytes.append(n * n * 4)

fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 3.6))
ax.plot(lengths, estimated, marker="o", label="XLA's \"bytes accessed\" (CPU)")
ax.plot(lengths, square_bytes, linestyle="--", label="one N × N f32 matrix")
ax.plot(lengths, linear, linestyle=":", color="black", label="q, k, v, output once")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("N (sequence length), d = 64")
ax.set_ylabel("bytes")
ax.set_title("naive attention: memory traffic grows like N²")
ax.legend()
fig.tight_layout()

# %% [markdown]
# No fusion removes the square term, because removing it means a *different algorithm*:
# computing the softmax in pieces, keeping running maxima and sums (lesson 8). Changing
# algorithms is the programmer's job, and the kernel is where the programmer does it.

# %% [markdown]
# ## The escape hatches before Pallas
#
# The long-standing way around XLA is a *custom call* (`CustomCall`): an operation whose body
# is an opaque function you wrote and compiled yourself. XLA schedules it but does not look
# inside.
#
# The [Pallas design document](https://docs.jax.dev/en/latest/pallas/design/design.html) gives
# two reasons this is not enough. The first is the language: C++ and, on GPUs, CUDA, which the
# authors call, arguably, too low-level for many machine-learning kernels — even experts
# struggle to write a fast matmul or multi-head attention that way.
#
# The second is time: new systems research reaches XLA only after a while, and users want it
# sooner. A kernel lets you get ahead; the compiler may absorb the idea later.

# %% [markdown]
# ## Triton's lesson
#
# Triton showed that GPU kernels can be written as *array programs on tiles*: you say what
# happens to a block of an array and the compiler maps it onto threads. The design document
# calls it the primary code-generation route of `torch.compile` in PyTorch 2.0, through
# TorchInductor.
#
# Why not compile Triton for a TPU? The design document grants that Triton's model is already
# TPU-like — programs on tiles of arrays held in fast memory — but its details are specialised
# for GPUs, so it cannot be compiled for a TPU directly. Its example is atomics: operations
# that exist to settle parallel writes to the same memory, which is not how a TPU works. What
# was needed was the same tile-level idea one level higher, abstract enough to compile for
# both machines (lesson 11 shows which of the course's kernels the GPU lowering of the pinned
# release accepts, and why the others are refused).

# %% [markdown]
# ## JAX is already an array language
#
# That is the observation behind Pallas: JAX users already write NumPy-style array programs,
# and JAX already traces Python into a typed program. Pallas adds three things:
#
# * **Refs** — mutable references to memory, read with `x_ref[...]` and written with
#   `o_ref[...] = value`;
# * **a few primitives**, such as `pl.program_id(axis)`, the position of the current program
#   in the grid;
# * **`pl.pallas_call`**, which runs a kernel function once per point of a grid.
#
# Inside the kernel body you write `jax.numpy` and `jax.lax`, restricted to the operations the
# backend can lower. See the
# [Pallas quickstart](https://docs.jax.dev/en/latest/pallas/quickstart.html).

# %% [markdown]
# ## Kernels are Python at trace time
#
# Because Pallas reuses JAX tracing rather than parsing Python source, a kernel may close over
# Python values, take functions as arguments, or be produced by another function. A *kernel
# factory* is just that: a function returning a kernel. The toolchain only ever sees the traced
# result.

# %%
def make_add_then(elementwise):
    """A kernel that adds two blocks and applies ``elementwise`` to the sum."""

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = elementwise(x_ref[...] + y_ref[...])

    return kernel


def add_then(x, y, elementwise, *, interpret):
    # No grid: one program sees the whole arrays, so nothing is reused or re-read.
    return pl.pallas_call(
        make_add_then(elementwise),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, y)


x = jax.random.normal(kq, (8, 128), jnp.float32)
y = jax.random.normal(kk, (8, 128), jnp.float32)
run = choose(tpu_features=False, gpu_ok=True)
for label, fn in [("doubled", lambda s: 2 * s), ("exponentiated", jnp.exp)]:
    _course.check(LESSON, f"add_then_{label}",
                  functools.partial(add_then, elementwise=fn),
                  lambda a, b, fn=fn: fn(a + b), (x, y), run, rtol=1e-6, atol=1e-6)

# %% [markdown]
# Two kernels, one source. The same trick gives you kernels specialised on block sizes,
# dtypes, masking or epilogues without any templating language.

# %% [markdown]
# ## To XLA, a Pallas kernel is a custom call
#
# Pallas does not remove the custom call; it writes the opaque function for you. Lowering a
# jitted function for TPU (possible on this CPU: lowering needs no chip) shows the kernel as
# one `custom_call` to `tpu_custom_call`, carrying the Mosaic program, and the `sin` as a
# separate operation after it.

# %%
def add_then_sin(x, y):
    return jnp.sin(add_then(x, y, lambda s: 2 * s, interpret=False))


stablehlo = jax.jit(add_then_sin).trace(x, y).lower(lowering_platforms=("tpu",)).as_text()
custom_calls = re.findall(r"custom_call @(\w+)", stablehlo)
print("custom calls:", custom_calls)
print("sine outside the kernel:", "stablehlo.sine" in stablehlo)
assert custom_calls == ["tpu_custom_call"] and "stablehlo.sine" in stablehlo

# %% [markdown]
# This is the program *before* XLA optimises it, so it cannot show whether XLA fuses anything
# into the kernel; only the compiled TPU program could. What the pinned release offers is
# narrower: `pltpu.CompilerParams(allow_input_fusion=[...])`, one flag per operand, lets XLA
# fuse the computation that produces an input into the kernel instead of writing that input
# to HBM first. JAX only passes the flags to the TPU compiler in the custom call's
# configuration; the fusing itself happens in XLA.
# %% [markdown]
# ## What Pallas refuses, and why
#
# Pallas accepts a subset of JAX. The design document names two exclusions and gives the
# reason for each, and both reasons are about the hardware:
#
# * `conv_general` — convolution is usually not a hardware primitive;
# * gather and scatter — the compiler underneath may not support reads and writes of
#   non-contiguous memory.
#
# A gather you need does not vanish; it changes shape. The rows you want become *block
# indices*, computed by an index map from integers that were copied to scalar memory before
# the kernel started (scalar prefetch, lesson 6). That is a schedule you can read and cost.

# %% [markdown]
# The [TPU details page](https://docs.jax.dev/en/latest/pallas/tpu/details.html) takes the
# same attitude further. Among its rules for the TPU backend:
#
# * reductions over integer values are not supported;
# * loops: the page says loop primitives are fully unrolled at compile time and asks for small
#   trip counts. The pinned release's lowering is more lenient than the page: it emits a real
#   loop (`scf.for`) for `lax.fori_loop` and unrolls only as far as its `unroll=` argument
#   asks (a partial unroll is left to the Mosaic compiler, as a `tpu.late_unroll` attribute
#   on the loop);
# * elementwise operations are not equally cheap: the page ranks `jnp.sin` and `jnp.cos` among
#   the expensive ones and `jnp.exp` in the middle.
#
# Read these two ways. Some rules describe the machine and will not change: operations are
# not equally cheap, and a TPU core moves tiles, not scattered words. Others describe today's
# lowering, and the docs word them so ("at the moment"): the pinned release already emits
# real loops (above), lowers `sum`, `max` and `min` over `int32` values (other integer types
# are refused), and lowers a gather *within* a block along one of its last two dimensions
# (`jnp.take_along_axis`-style) as an in-register gather. Before working around a refusal,
# check the release you run. A gather from HBM by data-dependent rows remains the index-map
# pattern above.

# %% [markdown]
# ## The correctness promise, and interpret mode as the oracle
#
# In exchange for what it refuses, Pallas makes a promise (same TPU page): although the TPU
# backend is experimental, a kernel the compiler accepts must produce the right result. If a
# compiled kernel's output looks wrong, run it again with `interpret=True` and report a bug
# when they differ.
#
# Interpret mode runs the kernel body as plain JAX on any backend, including this CPU. Every
# kernel in this course is checked against a plain-JAX reference, and on a machine without an
# accelerator, interpret mode is what runs.

# %%
got = add_then(x, y, jnp.tanh, interpret=True)
np.testing.assert_allclose(got, jnp.tanh(x + y), rtol=1e-6, atol=1e-6)
print("interpret=True agrees with plain JAX; on a TPU or GPU, compare interpret=False with it")

# %% [markdown]
# ## JAX transformations apply to kernels
#
# The design document's third argument for living inside JAX: a kernel is a JAX operation, so
# JAX's transformations apply to it. `jax.vmap` of a `pallas_call` is again one `pallas_call`,
# with one more grid axis in front: each batch element gets its own grid steps, and each
# operand's block gains a leading dimension of size one that the kernel never sees (a
# *squeezed* dimension, lesson 3). The kernel body is untouched.

# %%
batched = jax.vmap(functools.partial(add_then, elementwise=jnp.exp, interpret=True))
xs = jnp.stack([x, 2 * x, 3 * x])
ys = jnp.stack([y, y, y])
program = jax.make_jaxpr(batched)(xs, ys)
print("primitives after vmap:", [e.primitive.name for e in program.eqns])
t_batched = kernelsim.trace(batched, xs, ys)
print(t_batched)
assert [e.primitive.name for e in program.eqns] == ["pallas_call"]
assert t_batched.calls[0].grid == (3,)  # add_then had no grid: vmap added one axis of size 3
np.testing.assert_allclose(batched(xs, ys), jnp.exp(xs + ys), rtol=1e-6)

# %% [markdown]
# `jax.grad` is different: differentiating a kernel means a *backward kernel*, and Pallas does
# not derive one. In the pinned release a `pallas_call` has a forward-mode (`jvp`) rule but no
# transpose rule, so `jax.grad` fails; you write the backward kernel yourself and attach it
# with `jax.custom_vjp`. Lesson 10 does both, checked against `jax.grad` of plain JAX.

# %% [markdown]
# ## What is left to you
#
# Everything XLA used to decide silently is now yours to state: which blocks are on chip, in
# what order the grid visits them, in which memory space they live, and which grid axis reuses
# which block. Lessons 2–8 take these decisions one at a time.

# %% [markdown]
# ## Check yourself
#
# 1. XLA merged the softmax's elementwise steps into its neighbouring loops. Why is an
#    `N × N` array still in the compiled program?
# 2. Name the two reasons the design document gives for wanting more than custom calls.
# 3. Why can Triton not simply be compiled for a TPU?
# 4. What three things does Pallas add to JAX?
# 5. You need `table[idx]` inside a kernel. What does Pallas offer instead of a gather?
# 6. What does XLA see of a compiled Pallas kernel, and what can it not do with it?
# 7. You `jax.vmap` a kernel with no grid over a batch of 3. What does the `pallas_call` look
#    like afterwards, and what would `jax.grad` need?
#
# <details><summary>Answer</summary>
#
# 1. Fusion changes how operations are scheduled, not the algorithm. Naive attention's
#    algorithm produces the full score matrix before the row-wise softmax; only a different
#    algorithm (online softmax) avoids it.
# 2. The low-level language (C++, CUDA) that even experts find hard for matmul or attention,
#    and the delay before research techniques land in the compiler.
# 3. Its tile model is already TPU-like, but its details are GPU-specific: for example its
#    atomics exist to settle parallel writes to the same memory, which is not how a TPU works.
# 4. Refs, a few new primitives such as `program_id`, and `pallas_call`.
# 5. Prefetch `idx` as scalars and let an index map turn each one into the block index of the
#    row to copy (lesson 6).
# 6. One custom call (`tpu_custom_call` on TPU) wrapping the compiled kernel. XLA schedules it
#    like any operation but cannot see inside it; on TPU it may fuse the producers of inputs
#    you mark with `allow_input_fusion` into it. The lowered StableHLO cannot show fusion
#    either way: fusion happens later, when XLA compiles.
# 7. The `pallas_call` gains a leading grid axis of size 3 and every block a squeezed leading
#    dimension; the kernel body is unchanged. `jax.grad` needs a rule for the backward pass,
#    which `pallas_call` does not have; you write the backward kernel and attach it with
#    `jax.custom_vjp` (lesson 10).
#
# </details>

# %% [markdown]
# ## Practise it
#
# This lesson has no graded assignment yet. The next one is [Assignment 1 — your first
# kernel](../exercises/01_first_kernel/first_kernel.ipynb), which practises lesson 2.
