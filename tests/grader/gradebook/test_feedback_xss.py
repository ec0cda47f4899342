"""Feedback pages in Chromium: known XSS payloads, in every place a learner puts text into a
notebook, go through the course's feedback preprocessors and nbgrader's feedback template,
and the page is opened in Debian's chromium while dialogs, page errors from payloads and every
request that leaves the page are recorded. Nothing may run and nothing may be fetched.
"""

from __future__ import annotations

import base64
import html.parser
from pathlib import Path

import nbformat
import pytest

from grader.gradebook import feedback_pp

REPO = Path(__file__).resolve().parents[3]
# markup a learner can write into a markdown cell or an HTML/markdown output (after OWASP's
# XSS filter evasion cheat sheet and html5sec.org's vectors: the classes, written anew here)
PAYLOADS = [
    "<script>alert('script')</script>",
    "<img src=x onerror=alert('onerror')>",
    "<IMG SRC=\"javascript:alert('imgsrc');\">",
    "<svg onload=alert('svg')><circle r=5></circle></svg>",
    "<body onload=alert('body')>",
    "<iframe src=\"javascript:alert('iframe')\"></iframe>",
    "<iframe srcdoc=\"<script>alert('srcdoc')</script>\"></iframe>",
    "<a href=\"javascript:alert('href')\" id=clickme1>click</a>",
    "<a href=\"jav&#x09;ascript:alert('tab')\" id=clickme2>click</a>",
    "<a href=\"&#106;avascript:alert('entity')\" id=clickme3>click</a>",
    "<a href=\"data:text/html;base64,PHNjcmlwdD5hbGVydCgnZGF0YScpPC9zY3JpcHQ+\" "
    "id=clickme4>data</a>",
    "<math><mtext><table><mglyph><style><img src=x onerror=alert('mxss')>",
    "<noscript><p title=\"</noscript><img src=x onerror=alert('noscript')>\">",
    "<details open ontoggle=alert('toggle')>x</details>",
    "<div style=\"background:url(http://evil.example/style)\">css</div>",
    "<style>@import 'http://evil.example/import.css'; body{background:url(http://evil.example/"
    "bg)}</style>",
    "<link rel=stylesheet href=http://evil.example/link.css>",
    "<img src=\"http://evil.example/beacon.png\">",
    "<object data=\"javascript:alert('object')\"></object>",
    "<embed src=\"javascript:alert('embed')\">",
    "<form action=\"javascript:alert('form')\"><button id=clickme5>go</button></form>",
    "<input autofocus onfocus=alert('focus')>",
    "<video><source onerror=alert('video')></video>",
    "<meta http-equiv=refresh content=\"0;url=javascript:alert('meta')\">",
    "<base href=\"javascript:alert('base')//\">",
    "<!--<img src=x onerror=alert('comment')>-->",
    "<table background=\"javascript:alert('table')\"><tr><td>t</td></tr></table>",
    "<scr<script>ipt>alert('nested')</scr</script>ipt>",
    "[md-link](javascript:alert('mdlink')) ![md-img](x\" onerror=\"alert('mdimg'))",
]
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()


class _Elements(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, list]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, attrs))


def _notebook():
    html = "\n".join(PAYLOADS)
    outputs = [
        nbformat.v4.new_output("display_data", data={"text/html": html, "text/plain": "x"}),
        nbformat.v4.new_output("display_data", data={"text/markdown": html}),
        nbformat.v4.new_output("display_data", data={
            "application/javascript": "alert('js')", "image/svg+xml":
            "<svg xmlns='http://www.w3.org/2000/svg' onload=\"alert('svgout')\"/>"}),
        # the template writes these into an <img> element's attributes
        nbformat.v4.new_output("display_data", data={"image/png": PNG},
                               metadata={"image/png": {"width": "1 onerror=alert('width')",
                                                       "height": 1}}),
        nbformat.v4.new_output("display_data", data={"image/png": "x\" onerror=\"alert('png')"}),
        nbformat.v4.new_output("display_data", data={"image/png": PNG}, metadata={
            "filenames": {"image/png": "http://evil.example/file.png"}, "unconfined": True,
            "alt": "\" onerror=\"alert('alt')"}),
        nbformat.v4.new_output("execute_result", data={"text/html": html}, execution_count=1),
        nbformat.v4.new_output("stream", name="stdout", text=html),
        nbformat.v4.new_output("error", ename="<img src=x onerror=alert('ename')>",
                               evalue=html, traceback=[html]),
    ]
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(html),
        nbformat.v4.new_raw_cell(html, metadata={"raw_mimetype": "text/html"}),
        nbformat.v4.new_code_cell("print('hi')  # " + html, outputs=outputs)])


