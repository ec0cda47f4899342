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
# # Lesson 14 — Across chips: remote copies, a ring all-gather and a collective matmul
#
# **Learning objectives.** After this lesson you can
#
# 1. run a Pallas kernel once per device with `jax.shard_map`, and simulate four TPUs on a CPU
#    in TPU interpret mode;
# 2. copy a buffer into another device's memory with `pltpu.make_async_remote_copy`, and say
#    what its send and receive semaphores count;
# 3. write a ring all-gather: each step forwards the shard that arrived last to the right-hand
#    neighbour;
# 4. overlap communication with compute in a collective matmul: multiply the shard on hand
#    while the next one travels, and count the bytes each device sends.
#
# Up to now every kernel ran on one chip. A TPU pod links its chips with the inter-chip
# interconnect (ICI), and a Pallas kernel can start a DMA whose destination is a buffer on
# another chip. That is how a collective (all-gather, reduce-scatter) is written by hand, and
# why it can be fused with the matmul that consumes it. TPU interpret mode simulates several
# devices, their memories, DMAs and semaphores; here four CPU devices stand in for four chips.
# Reference: [distributed computing in Pallas for TPUs](https://docs.jax.dev/en/latest/pallas/tpu/distributed.html).
# Matching exercises: assignment 13, a ring reduce-scatter one way and both ways round the
# ring, then in two receive slots, and an all-reduce
# ([`../exercises/13_across_chips/`](../exercises/13_across_chips/)).

# %% [markdown]
# JAX reads the number of CPU devices once, when its CPU backend starts, so the flag comes
# before anything imports JAX (here, before `_course`). A notebook kernel started for this
# lesson alone gets it; in a kernel that already ran JAX, restart it first.

# %%
import os

DEVICES = 4
FLAG = f"--xla_force_host_platform_device_count={DEVICES}"
if FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FLAG}".strip()

import functools  # noqa: E402 - after the device flag, on purpose

import _course  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

LESSON = "14-across-chips"
_course.versions()
# Four TPU chips if there are; otherwise four CPU devices (also beside a GPU, whose devices
# cannot run TPU copies), with the kernels in TPU interpret mode.
on_tpu = jax.default_backend() == "tpu" and jax.device_count() >= DEVICES
devices = (jax.devices() if on_tpu else jax.devices("cpu"))[:DEVICES]
assert len(devices) == DEVICES, f"{len(devices)} devices: restart the kernel (flag above)"
print(f"{len(devices)} devices: {[str(d) for d in devices]}")
# Remote copies need TPU interpret mode off a TPU; the race detector checks every DMA.
interpret = False if on_tpu else pltpu.InterpretParams(detect_races=True, vector_clock_size=64)
keys = jax.random.split(jax.random.key(14), 4)

# %% [markdown]
# ## One kernel per device: `shard_map`
#
# `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` runs `f` once per device of the
# mesh, on that device's shard of each argument. Put a `pallas_call` in `f` and the kernel
# runs on every device, each seeing only its local shard, and `jax.lax.axis_index("x")`
# tells it which device it is. Nothing is exchanged yet: the kernel doubles its shard.

# %%
mesh = jax.sharding.Mesh(np.array(devices), ("x",))


def double_kernel(x_ref, o_ref):
    o_ref[...] = 2.0 * x_ref[...]


def double_per_device(x, *, interpret):
    def local(x):  # x is this device's (rows / 4, cols) shard
        return pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=interpret)(x)

    return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)(x)


x = jax.random.normal(keys[0], (DEVICES * 8, 128), jnp.float32)
_course.check(LESSON, "double_per_device", double_per_device, lambda a: 2.0 * a, (x,),
              _course.Execution(interpret, "TPU interpret mode, 4 devices" if interpret
                                else "compiled for TPU"), rtol=0, atol=0)

