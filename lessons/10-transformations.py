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
# # Lesson 10 — Transformations: vmap, grad and in-place updates
#
# **Learning objectives.** After this lesson you can
#
# 1. apply `jax.vmap` to a `pallas_call` and predict the grid and BlockSpecs it produces;
# 2. say which JAX transformations a `pallas_call` supports by itself in the pinned release:
#    `vmap` and `jvp`, not `grad`;
# 3. write a backward kernel and attach it to a forward kernel with `jax.custom_vjp`, and
#    check `jax.grad` of the result against plain JAX;
# 4. choose what the forward pass saves for the backward one (residuals) and count its HBM
#    traffic;
# 5. update part of a buffer in place with `input_output_aliases`, and read from kernelsim what
#    aliasing saves.
#
# Rules here: the [`pallas_call` API](https://docs.jax.dev/en/latest/_autosummary/jax.experimental.pallas.pallas_call.html),
# [Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html) and the
# [design note](https://docs.jax.dev/en/latest/pallas/design/design.html) on transformations.
# Matching exercises: [`../exercises/`](../exercises/) (assignment `10_transformations`).

# %%
import functools

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
from jax.experimental import pallas as pl

import kernelsim
from kernelsim.backend import choose

LESSON = "10-transformations"
_course.versions()
run = choose(tpu_features=False, gpu_ok=True)
keys = jax.random.split(jax.random.key(10), 4)

# %% [markdown]
# ## `vmap` of a kernel adds a grid axis
#
# A kernel written for one matrix: scale every row of `x` (shape `(M, N)`) by a vector `w`
# (shape `(1, N)`), one block of `BM` rows per grid step.

# %%
BM = 8


def scale_rows_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] * w_ref[...]


def scale_rows(x, w, *, interpret):
    m, n = x.shape
    rows = pl.BlockSpec((BM, n), lambda i: (i, 0))
    # w's block index never changes: it is fetched once and reused by every step.
    return pl.pallas_call(
        scale_rows_kernel,
        grid=(pl.cdiv(m, BM),),
        in_specs=[rows, pl.BlockSpec((1, n), lambda i: (0, 0))],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, w)


# %% [markdown]
# `jax.vmap` turns it into a kernel for a batch of matrices without touching the kernel.
# `in_axes=(0, None)` says `x` carries the batch on axis 0 and `w` is shared by every example.

# %%
B, M, N = 4, 32, 128
xb = jax.random.normal(keys[0], (B, M, N), jnp.float32)
w = jax.random.normal(keys[1], (1, N), jnp.float32)


def batched_scale_rows(x, w, *, interpret):
    return jax.vmap(functools.partial(scale_rows, interpret=interpret), in_axes=(0, None))(x, w)


_course.check(LESSON, "batched_scale_rows", batched_scale_rows, lambda x, w: x * w, (xb, w),
              run, rtol=0, atol=0)

# %% [markdown]
# There is still one `pallas_call`. The batching rule of `pallas_call` in the pinned release
# (`_pallas_call_batching_rule` in `jax/_src/pallas/pallas_call.py`) rewrites it:
#
# * the grid gains a new **leading** axis of size `B`: `(M/BM,)` becomes `(B, M/BM)`. The
#   TPU lowering marks that axis `"parallel"` (batch elements are independent) and applies
#   the `dimension_semantics` you gave to the axes after it;
# * every batched operand's block gains a **squeezed** dimension (`None`) at its batch axis,
#   and its index map a new first argument, the batch index, placed at that axis;
# * an unbatched operand (`in_axes=None`) keeps its BlockSpec: its index ignores the batch
#   index, so the pipeline still fetches it once;
# * outputs are always batched on axis 0.
#
# (A batch of size 1 is the exception: the rule drops the batch dimension and calls the
# kernel unchanged.)
#
# kernelsim traces the vmapped function like any other, and shows the grown call.

# %%
t_one = kernelsim.trace(functools.partial(scale_rows, interpret=True), xb[0], w)
t_batch = kernelsim.trace(functools.partial(batched_scale_rows, interpret=True), xb, w)
for label, t in [("one matrix", t_one), ("vmapped   ", t_batch)]:
    call = t.calls[0]
    blocks = {o.name: o.block_shape for o in call.operands}
    print(f"{label}: grid {call.grid}, blocks {blocks}")
