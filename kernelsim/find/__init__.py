"""A program's kernel calls: each ``pallas_call`` found in its jaxpr with the values around it,
modelled as a ``KernelCall`` (grid, operands, index maps, FLOPs)."""
