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
# # Lesson 7 — Performance
#
# **Learning objectives.** After this lesson you can
#
# 1. bound a kernel's time from below with the roofline: FLOPs over peak, bytes over
#    bandwidth;
# 2. compute arithmetic intensity and compare it with a chip's ridge point;
# 3. explain, with kernelsim's per-chip estimates, why 128-blocks reach only a few percent of
#    a TPU v5e's peak and large blocks about 90 %;
# 4. account for the fixed cost of every grid step;
# 5. measure a kernel when an accelerator is present — and know when you are only estimating;
# 6. tell XLA what a kernel costs with a `pl.CostEstimate` whose counts are those of the blocks
#    a sweep chose.
#
# Rules and published numbers here: the [TPU matmul guide](https://docs.jax.dev/en/latest/pallas/tpu/matmul.html),
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html) and
# [software pipelining](https://docs.jax.dev/en/latest/pallas/pipelining.html).
# Matching exercises: [`../exercises/`](../exercises/).

# %%
import functools
import re

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.backend import choose, platform
from kernelsim.chips import CHIPS
from kernelsim.timing import time_call

LESSON = "07-performance"
_course.versions()
V5E = CHIPS["tpu-v5e"]


def show(rows):
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths, strict=True)))


# %% [markdown]
# ## The roofline
#
# A kernel cannot finish faster than its arithmetic allows, nor faster than its memory traffic
# allows:
#
# $$t \;\ge\; \max\left(\frac{\text{FLOPs}}{P},\; \frac{\text{HBM bytes}}{W}\right)$$
#
# with `P` the peak FLOP/s and `W` the HBM bandwidth. The ratio *FLOPs / bytes* is the
# kernel's **arithmetic intensity**; the chip's ratio `P / W` is its **ridge point**. Below
# the ridge a kernel is memory-bound, above it compute-bound.

# %%
for name in ("tpu-v5e", "tpu-v6e", "h100"):
    chip = CHIPS[name]
    print(f"{name:8} bf16 peak {chip.peak_flops_bf16 / 1e12:6.0f} TFLOP/s, HBM "
          f"{chip.hbm_bytes_per_second / 1e9:5.0f} GB/s, ridge "
          f"{chip.ridge_flops_per_byte:4.0f} FLOP/B")

# %% [markdown]
# These numbers are kernelsim's chip table, each with its source. JAX keeps its own:
# `pltpu.get_tpu_info()` describes the TPU the code runs on (per TensorCore), and
# `pltpu.get_tpu_info_for_chip(version, cores)` any chip JAX knows, from any machine. On a CPU
# the first raises (there is no TPU to describe), so the cell asks for a v5e by name there.

# %%
if platform() == "tpu":
    info = pltpu.get_tpu_info()
else:
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V5E, 1)
print(f"JAX's {info.chip_version}: bf16 {info.bf16_ops_per_second / 1e12:.0f} TFLOP/s, HBM "
      f"{info.mem_bw_bytes_per_second / 1e9:.0f} GB/s, VMEM {info.vmem_capacity_bytes // 2**20} "
      f"MiB, {info.num_cores} TensorCore(s)")
if info.chip_version == pltpu.ChipVersion.TPU_V5E:  # the same chip as kernelsim's table
    assert info.bf16_ops_per_second == V5E.peak_flops_bf16
    assert abs(info.mem_bw_bytes_per_second / V5E.hbm_bytes_per_second - 1) < 0.01

# %% [markdown]
# An elementwise add of `float32` arrays does one FLOP per 12 bytes moved: hopelessly below any
# ridge. A matmul can be anywhere — it depends on the blocks.

# %% [markdown]
# ## The kernel we will tune
#
# The `k`-innermost matmul of lessons 4 and 5, with a `float32` VMEM accumulator, written as a
# factory over the block sizes `(bm, bk, bn)`. It uses TPU-only features (scratch,
# `pltpu.CompilerParams`).

