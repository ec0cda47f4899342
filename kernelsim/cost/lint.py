"""Warnings about a call's shape that a real backend would reject or run badly.

Each message names the operand and the rule; the rules' sources:
- block shapes: JAX's own check, ``_check_block_mappings`` in
  jax/_src/pallas/mosaic/lowering.py (jax 0.12.0.1), mirrored rule for rule (rank >= 1; the last
  two dims divisible by (8, 128) or whole; the dtype-dependent 1-D rule; pl.ANY/HBM blocks whole
  with a zero index map); https://docs.jax.dev/en/latest/pallas/tpu/details.html explains it.
  Stricter than JAX's check where the compiler is, as a TPU v5e showed (8-bit rows in 32s,
  ``_row_multiple``; no float16 block loads at all; tests/kernelsim/chip_verdicts_v5e.py and
  bench/recorded/tpu_perf-v5e.json ``lint``).
- VMEM: ``CallCost.mosaic_vmem_bytes`` (tile-padded buffers plus the body's kept values) against
  the chip's VMEM and its default scoped limit (``Chip.default_scoped_vmem_bytes``) or the call's
  ``vmem_limit_bytes`` (jax/_src/pallas/mosaic/core.py).
- output index maps reading scalar prefetch at a prefetched index
  (``_dependent_prefetch_reads``): what a TPU v5e did with every such index map it was given
  (tests/kernelsim/chip_verdicts_v5e.py).
- parallel after arbitrary, output revisits: same page, "Multicore / Pipelining" sections, and
  the TPU interpreter's revisit check (jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py);
  an output with ``RevisitMode.ANY`` may revisit (its restores are modelled,
  kernelsim.cost.schedule), but only single-buffered: ``RevisitMode.ANY is not supported with
  double buffering``
  (jax/_src/pallas/mosaic/lowering.py, the window params' ``revisit_mode``).
"""

from __future__ import annotations

from kernelsim.chips import Chip
from kernelsim.cost.estimate import CallCost, vmem_limit
from kernelsim.cost.schedule import CallSchedule, revisit_steps
from kernelsim.model import KernelCall, Operand, tile_padded_bytes

# TPU vreg geometry the block-shape rule uses: sublanes x lanes of 32-bit words (the same on
# every chip kernelsim models; jax/_src/tpu_info.py num_sublanes / num_lanes).
_SUBLANES, _LANES = 8, 128


# every block-shape warning ends with this sentence (the grader's tiling rule selects them by it)
BLOCK_SHAPE_REJECTED = "Mosaic will reject this block shape"
# Stable ids some warnings start with, in brackets (``rule_of``), for a grader to select by:
SCOPED_VMEM = "scoped_vmem"  # over the default scoped VMEM limit or the call's vmem_limit_bytes
VMEM_CAPACITY = "vmem_capacity"  # over the chip's whole VMEM
# an output's index map reading scalar prefetch at an index read from scalar prefetch
DEPENDENT_PREFETCH_READ = "dependent_prefetch_read"


def _nearest_multiple(b: int, a: int, m: int) -> int:
    """The legal size nearest ``b`` for a dim of ``a`` elements: a multiple of ``m``, or ``a``."""
    k = max(m, round(b / m) * m)
    return a if k >= a else k


def _nearest_1d(b: int, a: int, chunk: int, min_tiling: int) -> int:
    """The legal 1-D block size nearest ``b`` over ``a`` elements (whole, a multiple of
    ``chunk``, or a power of two >= ``min_tiling``)."""
    power = max(min_tiling, 1 << max(0, b.bit_length() - 1))
    if abs(power * 2 - b) < abs(power - b):
        power *= 2
    legal = [a, *(k for k in (max(chunk, round(b / chunk) * chunk), power) if k < a)]
    return min(legal, key=lambda k: (abs(k - b), k))


