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
# # Lesson 9 — Debugging kernels
#
# **Learning objectives.** After this lesson you can
#
# 1. print values from inside a kernel at every grid step with `pl.debug_print`, in a form the
#    TPU lowering also accepts;
# 2. make TPU interpret mode fill uninitialised memory with NaN and raise on out-of-bounds
#    reads, and read an unwritten block or a bad index map off the result;
# 3. catch a DMA race with `detect_races=True` and read the report;
# 4. read a TPU lowering error about a block shape, from `kernelsim.tpu_lowering_error` and
#    kernelsim's warnings;
# 5. find a wrong index map in kernelsim's step table and heatmap;
# 6. check a kernel's assumptions with `checkify` around it and `pl.debug_check` inside it,
#    and say where each one fires;
# 7. profile a kernel on a TPU or GPU and read its trace beside kernelsim's estimate.
#
# Every kernel here is wrong on purpose, and every tool runs on this CPU. A compiled kernel
# with the same bug would return plausible garbage, or nothing at all.
# Rules here: [TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html),
# [Grids and BlockSpecs](https://docs.jax.dev/en/latest/pallas/grid_blockspec.html) and the
# [`pl.debug_print` reference](https://docs.jax.dev/en/latest/_autosummary/jax.experimental.pallas.debug_print.html).
# Matching exercises: [`../exercises/`](../exercises/) (assignment 9, "find the bug").

# %%
import functools
import logging

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose

LESSON = "09-debugging"
_course.versions()
# Error messages below embed jaxprs, which JAX colours with terminal codes inside a notebook.
jax.config.update("jax_pprint_use_color", False)
keys = jax.random.split(jax.random.key(9), 4)
run = choose(tpu_features=False, gpu_ok=True)


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def interpreter_error(err: Exception, marker: str) -> str:
    """The line of a TPU-interpreter failure that contains ``marker``.

    The interpreter raises inside a callback, so its error arrives wrapped in a
    ``JaxRuntimeError`` together with the callback's traceback; one line says what happened.
    """
    return next(line for line in str(err).splitlines() if marker in line).strip()


# %% [markdown]
# ## Printing from inside a kernel
#
# Lesson 2 showed that Python's `print` in a kernel body runs once, while the body is traced.
# `pl.debug_print(fmt, *values)` is different: it is a JAX operation in the kernel, so it
# prints every time a grid step runs it, with that step's values. In the pinned release it is
# `jax.debug.print` with the format check left to the backend.

# %%
def block_sums_kernel(x_ref, o_ref):
    i = pl.program_id(0)
    pl.debug_print("step {} sums its block to {}", i, jnp.sum(x_ref[...]))
    o_ref[...] = x_ref[...]


x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128) / 1024
spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
_ = jax.block_until_ready(pl.pallas_call(
    block_sums_kernel, grid=(4,), in_specs=[spec], out_specs=spec,
    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x))

# %% [markdown]
# Four steps, four lines, each with its own `program_id` and block. The values are printed
# when the step *runs*, so the print is the way to see intermediate values (a mask, a running
# maximum, an index) at the step where a result goes wrong.
#
# On a TPU the same call lowers to the chip's own logging, and the pinned release's lowering is
# strict: values go in positionally, either all scalars (32-bit integers or floats when `fmt`
# has `{}` placeholders) or a single vector after a format string that ends in `{}`. The
# lines reach you only when the TPU compiler records them: JAX's debugging guide asks for the
# compiler option `xla_tpu_enable_log_recorder` (for example
# `jax.jit(f, compiler_options={"xla_tpu_enable_log_recorder": "true"})`); without it a
# compiled print is silent. On a GPU the Triton lowering refuses any `{}` placeholder: the
# format string is printed as it is, before the values, so a GPU print has no `{}`.
# Interpret mode accepts anything `jax.debug.print` does, so ask the TPU lowering before
# relying on a print there. `kernelsim.tpu_lowering_error` runs JAX's TPU lowering on this CPU
# and returns its error, or `None`:

# %%
def keyword_print_kernel(x_ref, o_ref):
    jax.debug.print("step {i}", i=pl.program_id(0))  # a keyword argument
    o_ref[...] = x_ref[...]