# **Precision on the MXU.** The MXU multiplies bfloat16 and adds in float32. A bfloat16 dot is
# one pass and needs no precision (Mosaic refuses `precision="highest"` on bfloat16 operands:
# "Bad lhs type"), only `preferred_element_type=jnp.float32` for the accumulator. A float32
# dot is built from bfloat16 passes: at JAX's default precision one pass (each operand
# rounded to bfloat16's 8 mantissa bits), at `precision="highest"` several, which together
# keep float32's 24. Measured on a TPU v5e on 2026-12-05 (its JAX release: lessons/CHECKED.md):
# a float32 dot at the default precision was 0.178 off float64, at "highest" 7.6e-6. So
# every float32 dot in this course, kernel and reference, says `precision="highest"`, and
# every bfloat16 dot says none; a kernel that takes either says
# `"highest" if x.dtype == jnp.float32 else None`. The passes cost time: "highest" does
# several MXU passes where bfloat16 does one, a reason the kernels we tune here are bfloat16.

# %%
def matmul_kernel(a_ref, b_ref, o_ref, acc_ref, *, k_steps):
    # k_steps: the grid's length along k. The first step stores its product (no zeroing pass),
    # the last adds its own and writes the output (no extra read of the accumulator), so the
    # float32 accumulator is read and written two times fewer than "zero, add every step, copy
    # out"; with one k step the product goes straight to the output.
    kk = pl.program_id(2)
    product = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
    if k_steps == 1:
        o_ref[...] = product.astype(o_ref.dtype)
        return

    @pl.when(kk == 0)
    def _first():
        acc_ref[...] = product

    @pl.when(jnp.logical_and(kk > 0, kk < k_steps - 1))
    def _middle():
        acc_ref[...] += product

    @pl.when(kk == k_steps - 1)
    def _last():
        o_ref[...] = (acc_ref[...] + product).astype(o_ref.dtype)


