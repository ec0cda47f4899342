"""Views of a ``kernelsim.Trace``: the interactive viewer (``viewer.js``, shown by anywidget
or standalone), matplotlib figures for static output, and comparisons.

Every view reads the Trace (``t.calls[i].schedule``, ``.cost``, ``.call``) -- or, for a Mosaic
GPU kernel, the ``kernelsim.gpu.GpuKernel`` -- and none re-derives a number. Colours come
from ``kernelsim.views.palette``. Steps count from 0 everywhere.
"""