# %% [markdown]
# ## A copy into another device: `make_async_remote_copy`
#
# `pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=...)` describes a DMA
# from `src` on this device to `dst` on the device `device_id` names (a dict from mesh axis to
# index, here `{"x": right}`). Two semaphores count it: `send_sem` on the sender, signalled
# when `src` has been read, and `recv_sem` on the receiver, signalled when `dst` is written.
# `.start()` issues it; `.wait()` on the descriptor waits for both, so every device runs the
# same code and each wait pairs with the neighbour's copy into it.
#
# A **ring all-gather**: device `d` owns shard `d`, and after `N - 1` steps every device
# holds all `N`. At step `s` device `d` forwards shard `(d - s) mod N`, the one it received
# last (its own at step 0), into the same rows of its right-hand neighbour's output; at the
# same time it receives shard `(d - 1 - s) mod N` from its left. No device writes rows another
# device is reading in the same step. On real chips no copy may land on a chip whose kernel
# has not started: a compiled TPU kernel runs behind a default device barrier for that
# (`pltpu.CompilerParams(skip_device_barrier=True)` turns it off), so this kernel needs no
# barrier of its own. A kernel that must also know its neighbours have reached some point
# signals them on a barrier semaphore (`pltpu.get_barrier_semaphore`, with a `collective_id`
# in `pltpu.CompilerParams`); interpret mode starts all four devices together.
# JAX ships a teaching version of this collective,
# `jax.experimental.pallas.ops.tpu.all_gather`: it starts with such a handshake and sends
# half of each shard each way round the ring, so the links in both directions carry data at
# every step.

# %%
def ring_all_gather_kernel(x_ref, o_ref, send_sems, recv_sems):
    n_dev = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, n_dev)
    m = x_ref.shape[0]
    o_ref[pl.ds(me * m, m), :] = x_ref[...]            # my own shard, in its place
    for step in range(DEVICES - 1):
        shard = jax.lax.rem(me - step + n_dev, n_dev)   # the shard that arrived last
        rows = o_ref.at[pl.ds(shard * m, m)]
        copy = pltpu.make_async_remote_copy(rows, rows, send_sems.at[step],
                                            recv_sems.at[step], device_id={"x": right})
        copy.start()
        copy.wait()  # my send has left and my left neighbour's shard has arrived


def ring_all_gather(x, *, interpret):
    def local(x):
        m, n = x.shape
        vmem = pl.BlockSpec(memory_space=pltpu.VMEM)  # small shards: whole arrays in VMEM
        return pl.pallas_call(
            ring_all_gather_kernel,
            out_shape=jax.ShapeDtypeStruct((DEVICES * m, n), x.dtype),
            in_specs=[vmem], out_specs=vmem,
            scratch_shapes=[pltpu.SemaphoreType.DMA((DEVICES - 1,)),
                            pltpu.SemaphoreType.DMA((DEVICES - 1,))],
            interpret=interpret,
        )(x)

    # every device returns the whole gathered array; P("x") stacks the four copies
    return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                         check_vma=False)(x)


def all_gather_reference(x):
    """What each of the four devices holds afterwards: all of x (plain JAX)."""
    return jnp.tile(x, (DEVICES, 1))


_course.check(LESSON, "ring_all_gather", ring_all_gather, all_gather_reference, (x,),
              _course.Execution(interpret, "TPU interpret mode, 4 devices, race detector on"
                                if interpret else "compiled for TPU"), rtol=0, atol=0)

# %% [markdown]
# Which shard each device forwards at each step: the diagonals are one shard travelling
# round the ring.

# %%
sent = np.array([[(d - s) % DEVICES for s in range(DEVICES - 1)] for d in range(DEVICES)])
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH * 0.6, 2.8))
# cells as wide as the axes (aspect="auto"): square ones were narrower than "shard 0"
shards = ax.imshow(sent, cmap="viridis", aspect="auto")
for (d, s), shard in np.ndenumerate(sent):  # black or white, whichever reads on the cell
    ax.text(s, d, f"shard {shard}", ha="center", va="center",
            color=_course.readable_ink(shards.cmap(shards.norm(shard))))
ax.set_xticks(range(DEVICES - 1), [f"step {s}" for s in range(DEVICES - 1)])
ax.set_yticks(range(DEVICES), [f"device {d}" for d in range(DEVICES)])
ax.set_title("ring all-gather: what each device sends right")
fig.tight_layout()

# %% [markdown]
# Each device sends `N - 1` shards and receives `N - 1`: `(N - 1) · m · n · 4` bytes each way
# over its links, the least an all-gather can move. Each step uses every link of the ring at
# once, but in one direction only: an ICI link carries data both ways, so this one-way ring
# leaves half of each link idle; JAX's bidirectional version above uses both halves.

# %%
m_local = x.shape[0] // DEVICES
per_device_bytes = (DEVICES - 1) * m_local * x.shape[1] * x.dtype.itemsize
print(f"each device sends {per_device_bytes:,} B in {DEVICES - 1} steps "
      f"({m_local * x.shape[1] * x.dtype.itemsize:,} B per step)")