def matmul(a, b, *, bm=128, bk=128, bn=128, cost=None, vmem_limit=None, interpret):
    # cost: the pl.CostEstimate handed to XLA (the section "Telling XLA what a kernel costs");
    # vmem_limit: bytes of scoped VMEM the compiler may use (None: its default, 16 MiB on a
    # v5e), raised for the largest blocks
    m, k = a.shape
    n = b.shape[1]
    # k innermost: the output block and accumulator stay on chip for the whole k loop;
    # A is re-read N/bn times and B M/bm times.
    return pl.pallas_call(
        functools.partial(matmul_kernel, k_steps=k // bk),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        cost_estimate=cost,
        interpret=interpret,
    )(a, b)


def matmul_reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


ka, kb = jax.random.split(jax.random.key(7))
a = jax.random.normal(ka, (256, 256), jnp.bfloat16)
b = jax.random.normal(kb, (256, 256), jnp.bfloat16)
tpu_run = choose(tpu_features=True)
# Outputs of size ~16; one bf16 rounding step there is 0.125.
_course.check(LESSON, "matmul_128", matmul, matmul_reference, (a, b), tpu_run,
              rtol=1e-2, atol=0.25)
_course.check(LESSON, "matmul_256x128x256", functools.partial(matmul, bm=256, bk=128, bn=256),
              matmul_reference, (a, b), tpu_run, rtol=1e-2, atol=0.25)

# %% [markdown]
# ## Intensity of one grid step
#
# Step `(i, j, k)` multiplies a `bm × bk` block by a `bk × bn` block: `2·bm·bk·bn` FLOPs for
# `(bm·bk + bk·bn)·s` bytes of input (`s` bytes per element). For square blocks `b` that is
# `b / s` FLOP/B — 64 for `bfloat16` 128-blocks, far below v5e's ridge of about 240. kernelsim
# computes the whole call's intensity from all counted bytes, the output's included, so its
# value sits a little below `b / s`: the output is written once, while the inputs are read
# `n / b` times.

# %%
n = 4096
square = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
rows = [["blocks (bm, bk, bn)", "steps", "FLOP/B (kernelsim)", "b/s", "bound"]]
for blk in (128, 256, 512):
    call = kernelsim.trace(functools.partial(matmul, bm=blk, bk=blk, bn=blk, interpret=True),
                           square, square, chip="tpu-v5e").calls[0]
    cost = call.cost
    bound = "compute" if cost.compute_seconds >= cost.memory_seconds else "memory"
    rows.append([(blk, blk, blk), f"{call.steps:,}", f"{cost.arithmetic_intensity:.0f}",
                 blk // 2, bound])
    assert cost.arithmetic_intensity < blk // 2  # the output's bytes pull it below b / s
show(rows)

# %% [markdown]
# ## Per-step overhead
#
# The roofline ignores that each grid step has a fixed cost: the pipeline issues DMAs, waits
# on semaphores and runs the scalar bookkeeping. kernelsim charges a constant per step. On a
# v5e it is 0.22 µs, **fitted on this very matmul's device time on a TPU v5e** (with a fixed
# cost per call of 8 µs and the chip's matmul and copy rates; the chip table records the
# recorded run). So agreement at `n = 4096` and `8192` below is largely by construction.

# %%
print(V5E.per_step_seconds, "s per step;", V5E.sources[2])

# %% [markdown]
# kernelsim's timeline of a `1024³` matmul with 128-blocks shows it. The top plot is the bytes
# each of the 512 steps moves; the bar below is the roofline estimate on a v5e, where the
# per-step overhead is larger than the memory and the compute time together.

# %%
square_1024 = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
t_1024 = kernelsim.trace(functools.partial(matmul, interpret=True), square_1024, square_1024,
                         chip="tpu-v5e")
cost_1024 = t_1024.to_dict()["calls"][0]
assert cost_1024["steps"] == 512
assert cost_1024["overhead_seconds"] > cost_1024["memory_seconds"] + cost_1024["compute_seconds"]
t_1024.timeline()

# %% [markdown]
# ## A block-size sweep, against the published table
#
# The TPU matmul guide times `bfloat16` matmuls on a TPU v5e and reports the percentage of
# peak FLOP/s reached. kernelsim traces the same kernels (index maps only — nothing this size
# runs here) and estimates `max(compute, memory) + steps × per-step cost + a fixed cost per
# call`, with constants fitted on a TPU v5e; percentage of peak is `2·n³ / P` over that estimate.

# %%
PUBLISHED = {  # JAX TPU matmul guide, TPU v5e, bf16: % of peak, sizes 1024, 4096, 8192
    (128, 128, 128): (3.66, 5.93, 6.08),
    (512, 1024, 1024): (8.58, 78.47, 91.50),
}
CONFIGS = [(128, 128, 128), (256, 256, 256), (512, 512, 512), (512, 1024, 1024)]
SIZES = (1024, 4096, 8192)

estimates = {}
rows = [["blocks", "n", "steps", "compute", "memory", "overhead", "kernelsim % peak",
         "published % peak"]]
for cfg in CONFIGS:
    bm, bk, bn = cfg
    for si, n in enumerate(SIZES):
        arr = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
        fn = functools.partial(matmul, bm=bm, bk=bk, bn=bn, interpret=True)
        d = kernelsim.trace(fn, arr, arr, chip="tpu-v5e").to_dict()["calls"][0]
        pct = 100 * (2 * n**3 / V5E.peak_flops_bf16) / d["estimated_seconds"]
        estimates[cfg, n] = pct
        published = PUBLISHED.get(cfg, (None,) * 3)[si]
        rows.append([cfg, n, f"{d['steps']:,}", f"{d['compute_seconds'] * 1e6:.0f} us",
                     f"{d['memory_seconds'] * 1e6:.0f} us",
                     f"{d['overhead_seconds'] * 1e6:.0f} us", f"{pct:.1f}",
                     "-" if published is None else f"{published:.2f}"])
show(rows)

# %%
fig, ax = plt.subplots(figsize=(_course.FIGURE_WIDTH, 4))
for cfg in CONFIGS:
    ax.plot(SIZES, [estimates[cfg, n] for n in SIZES], marker="o", label=f"kernelsim {cfg}")
for cfg, pcts in PUBLISHED.items():
    ax.plot(SIZES, pcts, linestyle="--", marker="x", color="black", alpha=0.6)
    ax.annotate(f"published {cfg}", (SIZES[-1], pcts[-1]),
                xytext=(-120, 6), textcoords="offset points")
ax.set_xscale("log", base=2)
ax.set_xlabel("n (square bf16 matmul n × n × n)")
ax.set_ylabel("% of v5e bf16 peak")
ax.set_ylim(0, 105)
ax.legend(loc="center right")
fig.tight_layout()

# %% [markdown]
# The shape matches: 128-blocks stay near 6-7 % however big the matrices get, because every step is
# tiny and the fixed cost per step dominates; `(512, 1024, 1024)` blocks get close to peak because
# each step does enough arithmetic to hide its copies and its overhead. kernelsim estimates 93 % of
# peak at `n = 4096` and 94 % at 8192 for them; on a TPU v5e's device time they ran at 90.6 % and
# 94.6 % (`bench/recorded/tpu_perf_model-v5e.json`, calls inside one jitted loop: the next
# section).
#
# The guide's 78.5 and 91.5 % are lower because it timed its calls one after another from Python,
# as this course first did: 79.2 % and 91.9 % that way (`bench/recorded/tpu_perf-v5e.json`). The
# difference is the host dispatching each separately jitted call, about 0.12-0.17 ms, not anything
# the chip does. It is what makes the guide's `n = 1024` figure 8.6 %: on a TPU v5e this matmul at
# `n = 1024` took 17 µs of device time, 171 µs per call dispatched one by one from Python, and
# 569 µs for one call synced on its own; a copy of one `(8, 128)` tile took 1.2, 158 and 510 µs
# (`bench/recorded/speed-v5e.json`, `timing_methods`). At 17 µs the matmul runs at 64 % of peak;
# kernelsim, whose fixed cost per call is the chip's few microseconds of starting a kernel, says
# 55 %.

# %%
assert 5 < estimates[(128, 128, 128), 8192] < 9
# the large blocks: on device time 90.6 % (n = 4096) and 94.6 % (8192) on a TPU v5e; 64 % at 1024
assert 85 < estimates[(512, 1024, 1024), 4096] < 97 and 88 < estimates[(512, 1024, 1024), 8192] < 98
assert 40 < estimates[(512, 1024, 1024), 1024] < 70

# %% [markdown]
# ## Measuring on a real backend
#
# An estimate is a hypothesis. On a TPU, time the compiled kernel against `jnp.dot`. What to
# time is the **device's** time: `kernelsim.timing.time_call` runs the call many times inside
# one jitted loop (each call's operands tied to the previous result, so XLA can neither hoist
# the call out of the loop nor merge the calls) and divides, after a warm-up that compiles
# it. Beside it, it reports the **dispatched** time: calls issued one by one from Python, then
# synced. That adds the host's dispatch of each separately jitted call, about 0.12-0.17 ms on
# a TPU v5e, which hides every kernel shorter than that (the next section's fixed cost).
# On this course's CPU runs there is nothing to measure: interpret mode times the
# interpreter, not the kernel.

# %%
if platform() == "tpu":
    n = 4096
    x = jax.random.normal(ka, (n, n), jnp.bfloat16)
    y = jax.random.normal(kb, (n, n), jnp.bfloat16)
    for cfg in ((128, 128, 128), (512, 1024, 1024), (1024, 4096, 1024)):
        fn = functools.partial(matmul, bm=cfg[0], bk=cfg[1], bn=cfg[2], vmem_limit=100 * 2**20,
                               interpret=False)
        try:
            timed = time_call(fn, (x, y))
        except Exception as err:  # noqa: BLE001 - a compile error: say so and time the rest
            print(f"{cfg}: does not compile on this chip, nothing to time "
                  f"({type(err).__name__}: {str(err).strip().splitlines()[0][:120]})")
            continue
        print(f"{cfg}: device {timed.device_s * 1e6:.0f} us "
              f"({100 * 2 * n**3 / V5E.peak_flops_bf16 / timed.device_s:.1f} % of v5e peak; "
              f"adjust the peak for your chip), dispatched {timed.dispatched_s * 1e6:.0f} us")
    timed = time_call(jnp.dot, (x, y))
    print(f"jnp.dot: device {timed.device_s * 1e6:.0f} us, dispatched "
          f"{timed.dispatched_s * 1e6:.0f} us")
else:
    print(f"No TPU present (backend: {platform()}): nothing measured here. The numbers above "
          "are kernelsim estimates; this kernel uses TPU-only features, so on a GPU it runs "
          "interpreted and its timing says nothing about the hardware.")

# %% [markdown]
# ### Against XLA's own matmul
#
# With large blocks the kernel competes with `jnp.dot`, XLA's own TPU matmul. On a TPU v5e
# (`bench/recorded/speed-v5e.json`, device time, each side at its fastest; its JAX release:
# lessons/CHECKED.md):
#
# | n | this kernel | blocks | `jnp.dot` | speed against `jnp.dot` |
# | --- | --- | --- | --- | --- |
# | 4096 | 0.728 ms (95.8 % of peak) | (512, 4096, 1024) | 0.716 ms (97.5 %) | 0.98 |
# | 8192 | 5.705 ms (97.8 %) | (1024, 4096, 1024) | 5.887 ms (94.8 %) | 1.03 |
#
# Two changes got it there (`bench/recorded/speed_probe-v5e-matmul.json`): blocks as long as
# the whole `K` or half of it, so few steps pay the fixed cost of a step, and the accumulator
# pattern of `matmul_kernel` above (the first step stores its product, the last writes the
# output), 1-3 % faster than zeroing the accumulator and copying it out. At `n = 4096` XLA
# stays 12 µs ahead. That is about what the first blocks take to arrive: the pipeline overlaps
# each copy with the step before it, except the first, and `(512, 4096)` of `A` with
# `(4096, 1024)` of `B` are 12 MiB, 15 µs at the v5e's 819 GB/s. Smaller blocks arrive sooner
# but make more steps: `(1024, 2048, 1024)` took 0.742 ms. At `n = 8192` the same wait is a
# quarter of a percent of the time, and the kernel is ahead.

# %% [markdown]
# ## A sweep, and telling XLA what a kernel costs
#
# A sweep times every candidate and keeps the fastest. `kernelsim.run(fn, *args,
# measure=True)` runs `fn`, times each of its kernels compiled on the device
# (`kernelsim/timing.py`: device time, as above) and puts the time beside the estimate
# (`call.measured.seconds`); with no accelerator, `measured` says so and only the estimate is
# there. The cell below sweeps three blockings of a `1024³` matmul and names its source.
#
# XLA cannot look inside a kernel. To the rest of the program a `pallas_call` is one custom call,
# and its cost is what the call says: a `pl.CostEstimate(flops=..., bytes_accessed=...,
# transcendentals=...)` passed as `cost_estimate=`. The TPU lowering writes it into the custom
# call's configuration (the cell finds it there). Whatever in XLA weighs an op, its scheduler for
# one when it chooses what to run beside a long op, has only these numbers to go on for the kernel
# (what XLA does with them lives in XLA and libtpu, not in JAX; this course has not measured an
# effect). Nothing checks them against the kernel (only that each is an `int`), and a wrong estimate
# changes no result. So make them the kernel's own for the blocks the sweep chose: the matmul's
# `2·M·N·K` FLOPs, the bytes *those blocks* move (kernelsim's count, re-reads included, not each
# array once: the 256-blocks below move three times what the largest blocks move) and the `exp`,
# `tanh` and the like it evaluates (none here). JAX's transformations scale it: `jax.jvp` of the
# call doubles it, `jax.vmap` multiplies it by the batch size (and drops it when that size is
# symbolic).

# %%
n = 1024
sweep_shape = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
on_chip = platform() == "tpu"
sweep = []
for blocks in ((128, 128, 128), (256, 256, 256), (512, 1024, 1024)):
    fn = functools.partial(matmul, bm=blocks[0], bk=blocks[1], bn=blocks[2], interpret=True)
    if on_chip:
        x = jax.random.normal(ka, (n, n), jnp.bfloat16)
        fn = functools.partial(fn, interpret=False)
        call = kernelsim.run(fn, x, x, measure=True)[1].calls[0]
        seconds = call.measured.seconds or float("inf")  # inf: the chip refused these blocks
    else:
        call = kernelsim.trace(fn, sweep_shape, sweep_shape, chip="tpu-v5e").calls[0]
        seconds = call.estimated_seconds
    sweep.append((seconds, blocks, call))
print("seconds:", "measured on this " + jax.devices()[0].device_kind if on_chip
      else "kernelsim's estimate for a TPU v5e (no accelerator here)")
for seconds, blocks, call in sorted(sweep):
    print(f"  {blocks}: {seconds * 1e6:8.1f} us, {call.hbm_read_bytes + call.hbm_write_bytes:,} B")
best_seconds, best_blocks, best_call = min(sweep)

cost = pl.CostEstimate(flops=2 * n**3, transcendentals=0,
                       bytes_accessed=best_call.hbm_read_bytes + best_call.hbm_write_bytes)
costed = functools.partial(matmul, bm=best_blocks[0], bk=best_blocks[1], bn=best_blocks[2],
                           cost=cost, interpret=False)
lowered = jax.jit(costed).trace(sweep_shape, sweep_shape).lower(lowering_platforms=("tpu",))
config = dict(re.findall(r"\\22(\w+)\\22:(\d+)", lowered.as_text()))  # the custom call's JSON
print("in the TPU custom call's configuration:", config)
assert int(config["bytes_accessed"]) == cost.bytes_accessed
assert int(config["flops"]) == 2 * n**3

# %% [markdown]
# ## Check yourself
#
# 1. A kernel moves 1 GB and does 100 GFLOP on a v5e. Which term of the roofline binds?
# 2. What is the per-step arithmetic intensity of `bfloat16` 256-blocks, inputs only?
# 3. Why do 128-blocks stay near 6 % of peak even at `n = 8192`, where the matmul is large?
# 4. kernelsim matches the published 128-block column. Why is that weak evidence, and which
#    column is the real test?
# 5. Why time a kernel only after a first call?
# 6. Two blockings of the same matmul hand XLA the same FLOPs in their `pl.CostEstimate`.
#    Why not the same `bytes_accessed`?
#
# <details><summary>Answer</summary>
#
# 1. Memory: 1 GB / 819 GB/s ≈ 1.2 ms, against 100 GFLOP / 197 TFLOP/s ≈ 0.5 ms. (Its
#    intensity, 100 FLOP/B, is below the ridge of about 240.)
# 2. `2·256³ / (2·256²·2 B)` = 128 FLOP/B.
# 3. The number of steps grows like `n³ / 128³`, and each step's fixed cost (≈ 0.22 µs on a v5e) is
#    larger than its copy and compute time, so time per FLOP does not improve with `n`.
# 4. Its per-step constant was fitted on 128- to 1024-blocks timed on a TPU v5e at `n = 4096`
#    and `8192`, so agreement there is by construction. The real test is what the fit did not
#    see: the matmuls at `n = 2048` (device time within 0.93–1.04 of the estimate) and other
#    kernels. One matching column supports the model's account of large problems; it does not
#    show that kernelsim predicts a given kernel's time — measure it.
# 5. The first call traces and compiles the kernel.
# 6. The FLOPs are the product's, whatever the blocks; the bytes are what the blocks move, and
#    smaller blocks re-read `A` and `B` more often (the sweep's table shows it).
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 6 —
# performance](../exercises/06_performance/performance.ipynb).
