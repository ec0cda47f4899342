"""Unit tests of site/readable.py (what makes a lesson page's code, outputs and figures
readable): fast, no build. The browser tests in test_readable_pages.py measure the result."""

from __future__ import annotations

import html
import re

from sitetools import load_hooks

readable = load_hooks().site_module("readable")

CODE = ('<div class="highlight-ipynb hl-python"><pre><span></span><span class="k">def</span> f():\n'
        '    <span class="s2">"""one\n    two"""</span>\n'
        '    <span class="k">return</span> 1\n</pre></div>')
TABLE = """call 0: 'add_kernel'  grid (2, 4) = 8 steps
operand  role    shape
-------  ------  ----------
x_ref    input   (256, 512)
o_ref    output  (256, 512)
HBM traffic 1,572,864 B (read 1,048,576, write 524,288); a prose line after the table"""


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_code_lines_become_balanced_spans_and_keep_their_text():
    out = readable.readable_code(CODE)
    lines = re.findall(r'<span class="ks-ln"(?: style="--i:(\d+)")?>(.*?)\n</span>', out,
                       re.DOTALL)
    assert [(i, _text(t)) for i, t in lines] == [
        ("", "def f():"), ("4", '    """one'), ("4", '    two"""'), ("4", "    return 1")]
    # a string over two lines is closed at the line end and reopened on the next
    assert '<span class="s2">    two"""</span>' in out
    # indentation is held together with the code after it (never a row of its own)
    assert '<span class="ks-ind">    </span><span class="k">return</span>' in out
    assert _text(out) == _text(CODE)  # the text a reader copies is unchanged
    assert out.count("<span") == out.count("</span>")


def test_table_rows_never_wrap_and_prose_lines_do():
    out = readable.readable_code(
        f'<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="text/plain">\n'
        f"<pre>{html.escape(TABLE)}\n</pre></div>")
    rows = [_text(r) for r in re.findall(r'<span class="ks-ln ks-trow">(.*?)\n</span>', out)]
    assert rows == TABLE.splitlines()[1:5]
    assert 'style="--cols:27"' in out  # the widest row, for the font that fits it
    prose = [_text(r) for r in re.findall(r'<span class="ks-ln">(.*?)\n</span>', out)]
    assert prose == [TABLE.splitlines()[0], TABLE.splitlines()[-1]]


def test_right_aligned_columns_are_a_table_too():
    texts = ["    operand     role   HBM bytes", "          q    input     262,144",
             "  m_scratch  scratch           0", "", "a line of prose, alone"]
    assert readable.table_rows(texts) == [True, True, True, False, False]


def test_figures_get_alt_text_from_the_lesson():
    img = f'<img alt="{readable.NO_ALT}" src="data:image/png;base64,AA">'

    def code(source: str) -> str:
        return (f'<div class="jp-Cell jp-CodeCell jp-Notebook-cell"><pre>{source}</pre>'
                f'<div class="jp-Cell-outputWrapper">{img}</div></div>')

    page = ('<div class="jp-Cell jp-MarkdownCell jp-Notebook-cell"><p>First.</p>'
            "<p>The heatmap counts copies per block: each <code>x</code> block once.</p></div>"
            + code("t.figure()")
            + code("# Figure: the two orders' traffic, side by side\nt.compare()"))
    out = readable.alt_texts(page)
    assert readable.NO_ALT not in out
    alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)"', out)]
    assert alts == ["Figure: The heatmap counts copies per block: each x block once.",
                    "the two orders' traffic, side by side"]
