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
# # Lesson 12 — Toward production: reading JAX's own flash attention
#
# **Learning objectives.** After this lesson you can
#
# 1. run a kernel that ships with JAX on the CPU, in TPU interpret mode, and check it against
#    plain JAX;
# 2. read a production kernel's grid, dimension semantics, BlockSpecs and scratch, and say what
#    each grid axis reuses and which axes may be split between cores;
# 3. measure its traffic, step count and estimated time against the course's own kernel with
#    kernelsim, and trade its DMA block size against per-step overhead;
# 4. explain how it skips causal blocks — `pl.when` for the work, an index map that repeats a
#    block for the copies — and count the copies that saves, or wastes;
# 5. read splash attention's mask information as scalar-prefetch tables that steer the index
#    maps;
# 6. check a configuration against the TPU lowering's block rules and the VMEM budget before
#    it reaches a TPU;
# 7. follow its backward pass through `jax.custom_vjp`: which residuals it saves, and what
#    they cost the backward kernels.
#
# Every earlier lesson built one piece; here they all appear in one kernel that people run in
# production, `jax.experimental.pallas.ops.tpu.flash_attention`, and its successor, splash
# attention. We read the pinned release's source with kernelsim beside it. References:
# [TPU pipelining](https://docs.jax.dev/en/latest/pallas/tpu/pipelining.html),
# [scalar prefetch and block-sparse computation](https://docs.jax.dev/en/latest/pallas/tpu/sparse.html),
# [TPU details](https://docs.jax.dev/en/latest/pallas/tpu/details.html), and for the step after
# this course, kernels across chips:
# [distributed computing in Pallas](https://docs.jax.dev/en/latest/pallas/tpu/distributed.html).
# No assignment grades reading JAX's kernels yet; the mechanisms read here are practised in
# [`../exercises/`](../exercises/), assignments 4 to 10 (the table in `lessons/README.md` says
# which task practises what).

# %%
import functools
import inspect
import math
from pathlib import Path

import _course
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

import kernelsim
from kernelsim.backend import choose
from kernelsim.verify import verify

LESSON = "12-production"
_course.versions()
tpu_run = choose(tpu_features=True)  # the op uses VMEM scratch and TPU compiler params
print("the bundled kernels run:", tpu_run.label)

FLASH = Path(tpu_flash.__file__)
SPLASH = Path(splash.__file__)
JAX_ROOT = Path(jax.__file__).parent.parent


def quote(path, first, count=1, after=None):
    """Print ``count`` lines of an installed JAX source file, from the first line containing
    ``first`` (searching from the first line containing ``after``, if given), as file:line."""
    lines = path.read_text().splitlines()
    begin = 0 if after is None else next(i for i, line in enumerate(lines) if after in line)
    start = next((i for i in range(begin, len(lines)) if first in lines[i]), None)
    if start is None:
        raise ValueError(f"{path.name} no longer contains {first!r}: the op changed in this "
                         "JAX release; re-read it before trusting this lesson's quotes")
    where = f"{start + 1}" if count == 1 else f"{start + 1}-{start + count}"
    print(f"{path.relative_to(JAX_ROOT)}:{where}")
    for n in range(start, start + count):
        print(f"{n + 1:5d} {lines[n]}")


def show(rows):
    """Print a list of rows (first row = header) as aligned columns."""
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths, strict=True)))


# %% [markdown]
# ## Running a kernel that has no `interpret=` argument
#
# The op is a jitted function of `(batch, heads, sequence, head_dim)` arrays, with an optional
# bias `ab` and segment ids, and static `causal`, `sm_scale`, `block_sizes` and `debug`:

# %%
quote(FLASH, "def flash_attention(", 12)

# %% [markdown]
# There is no `interpret` parameter: the op is meant for a TPU. JAX's answer is a context
# manager, `pltpu.force_tpu_interpret_mode(params)`: every `pallas_call` traced inside it runs
# in TPU interpret mode with those `InterpretParams` (lesson 5's interpreter, HBM, VMEM and
# DMAs simulated). The setting is part of `jit`'s cache key, so the jitted op is retraced
# under it. `on_tpu_or_interpreted` below compiles on a TPU and interprets everywhere else — on
# a GPU too, since the op uses TPU-only features (`choose(tpu_features=True)`).

# %%
B, H, N, D = 1, 2, 256, 128
SCALE = 1 / math.sqrt(D)
kq, kk, kv, kw = jax.random.split(jax.random.key(12), 4)
q, k, v = (jax.random.normal(key, (B, H, N, D), jnp.float32) for key in (kq, kk, kv))

# 128 everywhere (the op's defaults), forward and backward blocks.
BLOCKS = tpu_flash.BlockSizes.get_default(B, H, N, N, D)