def _page(tmp_path: Path, nb=None) -> Path:
    """The notebook (``_notebook()`` unless given) through the course's feedback preprocessors
    and nbgrader's template."""
    import nbgrader
    from nbconvert.exporters import HTMLExporter
    from traitlets.config.loader import PyFileConfigLoader

    templates = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    # the course's configuration, and what nbgrader's GenerateFeedback adds to it
    c = PyFileConfigLoader("nbgrader_config.py", path=str(REPO / "exercises")).load_config()
    c.HTMLExporter.template_name = "feedback"
    c.HTMLExporter.extra_template_basedirs = [str(templates / "templates")]
    c.HTMLExporter.extra_template_paths = [
        str(templates / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    exporter = HTMLExporter(config=c)
    nb = nb or _notebook()
    resources = {"nbgrader": {"notebook": "x", "score": 0, "max_score": 1, "late_penalty": 0}}
    for index, cell in enumerate(nb.cells):
        feedback_pp.InertHtml().preprocess_cell(cell, resources, index)
    html, _ = exporter.from_notebook_node(nb, resources=resources)
    path = tmp_path / "feedback.html"
    path.write_text(html)
    return path


def test_tasks_and_hints_show_as_markup_not_as_text(tmp_path):
    """Issue 35, item 13: nbgrader's template cleaned the cleaned cells again with nbconvert's
    list of tags, which lacks headings and paragraphs: feedback showed a literal </p>."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "## Task 1 \u2014 add\n\nAdd *two* arrays.\n\n<details><summary>Hint 1</summary>\n\n"
        "Load both inputs.\n\n</details>")])
    page = _page(tmp_path, nb).read_text()
    assert "<p>Add <em>two</em> arrays.</p>" in page and "<p>Load both inputs.</p>" in page
    assert "&lt;" not in page.split("<body", 1)[1]


def test_clean_keeps_harmless_markup_and_drops_the_rest():
    kept = feedback_pp.clean('<b class="x">bold</b> <a href="https://example.org/a">a</a> '
                             f'<img src="data:image/png;base64,{PNG}" alt="dot">')
    assert "<b class=\"x\">bold</b>" in kept and 'href="https://example.org/a"' in kept
    assert f"base64,{PNG}" in kept
    for payload in PAYLOADS:
        elements = _Elements()
        elements.feed(feedback_pp.clean(payload))
        for tag, attrs in elements.found:  # what a browser would build from the text
            assert tag in feedback_pp.SAFE_TAGS, (payload, tag)
            for name, value in attrs:
                assert name in {"class", "title", "href", "src", "alt", "align", "rel"}, payload
                assert name not in ("href", "src") or value.startswith(
                    ("https:", "data:image/png;base64,")), (payload, value)


def test_no_payload_runs_or_fetches_in_chromium(browser, tmp_path):
    path = _page(tmp_path)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    dialogs, requests, errors = [], [], []

    def route(r):
        url = r.request.url
        if url == path.as_uri() or url.startswith(("data:", "about:")):
            r.continue_()
        else:  # the template's own CDN assets are not payloads; record only the evil host
            if "evil.example" in url or url.startswith("javascript:"):
                requests.append(url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_timeout(500)
        for i in range(1, 6):  # a click on each payload link or button that survived
            target = page.query_selector(f"#clickme{i}")
            if target is not None:
                target.click(no_wait_after=True)
        page.keyboard.press("Tab")
        page.wait_for_timeout(500)
        text = page.inner_text("body")
    finally:
        context.close()
    assert dialogs == [] and requests == [], (dialogs, requests)
    assert not any("alert" in e for e in errors), errors
    assert "css" in text and "click" in text  # the payloads' text is shown, inert


def test_hidden_test_cells_keep_only_their_error_text():
    cell = nbformat.v4.new_code_cell("### BEGIN HIDDEN TESTS\ncourse.check('add', add, "
                                     "hidden=True)\n### END HIDDEN TESTS", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="printed during the check"),
        nbformat.v4.new_output("error", ename="CheckFailed", evalue="add: wrong",
                               traceback=["frame", "CheckFailed: add: wrong"])])
    feedback_pp.ClearHiddenOutputs().preprocess_cell(cell, {}, 0)
    assert [o.output_type for o in cell.outputs] == ["error"]
    assert cell.outputs[0].traceback == ["CheckFailed: add: wrong"]


@pytest.mark.parametrize("bad", ["x\" onerror=\"y", "<svg/>", "javascript:alert(1)"])
def test_an_image_that_is_not_base64_is_dropped(bad):
    out = nbformat.v4.new_output("display_data", data={"image/png": bad, "text/plain": "t"})
    feedback_pp.inert_output(out)
    assert "image/png" not in out.data and out.data["text/plain"] == "t"
