"""Views of a ``kernelsim.Trace``: the interactive viewer (``viewer.js``, shown by anywidget
or standalone), matplotlib figures for static output, and comparisons.

Every view is handed what it draws and reads it (``t.calls[i].schedule``, ``.cost``, ``.call``
of a ``kernelsim.trace_data.TraceData``, or a Mosaic GPU kernel's
``kernelsim.mosaic_gpu.kernel_data.GpuKernelData``); none imports the tracer, and none
re-derives a number.
Colours come from ``kernelsim.views.palette``. Steps count from 0 everywhere.
"""
