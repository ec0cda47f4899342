"""Warnings about a call's shape that a real backend would reject or run badly.

Each message names the operand and the rule; the rules' sources:
- block shapes: JAX's own check, ``_check_block_mappings`` in
  jax/_src/pallas/mosaic/lowering.py (jax 0.12.0.1), mirrored rule for rule (rank >= 1; the last
  two dims divisible by (8, 128) or whole; the dtype-dependent 1-D rule; pl.ANY/HBM blocks whole
  with a zero index map); https://docs.jax.dev/en/latest/pallas/tpu/details.html explains it.
- the default scoped VMEM limit: not stated in JAX's source or docs; kernelsim warns from the
  bound JAX's test_automatic_single_buffering (tests/pallas/tpu_pallas_test.py) sets
  (``Chip.scoped_vmem_exceeded_bytes``); ``vmem_limit_bytes``: jax/_src/pallas/mosaic/core.py.
- parallel after arbitrary, output revisits: same page, "Multicore / Pipelining" sections, and
  the TPU interpreter's revisit check (jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py);
  an output with ``RevisitMode.ANY`` may revisit (its restores are modelled, kernelsim.schedule),
  but only single-buffered: ``RevisitMode.ANY is not supported with double buffering``
  (jax/_src/pallas/mosaic/lowering.py, the window params' ``revisit_mode``).
"""

from __future__ import annotations

from kernelsim.chips import Chip
from kernelsim.cost import CallCost
from kernelsim.model import KernelCall, Operand
from kernelsim.schedule import CallSchedule, revisit_steps

# TPU vreg geometry the block-shape rule uses: sublanes x lanes of 32-bit words (the same on
# every chip kernelsim models; jax/_src/tpu_info.py num_sublanes / num_lanes).
_SUBLANES, _LANES = 8, 128


# every block-shape warning ends with this sentence (the grader's tiling rule selects them by it)
BLOCK_SHAPE_REJECTED = "Mosaic will reject this block shape"


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
    if not block:
        return (f"operand {op.name!r}: a rank-0 block; the TPU lowering supports blocks of "
                f"rank >= 1 (e.g. the whole array, {tuple(op.shape)}). {BLOCK_SHAPE_REJECTED}.")
    if len(block) >= 2:
        problems = [f"{pos} dim {b} is neither a multiple of {m} nor the array's {a}"
                    for b, a, m, pos in ((block[-1], op.shape[-1], _LANES, "last"),
                                         (block[-2], op.shape[-2], _SUBLANES, "second-to-last"))
                    if b != a and b % m]
        if not problems:
            return None
        nearest = (*block[:-2], _nearest_multiple(block[-2], op.shape[-2], _SUBLANES),
                   _nearest_multiple(block[-1], op.shape[-1], _LANES))
        return (f"operand {op.name!r}: block {op.block_shape} breaks TPU's (8, 128) tiling "
                "rule: " + "; ".join(problems) + f". Nearest legal block: {nearest}. "
                f"{BLOCK_SHAPE_REJECTED}.")
    bits = 32 if op.dtype == "bool" else 8 * op.itemsize  # bools are stored as int32
    min_tiling, chunk = _LANES * (32 // bits), _SUBLANES * _LANES
    b, a = block[0], op.shape[0]
    if b == a or b % chunk == 0 or (b >= min_tiling and b & (b - 1) == 0):
        return None
    return (f"operand {op.name!r}: 1-D block ({b},) of {op.dtype} over ({a},) breaks TPU's 1-D "
            f"tiling rule: it is neither the whole array, a multiple of {chunk}, nor a power of "
            f"two >= {min_tiling}. Nearest legal block: ({_nearest_1d(b, a, chunk, min_tiling)},)."
            f" {BLOCK_SHAPE_REJECTED}.")


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
    if tpu and cost.vmem_bytes > capacity:
        warnings.append(
            f"on-chip footprint {cost.vmem_bytes:,} B exceeds {chip.name}'s VMEM of "
            f"{capacity:,} B: use smaller blocks.")
    with_values = cost.vmem_bytes + call.temporaries_vmem_bytes
    if tpu and cost.vmem_bytes <= capacity < with_values:
        warnings.append(
            f"the buffers fit in {chip.name}'s VMEM ({cost.vmem_bytes:,} of {capacity:,} B), "
            f"but with the values the kernel body computes (up to "
            f"{call.temporaries_vmem_bytes:,} B held at once) they may not: Mosaic keeps what "
            "does not fit in vector registers in VMEM. Use smaller blocks.")
    limit = call.vmem_limit_bytes
    default = chip.scoped_vmem_exceeded_bytes
    if tpu and limit is None and default and capacity >= cost.vmem_bytes >= default:
        warnings.append(
            f"on-chip footprint {cost.vmem_bytes:,} B is at least {default:,} B, which JAX's "
            f"own test (test_automatic_single_buffering) expects to exceed Mosaic's default "
            f"scoped VMEM limit on {chip.name} (the default itself is stated neither in JAX's "
            "source nor in its docs): set pltpu.CompilerParams(vmem_limit_bytes=...) (XLA's "
            "--xla_tpu_scoped_vmem_limit_kib must allow it) or use smaller blocks.")
    if tpu and limit is not None and capacity >= cost.vmem_bytes > limit:
        # jax/_src/pallas/mosaic/core.py, CompilerParams: the limit also needs XLA's
        # --xla_tpu_scoped_vmem_limit_kib raised above it.
        warnings.append(
            f"on-chip footprint {cost.vmem_bytes:,} B exceeds the call's vmem_limit_bytes "
            f"{limit:,} B: raise the limit (together with XLA's "
            "--xla_tpu_scoped_vmem_limit_kib) or use smaller blocks.")
    if tpu and chip.smem_bytes and cost.smem_bytes > chip.smem_bytes:
        warnings.append(f"SMEM footprint {cost.smem_bytes:,} B exceeds {chip.name}'s "
                        f"{chip.smem_bytes:,} B: prefetch fewer scalars.")
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