def _row_multiple(dtype: str, itemsize: int) -> int:
    """Rows a block's second-to-last dim must be a multiple of (unless whole) for ``dtype``:
    8 for 32- and 16-bit values, 32 for 8-bit ones. JAX's own check asks 8 of every dtype;
    on a TPU v5e Mosaic rejects int8 blocks of 8 or 16 rows ("Failed to set window params":
    XLA tiles an 8-bit array in HBM 32 rows x 128 lanes, and a window must cover whole
    tiles), while bfloat16 and int16 blocks of 8 rows compile (tests/kernelsim/
    chip_verdicts_v5e.py). Bools are stored as 32-bit words."""
    return 32 if itemsize == 1 and dtype != "bool" else _SUBLANES


def _block_shape_problem(op: Operand) -> str | None:
    """Why Mosaic's TPU lowering would reject ``op``'s block shape, naming the rule and the
    nearest legal block; None when it accepts it."""
    if op.memory_space == "semaphore" or (op.memory_space == "smem" and op.trivial_window):
        return None
    block = tuple(d.size for d in op.block_dims or ())  # a squeezed dim counts as size 1
    if op.memory_space in ("any", "hbm"):
        if not op.trivial_window:
            return (f"operand {op.name!r} in {op.memory_space.upper()} has block {block} over "
                    f"array {op.shape}: such operands must be whole arrays with an index map "
                    "returning zeros (the kernel copies from them itself); nearest legal block: "
                    f"{tuple(op.shape)}. {BLOCK_SHAPE_REJECTED}.")
        return None
    if op.dtype == "float16" and op.memory_space == "vmem":
        return (f"operand {op.name!r}: a float16 block {op.block_shape} in VMEM: Mosaic "
                "fails to load float16 vectors on a TPU v5e ('Invalid vector type for load', "
                "whatever the rows: 8, 16, 32, 48 and whole arrays; int16 and bfloat16 load). "
                "Store the array as bfloat16 (x.astype(jnp.bfloat16)), or as float32 where "
                f"float16's precision matters. {BLOCK_SHAPE_REJECTED}.")
    if not block:
        return (f"operand {op.name!r}: a rank-0 block; the TPU lowering supports blocks of "
                f"rank >= 1 (e.g. the whole array, {tuple(op.shape)}). {BLOCK_SHAPE_REJECTED}.")
    if len(block) >= 2:
        rows = _row_multiple(op.dtype, op.itemsize)
        problems = [f"{pos} dim {b} is neither a multiple of {m} nor the array's {a}"
                    for b, a, m, pos in ((block[-1], op.shape[-1], _LANES, "last"),
                                         (block[-2], op.shape[-2], rows, "second-to-last"))
                    if b != a and b % m]
        if not problems:
            return None
        nearest = (*block[:-2], _nearest_multiple(block[-2], op.shape[-2], rows),
                   _nearest_multiple(block[-1], op.shape[-1], _LANES))
        tiling = f"({rows}, {_LANES})"
        return (f"operand {op.name!r}: block {op.block_shape} breaks TPU's {tiling} tiling "
                f"rule ({op.dtype}): " + "; ".join(problems) + f". Nearest legal block: "
                f"{nearest}. {BLOCK_SHAPE_REJECTED}.")
    bits = 32 if op.dtype == "bool" else 8 * op.itemsize  # bools are stored as int32
    min_tiling, chunk = _LANES * (32 // bits), _SUBLANES * _LANES
    b, a = block[0], op.shape[0]
    if b == a or b % chunk == 0 or (b >= min_tiling and b & (b - 1) == 0):
        return None
    return (f"operand {op.name!r}: 1-D block ({b},) of {op.dtype} over ({a},) breaks TPU's 1-D "
            f"tiling rule: it is neither the whole array, a multiple of {chunk}, nor a power of "
            f"two >= {min_tiling}. Nearest legal block: ({_nearest_1d(b, a, chunk, min_tiling)},)."
            f" {BLOCK_SHAPE_REJECTED}.")


def _fitting_blocks(call: KernelCall, cost: CallCost, budget: int) -> str:
    """``"; blocks that would fit: x_ref (256, 512), ..."``: the VMEM blocks and scratch with
    their largest dim size halved wherever it occurs (a size shared by several blocks is
    usually one tile size of the kernel, like a matmul's bm), again until the footprint is
    within ``budget`` bytes; the body's kept values are scaled with the buffers. Empty when
    halving cannot get there (no dim left to halve that stays a legal multiple)."""
    ops = [o for o in cost.operands if o.memory_space == "vmem" and o.onchip_bytes
           and (o.operand.block_dims or o.role == "scratch")]
    def dims_of(o):
        if o.operand.block_dims is None:
            return list(o.shape)
        return [d.size for d in o.operand.block_dims if d.kind != "squeezed"]
    shapes = {o.name: dims_of(o) for o in ops}
    start = sum(o.onchip_bytes for o in ops)
    if not start:
        return ""
    rest = cost.mosaic_vmem_bytes - start - cost.body_values_vmem_bytes

    def footprint() -> int:
        buffers = sum(o.buffers * tile_padded_bytes(tuple(shapes[o.name]), o.dtype,
                                                   o.operand.itemsize) for o in ops)
        return rest + buffers + cost.body_values_vmem_bytes * buffers // start

    def halvable(o, k: int) -> bool:
        size, rank = shapes[o.name][k], len(shapes[o.name])
        multiple = (_LANES if k == rank - 1 else
                    _row_multiple(o.dtype, o.operand.itemsize) if k == rank - 2 else 1)
        return size // 2 >= multiple and (size // 2) % multiple == 0

    while footprint() > budget:
        sizes = sorted({v for o in ops for k, v in enumerate(shapes[o.name])
                        if halvable(o, k)}, reverse=True)
        if not sizes:
            return ""
        for o in ops:
            shapes[o.name] = [v // 2 if v == sizes[0] and halvable(o, k) else v
                              for k, v in enumerate(shapes[o.name])]
    changed = [f"{o.name} {tuple(shapes[o.name])}" for o in ops
               if o.role != "scratch" and shapes[o.name] != dims_of(o)]
    return f"; blocks that would fit: {', '.join(changed)}" if changed else ""


def _dependent_prefetch_reads(call: KernelCall) -> list[str]:
    """An output's index map that reads scalar prefetch at an index it read from scalar
    prefetch: on a TPU v5e every such index map of A14's kv_cache_append halted the core, its
    page table 1-D or 2-D, while the table or the positions read at the step's own index ran;
    input index maps of that form ran (lesson 15's paged_decode, JAX's paged attention)
    (tests/kernelsim/chip_verdicts_v5e.py)."""
    outputs = {o.name for o in call.operands if o.role == "output"}
    return [f"[{DEPENDENT_PREFETCH_READ}] the index map of output {name!r} reads scalar "
            "prefetch at an index it read from scalar prefetch (e.g. table[s * slots + "
            "positions[s] // page_size]). On a TPU v5e such an output index map halted the "
            "core (E0200 'Core halted unexpectedly', the process lost), though TPU interpret "
            "mode runs it right. Look the table up before the call (pages = page_indices["
            "jnp.arange(S), positions // page_size]) and prefetch the result, so that the "
            "index map reads it at the step's own index."
            for name in sorted(call.dependent_prefetch_reads & outputs)]


def rule_of(warning: str) -> str | None:
    """The stable rule id a lint warning starts with (``"[scoped_vmem] ..."``), or None."""
    if warning.startswith("[") and "]" in warning:
        return warning[1:warning.index("]")]
    return None


def _revisits(op: Operand) -> list[int]:
    """Steps at which a block of ``op`` comes back after another block was visited."""
    return revisit_steps(op.block_indices).tolist()


def lint(call: KernelCall, schedule: CallSchedule, cost: CallCost, chip: Chip) -> list[str]:
    """Every warning for ``call`` on ``chip`` under its schedule's model."""
    warnings = []
    tpu = schedule.model == "tpu"
    capacity = chip.vmem_bytes
    # GPU model: a pallas_call lowers through Triton, which makes every operand a global-memory
    # pointer and allocates no shared memory for blocks (jax/_src/pallas/triton/lowering.py);
    # a block costs on-chip space only as the slices the body loads, into registers. Mosaic
    # GPU kernels' shared memory is kernelsim.gpu's (allocated as that lowering allocates it).
    need = cost.mosaic_vmem_bytes
    if tpu and need > capacity:
        warnings.append(
            f"[{VMEM_CAPACITY}] VMEM footprint {need:,} B (buffers {cost.vmem_bytes:,} B, "
            f"values the body keeps {cost.body_values_vmem_bytes:,} B) exceeds {chip.name}'s "
            f"VMEM of {capacity:,} B: use smaller blocks{_fitting_blocks(call, cost, capacity)}.")
    limit = vmem_limit(call, chip).bytes  # (capacity itself where the chip has no other)
    if tpu and call.vmem_limit_bytes is None and capacity >= need > limit:
        warnings.append(
            f"[{SCOPED_VMEM}] VMEM footprint {need:,} B (buffers {cost.vmem_bytes:,} B, "
            f"values the body keeps {cost.body_values_vmem_bytes:,} B) exceeds Mosaic's "
            f"default scoped VMEM limit on {chip.name}, {limit:,} B: the compile fails "
            "with CompileTimeScopedVmemOom. Set pltpu.CompilerParams(vmem_limit_bytes=...) "
            f"above {need:,} B (XLA's --xla_tpu_scoped_vmem_limit_kib must allow it) or use "
            f"smaller blocks{_fitting_blocks(call, cost, limit)}.")
    elif tpu and capacity >= need > limit:
        # jax/_src/pallas/mosaic/core.py, CompilerParams: the limit also needs XLA's
        # --xla_tpu_scoped_vmem_limit_kib raised above it.
        warnings.append(
            f"[{SCOPED_VMEM}] VMEM footprint {need:,} B exceeds the call's vmem_limit_bytes "
            f"{limit:,} B: raise the limit (together with XLA's "
            "--xla_tpu_scoped_vmem_limit_kib) or use smaller blocks"
            f"{_fitting_blocks(call, cost, limit)}.")
    if tpu and chip.smem_bytes and cost.smem_bytes > chip.smem_bytes:
        warnings.append(f"SMEM footprint {cost.smem_bytes:,} B exceeds {chip.name}'s "
                        f"{chip.smem_bytes:,} B: prefetch fewer scalars.")
    if tpu:
        warnings += _dependent_prefetch_reads(call)
    sem = call.dimension_semantics
    if tpu and "arbitrary" in sem:
        first_arbitrary = sem.index("arbitrary")
        late = [i for i, s in enumerate(sem) if "parallel" in s and i > first_arbitrary]
        if late:
            warnings.append(
                f"grid axis {late[0]} is {sem[late[0]]!r} but comes after 'arbitrary' axis "
                f"{first_arbitrary}: parallel axes must be a prefix of the grid "
                "(dimension_semantics=" + repr(sem) + ").")
    # A DMA the body starts or waits on names the operand, whether or not it runs at these
    # inputs (a copy another call started, a branch these inputs never take): only an
    # operand the body's code never names at all is reported.
    named = {n for c in call.body_copies for n in (c.src, c.dst)} | call.referenced
    for out, inp in call.aliases.items():  # one HBM buffer under two names
        if out in named or inp in named:
            named |= {out, inp}
    for op in call.operands:
        if (op.role in ("input", "output") and op.memory_space in ("any", "hbm")
                and op.name not in named):
            warnings.append(f"operand {op.name!r} stays in {op.memory_space.upper()} and "
                            "neither the pipeline nor the kernel body copies it (the body "
                            "never names it): is it used?")
        if tpu and op.role in ("input", "output") and (msg := _block_shape_problem(op)):
            warnings.append(msg)
        if not op.pipelined:
            continue
        if op.role == "output" and not op.revisit_any and (steps := _revisits(op)):
            block = tuple(int(v) for v in op.block_indices[steps[0]])
            warnings.append(
                f"output {op.name!r} revisits block {block} non-consecutively (first again at "
                f"step {steps[0]}, {len(steps)} revisit(s)): "
                "TPU writes a block back when its index changes, so the revisit overwrites it "
                "with a partial result. Make the reduction axis the innermost grid axis.")
    return warnings
