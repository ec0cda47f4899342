"""What each pipeline model's chip calls its memories: the one table the Trace's dict and the
views read (``Trace.to_dict()["memory_spaces"]``, the viewer's lanes, legends and sentences)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryNames:
    """What a pipeline model's chip calls its memories, in the words a view prints.

    off_chip: where the operands live and every copy's bytes come from.
    on_chip: where the pipeline keeps the blocks a grid step works on; ``on_chip_short``
        the same in a legend's few words, ``kept`` where a kept block stays.
    spaces: an operand's ``memory_space`` (``kernelsim.model.MemorySpace``) in these words.
    scalars: where scalar-prefetch operands live; None where the model has no scalar
        prefetch (the ``gpu`` model is Triton's pipeline, whose lowering raises "scalar
        prefetch not implemented in the Triton backend",
        jax/_src/pallas/triton/pallas_call_registration.py).
    """

    off_chip: str
    on_chip: str
    on_chip_short: str
    kept: str
    spaces: dict[str, str]
    scalars: str | None
    interconnect: str | None

    def action_labels(self) -> dict[str, str]:
        """A legend's words for each pipeline action."""
        on = self.on_chip_short
        return {"fetch": f"fetch ({self.off_chip} → {on})", "skip": "skip (block reused, no copy)",
                "writeback": f"write-back ({on} → {self.off_chip})",
                "keep": f"keep (stays {self.kept})"}


MEMORY_NAMES: dict[str, MemoryNames] = {
    "tpu": MemoryNames(off_chip="HBM", on_chip="VMEM", on_chip_short="VMEM", kept="in VMEM",
                       spaces={"vmem": "VMEM", "smem": "SMEM", "hbm": "HBM",
                               "any": "HBM, pl.ANY", "semaphore": "semaphore"},
                       scalars="SMEM", interconnect="ICI"),
    # Triton keeps a program's blocks in registers, staging some (a dot's operands) through
    # shared memory; Mosaic GPU copies them into shared memory and loads registers from there
    "gpu": MemoryNames(off_chip="global memory", on_chip="shared memory / registers",
                       on_chip_short="on chip", kept="on chip",
                       spaces={"vmem": "on chip", "smem": "on chip", "hbm": "global memory",
                               "any": "global memory, pl.ANY", "semaphore": "semaphore"},
                       scalars=None, interconnect=None),
}


def memory_spaces(model: str) -> list[dict[str, str]]:
    """The memories a ``model``'s views draw, as ``{"id", "name"}``: an operand's
    ``memory_space`` id and the name the hardware gives it (no SMEM where the model has no
    scalar prefetch)."""
    n = MEMORY_NAMES[model]
    return [{"id": "hbm", "name": n.off_chip}, {"id": "vmem", "name": n.on_chip},
            *([{"id": "smem", "name": f"{n.scalars} (scalars)"}] if n.scalars else [])]

