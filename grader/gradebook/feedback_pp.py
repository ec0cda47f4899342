"""nbgrader preprocessors for feedback pages: hidden tests stay hidden, learner HTML stays inert.

``ClearHiddenTests`` removes hidden test *source*, but a failing hidden test's traceback would
still quote it; ``ClearHiddenOutputs`` runs before it and reduces such a cell's error outputs to
``ename: evalue`` and drops its other outputs.

``InertHtml`` makes what the learner wrote safe to open, through an allow-list sanitiser
(``nh3``, the Rust ``ammonia`` library: it parses the HTML as a browser does and keeps only the
listed tags, attributes and URL schemes), never through filters that look for bad patterns:

- a markdown or raw cell is rendered here and sanitised, then handed to the template as a raw
  HTML cell, so the template's own markdown pass never runs over sanitised text again;
- an HTML or markdown output becomes sanitised ``text/html``; an image must be base64 (the
  template writes it into an attribute); any other rich type (JavaScript, SVG, widgets) is
  dropped;
- an output's metadata is rebuilt from integers only (the template writes ``width`` and
  ``height`` into an ``<img>`` unquoted, and ``filenames`` as its ``src``).

Images may only be ``data:`` images (no request leaves the page when it is opened); links may
be ``http``, ``https`` or ``mailto``; no ``style`` attribute or element survives, so no CSS
can fetch a URL.
"""

import re

import nh3
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

SAFE_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em", "h1",
    "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span",
    "strong", "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"})
SAFE_ATTRIBUTES = {"*": {"class", "title"}, "a": {"href"}, "img": {"src", "alt"},
                   "td": {"align"}, "th": {"align"}}
LINK_SCHEMES = ("http", "https", "mailto")
DATA_IMAGE = re.compile(r"^data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*$")
BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]*$")
PLAIN_OUTPUT_KEYS = {"text/plain", "text/latex", "application/json"}
IMAGE_OUTPUT_KEYS = {"image/png", "image/jpeg"}
HTML_OUTPUT_KEYS = {"text/html", "text/markdown"}


def _url(tag: str, attribute: str, value: str) -> str | None:
    """An image's ``src`` only as inline data; a link's ``href`` only to the listed schemes
    (a relative link stays)."""
    if tag == "img" and attribute == "src":
        return value if DATA_IMAGE.match(value) else None
    if tag == "a" and attribute == "href":
        scheme = re.match(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):", value)
        return value if scheme is None or scheme.group(1).lower() in LINK_SCHEMES else None
    return value


def clean(html: str) -> str:
    """``html`` with only harmless tags, attributes and URLs (the rest is dropped; the text
    of a dropped tag stays, a script's or style's does not)."""
    return nh3.clean(html, tags=set(SAFE_TAGS), attributes=SAFE_ATTRIBUTES,
                     url_schemes={*LINK_SCHEMES, "data"}, attribute_filter=_url,
                     strip_comments=True, link_rel="noopener noreferrer nofollow")


def _metadata(metadata) -> NotebookNode:
    """Of an output's metadata only an image's integer ``width`` and ``height``."""
    out = NotebookNode()
    for mime in IMAGE_OUTPUT_KEYS:
        sizes = metadata.get(mime) if isinstance(metadata, dict) else None
        if isinstance(sizes, dict):
            kept = {k: v for k, v in sizes.items() if k in ("width", "height")
                    and isinstance(v, int) and not isinstance(v, bool)}
            if kept:
                out[mime] = NotebookNode(kept)
    return out


def inert_output(out) -> None:
    """Make one code cell output safe to render (in place)."""
    data = out.get("data")
    if "metadata" in out:
        out["metadata"] = _metadata(out.get("metadata"))
    if not isinstance(data, dict):
        return
    html = []
    for key in list(data):
        value = data[key]
        if key in HTML_OUTPUT_KEYS and isinstance(value, str):
            html.append(markdown2html_mistune(value) if key == "text/markdown" else value)
            del data[key]
        elif key in IMAGE_OUTPUT_KEYS and isinstance(value, str) and BASE64.match(value):
            continue
        elif key not in PLAIN_OUTPUT_KEYS or not isinstance(value, str | dict | list):
            del data[key]
    if html:
        data["text/html"] = clean("".join(html))


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
            html = clean(markdown2html_mistune(cell.source))
            cell.cell_type = "raw"
            cell.source = f'<div class="inner_cell"><div class="text_cell_render rendered_html">' \
                f"{html}</div></div>"
            cell.metadata["raw_mimetype"] = "text/html"
            cell.pop("attachments", None)
        elif cell.cell_type == "code":
            for out in cell.get("outputs", []):
                inert_output(out)
        return cell, resources
