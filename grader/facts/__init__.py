"""The facts: what a learner's function does, read from its jaxpr and its run (where the work
happens, whose kernel it is, the order of its DMAs, a GPU kernel's copies and barriers)."""
