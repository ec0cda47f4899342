"""Feedback pages show a check's whole message: in nbgrader's feedback template an output's
``pre`` keeps each line on one line and scrolls sideways, so a failure's explanation ran off
the right edge. ``FeedbackCSS`` is nbconvert's CSS header plus rules that wrap those lines."""

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor

WRAP_CSS = """
div.output_area pre, div.output_subarea pre {
  white-space: pre-wrap;
  overflow-wrap: anywhere;
}
"""


class FeedbackCSS(CSSHTMLHeaderPreprocessor):
    """``CSSHTMLHeaderPreprocessor`` (pygments styles) and ``WRAP_CSS``."""

    def preprocess(self, nb, resources):
        nb, resources = super().preprocess(nb, resources)
        resources["inlining"]["css"].append(WRAP_CSS)
        return nb, resources
