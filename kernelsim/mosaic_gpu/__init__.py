"""The parts of ``kernelsim.gpu``'s walk of a Mosaic GPU kernel: the refs it follows and the
data it finds (what the viewer reads)."""