# %% [markdown]
# ## A collective matmul: compute while the next shard travels
#
# `out = x @ w` with `x` sharded by rows and `w` by columns: device `d` holds rows block `d`
# of `x` and column block `d` of `w`, and owes column block `d` of `out`, which needs every
# row block of `x`. Gathering `x` first and then multiplying leaves the matrix unit idle for
# the whole all-gather. Instead each step starts forwarding the shard on hand, multiplies that
# same shard by `w` while the copy travels, and only then waits: the transfer hides behind
# the matmul when the matmul takes longer. (The all-gather above waited at once, with nothing
# to overlap.) A collective matmul in production also splits each shard into chunks and sends
# in both directions; the idea is the same.

# %%
def collective_matmul_kernel(x_ref, w_ref, o_ref, shards, send_sems, recv_sems):
    n_dev = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, n_dev)
    m = x_ref.shape[0]
    shards[me] = x_ref[...]
    for step in range(DEVICES):
        shard = jax.lax.rem(me - step + n_dev, n_dev)
        copy = None
        if step < DEVICES - 1:  # the last shard goes nowhere
            copy = pltpu.make_async_remote_copy(shards.at[shard], shards.at[shard],
                                                send_sems.at[step], recv_sems.at[step],
                                                device_id={"x": right})
            copy.start()
        # the matmul of the shard on hand overlaps its trip to the right
        o_ref[pl.ds(shard * m, m), :] = jnp.dot(shards[shard], w_ref[...], precision="highest",
                                                preferred_element_type=jnp.float32)
        if copy is not None:
            copy.wait()


def sharded_matmul(kernel, grid=()):
    """``x @ w`` over the mesh, ``kernel`` on each device: its rows of ``x`` and columns of
    ``w``, a scratch for the ``N`` row shards and a DMA semaphore per send and per receive."""
    def matmul(x, w, *, interpret):
        def local(x, w):  # x: (M / 4, K) rows of this device; w: (K, N / 4) columns
            m, k = x.shape
            vmem = pl.BlockSpec(memory_space=pltpu.VMEM)  # whole arrays, the same at every step
            return pl.pallas_call(
                kernel,
                grid=grid,
                out_shape=jax.ShapeDtypeStruct((DEVICES * m, w.shape[1]), jnp.float32),
                in_specs=[vmem, vmem], out_specs=vmem,
                scratch_shapes=[pltpu.VMEM((DEVICES, m, k), x.dtype),
                                pltpu.SemaphoreType.DMA((DEVICES - 1,)),
                                pltpu.SemaphoreType.DMA((DEVICES - 1,))],
                interpret=interpret,
            )(x, w)

        return jax.shard_map(local, mesh=mesh, in_specs=(P("x", None), P(None, "x")),
                             out_specs=P(None, "x"), check_vma=False)(x, w)

    return matmul


collective_matmul = sharded_matmul(collective_matmul_kernel)


xm = jax.random.normal(keys[1], (DEVICES * 16, 128), jnp.float32)
wm = jax.random.normal(keys[2], (128, DEVICES * 128), jnp.float32)
_course.check(LESSON, "collective_matmul", collective_matmul,
              functools.partial(jnp.dot, precision="highest"), (xm, wm),
              _course.Execution(interpret, "TPU interpret mode, 4 devices, race detector on"
                                if interpret else "compiled for TPU"), rtol=1e-4, atol=1e-3)

# %% [markdown]
# What overlaps with what, per device and step: the copy of `m · K` values against a
# `(m, K) @ (K, N/4)` matmul. The matmul hides the copy when its time exceeds the copy's,
# which the ratio of FLOPs to bytes sent decides: `2 · m · K · N/4` FLOPs against
# `m · K · 4` bytes is `N/8` FLOP per byte sent, against a chip's peak FLOP rate over its ICI
# bandwidth. Wider `w` shards hide the ring better.

# %%
m_local, k = xm.shape[0] // DEVICES, xm.shape[1]
n_local = wm.shape[1] // DEVICES
flops_per_step = 2 * m_local * k * n_local
bytes_per_step = m_local * k * xm.dtype.itemsize
print(f"per step: {flops_per_step:,} FLOPs of matmul against {bytes_per_step:,} B sent "
      f"({flops_per_step / bytes_per_step:.0f} FLOP per byte sent)")
assert flops_per_step / bytes_per_step == n_local / 2

# %% [markdown]
# ## kernelsim's view
#
# `kernelsim.trace` follows the `pallas_call` into the `shard_map` and analyses it once per
# device of the mesh, with `axis_index("x")` equal to that device's coordinate. Each remote
# copy is a body DMA with its step, bytes, and the devices it reads from and writes to (the
# `device_id` evaluated on the sender). Nothing runs: the copies come from the kernel's code.