print(t_batch.summary())
assert t_batch.calls[0].grid == (B, M // BM)
assert t_batch.calls[0].operand("w_ref").fetches == 1

# %% [markdown]
# The heatmap counts copies per block: every block of `x` and of the output once, and the one
# block of `w` once for all 16 steps.

# %%
t_batch.heatmap()

# %% [markdown]
# A batch on another axis is read where it lies: with `in_axes=1` the block of `x` becomes
# `(BM, None, N)`. The output is still produced with the batch on axis 0, so `out_axes=1`
# costs a `transpose` after the kernel, outside it (a full read and write of the output).

# %%
xt = jnp.swapaxes(xb, 0, 1)  # (M, B, N)
vmapped_axis1 = jax.vmap(functools.partial(scale_rows, interpret=True), in_axes=(1, None),
                         out_axes=1)
t_axis1 = kernelsim.trace(vmapped_axis1, xt, w)
print("x block with the batch on axis 1:", t_axis1.calls[0].operand("x_ref").block_shape)
print("operations in the program:",
      [e.primitive.name for e in jax.make_jaxpr(vmapped_axis1)(xt, w).eqns])

# %% [markdown]
# ## Forward mode works, reverse mode does not
#
# The pinned release registers a JVP rule for `pallas_call` (`_pallas_call_jvp_rule`): it
# differentiates the kernel body and emits **one** `pallas_call` that takes the primals and
# the tangents and writes both outputs. So `jax.jvp` (forward mode) of a kernel works.

# %%
def sin_times_x_kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = jnp.sin(x) * x


def sin_times_x(x):
    return pl.pallas_call(sin_times_x_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=True)(x)


x = jax.random.normal(keys[2], (8, 128), jnp.float32)
_, tangent = jax.jvp(sin_times_x, (x,), (jnp.ones_like(x),))
print("jvp matches cos(x)·x + sin(x):",
      bool(jnp.allclose(tangent, jnp.cos(x) * x + jnp.sin(x), atol=1e-6)))
jvp_program = jax.make_jaxpr(lambda x, t: jax.jvp(sin_times_x, (x,), (t,)))(x, x)
print("one pallas_call with inputs and outputs doubled:",
      [(e.primitive.name, len(e.invars), len(e.outvars)) for e in jvp_program.eqns])

# %% [markdown]
# `jax.grad` needs more: JAX *linearizes* the function (splits the known primal values from the
# linear tangent computation) and then *transposes* the linear part. The JVP rule's single
# call computes primals and tangents together, so linearization cannot separate them, and the
# pinned release registers neither a partial-evaluation nor a transpose rule for
# `pallas_call` (only JVP, batching, dead-code elimination, type checking and lowering).
# `jax.grad` stops with an error:

# %%
try:
    jax.grad(lambda x: sin_times_x(x).sum())(x)
except ValueError as err:
    print("jax.grad:", str(err).splitlines()[0])

# %% [markdown]
# There is a deeper reason than a missing rule. A kernel body is imperative code on Refs. Its
# transpose turns every *read* of an input block into an *accumulation* into that input's
# gradient: a block that several grid steps read (the `A` panel of a matmul) becomes a block
# several steps add into, which is a reduction across the grid that the forward grid never had
# to order. And the backward pass usually wants its own blocking anyway (flash attention's
# backward loops over keys in the outer axis). So you write the backward kernel yourself and
# tell JAX about it with `jax.custom_vjp`.

# %% [markdown]
# ## A backward kernel through `jax.custom_vjp`
#
# Row softmax: `y = softmax(x)` along the last axis. For a cotangent `g` (the gradient of the
# loss with respect to `y`), the gradient with respect to `x` is, row by row,
# `dx = y · (g − Σ_j g_j y_j)`. It needs `y`, not `x`: the forward pass saves its own output
# as the **residual**, and the backward kernel reads `y` and `g` and writes `dx`, one block of
# rows per step, exactly like the forward.

# %%
def softmax_kernel(x_ref, y_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
    y_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(y_ref.dtype)


def softmax_backward_kernel(y_ref, g_ref, dx_ref):
    y, g = y_ref[...].astype(jnp.float32), g_ref[...].astype(jnp.float32)
    dx_ref[...] = (y * (g - jnp.sum(g * y, axis=1, keepdims=True))).astype(dx_ref.dtype)


def row_call(kernel, n_inputs, like, interpret):
    """A pallas_call over blocks of BM full rows, for kernels whose operands all have the
    shape of ``like``. Each block is used by one grid step: nothing is reused."""
    m, n = like.shape
    rows = pl.BlockSpec((BM, n), lambda i: (i, 0))
    return pl.pallas_call(kernel, grid=(pl.cdiv(m, BM),), in_specs=[rows] * n_inputs,
                          out_specs=rows, out_shape=jax.ShapeDtypeStruct(like.shape, like.dtype),
                          interpret=interpret)


def make_softmax(interpret):
    @jax.custom_vjp
    def softmax(x):
        return row_call(softmax_kernel, 1, x, interpret)(x)

    def forward(x):
        y = softmax(x)
        return y, y  # the output, and the residual the backward pass needs

    def backward(y, g):
        return (row_call(softmax_backward_kernel, 2, y, interpret)(y, g),)  # one per input

    softmax.defvjp(forward, backward)
    return softmax


# %% [markdown]
# `forward` returns the output and the residuals; `backward` receives the residuals and the
# cotangent and returns a tuple with one cotangent per input of `softmax`. `jax.grad` now
# works, and it must agree with plain JAX's gradient of `jax.nn.softmax`.

# %%
logits = jax.random.normal(keys[3], (32, 256), jnp.float32)
weights = jnp.linspace(-1.0, 1.0, 256, dtype=jnp.float32)


def loss_grad(x, *, interpret):
    return jax.grad(lambda x: jnp.sum(make_softmax(interpret)(x) * weights))(x)


def loss_grad_reference(x):
    return jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * weights))(x)


