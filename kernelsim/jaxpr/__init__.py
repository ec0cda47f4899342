"""Ordinary JAX code read and run in numpy: how a jaxpr nests, lax primitives with XLA's
semantics, and a jaxpr's concrete values without compiling it."""
