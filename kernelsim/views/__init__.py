"""Views of a ``kernelsim.Trace``: figures, an ipywidgets stepper, an HTML player, comparisons.

Every view reads the Trace (``t.calls[i].schedule``, ``.cost``, ``.call``); none re-derives a
number. Colours come from ``kernelsim.views.palette``.
"""
