"""``kernelsim.verify``'s witnesses: the copies TPU interpret mode really performs, and JAX's
real TPU and GPU lowerings."""