def with_kernel(kernel, x, *, interpret):
    # Each block is read once and written once.
    return pl.pallas_call(kernel, grid=(4,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret)(x)


for kernel in (keyword_print_kernel, block_sums_kernel):
    error = kernelsim.tpu_lowering_error(
        functools.partial(with_kernel, kernel, interpret=False), x)
    print(f"{kernel.__name__}: {error or 'lowers for TPU'}")

# %% [markdown]
# ## Uninitialised memory: NaN marks what nobody wrote
#
# A kernel that forgets part of its output returns whatever the memory held. Interpret mode
# fills new buffers so that the gap shows: `interpret=True` and TPU interpret mode fill with NaN
# (TPU interpret mode's `InterpretParams(uninitialized_memory="nan")`, the default). The other
# setting, `"zero"`, makes the same gap look like data.
#
# The bug below is a common one: the grid is `M // bm` where the rows need `cdiv(M, bm)`, so
# the last, partial block of rows is never written.

# %%
def copy_rows(x, bm, *, interpret):
    m, n = x.shape
    # BUG: m // bm drops the partial last block; pl.cdiv(m, bm) covers it.
    return pl.pallas_call(
        copy_kernel,
        grid=(m // bm,),
        in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x)


x40 = jax.random.normal(keys[0], (40, 256), jnp.float32)
fills = {"nan": copy_rows(x40, 16, interpret=pltpu.InterpretParams()),
         "zero": copy_rows(x40, 16, interpret=pltpu.InterpretParams(uninitialized_memory="zero"))}
for name, out in fills.items():
    print(f'uninitialized_memory="{name}": rows holding NaN',
          np.flatnonzero(np.isnan(out).any(axis=1)).tolist(),
          "| rows all zero", np.flatnonzero((out == 0).all(axis=1)).tolist())
unwritten = list(range(32, 40))  # the partial last block, rows 32..39
assert np.flatnonzero(np.isnan(fills["nan"]).any(axis=1)).tolist() == unwritten
assert np.flatnonzero((fills["zero"] == 0).all(axis=1)).tolist() == unwritten

# %% [markdown]
# A picture of the output makes the unwritten block obvious: every row the grid never reached
# is NaN with the default fill, and an innocent-looking zero with the other one.

# %%
fig, axes = plt.subplots(1, 2, figsize=(_course.FIGURE_WIDTH, 2.8), sharey=True)
for ax, (name, out) in zip(axes, fills.items(), strict=True):
    shown = np.where(np.isnan(out), 1.0, np.where(out == 0, 0.5, 0.0))
    ax.imshow(shown, aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(f'uninitialized_memory="{name}"')
    ax.set_xlabel("column")
axes[0].set_ylabel("row (black: NaN, grey: 0)")
for ax in axes:
    for edge in (16, 32):
        ax.axhline(edge - 0.5, color="tab:red", linewidth=0.8)
fig.tight_layout()

# %% [markdown]
# The same NaN fill exposes an accumulator that is read before anyone set it (`o_ref[...] +=`
# at the first step without a `pl.when(... == 0)` that zeroes it), and padding that a mask
# lets into a reduction (lesson 3's ragged column sums). With zeros, both can pass a test and
# fail on a chip.

# %% [markdown]
# ## Out-of-bounds block reads
#
# An index map can point past the end of an array. Take lesson 4's reversal of row blocks and
# forget the `- 1`: at step 0 the map asks for block 4 of a 4-block array.
#
# * `interpret=True` clamps the block's start so the copy fits, and silently reads the last
#   block twice;
# * TPU interpret mode raises: `out_of_bounds_reads="raise"` is its default. With
#   `"uninitialized"` it returns the fill value (NaN) for the missing part instead;
# * kernelsim, which evaluates every index map at every step, refuses the trace and names
#   the step.

# %%
def reverse_row_blocks(x, *, interpret):
    n_blocks = x.shape[0] // 8
    # BUG: block n_blocks - i is one past the end at step 0; n_blocks - 1 - i is right.
    return pl.pallas_call(
        copy_kernel,
        grid=(n_blocks,),
        in_specs=[pl.BlockSpec((8, x.shape[1]), lambda i: (n_blocks - i, 0))],
        out_specs=pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x)


def out_of_bounds_in_tpu_interpret_mode():
    """The buggy reversal in TPU interpret mode: print the interpreter's message."""
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128) / 1024
    logging.disable(logging.ERROR)  # JAX also logs the failing callback's traceback; skip it
    try:
        reverse_row_blocks(x, interpret=pltpu.InterpretParams())
        jax.effects_barrier()  # a GPU reports the interpreter's error here, not at the call
    except Exception as err:  # noqa: BLE001 - the interpreter's IndexError arrives wrapped
        print("TPU interpret mode:", interpreter_error(err, "Out-of-bounds"))
        pltpu.reset_tpu_interpret_mode_state()
    finally:
        logging.disable(logging.NOTSET)


clamped = reverse_row_blocks(x, interpret=True)
print("interpret=True, first row of each output block:", clamped[::8, 0].tolist())
assert clamped[::8, 0].tolist() == [3, 3, 2, 1]  # the prose below reads these blocks
# in a process of its own: on a TPU the interpreter's error would stay with this one (below)
_course.in_fresh_process(LESSON, out_of_bounds_in_tpu_interpret_mode, reverse_row_blocks,
                         copy_kernel, interpreter_error)
try:
    kernelsim.trace(functools.partial(reverse_row_blocks, interpret=True), x)
except kernelsim.TraceError as err:
    print("kernelsim:", err)

# %% [markdown]
# Element `[8·k, 0]` of `x` is `k`, so the printed column names the block each step read: the
# clamped run read blocks 3, 3, 2, 1, where a reversal reads 3, 2, 1, 0. The interpreter's
# message names the operand, the block index, the grid step and the rows it tried to read.
# After an exception inside TPU interpret mode, `pltpu.reset_tpu_interpret_mode_state()`
# must run before the next interpreted kernel (the pinned release's `InterpretParams`
# docstring says so). On a TPU that is not enough: with the last JAX release for Python
# 3.11 on a v5e, the error stayed with JAX's ordered effects, and every later interpreted
# kernel of the process raised it again. So this lesson runs its deliberate failures with
# `_course.in_fresh_process`, in a Python process of their own, on the CPU; do the same with
# a failure you provoke on purpose.

# %% [markdown]
# ## A DMA race
#
# With `pl.ANY` and `pltpu.make_async_copy` (lesson 5) the kernel orders its own copies, and
# it can get the order wrong. Below, the kernel starts a copy into a VMEM buffer and reads the
# buffer *before* waiting for the copy: a race between the DMA's write and the kernel's read.

# %%
def read_before_wait_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    o_ref[...] = buf[...]  # BUG: reads buf while the copy may still be writing it
    copy.wait()


def read_before_wait(x, interpret):
    # No grid: one step copies all of x through a VMEM buffer by hand.
    return pl.pallas_call(
        read_before_wait_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x)


for mode in ("on_wait", "eager"):
    out = read_before_wait(x, pltpu.InterpretParams(dma_execution_mode=mode))
    print(f'dma_execution_mode="{mode}": output equals x: {bool((out == x).all())}, '
          f"NaN: {bool(np.isnan(out).any())}")

# %% [markdown]
# What the buggy kernel returns depends on when the copy lands. TPU interpret mode moves a
# copy's data only when someone waits for it by default (`"on_wait"`, the latest moment a chip
# could), so the early read sees the NaN-filled buffer; with `"eager"` the copy lands at
# `.start()` and the bug hides. On a chip the answer would depend on timing.
#
# `detect_races=True` does not depend on timing. It keeps a vector clock per core and per DMA
# and reports two accesses to the same buffer that nothing orders, one of them a write. In the
# pinned release it raises at the first race (`on_race="raise"`, the default; `"warn"` logs
# each race and lets the kernel finish).

# %%
def race_in_tpu_interpret_mode():
    """The buggy copy under the race detector: print the first lines of its report."""
    x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128) / 1024
    logging.disable(logging.ERROR)
    try:
        read_before_wait(x, pltpu.InterpretParams(detect_races=True))
        jax.effects_barrier()
    except Exception as err:  # noqa: BLE001 - the detector's RuntimeError arrives wrapped
        text = str(err)
        report = text[text.index("RACE DETECTED"):].splitlines()
        print("\n".join(line for line in report[:5] if "clock:" not in line))
        pltpu.reset_tpu_interpret_mode_state()
    finally:
        logging.disable(logging.NOTSET)


_course.in_fresh_process(LESSON, race_in_tpu_interpret_mode, read_before_wait,
                         read_before_wait_kernel)

# %% [markdown]
# Read the report from the top: the buffer (`'vmem'`, then the interpreter's ids for it), the
# elements concerned (`[()]`: the whole buffer), then the two accesses, each with who made it
# and where. The write comes from a DMA (a thread id of its own, numbered from 100 in the
# pinned release), at the line that started the copy; the read comes from the core `(0, 0)`,
# at the line that read `buf`. Moving `copy.wait()` above the read orders the two, and the
# detector is silent:

# %%
def read_after_wait_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]