_course.check(LESSON, "softmax_grad", loss_grad, loss_grad_reference, (logits,), run,
              rtol=1e-5, atol=1e-6)

# %% [markdown]
# kernelsim traces the gradient function: two `pallas_call`s, the forward and the backward.
# The forward writes `y` once; the backward reads it back together with `g`.

# %%
t_grad = kernelsim.trace(functools.partial(loss_grad, interpret=True), logits)
for call in t_grad.calls:
    print(f"{call.name}: grid {call.grid}, HBM read {call.hbm_read_bytes:,} B, "
          f"write {call.hbm_write_bytes:,} B")
assert [c.name for c in t_grad.calls] == ["softmax_kernel", "softmax_backward_kernel"]

# %% [markdown]
# ## What to save: residuals cost HBM traffic
#
# Whatever `forward` returns as residuals is written to HBM in the forward pass and read back
# in the backward pass. Here the residual is the output `y`, which the forward writes anyway:
# the backward pays one read of `y` (`M·N` elements). The alternative is to save `x` and let
# the backward kernel *recompute* `y` from it: the same read, one more `exp` per element. The
# trade changes when the residual is not an output: a layer whose gradient needs a per-row
# statistic (a norm's `1/rms`) either writes that statistic as a second forward output and
# reads it back, or recomputes it from `x`, which the backward kernel loads anyway, for one
# reduction per row and no extra traffic. Flash attention is the extreme case: it saves only
# the row log-sum-exp and recomputes the `N × N` probabilities block by block in the backward
# kernel, because storing them is the traffic the forward kernel exists to avoid.

# %% [markdown]
# ## In place: `input_output_aliases`
#
# `input_output_aliases={i: o}` tells `pallas_call` that output `o` is input `i`'s buffer: the
# output must have the input's shape and dtype, and blocks the kernel never writes keep the
# input's values. That makes a *partial* update cheap: add `delta` into rows
# `[START, START + R)` of an accumulator `acc`, and touch only those rows.

# %%
ACC_ROWS, R, START = 256, 16, 64


def add_rows_kernel(acc_ref, delta_ref, out_ref):
    out_ref[...] = acc_ref[...] + delta_ref[...]


