"""What a learner reads when a check fails, beyond the verdict itself.

- ``HINTS``: known Pallas errors (as JAX, Mosaic or kernelsim word them) mapped to one line that
  says what to change; ``annotate`` appends the hints that match a failure message.
- ``block_map``: which output blocks hold wrong elements, drawn as a small grid.
- ``traffic_table``: the learner's per-operand HBM traffic, shown beside a failed budget rule.
- ``literal``: case parameters as Python literals (the manifest stores tuples as JSON).

Each hint has a test that triggers the real error (tests/workspace/test_messages.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Hint:
    name: str
    pattern: re.Pattern
    text: str


def _hint(name: str, pattern: str, text: str) -> Hint:
    return Hint(name, re.compile(pattern, re.I), text)


HINTS: tuple[Hint, ...] = (
    _hint("interpret-on-cpu", r"Only interpret mode is supported on CPU",
          "on a CPU Pallas kernels run interpreted: pass interpret=INTERPRET to pl.pallas_call "
          "(INTERPRET is set in the notebook's first cell and is False on a GPU or TPU)."),
    _hint("tiling-8-128", r"divisible by 8 and 128|\(8, 128\) tiling rule",
          "TPU's (8, 128) tiling rule: the last two dimensions of every block must be multiples "
          "of 8 and 128 (or equal the array's own dimensions), e.g. (8, 128), (16, 256) or the "
          "full extent; the failure names the operand and the nearest legal block."),
    _hint("block-prescribed", r"\] \S+ block shape: required",
          "this task prescribes that operand's block shape: put exactly the required one in its "
          "BlockSpec. Any TPU block follows the (8, 128) tiling rule: its last two dimensions "
          "are multiples of 8 and 128, or the array's own."),
    _hint("element-offsets", r"block index \([^)]*\) at grid step \d+",
          "an index map returns block indices (the i-th block), not element offsets: return "
          "(i, 0), not (i * block_rows, 0)."),
    _hint("block-rank", r"must have the same number of dimensions as the array shape",
          "a BlockSpec's block shape needs one entry per dimension of its array (None squeezes "
          "a dimension away)."),
    _hint("index-map-arity", r"must return \d+ values to match block_shape",
          "an index map must return one block index per dimension of the block shape, e.g. "
          "lambda i, j: (i, j) for a 2-D block."),
    _hint("out-shape-dtype", r"Invalid dtype for `swap`",
          "the value written to an output ref must have the ref's dtype, which out_shape sets: "
          "use jax.ShapeDtypeStruct(shape, x.dtype), or write value.astype(o_ref.dtype)."),
    _hint("store-shape", r"Invalid shape for `swap`",
          "the value written to a ref must have the ref's (block's) shape: reduce with "
          "keepdims=True, or write into a slice such as o_ref[:, 0:1]."),
    _hint("reads-output", r"got nan",
          "NaN in the output: in interpret mode an output buffer starts as NaN. Did the kernel "
          "read an output ref (o_ref[...]) before writing it, or leave part of it unwritten? "
          "Accumulate in a value or a scratch ref, then write the output. Or did a value "
          "overflow? float32 exp is inf above 88.7, and inf - inf or inf / inf is NaN: "
          "subtract the row's max before exp."),
    _hint("race", r"RACE DETECTED",
          "TPU interpret mode's race detector saw two accesses to one buffer that no wait "
          "orders: a copy into a buffer while its owner may still read it (one buffer used "
          "for every step with nothing telling the sender it was read: give each step its "
          "own, or have the reader signal a semaphore on the sender before it refills a "
          "slot), or a read of a buffer before the wait of the copy into it. Wait on each "
          "copy before using what it brought."),
    _hint("negative-index", r"Out-of-bounds (read|write) of .*\[\(?slice\(-\d+",
          "an index below 0: jax.lax.rem takes the sign of its first operand "
          "(jax.lax.rem(-1, 4) is -1), so (me - step - 1) mod N needs a multiple of N added "
          "first: jax.lax.rem(me - step - 1 + N, N)."),
    _hint("kernel-arity", r"\w+\(\) takes \d+ positional arguments? but \d+ were given",
          "if that function is your kernel: it receives one ref per input, then one per output "
          "(then any scratch refs), e.g. def kernel(x_ref, y_ref, o_ref)."),
    _hint("barrier-unobserved", r"Barrier completed phase \d+, but no threads observed phase",
          "a TMA copy completed on a barrier whose previous copy nobody waited for (GPU "
          "interpret mode stops there; a GPU would lose track of the barrier's phase): call "
          "plgpu.barrier_wait on a copy's barrier after every plgpu.copy_gmem_to_smem onto it, "
          "before the next copy reuses it."),
)


def hints_for(*texts: str | None) -> list[str]:
    """The hints whose pattern occurs in any of ``texts``, in table order."""
    found = [h.text for h in HINTS if any(t and h.pattern.search(t) for t in texts)]
    return list(dict.fromkeys(found))


def annotate(message: str, *more: str | None) -> str:
    """``message`` followed by one ``Hint:`` line per matching hint (``more``: other text the
    failure produced, such as kernelsim's trace error, searched but not repeated)."""
    hints = hints_for(message, *more)
    return message + "".join(f"\nHint: {h}" for h in hints)


def literal(params: dict[str, Any]) -> str:
    """``block=(8, 128), op='mul'``: parameters as Python literals."""
    def unjson(v):
        return tuple(v["__tuple__"]) if isinstance(v, dict) and "__tuple__" in v else v

    return ", ".join(f"{k}={unjson(v)!r}" for k, v in params.items())


def block_map(bad: np.ndarray, block: tuple[int, ...], max_cells: int = 32) -> str | None:
    """Rows of ``X`` (a block with a wrong element) and ``.`` for a 1-D or 2-D output, None
    when there is no picture to draw (other ranks, one block, more than ``max_cells`` a side)."""
    if bad.ndim not in (1, 2) or len(block) != bad.ndim:
        return None
    b = bad.reshape(1, -1) if bad.ndim == 1 else bad
    bs = (1, *block) if bad.ndim == 1 else tuple(block)
    bs = tuple(max(int(x or 1), 1) for x in bs)
    nb = tuple(-(-s // k) for s, k in zip(b.shape, bs, strict=True))
    if max(nb) > max_cells or nb[0] * nb[1] == 1:
        return None
    rows = []
    for i in range(nb[0]):
        cells = ["X" if b[i * bs[0]:(i + 1) * bs[0], j * bs[1]:(j + 1) * bs[1]].any() else "."
                 for j in range(nb[1])]
        rows.append("  " + " ".join(cells))
    nwrong = sum(r.count("X") for r in rows)
    grid = " x ".join(map(str, nb[-bad.ndim:]))
    return (f"wrong output blocks (X) of the {grid} grid of {tuple(block)} blocks: "
            f"{nwrong} of {nb[0] * nb[1]}\n" + "\n".join(rows))


def traffic_table(facts: Any) -> str:
    """One line per operand of each traced call: block, fetches, HBM bytes read and written. A
    kernel inside ``jax.shard_map`` is one call per device: its table once, for the first
    device, then a line per device of the copies it sends to other devices."""
    lines, mesh = [], {}
    for call in facts.calls:
        if call.device is not None:
            mesh.setdefault(call.name, []).append(call)
            if len(mesh[call.name]) > 1:
                continue
        each = "" if call.device is None else " on each device (device " \
            f"{call.device}'s shown)"
        lines.append(f"your call of `{call.name}` (grid {tuple(call.grid)}){each}: HBM read "
                     f"{call.hbm_read_bytes:,} B, written {call.hbm_write_bytes:,} B")
        for o in call.operands:
            lines.append(f"  {o.role:<7} {o.name:<10} block {o.block_shape}: {o.fetches} "
                         f"fetch(es), read {o.hbm_read_bytes:,} B, written "
                         f"{o.hbm_write_bytes:,} B")
    for name, calls in mesh.items():
        for call in calls:
            sent = call.remote_copies
            to = ", ".join(str(d) for d in sorted({r.dst_device for r in sent})) or "none"
            lines.append(f"`{name}` on device {call.device}: {len(sent)} remote copies, "
                         f"{sum(r.bytes for r in sent):,} B sent, to device(s) {to}")
    return "\n".join(lines)
