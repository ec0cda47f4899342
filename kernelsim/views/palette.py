"""The one palette every kernelsim view uses (matplotlib figures and the viewer).

Okabe & Ito's colour-blind-safe colours, one per pipeline action, each paired with a pattern
so that no view relies on hue alone. The viewer receives ``as_json()``, so a change here
changes every view.
"""

from __future__ import annotations

from kernelsim.cost.schedule import ACTIONS
from kernelsim.memories import MEMORY_NAMES

ACTION_COLORS: dict[str, str] = {
    "fetch": "#0072b2",      # HBM -> on-chip copy (blue)
    "skip": "#8c8c8c",       # input block unchanged: no copy (grey)
    "writeback": "#d55e00",  # on-chip -> HBM copy (vermillion)
    "keep": "#009e73",       # output block stays on chip (bluish green)
}
assert tuple(ACTION_COLORS) == ACTIONS

# matplotlib hatches; the viewer draws the same patterns with CSS gradients
ACTION_HATCHES: dict[str, str] = {"fetch": "//", "skip": "..", "writeback": "\\\\", "keep": ""}

ACTION_LABELS: dict[str, str] = MEMORY_NAMES["tpu"].action_labels()

IDLE = "#eef1f4"        # blocks / buffers not in use this step
EDGE = "#ffffff"        # block grid lines
INK = "#1f2933"         # text and outlines
SCRATCH = "#e69f00"     # scratch buffers (orange)
SMEM_READ = "#cc79a7"   # scalar-prefetch entries read by this step's index maps (purple)
# a Mosaic GPU kernel's events (kernelsim.mosaic_gpu.kernel_data.EVENT_KINDS): copies in the
# fetch and write-back colours, a barrier's wait in purple and its arrive in Tol's indigo,
# tensor-core work in green, the wait for it in yellow, the wait for TMA stores in dark brown.
# Brown and indigo are no other kind's colour: under simulated protan-, deutan- and tritanopia
# each stays well apart from every other kind and from the strip's dark cursor, and both read
# on white. The viewer prints each event's kind beside its colour
EVENT_COLORS: dict[str, str] = {
    "tma_load": ACTION_COLORS["fetch"], "load": "#56b4e9",
    "tma_store": ACTION_COLORS["writeback"], "store": "#e69f00",
    "barrier_wait": "#cc79a7", "barrier_arrive": "#332288", "wgmma": ACTION_COLORS["keep"],
    "wgmma_wait": "#f0e442", "wait_tma_store": "#663311", "commit_smem": "#8c8c8c",
}
OPERAND_CYCLE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442")


def as_json() -> dict[str, object]:
    """The palette as plain data (for the viewer)."""
    return {"actions": ACTION_COLORS, "idle": IDLE, "edge": EDGE,
            "ink": INK, "scratch": SCRATCH, "smem_read": SMEM_READ, "events": EVENT_COLORS}