# %%
import kernelsim  # noqa: E402

t_collective = kernelsim.trace(functools.partial(collective_matmul, interpret=True), xm, wm)
for c in t_collective.calls:
    for d in c.call.body_copies:
        if d.remote:
            print(f"device {d.src_device} -> {d.dst_device}  step {d.step}  "
                  f"{d.bytes:,} B  {d.src}[{d.src_slice[0][0]}]  signals {d.semaphore}")
sent = [sum(d.bytes for d in c.call.body_copies if d.remote) for c in t_collective.calls]
print(f"bytes each device sends: {sent}")
assert sent == [(DEVICES - 1) * m_local * k * xm.dtype.itemsize] * DEVICES  # N - 1 shards

# %% [markdown]
# Every device sends its three shards to its right-hand neighbour, 8,192 B each: the ring of
# the figure above, now read from the kernel. A grid of one step holds the whole loop, so
# the copies share step 0; their order is the order of their starts in the body (the next
# section gives each ring step a grid step of its own).
# `kernelsim.verify` runs the same program in TPU interpret mode and compares every copy,
# remote ones included, with this trace.

# %%
from kernelsim.verify import verify  # noqa: E402

v = verify(functools.partial(collective_matmul, interpret=True), xm, wm)
print(v.report())
assert v.ok

# %% [markdown]
# ## One ring step per grid step
#
# The loop can also be the grid: with `grid=(N,)`, grid step `s` is ring step `s`. Scratch
# buffers and semaphores live for the whole `pallas_call`, so a copy started at one grid
# step can be waited on at the next: step `s` first waits for the copy of step `s - 1`
# (the shard it brought is now here), then starts forwarding that shard, then multiplies it
# while it travels. Each copy is in flight across two grid steps, which the viewer below
# shows step by step.

# %%
def ring_matmul_kernel(x_ref, w_ref, o_ref, shards, send_sems, recv_sems):
    step = pl.program_id(0)
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, DEVICES)
    m = x_ref.shape[0]
    shard = jax.lax.rem(me - step + DEVICES, DEVICES)  # the shard on hand at this step

    def forward(s):  # the copy that carries shard (me - s) to the right at step s
        held = jax.lax.rem(me - s + DEVICES, DEVICES)
        return pltpu.make_async_remote_copy(shards.at[held], shards.at[held], send_sems.at[s],
                                            recv_sems.at[s], device_id={"x": right})

    @pl.when(step == 0)
    def _():
        shards[me] = x_ref[...]

    @pl.when(step > 0)
    def _():
        forward(step - 1).wait()  # my last send has left; `shard` has arrived from the left

    @pl.when(step < DEVICES - 1)  # the last shard goes nowhere
    def _():
        forward(step).start()

    o_ref[pl.ds(shard * m, m), :] = jnp.dot(shards[shard], w_ref[...], precision="highest",
                                            preferred_element_type=jnp.float32)


# one ring step per grid step: each one needs the last one's copy
collective_matmul_grid = sharded_matmul(ring_matmul_kernel, grid=(DEVICES,))


_course.check(LESSON, "collective_matmul_grid", collective_matmul_grid,
              functools.partial(jnp.dot, precision="highest"), (xm, wm),
              _course.Execution(interpret, "TPU interpret mode, 4 devices, race detector on"
                                if interpret else "compiled for TPU"), rtol=1e-4, atol=1e-3)

# %% [markdown]
# kernelsim now places each remote copy at the grid step that starts it, and knows the step
# that waits on it. The viewer shows one device's call (device 1 here; the picker switches
# devices): its ICI lane lists the copies in flight at each step, with their devices, bytes
# and semaphore. Step through it: at step 0 one copy leaves for device 2; at steps 1 and 2 the
# copy waited on and the one just started are both in flight; the last step only waits.

# %%
t_grid = kernelsim.trace(functools.partial(collective_matmul_grid, interpret=True), xm, wm)
sends = [(d.step, d.wait_step, d.dst_device, d.bytes)
         for d in t_grid.calls[1].call.body_copies if d.remote]
print("device 1's copies (started at step, waited on at step, to device, bytes):", sends)
assert sends == [(s, s + 1, 2, m_local * k * xm.dtype.itemsize) for s in range(DEVICES - 1)]
t_grid.show(call=1)

# %% [markdown]
# `kernelsim.verify` compares these copies with the ones TPU interpret mode performs.

