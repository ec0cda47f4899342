"""The one exception kernelsim raises for input it cannot analyse."""


class TraceError(Exception):
    """A function or kernel kernelsim cannot model; the message names the call and what to fix."""
