"""An ipywidgets stepper over a Trace: step slider, play/pause, call selector, operand
toggles and a tpu/gpu model switch.

The figure is a ``StepFigure`` rendered to PNG into an ``ipywidgets.Image`` (works in
JupyterLab 4 without ipympl). A step change only moves the existing artists and re-renders;
the call, model and operand controls rebuild the figure. The gpu/tpu switch builds the other
model's schedule and cost from the same KernelCall (``schedule.build`` + ``cost.compute``).
"""

from __future__ import annotations

import io
import time
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg

from kernelsim.views.data import call_view
from kernelsim.views.figure import StepFigure

if TYPE_CHECKING:
    from kernelsim.trace import Trace


def in_notebook_frontend() -> bool:
    """True inside a Jupyter kernel (where widgets have a front end to render them)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Stepper:
    """The widget and its state; ``.widget`` is the ipywidgets box to display.

    ``redraw_seconds`` holds how long each step redraw (artist update + PNG render) took.
    """

    def __init__(self, t: Trace, call: int = 0, model: str | None = None, dpi: int = 72):
        import ipywidgets as w

        self.trace, self.dpi = t, dpi
        self.redraw_seconds: list[float] = []
        self.image = w.Image(format="png")
        self.status = w.HTML()
        self.slider = w.IntSlider(0, min=0, max=0, description="step", continuous_update=True,
                                  layout=w.Layout(width="60%"))
        self.play = w.Play(0, min=0, max=0, interval=250, description="play")
        w.jslink((self.play, "value"), (self.slider, "value"))
        self.play.observe(lambda ch: setattr(self.slider, "value", ch["new"]), "value")
        self.calls = w.Dropdown(options=[(f"{i}: {c.name}", i) for i, c in enumerate(t.calls)],
                                value=call, description="call")
        self.model = w.ToggleButtons(options=["tpu", "gpu"], value=model or t.model,
                                     description="model")
        self.toggles = w.HBox()
        self.slider.observe(lambda ch: self.show(ch["new"]), "value")
        self.calls.observe(lambda ch: self.rebuild(), "value")
        self.model.observe(lambda ch: self.rebuild(), "value")
        self.widget = w.VBox([w.HBox([self.calls, self.model]), self.toggles,
                              w.HBox([self.play, self.slider]), self.status, self.image])
        self.rebuild()

    @property
    def step(self) -> int:
        return self.figure.step

    def png(self) -> bytes:
        """The canvas as it is now, PNG-encoded (fast compression: this runs every step)."""
        from PIL import Image

        width, height = self.canvas.get_width_height()
        img = Image.frombuffer("RGBA", (width, height), self.canvas.buffer_rgba(), "raw",
                               "RGBA", 0, 1)
        buf = io.BytesIO()
        img.save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def hidden(self) -> tuple[str, ...]:
        return tuple(cb.description for cb in self.toggles.children if not cb.value)

    def rebuild(self, keep_toggles: bool = False) -> None:
        """Build the figure for the selected call, model and visible operands."""
        import ipywidgets as w

        view = call_view(self.trace, self.calls.value, self.model.value)
        if not keep_toggles:
            boxes = []
            for s in view.schedule.operands:
                cb = w.Checkbox(True, description=s.operand.name, indent=False,
                                layout=w.Layout(width="auto"))
                cb.observe(lambda ch: self.rebuild(keep_toggles=True), "value")
                boxes.append(cb)
            self.toggles.children = boxes
        self.figure = StepFigure(view, hidden=self.hidden(), dpi=self.dpi)
        self.canvas = FigureCanvasAgg(self.figure.fig)
        # Blitting: draw everything that never changes once, then per step restore it and
        # draw only the artists ``update`` touched.
        self.dynamic = self.figure.dynamic_artists()
        for a in self.dynamic:
            a.set_animated(True)
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.figure.fig.bbox)
        steps = view.call.steps
        step = min(self.slider.value, steps - 1)
        self.slider.max = self.play.max = steps - 1
        self.show(step, force=True)

    def show(self, step: int, force: bool = False) -> None:
        """Show ``step``: update the figure's artists and re-render the image."""
        if step == self.figure.step and not force:
            return
        t0 = time.perf_counter()
        self.figure.update(step)
        self.canvas.restore_region(self.background)
        for a in self.dynamic:
            self.figure.fig.draw_artist(a)
        self.image.value = self.png()
        self.status.value = f"<b>{self.figure.header.get_text()}</b>"
        self.redraw_seconds.append(time.perf_counter() - t0)
        if self.slider.value != step:
            self.slider.value = step


def widget(t: Trace, call: int = 0):
    """The stepper widget in a notebook; elsewhere the static figure of step 0 and a note."""
    if not in_notebook_frontend():
        print("kernelsim: no notebook front end here; showing the static figure of step 0 "
              "(use Trace.widget() in JupyterLab for the stepper).")
        from kernelsim.views.figure import step_figure

        return step_figure(t, 0, call)
    return Stepper(t, call).widget