def read_after_wait(x, *, interpret):
    # No grid: one step copies all of x through a VMEM buffer by hand.
    return pl.pallas_call(
        read_after_wait_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x)


tpu_run = choose(tpu_features=True)
_course.check(LESSON, "read_after_wait", read_after_wait, lambda a: a, (x,), tpu_run,
              rtol=0, atol=0)
jax.block_until_ready(read_after_wait(x, interpret=pltpu.InterpretParams(detect_races=True)))
print("race detector: no race in read_after_wait")

# %% [markdown]
# ## Reading a lowering error
#
# Interpret mode knows nothing of the TPU's block-shape rule (lesson 3), so a kernel can pass
# every test here and still never compile. One row per grid step is a natural first try for a
# row-wise kernel, and a block the lowering rejects:

# %%
def scale_rows_kernel(x_ref, s_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[...]


def scale_rows(x, scales, *, rows, interpret):
    m, n = x.shape
    # Each row block of x and its scales are read once.
    return pl.pallas_call(
        scale_rows_kernel,
        grid=(m // rows,),
        in_specs=[pl.BlockSpec((rows, n), lambda i: (i, 0)),
                  pl.BlockSpec((rows, 1), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, scales)


scales = jax.random.normal(keys[1], (32, 1), jnp.float32)
one_row = functools.partial(scale_rows, rows=1)
_course.check(LESSON, "scale_rows_one_row", one_row, lambda a, s: a * s, (x, scales), run,
              rtol=0, atol=0, cannot_compile={
                  "tpu": "one row per block breaks the (8, 128) rule, on purpose: the lowering "
                         "error is what this section reads"})
print(kernelsim.tpu_lowering_error(functools.partial(one_row, interpret=False), x, scales))

# %% [markdown]
# The kernel is right, and the check says so in interpret mode. On a TPU, `_course.check`
# tries to compile it, falls back to interpret mode when that fails and prints the fallback
# with the compiler's error; `cannot_compile={"tpu": ...}` declares that this kernel is meant
# to fail there (an undeclared fallback says the kernel should have compiled). The lowering's
# message reads, in order:
#
# * the rule: the last two block dimensions divisible by 8 and 128, or equal to the array's;
# * the culprit: `args[0]`, the first argument passed to the `pallas_call` (an output block
#   would read `outputs`, or `outputs[k]` when there are several), then the kernel's name and
#   the file and line of the call;
# * the evidence: the block shape (as `Blocked(block_size=...)` per dimension) beside the
#   array shape, the index map as a jaxpr, and the memory space.
#
# Here the second-to-last dimension is 1, neither a multiple of 8 nor 32. The lowering stops at
# the first bad operand, inputs before outputs; kernelsim's TPU model checks the same rule for
# every operand and lists them all:

# %%
for warning in kernelsim.trace(functools.partial(one_row, interpret=True), x,
                               scales).calls[0].warnings:
    print("kernelsim:", warning)
eight_rows = functools.partial(scale_rows, rows=8, interpret=False)
print("rows=8:", kernelsim.tpu_lowering_error(eight_rows, x, scales) or "lowers for TPU")

# %% [markdown]
# ## A wrong index map in the step table
#
# A bias row added to `x` in `(8, 128)` tiles, on a `(2, 4)` grid. The bias's index map
# should follow the column index `j`; this one follows `i`. Nothing raises: every block index
# is inside the array. Only the values are wrong.

# %%
def bias_add_kernel(x_ref, bias_ref, o_ref):
    o_ref[...] = x_ref[...] + bias_ref[...]


def bias_add(x, bias, *, bias_index_map, interpret):
    # j innermost: the bias block should change with j; x and the output are used once.
    return pl.pallas_call(
        bias_add_kernel,
        grid=(x.shape[0] // 8, x.shape[1] // 128),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                  pl.BlockSpec((1, 128), bias_index_map)],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        interpret=interpret,
    )(x, bias)


buggy_bias_add = functools.partial(bias_add, bias_index_map=lambda i, j: (0, i))  # BUG
xb = jax.random.normal(keys[2], (16, 512), jnp.float32)
bias = jax.random.normal(keys[3], (1, 512), jnp.float32)
wrong = buggy_bias_add(xb, bias, interpret=True) != xb + bias
print("wrong elements per 128-column block:", wrong.reshape(16, 4, 128).sum(axis=(0, 2)).tolist())

# %% [markdown]
# kernelsim's step table lists, for every step, the grid index and the block each operand
# uses. Put the output's block next to the bias's: the output column block is `j`, the bias
# column block is `i`.

# %%
t_bias = kernelsim.trace(functools.partial(buggy_bias_add, interpret=True), xb, bias)
blocks = {}
for e in t_bias.steps():
    blocks.setdefault((e.step, e.grid_index), {})[e.operand] = e.block_index
print(f"{'step':>4}  {'grid (i, j)':>11}  {'output block':>12}  {'bias block':>10}")
for (step, grid_index), used in blocks.items():
    print(f"{step:>4}  {grid_index!s:>11}  {used['o_ref']!s:>12}  {used['bias_ref']!s:>10}")

# %% [markdown]
# The heatmap says the same at a glance: bias blocks 2 and 3 are never fetched, and the first
# two serve every column. A block fetched zero times, or more often than the grid order
# explains, is the usual trace of a wrong index map.

# %%
t_bias.heatmap()

# %% [markdown]
# The step viewer shows the same run one step at a time; watch the bias block stay put while
# the output block moves along the row.

# %%
t_bias.show()

# %% [markdown]
# The fix is the map `(0, j)`. Checked against the reference, and counted: each bias block is
# now fetched twice, once per row of the grid, as the grid order explains.

# %%
fixed_bias_add = functools.partial(bias_add, bias_index_map=lambda i, j: (0, j))
_course.check(LESSON, "bias_add_fixed", fixed_bias_add, lambda a, b: a + b, (xb, bias), run,
              rtol=0, atol=0)


def bias_fetches(trace):
    """Fetches of each bias block over the run, by block column."""
    counts = [0] * 4
    for e in trace.steps():
        if e.operand == "bias_ref" and e.action == "fetch":
            counts[e.block_index[1]] += 1
    return counts


fixed_fetches = bias_fetches(kernelsim.trace(functools.partial(fixed_bias_add, interpret=True),
                                             xb, bias))
print("bias fetches per block, wrong map:", bias_fetches(t_bias), "| right map:", fixed_fetches)
assert bias_fetches(t_bias) == [1, 1, 0, 0] and fixed_fetches == [2, 2, 2, 2]

# %% [markdown]
# ## Checking assumptions: `checkify` around a kernel, `pl.debug_check` inside
#
# Many kernel bugs are bad inputs: a page table entry past the end of the cache, a negative
# length. Two tools state such assumptions, and they fire in different places.
#
# `jax.experimental.checkify` works on the JAX code *around* a kernel. `checkify.check(pred,
# msg)` in the wrapper, and `checkify.checkify(f)` turns the function into one that returns an
# error value beside its result, even under `jit`; `err.throw()` raises it. The program still
# runs to the end, so the wrapper also keeps the kernel safe (here by clamping). Inside a kernel
# body the pinned release cannot use it: `pallas_call` has no checkify rule, so a
# `checkify.check` in a kernel fails while tracing ("Cannot abstractly evaluate a
# checkify.check which was not functionalized").

# %%
from jax.experimental import checkify  # noqa: E402 - introduced here


def gather_row_kernel(ids_ref, row_ref, o_ref):
    del ids_ref  # used by the index map only
    o_ref[...] = row_ref[...]


def gather_rows_checked(table, ids, *, interpret):
    # the assumption the kernel's index map relies on, checked on the ids before the kernel
    checkify.check(jnp.all((ids >= 0) & (ids < table.shape[0])),
                   "row id out of range: the table has {n} rows", n=jnp.int32(table.shape[0]))
    # checkify reports, it does not stop the program: keep the kernel's reads in bounds anyway
    ids = jnp.clip(ids, 0, table.shape[0] - 1)
    row = pl.BlockSpec((None, 1, table.shape[2]), lambda i, ids: (ids[i], 0, 0))
    return pl.pallas_call(
        gather_row_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(ids.shape[0],),
                                               in_specs=[row], out_specs=pl.BlockSpec(
                                                   (None, 1, table.shape[2]),
                                                   lambda i, ids: (i, 0, 0))),
        out_shape=jax.ShapeDtypeStruct((ids.shape[0], 1, table.shape[2]), table.dtype),
        interpret=interpret,
    )(ids, table)


table = jax.random.normal(keys[1], (16, 1, 128), jnp.float32)
checked = jax.jit(checkify.checkify(functools.partial(gather_rows_checked,
                                                      interpret=pltpu.InterpretParams())))
err, rows = checked(table, jnp.array([3, 0, 15], jnp.int32))
print("good ids:", err.get(), "| rows match:", bool(jnp.all(rows[:, 0] == table[[3, 0, 15], 0])))
err, _ = checked(table, jnp.array([3, 16, 1], jnp.int32))
print("bad ids: ", err.get().splitlines()[0])
assert err.get() is not None and "out of range" in err.get()

# %% [markdown]
# `pl.debug_check(pred, msg)` goes *inside* the kernel and costs nothing unless checks are
# on: with `pl.enable_debug_checks(True)` the TPU lowering compiles it into an assertion of
# the Mosaic kernel (`cf.assert`), which stops the chip's program when it fails; without it
# the call is dropped. In the pinned release neither interpret mode evaluates it (the same
# kernel with a failing check runs to the end on this CPU), so it is a guard for the chip, not
# for interpret mode. The cell asks the lowering with `debug=True`, which prints the Mosaic
# module, and looks for the assertion.

# %%
import contextlib  # noqa: E402
import io  # noqa: E402


def sqrt_kernel(x_ref, o_ref):
    pl.debug_check(jnp.all(x_ref[...] >= 0), "negative input to sqrt")
    o_ref[...] = jnp.sqrt(x_ref[...])


def checked_sqrt(x, *, interpret, debug=False):
    block = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(sqrt_kernel, grid=(x.shape[0] // 8,), in_specs=[block],
                          out_specs=block, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=interpret, debug=debug)(x)


positive = jnp.abs(jax.random.normal(keys[2], (32, 128), jnp.float32))
for enabled in (False, True):
    mosaic = io.StringIO()
    with pl.enable_debug_checks(enabled), contextlib.redirect_stdout(mosaic):
        error = kernelsim.tpu_lowering_error(
            functools.partial(checked_sqrt, interpret=False, debug=True), positive)
    asserts = [line.strip() for line in mosaic.getvalue().splitlines() if "cf.assert" in line]
    print(f"enable_debug_checks({enabled}): lowers: {error is None}; "
          f"assertions in the TPU kernel: {asserts or 'none'}")
    assert error is None and bool(asserts) == enabled
with pl.enable_debug_checks(True):
    ran = checked_sqrt(positive.at[3, 3].set(-1.0), interpret=pltpu.InterpretParams())
print("TPU interpret mode with a failing check: NaNs in the result:",
      int(jnp.isnan(ran).sum()), "(no error raised)")

# %% [markdown]
# ## Profile it on hardware
#
# Everything so far ran on a CPU, where a kernel's time says nothing about a chip. On a TPU
# or GPU, wrap the calls in `jax.profiler.trace(logdir)` and open the result in XProf
# (TensorBoard's profile plugin) or, with `create_perfetto_trace=True`, in
# [Perfetto](https://ui.perfetto.dev). What to read there:
#
# * the device lane (one per TPU core or GPU stream), not the host lanes: the kernel appears
#   as one op named after the kernel function (a TPU custom call, a Triton or Mosaic GPU
#   kernel), once per call;
# * its duration against the gaps beside it: a kernel of a few microseconds between long gaps
#   is launch- or host-bound, and making it faster changes nothing;
# * for a TPU, XProf's op profile gives its FLOP rate and bandwidth utilisation: compare them
#   with the roofline of lesson 7.
#
# Put kernelsim's estimate beside the measured time: the estimate is a lower bound from bytes,
# FLOPs and per-step overhead, so a measurement far above it points at what the model leaves
# out (a compute-bound body, bank conflicts, a pipeline that does not overlap). The cell
# profiles when an accelerator is present and says so when it is not.

# %%
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

profile_x = jax.random.normal(keys[3], (1024, 1024), jnp.float32)
profiled = functools.partial(copy_rows, bm=256)  # 256 divides 1024 rows: its bug does not bite
estimate = kernelsim.trace(functools.partial(profiled, interpret=True), profile_x)
estimate_us = estimate.calls[0].estimated_seconds * 1e6
print(f"kernelsim's estimate on {estimate.chip.name}: {estimate_us:.1f} us")
if jax.default_backend() in ("tpu", "gpu"):
    fn = jax.jit(functools.partial(profiled, interpret=False))
    jax.block_until_ready(fn(profile_x))  # compile outside the profile
    logdir = Path(tempfile.mkdtemp(prefix="pallas-profile-"))
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
        start = time.perf_counter()
        for _ in range(10):
            out = fn(profile_x)
        jax.block_until_ready(out)
        measured_us = (time.perf_counter() - start) / 10 * 1e6
    print(f"measured on {jax.devices()[0].device_kind}: {measured_us:.1f} us per call, host "
          f"clock, launch included; the trace is in {logdir}:")
    for path in sorted(logdir.rglob("*"))[:6]:
        if path.is_file():
            print("  ", path.relative_to(logdir))
else:
    print(f"no accelerator here ({jax.default_backend()}): nothing to profile, and the number "
          "above is an estimate for a chip, not a measurement")

# %% [markdown]
# ## Find the bug
#
# A routine that works for the kernels of this course:
#
# 1. compare with a plain-JAX reference on shapes that are not multiples of the block, and
#    look at *where* the result is wrong (which blocks, which rows);
# 2. run in TPU interpret mode with the defaults: NaN for uninitialised memory, errors for
#    out-of-bounds reads; add `detect_races=True` when the kernel starts its own DMAs;
# 3. trace with kernelsim and read the step table and heatmap against what each step should
#    touch;
# 4. `pl.debug_print` the scalar that decides the suspicious step (an index, a mask count);
# 5. before a chip sees it, `kernelsim.tpu_lowering_error` with `interpret=False`.
#
# [Assignment 9](../exercises/) hands you five broken kernels to fix: a roll whose index map
# points the wrong way (`roll_rows`), row sums whose accumulator is never initialised
# (`row_sums`), a column maximum whose ragged-edge mask is off by one (`column_max`), a
# pooling kernel whose blocks the TPU lowering rejects (`pool_rows`) and lesson 5's
# hand-made double buffering with a read that races its DMA (`chunk_sum`).

# %% [markdown]
# ## Check yourself
#
# 1. A Python `print` and a `pl.debug_print` sit in the same kernel with `grid=(4,)`. How many
#    lines does each produce, and why?
# 2. Why might a test with `uninitialized_memory="zero"` pass a kernel that is wrong on a chip?
# 3. An index map returns block 4 of a 4-block array at step 0. What do `interpret=True`, TPU
#    interpret mode and kernelsim do?
# 4. The racy kernel returned the right values with `dma_execution_mode="eager"`. Is it
#    correct? What would you run to be sure?
# 5. A block-shape error from the lowering names `args[1]`. Which operand is it, and how
#    would the message name the output?
# 6. In the bias example's heatmap, what gives the bug away, and what should the bias row
#    show with the right index map?
#
# <details><summary>Answer</summary>
#
# 1. `print` one line, while the body is traced; `pl.debug_print` four lines, one per step,
#    because it is an operation of the traced program and runs each time a step does.
# 2. A forgotten write or an accumulator that was never initialised then reads as 0, which is
#    often the right starting value; on a chip the memory holds whatever was there before.
# 3. `interpret=True` clamps the start and silently reads the last block; TPU interpret mode
#    raises an out-of-bounds error naming the operand, block index and grid step; kernelsim
#    raises a `TraceError` naming the step and the valid block range.
# 4. No: the read is still unordered with the copy's write, and "eager" only happened to
#    finish the copy first. Run it with `pltpu.InterpretParams(detect_races=True)`.
# 5. The second argument passed to the `pallas_call` (counting from 0; in `scale_rows`, the
#    scales). Outputs are named `outputs`, or `outputs[k]` when there are several.
# 6. Bias blocks 2 and 3 show 0 fetches; with the right map (`(0, j)`) each of the four bias
#    blocks is fetched once per row of the grid, twice here.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 9 — find the
# bug](../exercises/09_debugging/debugging.ipynb).
