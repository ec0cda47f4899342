"""Readable notebook pages: what ``site/hooks.py`` does to a lesson's rendered HTML so that
no code or output box hides text, on a desktop or a phone, and every figure has alt text.

* Code cells and printed outputs: every line becomes ``<span class="ks-ln">``, with its
  leading indentation as ``--i`` (in characters). ``site/docs/css/course.css`` wraps a line
  that does not fit its box, continues it under its own indentation plus four characters and
  marks the continued rows with a "↪" and a bar in the gutter, so a wrapped line never reads
  as a new one. Text is unchanged: copying a cell copies what the lesson holds.
* Rows of printed tables (kernelsim's summaries; a run of lines whose columns line up):
  ``ks-ln ks-trow``, never wrapped, since a wrapped row is garbage. Their ``<pre>`` gets the
  widest row as ``--cols`` (characters); the stylesheet scales the rows' font to fit the box
  and lets the box scroll sideways only where the smallest legible size does not fit.
* Figures: nbconvert writes "No description has been provided for this image" as every
  image's alt text. The alt text becomes the code cell's ``# Figure: ...`` comment when it has
  one, else the last paragraph of the markdown cell before it (what the lesson says about
  the figure), cut at a sentence end.

Pure functions of the page's HTML: new lessons need nothing here.
"""

from __future__ import annotations

import html
import re

NO_ALT = "No description has been provided for this image"
HELD_INDENT_MAX = 16  # deeper indentation may wrap: held, it alone could outrun a phone's row
ALT_MAX_CHARS = 300

_CODE_PRE = re.compile(r'(<div class="highlight[^"]*"><pre>)(.*?)(</pre>)', re.DOTALL)
_OUTPUT_PRE = re.compile(r'(<div class="jp-RenderedText[^"]*"[^>]*>\s*<pre)(>)(.*?)(</pre>)',
                         re.DOTALL)
_TAG = re.compile(r"<(/?)([a-zA-Z][\w-]*)\b[^>]*?(/?)>")
_RULE_LINE = re.compile(r"^\s*-{2,}(?:\s{1,}-{2,})+\s*$")
_ROW = re.compile(r'<span class="ks-ln ks-trow">(.*?)\n</span>', re.DOTALL)


# --- lines ---------------------------------------------------------------------------------

def _text(fragment: str) -> str:
    return html.unescape(_TAG.sub("", fragment))


def split_lines(body: str) -> list[str]:
    """The HTML of a ``<pre>``'s content, one balanced fragment per line (the inline tags open
    at a line end are closed there and reopened on the next line), newlines removed."""
    lines: list[str] = []
    current: list[str] = []
    open_tags: list[tuple[str, str]] = []  # (name, opening tag as written)
    pos = 0
    for m in _TAG.finditer(body + "<end>"):
        text = body[pos:m.start()] if m.group(2) != "end" else body[pos:]
        pieces = text.split("\n")
        for k, piece in enumerate(pieces):
            if k:
                current += [f"</{name}>" for name, _ in reversed(open_tags)]
                lines.append("".join(current))
                current = [tag for _, tag in open_tags]
            current.append(piece)
        if m.group(2) == "end":
            break
        pos = m.end()
        closing, name, self_closing = m.group(1), m.group(2).lower(), m.group(3)
        current.append(m.group(0))
        if closing:
            for k in range(len(open_tags) - 1, -1, -1):
                if open_tags[k][0] == name:
                    del open_tags[k]
                    break
        elif not self_closing:
            open_tags.append((name, m.group(0)))
    lines.append("".join(current))
    if lines and not _text(lines[-1]).strip("\n") and len(lines) > 1:
        lines.pop()  # a trailing newline ends the last line, it opens no new one
    return lines


def _columns(line: str) -> set[tuple[str, int]]:
    """Where a line's columns start and end: the edges of its gaps of two or more spaces
    (left-aligned columns share their start, right-aligned ones their end)."""
    edges: set[tuple[str, int]] = set()
    for m in re.finditer(r"\S( {2,})(?=\S)", line):
        edges |= {("end", m.start(1)), ("start", m.end(1))}
    return edges


def table_rows(texts: list[str]) -> list[bool]:
    """Which lines are rows of a printed table: a run of non-blank lines, each sharing a
    column edge with the next, three or more long, or two around a rule line (``---  --``)."""
    rows = [False] * len(texts)
    cols = [_columns(t) for t in texts]
    k = 0
    while k < len(texts):
        end = k + 1
        while end < len(texts) and texts[end].strip() and cols[end - 1] & cols[end]:
            end += 1
        ruled = any(_RULE_LINE.match(t) for t in texts[k:end])
        if end - k >= 3 or (ruled and end - k >= 2):
            rows[k:end] = [True] * (end - k)
        k = end
    return rows


