"""``unreadable_text`` finds each problem it names in a figure made to have it, and nothing in
one made without; ``readable_ink`` picks the label colour a cell needs."""

import pytest
from matplotlib.figure import Figure

from kernelsim.views.figure import DPI, FONT
from kernelsim.views.readability import contrast, drawn_texts, readable_ink, unreadable_text


def _planted(*texts: dict, size=(3.0, 1.5)) -> Figure:
    """A figure with an axes titled "planted" and ``texts`` (``Axes.text``'s keyword
    arguments, in axes coordinates), white unless ``facecolor`` says otherwise."""
    fig = Figure(figsize=size, dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 0.8))
    ax.set_axis_off()
    ax.set_title("planted")
    for text in texts:
        ax.text(**{"fontsize": FONT, "transform": ax.transAxes, **text})
    return fig


def test_a_readable_figure_has_no_problem():
    fig = _planted({"x": 0.05, "y": 0.5, "s": "black on white"},
                   {"x": 0.6, "y": 0.5, "s": "white", "color": "white",
                    "bbox": {"facecolor": "#1f2933"}})  # judged against its box
    assert unreadable_text(fig) == []


@pytest.mark.parametrize("texts, says", [
    # two texts in one place
    (({"x": 0.1, "y": 0.5, "s": "first label"}, {"x": 0.2, "y": 0.5, "s": "second label"}),
     ["'first label' and 'second label' overlap"]),
    # side by side with no space: "0.000000.00006" read as one number
    (({"x": 0.5, "y": 0.5, "s": "0.00000", "ha": "right"},
      {"x": 0.5, "y": 0.5, "s": "0.00006", "ha": "left"}),
     ["'0.00000' and '0.00006' run together"]),
    # past the right edge
    (({"x": 0.8, "y": 0.5, "s": "a label too long for the figure"},),
     ["'a label too long for the figure' runs", "past the figure's edge"]),
    # white on yellow, black on dark blue: lessons 14 and 13's cells
    (({"x": 0.1, "y": 0.5, "s": "shard 3", "color": "white",
       "bbox": {"facecolor": "#fde725", "edgecolor": "none"}},),
     ["'shard 3' is #ffffff on #fde725, contrast 1.3:1"]),
    (({"x": 0.1, "y": 0.5, "s": "core 0", "color": "black",
       "bbox": {"facecolor": "#3b4cc0", "edgecolor": "none"}},),
     ["'core 0' is #000000 on #3b4cc0, contrast 3.0:1", "use black or white"]),
    # pale on the figure's own white, found without a box
    (({"x": 0.1, "y": 0.5, "s": "faint", "color": "#bbbbbb"},),
     ["'faint' is #bbbbbb on #ffffff"]),
])
def test_each_planted_problem_is_named_once(texts, says):
    problems = unreadable_text(_planted(*texts))
    assert len(problems) == 1, problems
    assert problems[0].startswith("figure 'planted': "), problems
    assert all(part in problems[0] for part in says), (says, problems)


def test_the_fill_is_what_is_drawn_under_the_text():
    """Black on an image's dark cell, no box: the fill comes from the pixels behind it."""
    fig = _planted({"x": 0.45, "y": 0.45, "s": "cell"})
    fig.axes[0].imshow([[0.0]], cmap="coolwarm", vmin=0, vmax=1, extent=(0, 1, 0, 1))
    (problem,) = unreadable_text(fig)
    assert "'cell' is #000000 on #3" in problem and "contrast 3.0:1" in problem  # ~#3b4cc0


def test_a_legend_over_a_text_is_named():
    fig = _planted({"x": 0.02, "y": 0.9, "s": "under the legend", "va": "top"})
    fig.axes[0].plot([0], [0], label="a line with a long name")
    fig.axes[0].legend(loc="upper left", frameon=True)
    problems = unreadable_text(fig)
    assert any("the legend covers 'under the legend'" in p for p in problems), problems


def test_the_check_leaves_a_bare_figures_canvas_and_its_texts_as_they_were():
    fig = _planted({"x": 0.1, "y": 0.5, "s": "kept"})
    canvas = fig.canvas
    unreadable_text(fig)
    assert fig.canvas is canvas
    assert sorted(t.get_text() for t, _ in drawn_texts(fig)) == ["kept", "planted"]


def test_readable_ink_is_black_on_light_and_white_on_dark():
    assert [readable_ink(c) for c in ("#fde725", "#eef1f4", "#3b4cc0", "#440154")] == \
        ["black", "black", "white", "white"]
    assert contrast("black", "white") == pytest.approx(21)
