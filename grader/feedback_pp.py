"""nbgrader preprocessors for feedback pages: hidden tests stay hidden, learner HTML stays inert.

``ClearHiddenTests`` removes hidden test *source*, but a failing hidden test's traceback would
still quote it; ``ClearHiddenOutputs`` runs before it and reduces such a cell's error outputs to
``ename: evalue`` and drops its other outputs.

``InertHtml`` makes what the learner wrote safe to open: markdown is rendered here and cleaned
(a markdown link to ``javascript:`` or an ``<img onerror>`` would otherwise reach the page, since
nbconvert renders markdown with harmful protocols allowed), and HTML outputs are cleaned the same
way; outputs of any other rich type (JavaScript, SVG, widgets) are dropped.
"""

import bleach
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbgrader.preprocessors import NbGraderPreprocessor

SAFE_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em", "h1",
    "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span",
    "strong", "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"})
SAFE_ATTRIBUTES = {"*": ["class", "title", "id"], "a": ["href"], "img": ["src", "alt"],
                   "td": ["align"], "th": ["align"]}
SAFE_PROTOCOLS = frozenset({"http", "https", "mailto"})
PLAIN_OUTPUT_KEYS = {"text/plain", "text/latex", "application/json", "image/png", "image/jpeg"}
HTML_OUTPUT_KEYS = {"text/html", "text/markdown"}


def clean(html: str) -> str:
    """``html`` with only harmless tags and attributes; the rest is shown as text."""
    return bleach.clean(html, tags=SAFE_TAGS, attributes=SAFE_ATTRIBUTES,
                        protocols=SAFE_PROTOCOLS, strip_comments=True)


class ClearHiddenOutputs(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and "### BEGIN HIDDEN TESTS" in cell.source:
            kept = []
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename')}: {out.get('evalue')}"]
                    kept.append(out)
            cell["outputs"] = kept
        return cell, resources


class InertHtml(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type in ("markdown", "raw"):
            cell.source = clean(markdown2html_mistune(cell.source))
        elif cell.cell_type == "code":
            for out in cell.get("outputs", []):
                data = out.get("data")
                if not data:
                    continue
                for key in list(data):
                    if key in HTML_OUTPUT_KEYS:
                        data[key] = clean(markdown2html_mistune(data[key])
                                          if key == "text/markdown" else data[key])
                    elif key not in PLAIN_OUTPUT_KEYS:
                        del data[key]
        return cell, resources
