"""Whether a person can read a matplotlib figure's text (``unreadable_text``): no text
overlapping another, running into it or past the figure's edge, and none too faint on what
is behind it (WCAG 2 contrast). Any ``Figure``, pyplot's or a bare one; the lessons check each
figure a cell shows with it (``lessons/_course.py``), the tests each of kernelsim's.
"""

from __future__ import annotations

import contextlib

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgba
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

CONTRAST_MIN = 4.5  # WCAG 2 (level AA): text's contrast ratio against what is behind it
SLACK_PX = 1.0      # pixels of overlap, or of text past the edge, that rounding explains
GAP_PX = 2.0        # texts side by side closer than this read as one ("0.10.2"): a space is ~3
QUOTED_CHARS = 40   # characters of a text quoted in a problem


def _linear(channel: np.ndarray) -> np.ndarray:
    return np.where(channel <= 0.04045, channel / 12.92, ((channel + 0.055) / 1.055) ** 2.4)


def luminance(color) -> float:
    """WCAG 2 relative luminance of an sRGB colour (any matplotlib colour, alpha ignored):
    0 for black, 1 for white."""
    r, g, b = _linear(np.asarray(to_rgba(color)[:3], float))
    return float(0.2126 * r + 0.7152 * g + 0.0722 * b)


def contrast(a, b) -> float:
    """WCAG 2 contrast ratio of two colours, from 1 (the same) to 21 (black on white)."""
    la, lb = sorted((luminance(a), luminance(b)))
    return (lb + 0.05) / (la + 0.05)


def readable_ink(fill) -> str:
    """``"black"`` or ``"white"``, whichever contrasts more with ``fill``: the colour for a
    label drawn on a cell of that colour."""
    return "black" if contrast("black", fill) >= contrast("white", fill) else "white"


def _over(color, under: np.ndarray) -> np.ndarray:
    """``color`` (RGBA) composited over the opaque RGB ``under``."""
    rgba = np.asarray(to_rgba(color), float)
    return rgba[3] * rgba[:3] + (1 - rgba[3]) * under


@contextlib.contextmanager
def _text_drawing(draw):
    """Every ``Text`` drawn by ``draw(text, renderer)`` instead, for the duration."""
    original = Text.draw
    Text.draw = draw
    try:
        yield
    finally:
        Text.draw = original


@contextlib.contextmanager
def _agg_canvas(fig: Figure):
    """``fig``'s canvas if it draws with Agg, else an Agg canvas for the duration."""
    previous = fig.canvas
    canvas = previous if isinstance(previous, FigureCanvasAgg) else FigureCanvasAgg(fig)
    try:
        yield canvas
    finally:
        if canvas is not previous:
            fig.set_canvas(previous)


def _draw_recording_texts(canvas: FigureCanvasAgg) -> list[tuple[Text, Bbox]]:
    drawn: list[tuple[Text, Bbox]] = []
    draw = Text.draw

    def record(text, renderer):
        draw(text, renderer)
        if text.get_visible() and text.get_text().strip():
            drawn.append((text, text.get_window_extent(renderer)))

    with _text_drawing(record):
        canvas.draw()
    return drawn


def drawn_texts(fig: Figure) -> list[tuple[Text, Bbox]]:
    """Each visible, non-empty text that drawing ``fig`` with Agg draws (titles, tick and axis
    labels, legend entries, annotations), with its window extent: pixels at the figure's dpi,
    from the figure's bottom left."""
    with _agg_canvas(fig) as canvas:
        return _draw_recording_texts(canvas)


def _figure_name(fig: Figure) -> str:
    """"figure 'TITLE'": its suptitle, else its first axes title."""
    titles = [fig.get_suptitle()] + [ax.get_title(loc) for ax in fig.axes
                                     for loc in ("center", "left", "right")]
    title = next((t for t in titles if t.strip()), "")
    return f"figure {_quoted(title)}" if title else "an untitled figure"


def _quoted(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS - 1] + "…")


