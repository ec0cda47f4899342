"""Stage 1 of kernelsim: a pallas_call as plain data (grid, operands, evaluated index maps).

Everything here is independent of JAX's internals; ``kernelsim.find.call_model`` fills these
dataclasses from a captured ``pallas_call`` and the stages after it (schedule, cost, views) read
only them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Role = Literal["scalar_prefetch", "input", "output", "scratch"]
MemorySpace = Literal["vmem", "smem", "hbm", "any", "semaphore"]
BlockKind = Literal["blocked", "element", "squeezed"]


@dataclass(frozen=True)
class BlockDim:
    """One dimension of a block.

    kind: ``blocked`` (the index map returns a block index; the block starts at index * size),
        ``element`` (the index map returns an element offset into the padded array) or
        ``squeezed`` (size 1, dropped from the kernel's ref; the map returns an element index).
    size: block extent in elements (1 for ``squeezed``).
    padding: (low, high) elements of padding for ``element`` dims.
    """

    kind: BlockKind
    size: int
    padding: tuple[int, int] = (0, 0)

    def start(self, index: np.ndarray) -> np.ndarray:
        """Element offset of the block's first element in the unpadded array (may be negative)."""
        if self.kind == "blocked":
            return index * self.size
        return index - self.padding[0]

    def block_count(self, extent: int) -> int:
        """How many distinct block indices fit in an array dimension of ``extent`` elements."""
        if self.kind == "blocked":
            return -(-extent // self.size)
        if self.kind == "squeezed":
            return extent
        return extent + self.padding[0] + self.padding[1] - self.size + 1


@dataclass
class Operand:
    """One operand of a pallas_call, in pallas_call order.

    block_indices: int64 array [steps, ndim], the index map's output at every grid step in
        execution order; ``None`` for scratch, scalar prefetch and operands without a window.
    value: the concrete array for scalar-prefetch operands (what the index maps read from SMEM).
    trivial_window: the block is the whole array *and* the index map returns literal zeros
        (JAX's ``BlockMapping.has_trivial_window``): Mosaic single-buffers such a VMEM block.
    buffer_count: on-chip buffers the TPU pipeline allocates (``pl.Buffered(n)``, 2 by default,
        1 for a trivial window), as the adapter read it from JAX.
    revisit_any: an output with ``pl.Buffered(..., revisit=pl.RevisitMode.ANY)``: a block that
        comes back after another was visited is read back from HBM first (see
        ``kernelsim.cost.schedule``).
    """

    name: str
    role: Role
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    memory_space: MemorySpace
    block_dims: tuple[BlockDim, ...] | None = None
    buffer_count: int = 2
    block_indices: np.ndarray | None = None
    value: np.ndarray | None = None
    trivial_window: bool = False
    revisit_any: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array in HBM (or of the scratch buffer on chip)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.itemsize

    @property
    def block_shape(self) -> tuple[int | None, ...] | None:
        """The BlockSpec's shape as the user wrote it: ``None`` marks a squeezed dimension."""
        if self.block_dims is None:
            return None
        return tuple(None if d.kind == "squeezed" else d.size for d in self.block_dims)

    @property
    def block_buffer_bytes(self) -> int:
        """Bytes of one on-chip buffer holding a full block."""
        if self.block_dims is None:
            return self.nbytes
        return int(np.prod([d.size for d in self.block_dims], dtype=np.int64)) * self.itemsize

    @property
    def tile_padded_buffer_bytes(self) -> int:
        """Bytes of one on-chip buffer of the block (the whole array, for an operand without a
        window) with Mosaic's tile padding (``tile_padded_bytes``)."""
        dims = (self.shape if self.block_dims is None
                else tuple(d.size for d in self.block_dims if d.kind != "squeezed"))
        return tile_padded_bytes(dims, self.dtype, self.itemsize)

    @property
    def pipelined(self) -> bool:
        """Input/output with a window in VMEM or SMEM: the pipeline copies its blocks."""
        return self.role in ("input", "output") and self.memory_space in ("vmem", "smem")


def tile_padded_bytes(shape: tuple[int, ...], dtype: str, itemsize: int) -> int:
    """Bytes of an array of ``shape`` in TPU on-chip memory (VMEM or SMEM) as Mosaic lays it
    out: the last dim padded to a multiple of 128 lanes and, from rank 2, the second-to-last
    to the dtype's row tile -- 8 rows of 32-bit values, 16 of 16-bit, 32 of 8-bit (narrow
    values pack into 32-bit words: the (8, 128), (16, 128) and (32, 128) tilings), or for
    fewer rows the smallest power of two that holds them (at least the values one 32-bit
    word packs). Mosaic's memref layout inference (``getTilingFactor`` in
    jaxlib/mosaic/dialect/tpu/transforms/infer_memref_layout.cc, last in JAX's repository at
    commit ba6a5ffbf8) makes those tiles and treats SMEM as VMEM. Bools are 32-bit words."""
    if not shape:
        return itemsize
    width = 4 if dtype == "bool" else itemsize
    dims = list(shape)
    dims[-1] = -(-dims[-1] // _LANES) * _LANES
    if len(dims) >= 2:
        packing = max(1, 4 // max(width, 1))
        tile = min(_SUBLANES * packing, max(packing, 1 << max(0, dims[-2] - 1).bit_length()))
        dims[-2] = -(-dims[-2] // tile) * tile
    return int(np.prod(dims, dtype=np.int64)) * width


_SUBLANES, _LANES = 8, 128  # TPU vreg: sublanes x lanes of 32-bit words (jax/_src/tpu_info.py)


OFF_CHIP: tuple[MemorySpace, ...] = ("hbm", "any")  # where a copy's bytes are HBM traffic


@dataclass(frozen=True)
class MeshDevice:
    """One device of a ``jax.shard_map`` mesh that a kernel runs on.

    axes / sizes: the mesh's axis names and extents, in mesh order; coords: this device's
    index along each. ``id`` numbers the devices row-major over the mesh (last axis fastest),
    as TPU interpret mode numbers them.
    """

    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    coords: tuple[int, ...]

    @property
    def id(self) -> int:
        return self.logical_id(self.coords)

    def logical_id(self, coords: tuple[int, ...]) -> int:
        """The row-major number of the device at mesh ``coords``."""
        return int(np.ravel_multi_index(tuple(int(c) for c in coords), self.sizes))

    def target(self, device_id: dict[str, int] | tuple[int, ...] | int) -> int:
        """The device a remote copy's ``device_id`` (mesh form) names, seen from this one: a
        dict sets the axes it names and keeps this device's index on the others; a tuple gives
        every coordinate; an int is the coordinate on a one-axis mesh."""
        if isinstance(device_id, dict):
            unknown = set(device_id) - set(self.axes)
            if unknown:
                raise KeyError(f"device_id names axes {sorted(map(str, unknown))} that the "
                               f"mesh {self.axes} does not have")
            return self.logical_id(tuple(device_id.get(a, c)
                                         for a, c in zip(self.axes, self.coords, strict=True)))
        coords = tuple(device_id) if isinstance(device_id, tuple) else (device_id,)
        return self.logical_id(coords)


# Per dimension of a ref, ``(start, size, stride)`` in elements: one strided box of it.
Slice = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class BodyCopy:
    """One DMA the kernel body starts at one grid step (``pltpu.make_async_copy(...).start()``,
    ``pltpu.async_copy``, ``pltpu.sync_copy``), found by interpreting the body.

    src / dst: operand names (``scopedN`` for ``pl.run_scoped`` allocations); bytes: the
    bytes the copy moves (the source slice's size). src_slice / dst_slice: the box of each
    ref it reads and writes (None when the selection is not one strided box, e.g. a gather).
    semaphore: the DMA semaphore it signals (``name`` or ``name[i]`` for an element of a
    semaphore array). start_pos / wait_pos: the position of its start and of the wait that
    completes it among the DMA starts and waits of their step (from 0, in body order);
    wait_step: the step of that wait (``kernelsim.body.steps``), None if it is never waited on.
    src_device / dst_device: for a kernel inside ``jax.shard_map``, the ``MeshDevice.id`` of
    the device whose memory it reads and of the one it writes (they differ for a remote copy,
    ``pltpu.make_async_remote_copy``); None outside a mesh. A remote copy's ``wait_step`` is
    the sender's own wait on that semaphore (every device runs the same body).
    """

    step: int
    src: str
    dst: str
    src_space: MemorySpace
    dst_space: MemorySpace
    bytes: int
    src_slice: Slice | None = None
    dst_slice: Slice | None = None
    semaphore: str = ""
    start_pos: int = 0
    wait_step: int | None = None
    wait_pos: int | None = None
    src_device: int | None = None
    dst_device: int | None = None

    @property
    def remote(self) -> bool:
        """The copy crosses from one device to another (over the chips' interconnect)."""
        return self.src_device != self.dst_device


@dataclass(frozen=True)
class Matmul:
    """One ``dot_general`` of a kernel body.

    dtype: its lhs input dtype. flops: what it performs in one kernel invocation (its loop
    repetitions included). k_major: both operands are contracted along the dimension that is
    minor (contiguous) where they were loaded: a block loaded from a ref is row-major, and a
    ``transpose`` of a value only relabels its dimensions (the Triton lowering makes it
    ``tt.trans``, which Triton folds into the shared-memory view a WGMMA reads:
    ``FuseTransMMAV3Plus`` in its OptimizeDotOperands.cpp), so ``a @ b`` with ``b`` a
    ``(K, N)`` block is not K-major and ``a @ bt.T`` with ``bt`` an ``(N, K)`` block is; so is
    a ``dot_general`` contracting ``bt``'s dimension 1. tf32: float32 inputs at a precision
    the Triton lowering multiplies as TF32 (JAX's default; ``_TF32_PRECISIONS`` in
    jax/_src/pallas/triton/lowering.py), not ``Precision.HIGHEST``. precision: the dot's
    ``lax.Precision`` name, "DEFAULT", "HIGH" or "HIGHEST" (a ``DotAlgorithmPreset`` as the
    one of the three whose bf16 passes it takes; none given is "DEFAULT"): on a TPU a float32
    dot takes one bf16 pass of the MXU at DEFAULT and more at HIGH and HIGHEST
    (``kernelsim.chips.Chip.matmul_flops_per_second``).
    """

    dtype: str
    flops: int
    k_major: bool
    tf32: bool = False
    precision: str = "DEFAULT"


@dataclass(frozen=True)
class StepWork:
    """A kernel body's work at each grid step, each ``pl.when`` at the branch its predicate
    takes there (``kernelsim.find.flops.step_work``).

    flops / vector_vregs / lane_broadcast_vregs: (steps,) int arrays, as
    ``KernelCall.flops_per_step`` and its siblings count one invocation; None when no
    predicate could be evaluated (then every step is counted as one invocation with each
    ``pl.when`` at its most expensive branch).
    computes: (steps,) bools, the steps whose body computes or stores an array (a matmul,
        vector work, a lane broadcast, a store into a ref), not only scalar index arithmetic:
        the working steps.
    unevaluated: for each ``pl.when`` whose predicate is not a function of the grid step alone
        (it reads a block, scratch, a loop's carry), why; its most expensive branch is counted
        at every step.
    """

    flops: np.ndarray | None
    vector_vregs: np.ndarray | None
    lane_broadcast_vregs: np.ndarray | None
    computes: np.ndarray | None
    unevaluated: tuple[str, ...] = ()

    @property
    def evaluated(self) -> bool:
        return self.flops is not None


@dataclass
class KernelCall:
    """One captured pallas_call.

    grid: the grid's extents; steps run in row-major order (last axis fastest).
    flops_per_step: FLOPs one kernel invocation performs, counted from the kernel jaxpr.
    vector_vregs_per_step: the vector registers one invocation's arithmetic other than
        matmuls produces, tile-padded (``kernelsim.find.flops.count_flops``).
    lane_broadcast_vregs_per_step: the column vregs one invocation broadcasts across the
        lanes (``kernelsim.find.flops.lane_broadcast_vregs``). These three count every
        ``pl.when`` at its most expensive branch.
    step_work: the work at each grid step as the body's ``pl.when`` predicates decide it
        (``StepWork``); None for a body without one.
    matmuls: the kernel body's dot_generals (``kernelsim.find.flops.Matmul``: input dtype, FLOPs per
        invocation, whether both operands are K-major).
    cost_estimate_flops / cost_estimate_bytes / cost_estimate_transcendentals /
        cost_estimate_remote_bytes: the call's own ``pl.CostEstimate``, if given (the last is
        its ``remote_bytes_transferred``: bytes this call sends to other devices).
    body_copies: the DMAs the kernel body starts, in step and program order (empty unless the
        body has any; the pipeline's own copies are the schedule's).
    vmem_limit_bytes: the call's ``pltpu.CompilerParams(vmem_limit_bytes=...)``, if given.
    aliases: output name -> the input whose HBM buffer it reuses (``input_output_aliases``).
    scoped_vmem_bytes / scoped_smem_bytes: the most VMEM / SMEM the kernel body's
        ``pl.run_scoped`` allocations hold at once (``emit_pipeline`` allocates its buffers
        that way), on top of the pipeline's buffers and the scratch operands.
    body_values_vmem_bytes: the most bytes of the kernel body's values that Mosaic keeps in
        VMEM beside the buffers at once (a matmul's or reduction's result, a value read more
        than once; ``kernelsim.find.call_model``), tile-padded.
    read_by_index_maps: the scalar-prefetch operands some index map reads.
    dependent_prefetch_reads: the block operands whose index map reads scalar prefetch at an
        index read from scalar prefetch (``index_maps.reads_prefetch_at_prefetched_index``).
    referenced: the operands the kernel body's code names at all (a read, a write, a DMA or
        a wait on it, in any branch, whether or not it runs at these inputs).
    device: the mesh device this call runs on, for a kernel inside ``jax.shard_map`` (which
        runs it once per device; kernelsim keeps one call per device); None outside one.
    """

    name: str
    grid: tuple[int, ...]
    dimension_semantics: tuple[str, ...]
    operands: list[Operand]
    flops_per_step: int = 0
    vector_vregs_per_step: int = 0
    lane_broadcast_vregs_per_step: int = 0
    step_work: StepWork | None = None
    matmuls: tuple[Matmul, ...] = ()
    cost_estimate_flops: int | None = None
    cost_estimate_bytes: int | None = None
    cost_estimate_transcendentals: int | None = None
    cost_estimate_remote_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    body_copies: list[BodyCopy] = field(default_factory=list)
    vmem_limit_bytes: int | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    scoped_vmem_bytes: int = 0
    scoped_smem_bytes: int = 0
    referenced: frozenset[str] = frozenset()
    read_by_index_maps: frozenset[str] = frozenset()
    dependent_prefetch_reads: frozenset[str] = frozenset()
    body_values_vmem_bytes: int = 0
    device: MeshDevice | None = None

    @property
    def matmul_dtypes(self) -> tuple[str, ...]:
        """The input dtype of each of the kernel body's matmuls."""
        return tuple(m.dtype for m in self.matmuls)

    @property
    def steps(self) -> int:
        """Number of grid steps (kernel invocations)."""
        return int(np.prod(self.grid, dtype=np.int64))

    def grid_indices(self) -> np.ndarray:
        """int64 array [steps, len(grid)]: the grid point of every step, row-major."""
        if not self.grid:
            return np.zeros((1, 0), dtype=np.int64)
        return np.indices(self.grid, dtype=np.int64).reshape(len(self.grid), -1).T
