"""From a modelled call to what it costs: the per-step schedule of block copies, bytes and time
on a chip, GPU L2 reuse, and the lint of what a real backend would reject or run badly."""