def on_tpu_or_interpreted(fn, *args, interpret):
    """``fn(*args)``, compiled when ``interpret`` is False, else with every ``pallas_call`` it
    traces in TPU interpret mode (``interpret`` as the InterpretParams when it is one)."""
    if interpret is False:
        return fn(*args)
    params = interpret if isinstance(interpret, pltpu.InterpretParams) else \
        pltpu.InterpretParams()
    with pltpu.force_tpu_interpret_mode(params):
        return fn(*args)


def op(causal=False, block_sizes=BLOCKS):
    """JAX's TPU flash attention with this lesson's scale: a function of (q, k, v)."""
    return functools.partial(tpu_flash.flash_attention, causal=causal, sm_scale=SCALE,
                             block_sizes=block_sizes)


def jax_flash(q, k, v, *, causal=False, interpret):
    with jax.default_matmul_precision("highest"):  # the op's dots in float32, as the reference
        return on_tpu_or_interpreted(op(causal), q, k, v, interpret=interpret)


def attention_reference(q, k, v, causal=False):
    """Plain JAX: one softmax over each full row of scores, masked above the diagonal."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest") * SCALE
    if causal:
        visible = jnp.tril(jnp.ones((q.shape[2], k.shape[2]), bool))
        scores = jnp.where(visible, scores, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v,
                      precision="highest")


to_bshd = functools.partial(jnp.transpose, axes=(0, 2, 1, 3))
with jax.default_matmul_precision("highest"):  # float32 in float32, as the reference: a TPU
    # multiplies float32 in one bfloat16 pass by default (lesson 7)
    library = jax.nn.dot_product_attention(to_bshd(q), to_bshd(k), to_bshd(v), is_causal=True)
np.testing.assert_allclose(to_bshd(attention_reference(q, k, v, causal=True)), library,
                           rtol=1e-5, atol=1e-5)
print("reference agrees with jax.nn.dot_product_attention(is_causal=True)")

_course.check(LESSON, "jax_flash_attention", jax_flash, attention_reference, (q, k, v),
              tpu_run, rtol=1e-4, atol=1e-5)
_course.check(LESSON, "jax_flash_attention_causal", functools.partial(jax_flash, causal=True),
              functools.partial(attention_reference, causal=True), (q, k, v), tpu_run,
              rtol=1e-4, atol=1e-5)

# %% [markdown]
# ## The grid, and what each axis reuses
#
# From here on the shape is lesson 8's: one head, `N = 1024`, `d = 128`, `bfloat16`, query
# blocks of 256 and key/value blocks of 128. kernelsim only traces (index maps, no kernel
# arithmetic), so this is fast on a CPU. The grid has four axes, the key/value axis last:

# %%
quote(FLASH, "grid = (", 6, after="def _flash_attention_impl")
quote(FLASH, "dimension_semantics=(", 6, after="def _flash_attention_impl")

# %% [markdown]
# * `(batch / block_b, heads, query blocks, key/value blocks)`, row-major: for each query
#   block, all key/value blocks go by (lesson 4's grid order);
# * the first three axes are `"parallel"`: no step depends on another with a different batch,
#   head or query block, so on a megacore chip (v4, v5p) the compiler may split them between
#   the two TensorCores (lesson 4);
# * the key/value axis is `"arbitrary"` and last: its steps carry the running max, sum and
#   accumulator from one to the next (lesson 8), so they must run in order, on one core.
#
# The index maps say what stays on chip. `Q` and the output ignore the key/value index, so
# they stay resident for a whole row of steps; `K` and `V` follow it:

# %%
quote(FLASH, "def q_index_map(", 2, after="def _flash_attention_impl")
quote(FLASH, "def o_index_map(", 2, after="def _flash_attention_impl")
quote(FLASH, "in_specs = [", 8, after="def _flash_attention_impl")

# %% [markdown]
# The blocks are `(block_b, 1, block_q, head_dim)`: the head dimension is a block dim of size 1
# kept in the Ref (the kernel indexes it with `[batch_idx]`, `batch_idx = (b, 0)`), where
# lesson 3 would squeeze it out with `None`. The last two block dims obey the (8, 128) rule of
# lesson 3. `ab`, the segment ids and (without residuals) `l` and `m` are `None`: an empty
# pytree, so the optional operands simply vanish from the call.
#
# kernelsim names operands after the kernel's parameters. This kernel is
# `_flash_attention_kernel(q_tile_ref, *args, **kwargs)`, so all but the first appear as
# positions in `*args`; the function it dispatches to names them, which gives a lookup table.
# The `None` operands keep their positions (`ab` is `args[2]`), so the real ones are `args[0]`,
# `args[1]` (`K`, `V`), `args[5]` (the output) and the scratch at `args[8]` to `args[10]`.

# %%
def short(name):
    return name.removesuffix("_tile_ref").removesuffix("_ref")


inner = list(inspect.signature(tpu_flash._flash_attention_kernel_single_batch).parameters)
assert inner[:2] == ["batch_idx", "q_tile_ref"]
FLASH_NAMES = {"q_tile_ref": "q"} | {f"args[{i}]": short(name) for i, name in enumerate(inner[2:])}
print(FLASH_NAMES)

NB, DB = 1024, 128
bf16 = jax.ShapeDtypeStruct((1, 1, NB, DB), jnp.bfloat16)


def blocks(bq=256, bk_major=128, bk=128):
    """BlockSizes for the traced shape, with matching backward blocks."""
    return tpu_flash.BlockSizes(
        block_q=bq, block_k_major=bk_major, block_k=bk, block_b=1,
        block_q_major_dkv=bq, block_k_major_dkv=bk_major, block_k_dkv=bk, block_q_dkv=bq,
        block_k_major_dq=bk_major, block_k_dq=bk, block_q_dq=bq)


def trace_op(causal=False, **sizes):
    fn = functools.partial(tpu_flash.flash_attention, causal=causal, block_sizes=blocks(**sizes))
    return kernelsim.trace(fn, bf16, bf16, bf16, chip="tpu-v5e")


def operand_table(call, names):
    rows = [["operand", "role", "block", "fetches", "skips", "writebacks", "HBM bytes"]]
    for o in call.operands:
        rows.append([names.get(o.name, o.name), o.role, o.block_shape or "-", o.fetches,
                     o.skips, o.writebacks, f"{o.hbm_read_bytes + o.hbm_write_bytes:,}"])
    show(rows)


t_op = trace_op()
op_call = t_op.calls[0]
print(f"grid {op_call.grid}, semantics {op_call.call.dimension_semantics}")
operand_table(op_call, FLASH_NAMES)
assert op_call.grid == (1, 1, NB // 256, NB // 128)
assert op_call.operand("q_tile_ref").fetches == NB // 256  # once per query block
assert op_call.operand("args[0]").fetches == (NB // 256) * (NB // 128)  # K: every step

# %% [markdown]
# ## Scratch, and a loop inside each step
#
# The running statistics live in VMEM scratch, allocated unless one `block_k` covers the
# whole sequence (then the op dispatches to a kernel that needs none):

# %%
quote(FLASH, "if block_k != kv_seq_len:", 7, after="def _flash_attention_impl")
quote(FLASH, "@pl.when(kv_seq_idx == 0)", 2)
quote(FLASH, "@pl.when(kv_seq_idx == (kv_seq_len // block_k_major) - 1)", 3)

# %% [markdown]
# Lesson 8's kernel, with three production choices:
#
# * `m` and `l` are `(block_q, 128)`: 128 lanes holding one value per row, as lesson 8's
#   kernel keeps them too (a `(block_q, 1)` column would be spread across the lanes at every
#   step: lesson 8's ladder measured that form 1.6-1.8 times slower);
# * masked scores get `DEFAULT_MASK_VALUE`, `-0.7 × float32 max`, added rather than set to
#   `-inf`: scores are never infinite, so `exp(-inf - (-inf))` cannot appear, even in a
#   fully masked row;
# * `acc` is kept normalised by the running sum after every block, not divided at the end.
#
# And a fourth that matters for speed: the key/value block the pipeline copies,
# `block_k_major`, may be larger than the block each matmul uses, `block_k`. The body walks the
# copied block in `block_k` slices with `pl.loop` — lesson 8's kernel 2, inside a grid step:

# %%
quote(FLASH, "@pl.loop(0, block_k_major, step=block_k, unroll=True)", 7)

# %% [markdown]
# ## Traffic against the course's kernel
#
# Lesson 8's grid kernel, loaded from its file (`_course.definitions` runs only the imports and
# the named `def`s, none of that lesson's cells), traced on the same shape in its
# `(heads, sequence, head_dim)` layout. Next to it, the op with the same blocks, and the op
# copying 512 keys per step while still computing on 128 at a time.

# %%
lesson8 = _course.definitions("08-flash-attention", "last_kv_block", "widen", "flash_step",
                              "flash_kernel", "statistics_scratch", "flash_attention",
                              SCALE=1 / math.sqrt(DB), LANES=128)
hsd = jax.ShapeDtypeStruct((1, NB, DB), jnp.bfloat16)


def trace_lesson8(causal=False):
    fn = functools.partial(lesson8.flash_attention, bq=256, bkv=128, causal=causal,
                           interpret=True)
    return kernelsim.trace(fn, hsd, hsd, hsd, chip="tpu-v5e")


t_course = trace_lesson8()
t_major = trace_op(bk_major=512)
comparison = kernelsim.compare(t_course, t_op, t_major,
                               labels=["lesson 8", "JAX op, bk_major 128", "JAX op, bk_major 512"])
print(comparison)
traffic = [t.calls[0].hbm_read_bytes + t.calls[0].hbm_write_bytes
           for t in (t_course, t_op, t_major)]
assert traffic == [2 * (2 * NB * DB + 2 * NB * NB * DB // 256)] * 3  # lesson 8's formula
assert [t.calls[0].call.steps for t in (t_course, t_op, t_major)] == [32, 32, 8]
assert t_major.calls[0].cost.estimated_seconds < t_op.calls[0].cost.estimated_seconds
comparison.figure()

# %% [markdown]
# The bytes are identical: `K` and `V` are re-read once per query block, whichever kernel and
# whatever `block_k_major`, exactly lesson 8's `s·(2·N·d + 2·N²·d / bq)`. The step count is
# not. At this size each step moves a few tens of KiB, and kernelsim's per-step cost
# (lesson 7) dominates its estimate on tpu-v5e; copying 512 keys per step cuts the steps by
# four and the estimate with them, while the matmuls keep their 128-wide shape. That is the
# knob `BlockSizes` exposes, and why its docstring says block sizes barely change the numerics
# but change performance greatly.
#
# The op also hands the compiler a `pl.CostEstimate`, built from its plain-JAX reference (the
# TPU lowering writes it into the custom call's configuration). kernelsim reports its FLOPs,
# but times the call from the kernel's own work per step: the reference of the causal op
# computes every score of the N×N matrix, twice what the kernel multiplies. Its byte count is
# the compulsory traffic: every input and output once, none of the re-reads.

# %%
quote(FLASH, "input_bytes = sum(", 2, after="def _fwd_cost_estimate")
print(f"pl.CostEstimate bytes_accessed: {op_call.call.cost_estimate_bytes:,} B; "
      f"kernelsim counts {traffic[1]:,} B")
assert op_call.call.cost_estimate_bytes == 4 * NB * DB * 2  # q, k, v, o once
assert op_call.cost.flops_source == "pl.CostEstimate"

# %% [markdown]
# ## Causal: the same skip, a different repeat
#
# The op skips blocks above the diagonal in both of lesson 8's ways. `pl.when(should_run)`
# skips the work, and the `K`/`V` index map gives a skipped step the index of a block that
# some step needs anyway, so no copy is wasted on it:

# %%
quote(FLASH, "def below_or_on_diag(", 4)
quote(FLASH, "def kv_index_map(", 12, after="def _flash_attention_impl")

# %% [markdown]
# Lesson 8 repeats the **last** needed block; the op sends skipped steps to block **0**, "the
# 0th one to be used for the next block_q rows". Both fetch `K` 20 times out of 32 steps.
# The difference is *when* block 0 for the next row is copied. The pipeline copies a step's
# block while the step before it computes (lesson 3's double buffering). In the op that is
# during the last step that computes, so the copy overlaps real work; in lesson 8 it is during
# the row's last, skipped, step, which has nothing to hide it behind. The picture shows the
# `K` block each step asks for, and whether it is copied.

# %%
t_op_causal = trace_op(causal=True)
t_course_causal = trace_lesson8(causal=True)
k_fetches = {"JAX op": t_op_causal.calls[0].operand("args[0]").fetches,
             "lesson 8": t_course_causal.calls[0].operand("k_ref").fetches}
print("K fetches, causal:", k_fetches)
assert k_fetches == {"JAX op": 20, "lesson 8": 20}


def k_schedule(trace, operand):
    """(block index, fetched?) of one operand for every (query block, kv step)."""
    grid = trace.calls[0].grid
    index = np.zeros(grid[-2:], int)
    fetched = np.zeros(grid[-2:], bool)
    for e in trace.steps(0):
        if e.operand == operand:
            i, j = e.grid_index[-2:]
            index[i, j], fetched[i, j] = e.block_index[-2], e.action == "fetch"
    return index, fetched


fig, axes = plt.subplots(1, 2, figsize=(_course.FIGURE_WIDTH, 3.2), sharey=True)
for ax, (label, trace, operand) in zip(
        axes, [("lesson 8:\nrepeat the last needed block", t_course_causal, "k_ref"),
               ("JAX op:\nrepeat block 0", t_op_causal, "args[0]")], strict=True):
    index, fetched = k_schedule(trace, operand)
    needed = np.array([[j <= lesson8.last_kv_block(i, 256, 128) for j in range(index.shape[1])]
                       for i in range(index.shape[0])])
    ax.imshow(np.where(fetched, 2, np.where(needed, 1, 0)), cmap="Blues", vmin=0, vmax=2.5)
    for (i, j), block in np.ndenumerate(index):
        ax.text(j, i, block, ha="center", va="center",
                color="white" if fetched[i, j] else "black")
    ax.set_title(label)
    ax.set_xlabel("key/value step j")
axes[0].set_ylabel("query block i")
fig.suptitle("K block per step (dark: copied; light: needed, already on chip; "
             "white: skipped)")
fig.tight_layout()
op_index, op_fetched = k_schedule(t_op_causal, "args[0]")
assert op_index[0, 2] == 0 and op_fetched[0, 2] and not op_fetched[1, 0]  # row 1's block 0
course_index, course_fetched = k_schedule(t_course_causal, "k_ref")
assert course_index[0, 7] == 1 and course_fetched[1, 0]

# %% [markdown]
# Row 0 of the op: blocks 0 and 1 are computed on, and at step 2 block 0 is copied again,
# ready for row 1. The copy count is the same; only its timing moved.

# %% [markdown]
# ## Splash attention: the mask as scalar prefetch
#
# Splash attention (`splash_attention_kernel.py`) generalises the diagonal to any mask. Before
# anything runs, on the host, it cuts the mask into `(block_q, block_kv)` blocks and records per
# head, query block and key/value step: `block_mask` (0 = all masked, skip; 1 = partly masked;
# 2 = all visible) and `data_next`, the key/value block that step should have on chip. Those
# tables are scalar-prefetch operands (lesson 6), in SMEM:

# %%
quote(SPLASH, "num_scalar_prefetch = 3", 1, after="def _splash_attention_forward(")
quote(SPLASH, "def k_index_map(", 6, after="def _splash_attention_forward(")
quote(SPLASH, "next_j = to_i32(data_next_ref[h, i, j])", 1)

mask = masks.MultiHeadMask([masks.CausalMask((NB, NB))])
splash_fwd = splash.make_splash_mha(
    mask, head_shards=1, q_seq_shards=1,
    block_sizes=splash.BlockSizes(block_q=256, block_kv=128, block_kv_compute=128))
info = splash_fwd.fwd_mask_info
print("block_mask (query block x kv step):\n", np.asarray(info.block_mask[0]))
print("data_next:\n", np.asarray(info.data_next[0]))

# %% [markdown]
# For a causal mask, `data_next` is the op's clamp written out as data: the step's own block
# where `block_mask` is nonzero, block 0 where it is 0. Any other pattern — a sliding window,
# a document mask — only changes the tables, not the kernel. The traced kernel reads the
# tables once into SMEM and fetches `K` the same 20 times. It also reads `q_sequence`, the
# query positions from which its mask function rebuilds the causal mask in every block it
# computes, stored 128 lanes wide as `int32`: more bytes than `Q` itself at this size. Only the
# head axis is `"parallel"` here: on a megacore chip, splash's forward may split heads, not
# query blocks, between the two cores.

# %%
t_splash = kernelsim.trace(splash_fwd, *[jax.ShapeDtypeStruct((1, NB, DB), jnp.bfloat16)] * 3,
                           chip="tpu-v5e")
splash_call = t_splash.calls[0]
print(f"grid {splash_call.grid}, semantics {splash_call.call.dimension_semantics}")
operand_table(splash_call, {})
assert splash_call.operand("k_ref").fetches == 20
assert splash_call.operand("q_sequence_ref").hbm_read_bytes == NB * 128 * 4
assert {str(o.memory_space) for o in splash_call.operands
        if o.role == "scalar_prefetch"} == {"smem"}

# %% [markdown]
# Its values match plain JAX too. Splash has no `sm_scale`: the caller scales `q`. It does
# take `interpret=`.

# %%
def jax_splash_causal(q, k, v, *, interpret):
    kernel = splash.make_splash_mha(
        masks.MultiHeadMask([masks.CausalMask((N, N))] * H), head_shards=1, q_seq_shards=1,
        block_sizes=splash.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128),
        interpret=interpret)
    # splash's dots take JAX's default precision when they are traced: float32 in float32
    # here, as the reference (a TPU's default is one bfloat16 pass: lesson 7)
    with jax.default_matmul_precision("highest"):
        return kernel(q[0] * SCALE, k[0], v[0])[None]  # splash takes (heads, sequence, head_dim)


_course.check(LESSON, "splash_attention_causal", jax_splash_causal,
              functools.partial(attention_reference, causal=True), (q, k, v), tpu_run,
              rtol=1e-4, atol=1e-5)

# %% [markdown]
# In the viewer, step through splash's run: the SMEM panel shows which `data_next` and
# `block_mask` entries each step's index maps read.

# %%
t_splash.show()

# %% [markdown]
# ## Block rules and VMEM, before a TPU
#
# `kernelsim.tpu_lowering_error` runs JAX's real Mosaic lowering on the CPU. A `block_q` of
# 100 breaks lesson 3's (8, 128) rule for the `Q` block; a `block_k` of 64 is refused by the op
# itself, before the lowering sees it, because `m` and `l` are tiled 128 lanes wide:

# %%
def lowering_verdict(**sizes):
    fn = functools.partial(tpu_flash.flash_attention, block_sizes=blocks(**sizes))
    error = kernelsim.tpu_lowering_error(fn, bf16, bf16, bf16)
    return "lowers" if error is None else error.splitlines()[0]


verdicts = {sizes: lowering_verdict(bq=sizes[0], bk=sizes[1])
            for sizes in [(256, 128), (100, 128), (256, 64)]}
for (bq, bk), verdict in verdicts.items():
    print(f"block_q={bq:4d} block_k={bk:4d}: {verdict[:110]}")
assert verdicts[(256, 128)] == "lowers"
assert verdicts[(100, 128)].startswith("ValueError") and "divisible by 8 and 128" in \
    verdicts[(100, 128)]
assert verdicts[(256, 64)] == "NotImplementedError: block_k=64 should be a multiple of 128"
quote(FLASH, "block_k_repeats, rem = divmod(block_k, MIN_BLOCK_SIZE)", 5)

# %% [markdown]
# The VMEM footprint follows from the BlockSpecs and scratch (lesson 5): two buffers for each
# pipelined block (one when its grid axis has a single step: the block never moves, and Mosaic
# gives it one buffer), one for each scratch array. kernelsim's on-chip peak is that sum.
# Bigger blocks buy fewer steps with VMEM: tpu-v5e has 128 MiB per core, and the compiler's
# scoped limit below it is what a kernel gets unless `vmem_limit_bytes` (with the XLA flag of
# lesson 5) raises it; the op sets none.

# %%
def footprint(bq, bk_major, n=NB, d=DB, s=2):
    """VMEM bytes: q, k, v, o blocks (s bytes/element), two buffers each unless their grid
    axis has one step; f32 m, l, acc scratch."""
    q_bufs, kv_bufs = (1 if n == b else 2 for b in (bq, bk_major))
    return s * d * (2 * q_bufs * bq + 2 * kv_bufs * bk_major) + 4 * (2 * bq * 128 + bq * d)


rows = [["block_q", "block_k_major", "steps", "on-chip peak", "estimate on tpu-v5e"]]
for bq, bk_major in [(256, 128), (256, 512), (512, 512), (1024, 1024)]:
    c = trace_op(bq=bq, bk_major=bk_major).calls[0]
    assert c.cost.onchip_peak_bytes == footprint(bq, bk_major)
    rows.append([bq, bk_major, c.call.steps, f"{c.cost.onchip_peak_bytes / 2**20:.2f} MiB",
                 f"{c.cost.estimated_seconds * 1e6:.1f} us"])
show(rows)

# %% [markdown]
# ## The backward pass: `custom_vjp` and its residuals
#
# `pallas_call` has no transpose rule (lesson 10), so the op attaches its own backward with
# `jax.custom_vjp`. The forward saves the output and, as two extra kernel outputs, the
# row sums `l` and maxima `m`:

# %%
quote(FLASH, "@functools.partial(jax.custom_vjp, nondiff_argnums=range(5, 10))", 2)
quote(FLASH, "o, l, m = _flash_attention(", 4, after="def _flash_attention_fwd(")
quote(FLASH, "di = jnp.sum(", 3, after="def _flash_attention_bwd(")

# %% [markdown]
# What the backward computes for one block of queries against one block of keys. `s` is that
# block's scores, rebuilt from `Q` and `K` as the forward built them (bias, scale, mask). A
# product of two blocks is a matrix product; `*` is elementwise.
#
# * `p = exp(s - m) / l`, from the saved `m` and `l`;
# * `dV += pᵀ dO`;
# * `dp = dO Vᵀ`, then `ds = p * (dp - di)`, then `ds` times the scale;
# * `dK += dsᵀ Q` and `dq += ds K`: both carry the scale through `ds`.
#
# `di` is the softmax's correction, `rowsum(p * dp)`; the `dq` kernel's comment writes it so.
# The op computes it in plain JAX, before both kernels, as `rowsum(dO * o)`. The two are
# equal because each row of `o` is that row of `p` times `V`. Taken from `o`, `di` needs no
# whole row of `p`: that is why `o` is a residual.

# %%
quote(FLASH, "ds = (dp - jnp.tile(di", 6, after="def _flash_attention_dq_kernel(")

# %% [markdown]
# The backward is two kernels. `dq` keeps the forward's order (key/value axis innermost,
# accumulating into `dq`); `dK` and `dV` need the opposite, the key/value block outer and the
# query blocks streaming past, because the sum for `dK` runs over queries:

# %%
quote(FLASH, "# kv index needs to be before q index", 8, after="def _flash_attention_bwd_dkv")

# %% [markdown]
# `jax.grad` through the op must agree with `jax.grad` of plain JAX. The interpret-mode context
# has to surround the whole gradient, not only the forward call: `jax.grad` traces the
# backward kernels after the forward has returned.

# %%
w = jax.random.normal(kw, (B, H, N, D), jnp.float32)


def weighted_grads(attention):
    """Gradients of sum(attention(q, k, v) * w) with respect to q, k and v."""
    return jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * w), argnums=(0, 1, 2))


def jax_flash_grads(q, k, v, *, interpret):
    with jax.default_matmul_precision("highest"):  # the op's dots in float32, as the reference
        return on_tpu_or_interpreted(weighted_grads(op(causal=True)), q, k, v,
                                     interpret=interpret)


_course.check(LESSON, "jax_flash_attention_grad", jax_flash_grads,
              weighted_grads(functools.partial(attention_reference, causal=True)), (q, k, v),
              tpu_run, rtol=1e-4, atol=1e-5)

# %% [markdown]
# kernelsim traces the gradient: the forward (now writing `l` and `m`), then the `dK`/`dV`
# kernel, then the `dq` kernel.

# %%
def op_grads(q, k, v):
    return jax.grad(lambda q, k, v: tpu_flash.flash_attention(
        q, k, v, causal=True, block_sizes=blocks()).astype(jnp.float32).sum(),
        argnums=(0, 1, 2))(q, k, v)


t_grad = kernelsim.trace(op_grads, bf16, bf16, bf16, chip="tpu-v5e")
show([["call", "grid", "HBM read", "HBM write", "estimate"]] +
     [[c.name, c.grid, f"{c.hbm_read_bytes:,}", f"{c.hbm_write_bytes:,}",
       f"{c.cost.estimated_seconds * 1e6:.1f} us"] for c in t_grad.calls])
assert [c.name for c in t_grad.calls] == ["_flash_attention_kernel",
                                          "_flash_attention_dkv_kernel",
                                          "_flash_attention_dq_kernel"]
dkv = t_grad.calls[1]
operand_table(dkv, {})

# %% [markdown]
# The `dK`/`dV` kernel reads far more than the others, and its table says why.
#
# * **Lane-wide residuals.** `l`, `m` and `di` each have one value per query row, but they
#   travel as `(…, 128)` `float32` arrays: 512 bytes per row, twice a `bfloat16` row of `Q`.
#   The forward writes `l` and `m` that wide and keeps lane 0; the backward broadcasts them
#   back to 128 lanes before the call.
# * **Copies on skipped steps.** For each key/value block the skipped query steps come
#   *first* (query blocks wholly before the diagonal). `Q`, `dO` and `di` repeat block 0
#   there — a block those steps do not use and the next computing step replaces — and `l`
#   and `m` do not repeat at all, so they are copied at every step:

# %%
quote(FLASH, "# If the q block is skipped, stay at the 0th q block.", 8,
      after="def _flash_attention_bwd_dkv")
quote(FLASH, "def lm_index_map(", 2, after="def _flash_attention_bwd_dkv")


def copies(indices):
    """Copies the pipeline makes for a sequence of block indices: one per change (lesson 6)."""
    return sum(1 for prev, cur in zip([None, *indices], indices, strict=False) if cur != prev)


def needed(i, j, bq=256, bk=128):
    return tpu_flash.below_or_on_diag(i, bq, j, bk)


steps = [(j, i) for j in range(NB // 128) for i in range(NB // 256)]  # kv outer, q inner
as_shipped = copies([i if needed(i, j) else 0 for j, i in steps])
unclamped = copies([i for j, i in steps])
first_needed = {j: min(i for i in range(NB // 256) if needed(i, j)) for j in range(NB // 128)}
ideal = copies([max(i, first_needed[j]) for j, i in steps])
print(f"Q block copies in the dK/dV kernel: as shipped {as_shipped}, unclamped (l, m) "
      f"{unclamped}, repeating each row's first needed block {ideal}")
assert dkv.operand("q_tile_ref").fetches == as_shipped == 26
assert dkv.operand("l_tile_ref").fetches == dkv.operand("m_tile_ref").fetches == unclamped == 32
assert ideal == 18
per_copy = {name: dkv.operand(name).hbm_read_bytes // dkv.operand(name).fetches
            for name in ("q_tile_ref", "do_tile_ref", "di_tile_ref", "l_tile_ref", "m_tile_ref")}
saved = sum((dkv.operand(name).fetches - ideal) * size for name, size in per_copy.items())
print(f"with that repeat in all five index maps: {saved:,} B less, of {dkv.hbm_read_bytes:,} B "
      f"read ({saved / dkv.hbm_read_bytes:.0%})")
assert saved / dkv.hbm_read_bytes > 1 / 3
t_grad.heatmap(call=1)

# %% [markdown]
# Repeating each key/value row's first needed query block would copy `Q`, `dO` and `di` 18
# times instead of 26, and the same repeat in `l`'s and `m`'s index map 18 times instead of
# 32: more than a third of this call's reads. Production code is not the last word;
# kernelsim's table is how you would find that, and the index maps are where you would fix
# it.
#
# Are those counts what a TPU's pipeline would do? `kernelsim.verify` runs the gradient in TPU
# interpret mode and compares every copy the interpreter makes with kernelsim's schedule.

# %%
grad_inputs = [x[:, :1].repeat(4, axis=2).astype(jnp.bfloat16) for x in (q, k, v)]
assert grad_inputs[0].shape == (1, 1, NB, DB)
verified = verify(op_grads, *grad_inputs)
assert verified.ok, verified.report()
print("kernelsim's copies equal TPU interpret mode's, copy for copy, in all",
      len(verified.trace.calls), "calls")

# %% [markdown]
# ## What the course gave you, in one kernel
#
# | in the op | lesson |
# | --- | --- |
# | a kernel in a jitted function, interpreted on the CPU, checked against plain JAX | 1, 2 |
# | `Q`/output index maps that ignore the key/value index: resident blocks | 4 |
# | `(8, 128)`-legal block shapes, a size-1 head block dim, double-buffered blocks | 3 |
# | `"parallel"` batch, head and query axes, an `"arbitrary"` reduction axis last | 4 |
# | `m`, `l`, `acc` in VMEM scratch; footprint against the VMEM per core | 5 |
# | index maps that repeat a block to skip copies; splash's tables in SMEM | 6 |
# | per-step overhead against `block_k_major`; a `pl.CostEstimate` for the compiler | 7 |
# | the online softmax, `pl.when` around the work, the causal mask | 8 |
# | reading a lowering error before the TPU does | 9 |
# | `custom_vjp`, residuals and their traffic | 10 |
# | TPU-only features (scratch, scalar prefetch, TPU compiler params): interpreted on GPU | 6, 11 |
#
# ## Check yourself
#
# 1. In the op's forward grid `(1, heads, 4, 8)`, which blocks stay in VMEM from one step to
#    the next within a row, and why must the last axis be `"arbitrary"`?
# 2. `block_k_major = 512, block_k = 128` against `128, 128` at this shape: what happens to
#    the HBM bytes, the step count and the estimate, and why does the body still compute on
#    128 keys at a time?
# 3. The op's causal index map sends skipped steps to block 0, lesson 8's to the last needed
#    block. Why do both fetch `K` 20 times, and which hides the copy of the next row's first
#    block behind real work?
# 4. In splash, what does each value of `block_mask` make a step do, and where do `block_mask`
#    and `data_next` live while the kernel runs?
# 5. You want `block_k = 64` for short sequences. What refuses it, and what would a `block_q`
#    of 100 run into instead?
# 6. The op's `pl.CostEstimate` says 1 MiB of bytes for the forward here; kernelsim says
#    2.5 MiB. Which is right, and what is the estimate's number?
# 7. Write the `dK`/`dV` kernel's query index map that copies `Q` 18 times instead of 26. Why
#    can the forward's "repeat block 0" not be reused here?
#
# <details><summary>Answer</summary>
#
# 1. The `Q` block and the output block (their index maps ignore the key/value index), and the
#    `m`, `l`, `acc` scratch. The steps of a row update that scratch in order — the first
#    initialises it, the last writes the output — so they cannot be reordered or split
#    between cores.
# 2. The bytes do not change (`K` and `V` are still read once per query block); the steps drop
#    from 32 to 8, so the per-step overhead, most of the estimate at this size, drops by four.
#    `pl.loop` walks the 512-key block in 128-key slices, so the matmuls and the 128-lane `m`
#    and `l` tiles keep their shapes.
# 3. Each row copies exactly the blocks it needs: the first skipped step's repeated index
#    either equals the block already there (lesson 8) or is block 0, which the next row needs
#    first anyway (the op). The op's copy of block 0 starts during the row's last computing
#    step; lesson 8's during the row's last skipped step, which has no work to overlap it.
# 4. 0: skip the work; its `data_next` entry names the next block a later step needs (block 0
#    of the next row, here), so a skipped step copies nothing that is not used. 1 and 2:
#    compute. A mask stored as blocks is applied only in the 1 blocks
#    (`should_not_mask`); a mask function, like this causal one, is evaluated in every block
#    computed. The tables are scalar-prefetch operands, copied into SMEM before the grid
#    starts and read there by the index maps and the body.
# 5. The op itself: `m` and `l` are 128 lanes wide, so it raises `NotImplementedError` unless
#    `block_k` is a multiple of 128. A `block_q` of 100 passes the op's checks but the TPU
#    lowering rejects the `(…, 100, 128)` block (second-minor dimension not divisible by 8).
# 6. kernelsim's: the estimate counts each input and output once (the compulsory traffic) and
#    leaves out the re-reads of `K` and `V`, which the blocked schedule makes
#    `N / block_q = 4` times.
# 7. `jnp.maximum(q_seq_index, first_needed(kv_seq_index))`, with `first_needed(j)` the first
#    query block whose last row reaches key block `j`. The forward's skipped steps come at the
#    *end* of a row, so block 0 is the next row's first block; in the `dK`/`dV` kernel they come
#    at the *start*, so block 0 is a block the row never uses.
#
# </details>

# %% [markdown]
# ## Practise it
#
# Graded practice for this lesson: [Assignment 7 — flash
# attention](../exercises/07_flash_attention/flash_attention.ipynb): its tasks 4 and 5 after
# lessons 10 and 12. They write a backward like the op's as Pallas kernels: `D` (the op's
# `di`, there a kernel of its own), then `dK` and `dV` with the key blocks outer, then `dq`; task
# 5 attaches it to the forward with `jax.custom_vjp`. Their forward saves one logsumexp per row,
# `m + log(l)`, where the op saves `m` and `l`. Task 6 is lesson 8's dropout.