# %%
v_grid = verify(functools.partial(collective_matmul_grid, interpret=True), xm, wm)
print(v_grid.report())
assert v_grid.ok

# %% [markdown]
# ## A buffer used again: two slots and a semaphore that frees them
#
# The all-gather lands every shard in rows of its own, so no buffer is ever written twice. A
# reduce-scatter (assignment 13) adds what arrives to its own rows and sends the sum on: it
# needs a receive buffer. One per step costs `N - 1` chunks of VMEM, which on a pod of 256 chips
# no longer fits; the distributed guide's reduce-scatter keeps **two slots** and uses them in
# turn, whatever `N` is.
#
# Reusing a slot opens a race the DMA semaphores do not close. A copy's `.wait()` says *my*
# data has arrived, not that *my neighbour* has finished reading what I sent it earlier. A left
# neighbour one step ahead may start its next copy into a slot this device is still reading.
# So the receiver tells the sender, with a second kind of semaphore:
#
# - `pltpu.SemaphoreType.REGULAR((2,))` in the scratch: one counter per slot, on every device.
# - `pl.semaphore_signal(free.at[slot], 1, device_id={"x": left})` adds 1 to the *left*
#   neighbour's counter: "I have read this slot; fill it again".
# - `pl.semaphore_wait(free.at[slot], 1)` waits until this device's own counter reaches 1,
#   then takes it back down: a sender waits before refilling a slot.
#
# Every signal must be waited on before the kernel ends: TPU interpret mode prints a warning
# for a semaphore left above 0 at kernel exit (it does not fail the kernel), and the docstring
# of JAX's barrier semaphore warns that one not waited back down to 0 corrupts the semaphores.
# TPU interpret mode's race detector (`pltpu.InterpretParams(detect_races=True)`) sees the
# missing signal even when the values come out right, as a write into a slot with no wait
# ordering it after the owner's read.
#
# ## An all-reduce from two collectives
#
# A reduce-scatter leaves device `d` with chunk `d` summed; an all-gather of those chunks then
# gives every device the whole sum. That is the **ring all-reduce**: each device sends
# `N - 1` chunks in each half, `2 (N - 1) · m · n` elements in all, `2 (N - 1) / N` of its
# array: the bandwidth-optimal amount for an all-reduce. The all-gather half needs no slots:
# each chunk lands in its own rows of the output.
#
# ## Telling XLA what a collective sends
#
# XLA cannot see inside a kernel. `pl.CostEstimate` has a field for the links as well as the
# FLOPs and the HBM bytes: `remote_bytes_transferred`, the bytes this call sends to other
# devices. For the all-gather above that is `(N - 1) · m · n · 4` bytes per device; whatever
# in XLA weighs the call has only the estimate to go on (lesson 7). kernelsim
# reads the same field (`CallTrace.cost_estimate`) and counts the remote copies themselves, so
# the two can be compared: assignment 13's graded rules do exactly that.

# %% [markdown]
# ## Check yourself
#
# 1. Why does the lesson set `XLA_FLAGS` before importing `_course`, and what would
#    `jax.devices()` show otherwise?
# 2. In the ring all-gather, which semaphore does a device's `copy.wait()` wait on for the
#    data *it receives*, and who signals it?
# 3. Why may the all-gather forward shard `(d - s) mod N` at step `s` without a barrier, but
#    not shard `(d - s - 1) mod N`?
# 4. With `x` of `(64, 128)` and `w` of `(128, 512)` on four devices, how many bytes does each
#    device send, and how many FLOPs does it compute per step?
#
# <details><summary>Answer</summary>
#
# 1. JAX reads the CPU device count once, when its CPU backend starts; `_course` imports JAX
#    and starts it. Without the flag `jax.devices()` lists one CPU device and the mesh of four
#    cannot be built.
# 2. Its `recv_sem` entry for that step: the left neighbour's copy signals it on this device
#    when the rows have been written. The same descriptor's wait also waits for this device's
#    own send (its `send_sem`).
# 3. Shard `(d - s) mod N` is already here (its own, or waited for at the end of step
#    `s - 1`); shard `(d - s - 1) mod N` is the one arriving during step `s`, and forwarding
#    it before its wait would send rows that are still being written.
# 4. Shards of `16 × 128` float32 values: `3 × 8,192 = 24,576` B sent; per step
#    `2 · 16 · 128 · 128 = 524,288` FLOPs.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 13 — across chips: a ring
# reduce-scatter](../exercises/13_across_chips/across_chips.ipynb).
