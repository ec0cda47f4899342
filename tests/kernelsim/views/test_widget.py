"""The ipywidgets stepper: programmatic control changes update the shown step and blocks."""

from matplotlib.colors import to_hex

from kernelsim.views import palette as pal
from kernelsim.views.widget import Stepper, widget


def _rect(stepper, name):
    r = stepper.figure.panels[name]["rect"]
    return (r.get_x(), r.get_y()), to_hex(r.get_facecolor())


def test_slider_updates_step_header_and_highlights_without_rebuilding(mm_trace):
    s = Stepper(mm_trace)
    fig, first_png = s.figure.fig, s.image.value
    assert s.step == 0 and "step 1 of 64" in s.status.value
    s.slider.value = 3  # grid (0, 0, 3): output written back
    assert s.step == 3 and "step 4 of 64" in s.status.value
    assert _rect(s, "x_ref") == ((384, 0), pal.ACTION_COLORS["fetch"])
    assert _rect(s, "o_ref") == ((0, 0), pal.ACTION_COLORS["writeback"])
    s.slider.value = 24  # grid (1, 2, 0)
    assert _rect(s, "o_ref") == ((256, 128), pal.ACTION_COLORS["keep"])
    assert s.figure.fig is fig  # the same artists, moved
    assert s.image.value != first_png and s.image.value[:4] == b"\x89PNG"
    s.play.value = 10  # play drives the slider
    assert s.slider.value == 10 and s.step == 10
    assert len(s.redraw_seconds) >= 4


def test_model_switch_and_operand_toggles(mm_trace):
    s = Stepper(mm_trace)
    s.slider.value = 1
    assert _rect(s, "o_ref")[1] == pal.ACTION_COLORS["keep"]
    s.model.value = "gpu"  # built from the same KernelCall: every program stores its block
    assert _rect(s, "o_ref")[1] == pal.ACTION_COLORS["writeback"] and s.step == 1
    assert "gpu" in s.figure.subheader.get_text()
    s.toggles.children[0].value = False
    assert list(s.figure.panels) == ["y_ref", "o_ref"]


def test_outside_a_notebook_falls_back_to_the_static_figure(mm_trace, capsys):
    from matplotlib.figure import Figure

    out = widget(mm_trace)
    assert isinstance(out, Figure)
    assert capsys.readouterr().out.count("\n") == 1