def add_rows_in_place(acc, delta, *, interpret):
    r, n = delta.shape
    first = START // BM  # block index of the first updated row
    acc_rows = pl.BlockSpec((BM, n), lambda i: (first + i, 0))
    # Only r // BM steps; each reads one block of acc and of delta, writes that block of acc.
    return pl.pallas_call(
        add_rows_kernel,
        grid=(r // BM,),
        in_specs=[acc_rows, pl.BlockSpec((BM, n), lambda i: (i, 0))],
        out_specs=acc_rows,
        out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
        input_output_aliases={0: 0},  # input 0 (acc) is output 0
        interpret=interpret,
    )(acc, delta)


acc = jax.random.normal(keys[0], (ACC_ROWS, N), jnp.float32)
delta = jax.random.normal(keys[1], (R, N), jnp.float32)
_course.check(LESSON, "add_rows_in_place", add_rows_in_place,
              lambda acc, d: acc.at[START:START + R].add(d), (acc, delta), run, rtol=0, atol=0)

# %% [markdown]
# Without the alias the output is a fresh buffer, and rows the kernel does not write are
# uninitialised (NaN in interpret mode). A correct kernel without aliasing must therefore
# write *every* block of the output, copying the untouched rows through the kernel:

# %%
def add_rows_copy(acc, delta, *, interpret):
    n = acc.shape[1]
    rows = pl.BlockSpec((BM, n), lambda i: (i, 0))
    # delta's block index is clamped into range; steps outside the update add nothing.
    delta_rows = pl.BlockSpec((BM, n), lambda i: (jnp.clip(i - START // BM, 0, R // BM - 1), 0))

    def kernel(acc_ref, delta_ref, out_ref):
        i = pl.program_id(0)
        inside = (i >= START // BM) & (i < (START + R) // BM)
        out_ref[...] = acc_ref[...] + jnp.where(inside, delta_ref[...], 0.0)

    return pl.pallas_call(kernel, grid=(acc.shape[0] // BM,), in_specs=[rows, delta_rows],
                          out_specs=rows, out_shape=jax.ShapeDtypeStruct(acc.shape, acc.dtype),
                          interpret=interpret)(acc, delta)


_course.check(LESSON, "add_rows_copy", add_rows_copy,
              lambda acc, d: acc.at[START:START + R].add(d), (acc, delta), run, rtol=0, atol=0)

# %% [markdown]
# kernelsim counts what each version moves. The aliased kernel reads two blocks of `acc`
# and two of `delta` and writes two blocks; the copying kernel reads and writes all of `acc`.

# %%
t_alias = kernelsim.trace(functools.partial(add_rows_in_place, interpret=True), acc, delta)
t_copy = kernelsim.trace(functools.partial(add_rows_copy, interpret=True), acc, delta)
moved = {label: (t.calls[0].hbm_read_bytes, t.calls[0].hbm_write_bytes)
         for label, t in [("aliased", t_alias), ("copy", t_copy)]}
for label, (read, write) in moved.items():
    print(f"{label:8s}: HBM read {read:,} B, write {write:,} B")
assert moved["aliased"] == (2 * R * N * 4, R * N * 4)

fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 2.6))
for row, (read, write) in enumerate(moved.values()):
    ax.barh(row, read / 1024, color="tab:blue", label="read" if row == 0 else None)
    ax.barh(row, write / 1024, left=read / 1024, color="tab:orange",
            label="write" if row == 0 else None)
ax.set_yticks(range(len(moved)), list(moved))
ax.set_xlabel("HBM traffic (KiB)")
ax.set_title(f"add {R} rows into a {ACC_ROWS}×{N} float32 accumulator")
ax.legend(loc="lower right")
fig.tight_layout()
fig  # noqa: B018 - a cell's last expression is displayed

# %% [markdown]
# What aliasing does *not* do: change JAX's value semantics. `acc` still holds its old values
# after the call. When the caller still needs them, XLA gives the kernel a copy of `acc` to
# write into ([XLA aliasing](https://openxla.org/xla/aliasing): an aliased input that is not
# donated is copied first), and that copy is a full read and write again. The saving is real
# when the old buffer is dead: a temporary inside a jitted function, or an argument donated
# with `jax.jit(..., donate_argnums=...)` (a KV cache updated every decoding step is the
# classic case). Aliasing also constrains the other transformations: the pinned release's
# JVP rule refuses an aliased call (`NotImplementedError`), and its batching rule broadcasts
# an unbatched aliased input to the batch size before the call, since every example writes
# its own copy.

# %% [markdown]
# ## Check yourself
#
# 1. `scale_rows` has grid `(4,)` for a `(32, 128)` matrix. What grid and `x` block does
#    `jax.vmap(scale_rows, in_axes=(0, None))` give for a `(6, 32, 128)` batch, and how many
#    times is `w` fetched?
# 2. You vmap the same function with `in_axes=(0, 0)` over `w` broadcast to `(6, 1, 128)`.
#    What changes in `w`'s traffic?
# 3. `jax.jvp` of a `pallas_call` works in the pinned release, `jax.grad` does not. Why?
# 4. In `softmax`'s `custom_vjp`, `forward` returns `(y, y)`. What would you save instead for
#    an RMS norm `y = x / rms(x)`, and why does it cost no extra HBM traffic?
# 5. An aliased kernel writes only 2 of the 32 blocks of its output. What do the other 30
#    hold, and what would they hold without the alias?
#
# <details><summary>Answer</summary>
#
# 1. Grid `(6, 4)`, `x` block `(None, 8, 128)`; `w` keeps its BlockSpec, its block index never
#    changes, so it is fetched once.
# 2. `w` becomes a batched operand: its block is `(None, 1, 128)` and its index follows the
#    batch index, so it is fetched 6 times (once per example) instead of once.
# 3. The JVP rule differentiates the kernel body into one `pallas_call` computing primals and
#    tangents together. Reverse mode needs linearization, which cannot split that call, and a
#    transpose rule, which `pallas_call` does not have; transposing a kernel would turn reads
#    of shared blocks into accumulations across grid steps.
# 4. Save `x` and recompute `1/rms(x)` per row in the backward kernel: that kernel reads `x`
#    anyway, so recomputing costs one reduction per row and no bytes; saving the statistic
#    would add a forward output, its write and its read.
# 5. The input's values (the output *is* the input's buffer). Without the alias, uninitialised
#    memory: NaN in interpret mode, whatever the memory held on hardware.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 10 —
# transformations](../exercises/10_transformations/transformations.ipynb), and `jax.custom_vjp`
# in [Assignment 7 — flash attention](../exercises/07_flash_attention/flash_attention.ipynb):
# its tasks 4 and 5 after lessons 10 and 12.