def hold_indent(line: str, indent: int) -> str:
    """``line`` (HTML) with its first ``indent`` spaces, and the tags around them, in
    ``<span class="ks-ind">``, which never wraps: a long line's first row keeps its code
    instead of holding only the indentation. Unchanged where that would split a tag's
    content (indentation inside a multi-line string)."""
    seen, pos = 0, 0
    for m in _TAG.finditer(line + "<end>"):
        text = line[pos:m.start()]
        if seen + len(text) >= indent:
            cut = pos + indent - seen
            if text[:indent - seen].strip():
                return line
            rest = line[cut:]
            closing = re.match(r"(?:</[a-zA-Z][\w-]*>)*", rest).group(0) if \
                cut == m.start() else ""
            head = line[:cut] + closing
            if len(re.findall(r"<[a-zA-Z]", head)) != head.count("</"):
                return line
            return f'<span class="ks-ind">{head}</span>{line[len(head):]}'
        seen += len(text)
        pos = m.end()
    return line


def line_spans(body: str, tables: bool = False) -> str:
    """``<pre>`` content as one ``<span class="ks-ln">`` per line (newline kept inside, so
    the text and its copy are unchanged), each with its indentation as ``--i``; with
    ``tables``, rows of printed tables are ``ks-ln ks-trow`` (never wrapped)."""
    lines = split_lines(body)
    texts = [_text(line) for line in lines]
    rows = table_rows(texts) if tables else [False] * len(lines)
    out = []
    for line, text, row in zip(lines, texts, rows, strict=True):
        indent = len(text) - len(text.lstrip(" "))
        style = ""
        if indent and text.strip() and not row:
            style = f' style="--i:{indent}"'
            if indent <= HELD_INDENT_MAX:
                line = hold_indent(line, indent)
        out.append(f'<span class="ks-ln{" ks-trow" if row else ""}"{style}>{line}\n</span>')
    return "".join(out)


def readable_code(content: str) -> str:
    """Code cells' and printed outputs' ``<pre>`` boxes as wrapped lines and table rows; a
    ``<pre>`` holding a table gets its widest row, in characters, as ``--cols``."""
    content = _CODE_PRE.sub(lambda m: m.group(1) + line_spans(m.group(2)) + m.group(3),
                            content)

    def output(m: re.Match) -> str:
        spans = line_spans(m.group(3), tables=True)
        widths = [len(_text(row)) for row in _ROW.findall(spans)]
        attrs = f' style="--cols:{max(widths)}"' if widths else ""
        return f"{m.group(1)}{attrs}{m.group(2)}{spans}{m.group(4)}"

    return _OUTPUT_PRE.sub(output, content)


# --- alt text ------------------------------------------------------------------------------

_CELL = re.compile(r'<div class="jp-Cell jp-(Markdown|Code)Cell\b')
_IMG_NO_ALT = re.compile(rf'<img alt="{re.escape(NO_ALT)}"')
_FIGURE_COMMENT = re.compile(r"^\s*#\s*Figure:\s*(.+)$", re.MULTILINE)
_PARAGRAPH = re.compile(r"<p>(.*?)</p>", re.DOTALL)


def _sentences(text: str, limit: int = ALT_MAX_CHARS) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) <= limit:
        return text
    cut = max(text.rfind(". ", 0, limit), text.rfind("; ", 0, limit))
    return text[:cut + 1] if cut > 0 else text[:limit - 1].rstrip() + "…"


def figure_alt(markdown_html: str, code_html: str) -> str:
    """Alt text of a figure drawn by the code cell ``code_html`` after the markdown cell
    ``markdown_html`` (either may be empty)."""
    m = _FIGURE_COMMENT.search(_text(code_html))
    if m:
        return _sentences(m.group(1))
    paragraphs = [_text(p) for p in _PARAGRAPH.findall(markdown_html)]
    paragraphs = [p for p in paragraphs if p.strip()]
    return "Figure: " + _sentences(paragraphs[-1]) if paragraphs else "Figure"


def alt_texts(content: str) -> str:
    """Every image nbconvert left without a description gets one from the lesson."""
    if NO_ALT not in content:
        return content
    starts = [(m.start(), m.group(1)) for m in _CELL.finditer(content)] + [(len(content), "")]
    out, pos, markdown = [], 0, ""
    for (start, kind), (end, _) in zip(starts, starts[1:], strict=False):
        cell = content[start:end]
        if kind == "Markdown":
            markdown = cell
        elif NO_ALT in cell:
            alt = html.escape(figure_alt(markdown, cell.split("jp-Cell-outputWrapper")[0]),
                              quote=True)
            out.append(content[pos:start] + _IMG_NO_ALT.sub(f'<img alt="{alt}"', cell))
            pos = end
    out.append(content[pos:])
    return "".join(out)


def readable(content: str) -> str:
    """A notebook page made readable (see the module's docstring)."""
    return alt_texts(readable_code(content))
