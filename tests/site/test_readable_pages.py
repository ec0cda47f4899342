"""Lesson pages and the viewer read well at a desktop's and a phone's width (chromium, the
session's one built site): no code or output box hides text at 1280 px, no page scrolls
sideways at 390 px, wrapped lines are marked, figures fit and say what they show, the
viewer's controls stay on screen while it steps, and with the gpu model the viewer speaks of
the GPU's memories. Screenshots of what was measured land in build/screenshots/."""

from __future__ import annotations

import re

import pytest
from sitetools import PAGE_WIDTH, REPO, watch

MEASURED = ("01-why-pallas", "04-index-maps", "06-scalar-prefetch", "08-flash-attention",
            "11-gpu")
SHOTS = REPO / "build" / "screenshots"

# Material's "Back to top" button floats over the text while a page scrolls up: a short
# scroll down puts it away before a screenshot
SETTLE = "() => new Promise(r => { scrollBy(0, 4); setTimeout(r, 500); })"
# words of wrapped lines (of outputs, or of code: an identifier, "bloc/k_rows") broken in two
# though a space or punctuation was there to break at; the argument selects the boxes
BROKEN_WORDS = r"""(box) => [...document.querySelectorAll(`article ${box} .ks-ln`)]
  .filter(l => !l.classList.contains('ks-trow')).flatMap(l => {
    const range = document.createRange(), out = [];
    const walk = document.createTreeWalker(l, NodeFilter.SHOW_TEXT);
    let prevTop = null, prevChar = ' ', seen = '';
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (let k = 0; k < n.length; k++) {
        range.setStart(n, k); range.setEnd(n, k + 1);
        const r = range.getBoundingClientRect();
        if (!r.width) continue;
        const c = n.data[k];
        // a break between two word characters, in a word short enough to fit a row and with
        // something before it in its line (a line's indentation never wraps away from it)
        if (prevTop !== null && r.top > prevTop + 2 && /\w/.test(prevChar) && /\w/.test(c)) {
          const head = /\S*$/.exec(n.data.slice(0, k))[0];
          const word = head + /^\S*/.exec(n.data.slice(k))[0];
          const before = seen + n.data.slice(0, k - head.length);
          if (word.length <= 20 && /\S/.test(before)) out.push(word);
        }
        prevTop = r.top; prevChar = c;
      }
      seen += n.data;
    }
    return out.slice(0, 1); })"""
MARKED = """() => [...document.querySelectorAll('article .ks-ln:not(.ks-trow)')]
  .filter(l => l.getBoundingClientRect().height > 1.5 * parseFloat(getComputedStyle(l).lineHeight))
  .map(l => getComputedStyle(l, '::before').content)"""


@pytest.fixture
def phone(browser):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True,
                                  has_touch=True, device_scale_factor=2)
    w = watch(context)
    yield w
    context.close()
    w.check()


@pytest.mark.parametrize("stem", MEASURED)
def test_no_code_or_output_box_hides_text_at_1280(site_at_1280, stem):
    seen = site_at_1280[f"lessons/{stem}/"].measured
    assert seen["lines"] > 20, "the lesson's lines are not wrapped"
    assert seen["hidden"] == [], stem
    assert seen["width"] <= 1280


@pytest.mark.parametrize("stem", MEASURED)
def test_no_page_scrolls_sideways_at_390_and_wrapped_lines_are_marked(phone, base_url, stem):
    page = phone.page
    page.goto(f"{base_url}lessons/{stem}/")
    assert page.evaluate(PAGE_WIDTH) <= 390, stem
    marks = page.evaluate(MARKED)
    assert marks and set(marks) == {'"↪" / ""'}, marks[:3]
    assert page.evaluate(BROKEN_WORDS, ".jp-OutputArea-output") == []
    assert page.evaluate(BROKEN_WORDS, ".jp-InputArea-editor") == []
    # code keeps its size: wrapped, not shrunk
    size = page.evaluate("() => parseFloat(getComputedStyle("
                         "document.querySelector('.jp-InputArea-editor pre')).fontSize)")
    assert size >= 12


def test_no_lesson_hides_text_at_1280(site_at_1280):
    """Every lesson, not only the measured five: no code or output box hides text."""
    hidden = {path: seen.measured["hidden"] for path, seen in site_at_1280.items()
              if path.startswith("lessons/")}
    assert len(hidden) == len(list((REPO / "lessons").glob("[0-9][0-9]-*.py")))
    assert {path: boxes for path, boxes in hidden.items() if boxes} == {}


