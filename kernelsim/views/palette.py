"""The one colour palette every kernelsim view uses (figures, widget, HTML player).

One colour per pipeline action, plus the few non-action colours the views share. The HTML
player receives this dict as JSON, so a change here changes every view.
"""

from __future__ import annotations

from kernelsim.schedule import ACTIONS

ACTION_COLORS: dict[str, str] = {
    "fetch": "#2b7bd6",      # HBM -> on-chip copy
    "skip": "#9aa5b1",       # input block unchanged: no copy
    "writeback": "#e07b24",  # on-chip -> HBM copy
    "keep": "#3a9d5d",       # output block stays on chip
}
assert tuple(ACTION_COLORS) == ACTIONS

ACTION_LABELS: dict[str, str] = {
    "fetch": "fetch (HBM -> VMEM)", "skip": "skip (block reused)",
    "writeback": "write-back (VMEM -> HBM)", "keep": "keep (stays on chip)",
}

IDLE = "#eef1f4"        # blocks / buffers not in use this step
EDGE = "#ffffff"        # block grid lines
INK = "#1f2933"         # text and outlines
SCRATCH = "#c9b6e4"     # scratch buffers
SMEM_READ = "#d63384"   # scalar-prefetch entries read by this step's index maps
READ = "#2b7bd6"        # in-block reads (access figure)
WRITE = "#e07b24"       # in-block writes (access figure)
OPERAND_CYCLE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def as_json() -> dict[str, object]:
    """The palette as plain data (for the HTML player)."""
    return {"actions": ACTION_COLORS, "labels": ACTION_LABELS, "idle": IDLE, "edge": EDGE,
            "ink": INK, "scratch": SCRATCH, "smem_read": SMEM_READ}