def _fill(text: Text, box: Bbox, behind: np.ndarray) -> np.ndarray | None:
    """The colour behind ``text`` (RGB): its bbox patch's face over the median of the figure's
    pixels under ``box``; None where ``box`` lies off the figure."""
    height, width = behind.shape[:2]
    rows = slice(max(int(height - box.y1), 0), min(int(np.ceil(height - box.y0)), height))
    cols = slice(max(int(box.x0), 0), min(int(np.ceil(box.x1)), width))
    under = behind[rows, cols].reshape(-1, 3)
    if not under.size:
        return None
    fill = np.median(under, axis=0)
    patch = text.get_bbox_patch()
    if patch is not None and patch.get_visible() and patch.get_fill():
        fill = _over(patch.get_facecolor(), fill)
    return fill


def _shared(a: Bbox, b: Bbox) -> tuple[float, float]:
    """Width and height (pixels) of the intersection of ``a`` and ``b``; <= 0 if apart."""
    return min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)


def unreadable_text(fig: Figure) -> list[str]:
    """What keeps a reader from reading ``fig``'s texts, one sentence per problem that names
    the text and the figure and says what to do; empty when every text is readable.

    A problem is a text past the figure's edge, two texts overlapping, a text under a legend
    it is not part of (each by more than ``SLACK_PX``), two texts side by side (sharing more
    than ``SLACK_PX`` of height) less than ``GAP_PX`` apart, or a text whose WCAG 2 contrast
    ratio against its fill is below ``CONTRAST_MIN``; lengths in pixels at the figure's dpi.
    The fill is the median colour of the pixels under the text in the figure drawn with no
    text (the same layout: only the texts' drawing is skipped), or the text's bbox patch over
    it. A rotated text is judged by the upright box around it. A sentence repeated (the same
    label in several cells) is given once. Draws ``fig`` with Agg twice; its canvas is left
    as it was.
    """
    with _agg_canvas(fig) as canvas:
        with _text_drawing(lambda text, renderer: None):
            canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba(), float) / 255
        behind = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])  # over a white page
        drawn = _draw_recording_texts(canvas)
        renderer = canvas.get_renderer()
        legends = [(legend, legend.get_window_extent(renderer)) for legend in
                   [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends]
    name, problems = _figure_name(fig), []
    fit = "shorten or rotate the labels, or enlarge the figure"
    edge = fig.bbox
    for text, box in drawn:
        past = max(edge.x0 - box.x0, box.x1 - edge.x1, edge.y0 - box.y0, box.y1 - edge.y1)
        if past > SLACK_PX:
            problems.append(f"{name}: {_quoted(text.get_text())} runs {past:.0f} px past the "
                            f"figure's edge; {fit}")
    for i, (a, box_a) in enumerate(drawn):
        for b, box_b in drawn[i + 1:]:
            w, h = _shared(box_a, box_b)
            if h <= SLACK_PX or w <= -GAP_PX:
                continue
            how = f"overlap ({w:.0f} × {h:.0f} px)" if w > SLACK_PX else \
                f"run together (side by side, {max(0.0, -w):.1f} px apart)"
            problems.append(f"{name}: {_quoted(a.get_text())} and {_quoted(b.get_text())} "
                            f"{how}; {fit}")
    for legend, legend_box in legends:
        own = {id(t) for t in [*legend.get_texts(), legend.get_title()]}
        problems += [f"{name}: the legend covers {_quoted(text.get_text())}; move the legend "
                     "(another loc, or outside the axes) or enlarge the figure"
                     for text, box in drawn if id(text) not in own
                     and min(_shared(legend_box, box)) > SLACK_PX]
    for text, box in drawn:
        fill = _fill(text, box, behind)
        if fill is None:
            continue
        ink = _over(to_rgba(text.get_color(), text.get_alpha()), fill)
        ratio = contrast(ink, fill)
        if ratio < CONTRAST_MIN:
            problems.append(f"{name}: {_quoted(text.get_text())} is {to_hex(ink)} on "
                            f"{to_hex(fill)}, contrast {ratio:.1f}:1, below "
                            f"{CONTRAST_MIN}:1; use black or white, whichever contrasts "
                            "(readable_ink)")
    return list(dict.fromkeys(problems))