def test_no_lesson_scrolls_sideways_at_390(lessons_at_390):
    assert {stem: seen.measured["width"] for stem, seen in lessons_at_390.items()
            if seen.measured["width"] > 390} == {}


def test_every_lesson_figure_takes_the_column_at_390(lessons_at_390):
    """Each figure at its drawn width or the column's, whichever is less: no hint or other box
    beside it in its output's row."""
    assert sum(1 for seen in lessons_at_390.values() if seen.measured["squeezed"]) == 0, {
        stem: seen.measured["squeezed"][:3] for stem, seen in lessons_at_390.items()
        if seen.measured["squeezed"]}


# a printed table's font and its box, as course.css sizes them: [font px, box width, text width]
TABLE_BOX = """() => { const pre = document.querySelector('pre');
  return [parseFloat(getComputedStyle(pre.querySelector('.ks-trow')).fontSize),
          pre.clientWidth, pre.scrollWidth]; }"""


@pytest.mark.parametrize(("width", "columns"), [(390, 146), (390, 40), (1280, 180)])
def test_a_wide_table_scrolls_at_a_readable_size_on_a_phone(browser, tmp_path, width, columns):
    """A phone shows few of the lessons' tables (up to 146 characters wide) whole even at
    10 px: there a table keeps 12 px and scrolls inside its own box (issue 37: at 390 px, 46
    tables shrank to 10 px and scrolled anyway); a desktop's wider column still shrinks a
    table to fit it whole. Needs only site/docs/css/course.css, not a built site."""
    from sitetools import load_site, serve_folder

    rows = [f"{'operand':<{columns - 12}} role  bufs", f"{'-' * (columns - 12)} ----  ----",
            f"{'x_ref':<{columns - 12}} input    2"]
    pre = load_site("readable").readable_code(
        '<div class="jp-RenderedText jp-OutputArea-output"><pre>' + "\n".join(rows)
        + "\n</pre></div>")
    (tmp_path / "course.css").write_text((REPO / "site/docs/css/course.css").read_text())
    (tmp_path / "index.html").write_text(
        '<!DOCTYPE html><meta name="viewport" content="width=device-width">'
        '<link rel="stylesheet" href="course.css"><article><div class="jupyter-wrapper">'
        f'<div class="jp-OutputArea"><div class="jp-OutputArea-child">{pre}</div></div>'
        "</div></article>")
    context = browser.new_context(viewport={"width": width, "height": 844})
    try:
        page = context.new_page()
        with serve_folder(tmp_path) as url:
            page.goto(url)
            size, box, text = page.evaluate(TABLE_BOX)
            assert page.evaluate(PAGE_WIDTH) <= width  # only the table's box scrolls
    finally:
        context.close()
    if width == 390:
        assert size >= 12, (columns, size)
        assert (text > box + 1) == (columns * 0.61 * 12 > box), (columns, box, text)
    else:
        assert size < 13 and text <= box + 1, (size, box, text)  # shrunk to fit, whole


def test_figures_fit_a_phone_and_a_tap_shows_the_full_size(phone, base_url):
    page = phone.page
    page.goto(f"{base_url}lessons/03-tiling/", wait_until="networkidle")
    img = page.locator(".jp-OutputArea-output > img").first
    img.scroll_into_view_if_needed()
    natural = img.evaluate("i => i.naturalWidth")
    column = page.locator("article").bounding_box()["width"]
    assert img.bounding_box()["width"] <= column < natural
    hint = page.locator(".ks-figure-hint").first
    assert hint.is_visible() and "full size" in hint.inner_text()
    img.click()
    assert abs(img.bounding_box()["width"] - natural) <= 1  # its labels at their drawn size
    assert page.evaluate(PAGE_WIDTH) <= 390  # the figure's box scrolls, not the page
    # and it scrolls through a window as wide as the notebook's column (it was ~200 px)
    window, area = img.evaluate("i => [i.parentElement.clientWidth, "
                                "i.closest('.jp-OutputArea').clientWidth]")
    assert window >= area - 2, (window, area)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "lesson-03-figure-full-390.png")
    img.click()
    assert img.bounding_box()["width"] <= column


def test_every_figure_says_what_it_shows(built_site):
    from sitetools import load_hooks

    no_alt = load_hooks().site_module("readable").NO_ALT
    for page in sorted((built_site / "lessons").glob("*/index.html")):
        text = page.read_text()
        assert no_alt not in text, page.parent.name
        for alt in re.findall(r'<img alt="([^"]*)"', text):
            assert len(alt) > 20, (page.parent.name, alt)


def test_where_to_ask_link_is_on_every_page(built_site):
    import yaml

    ask = yaml.safe_load((REPO / "mkdocs.yml").read_text())["extra"]["ask"]
    for rel in ("index.html", "lessons/04-index-maps/index.html", "glossary/index.html"):
        text = (built_site / rel).read_text()
        assert f'<p class="ks-ask"><a href="{ask["url"]}"' in text, rel


# --- the viewer ------------------------------------------------------------------------------

def _viewer_of(page, lane: str):
    """The first viewer with lane ``lane``, by position (its lanes change with the model)."""
    index = page.locator(".ks-viewer").evaluate_all(
        "(vs, lane) => vs.findIndex(v => v.querySelector(`[data-lane=${lane}]`))", lane)
    assert index >= 0, f"no viewer with a {lane} lane"
    return page.locator(".ks-viewer").nth(index)


def test_viewer_controls_stay_on_screen_at_1280x900_while_stepping(watched, base_url):
    page = watched.page
    page.goto(f"{base_url}lessons/06-scalar-prefetch/")
    viewer = _viewer_of(page, "smem")
    viewer.scroll_into_view_if_needed()
    box = viewer.bounding_box()
    assert box["height"] <= 900, f"the viewer is {box['height']:.0f} px tall"
    # scroll so the viewer's bottom (traffic, legend) is on screen, then step from there
    page.evaluate("(y) => scrollBy(0, y)", box["y"] + box["height"] - 900 + 20)
    steps = []
    for _ in range(3):
        nxt = viewer.locator(".ks-next")
        b = nxt.bounding_box()
        assert 48 <= b["y"] and b["y"] + b["height"] <= 900, b  # below the header, on screen
        nxt.click()
        steps.append(viewer.get_attribute("data-step"))
        status = viewer.locator("[role=status]").bounding_box()
        assert status["y"] >= 48 and status["y"] + status["height"] <= 900
    assert steps == ["1", "2", "3"]
    traffic = viewer.locator("[data-lane=traffic]").bounding_box()
    assert traffic["y"] + traffic["height"] <= 900 + 1  # the panels are on screen with them
    page.evaluate(SETTLE)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "lesson-06-viewer-1280.png")


def test_viewer_stays_one_screen_wide_on_a_phone(phone, base_url):
    page = phone.page
    page.goto(f"{base_url}lessons/06-scalar-prefetch/")
    viewer = _viewer_of(page, "smem")
    viewer.scroll_into_view_if_needed()
    viewer.locator(".ks-next").click()
    assert page.evaluate(PAGE_WIDTH) <= 390
    box = viewer.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    # two screens down, at the traffic chart, the controls are still under the header
    viewer.locator("[data-lane=traffic]").scroll_into_view_if_needed()
    nxt = viewer.locator(".ks-next")
    b = nxt.bounding_box()
    assert 48 <= b["y"] and b["y"] + b["height"] <= 844, b
    nxt.click()
    assert viewer.get_attribute("data-step") == "2"
    page.evaluate(SETTLE)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "lesson-06-viewer-390.png")


def test_gpu_model_shows_global_and_shared_memory_and_no_tpu_words(watched, base_url):
    page = watched.page
    page.goto(f"{base_url}lessons/06-scalar-prefetch/")
    viewer = _viewer_of(page, "smem")
    viewer.scroll_into_view_if_needed()
    viewer.locator(".ks-model").select_option("gpu")
    viewer.locator(".ks-next").click()
    lanes = viewer.locator("[data-lane]").evaluate_all("els => els.map(e => e.dataset.lane)")
    assert lanes[:2] == ["global", "shared"] and "smem" not in lanes, lanes
    text = viewer.inner_text()
    assert "global memory" in text and "shared memory" in text
    assert not re.search(r"VMEM|SMEM|HBM", text, re.IGNORECASE), re.findall(
        r".{30}(?:VMEM|SMEM|HBM).{30}", text, re.IGNORECASE)
    assert viewer.locator(".ks-cell.ks-read").count() == 0  # no scalar-prefetch reads drawn
    viewer.locator(".ks-model").select_option("tpu")  # and back: the TPU's words again
    assert "SMEM read" in viewer.locator("[role=status]").inner_text()


@pytest.mark.parametrize("width", [1280, 390])
def test_screenshots_of_lesson_4(browser, base_url, width):
    """Lesson 4 at both widths, for a person to look at (build/screenshots/)."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{base_url}lessons/04-index-maps/", wait_until="networkidle")
        page.locator(".ks-trow").first.scroll_into_view_if_needed()
        page.evaluate("() => scrollBy(0, -300)")
        page.evaluate(SETTLE)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / f"lesson-04-{width}.png")
    finally:
        context.close()
