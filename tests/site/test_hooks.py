"""Unit tests of the site build's modules (site/hooks.py, content.py, pages.py, text.py): fast,
no build."""

from __future__ import annotations

import pytest
from sitetools import load_hooks, load_site

from grader.website import shipped_lessons

hooks = load_hooks()
content, pages, text = load_site("content"), load_site("pages"), load_site("text")
SETTINGS = {"execute": True, "toc_depth": 2}  # mkdocs-jupyter's, as far as a digest cares


@pytest.mark.parametrize(("repo_path", "site_path"), [
    ("exercises/", "exercises/"),
    ("exercises/release/01_first_kernel/first_kernel.ipynb", "exercises/01_first_kernel/"),
    ("exercises/source/02_tiling", "exercises/02_tiling/"),
    ("exercises/99_unknown/", "exercises/"),
    ("lessons/03-tiling.py", "lessons/03-tiling/"),
    ("lessons/03-tiling.py#a-tiled-matmul", "lessons/03-tiling/#a-tiled-matmul"),
    ("kernelsim/trace.py", None),
])
def test_repo_links_map_to_site_pages(repo_path, site_path):
    got = text.repo_target_to_site(repo_path, {"03-tiling"}, {"01_first_kernel", "02_tiling"})
    assert got == site_path


def test_lesson_links_are_rewritten_relative_to_the_page():
    page = '<a href="../exercises/">x</a> <a href="04-index-maps.py#grid">y</a> ' \
           '<a href="https://docs.jax.dev/">z</a> <a href="#top">t</a>'
    out = text.rewrite_repo_links(page, "lessons/03-tiling/", "lessons", {"04-index-maps"},
                                  set())
    assert 'href="../../exercises/"' in out
    assert 'href="../04-index-maps/#grid"' in out
    assert 'href="https://docs.jax.dev/"' in out and 'href="#top"' in out


def test_cdn_scripts_are_stripped_and_external_loads_found():
    page = ('<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js"> '
            '</script><script type="text/x-mathjax-config">init()</script>'
            '<script type="module">const m = (await import("https://cdn.example/m.mjs"));'
            '</script><p>keep</p><a href="https://docs.jax.dev/">a link is fine</a>')
    assert text.external_loads(page)
    out = text.strip_cdn(page)
    assert "<p>keep</p>" in out and "mathjax" not in out.lower() and "import(" not in out
    assert text.external_loads(out) == []
    assert text.external_loads('<link rel="stylesheet" href="//fonts.example/css">')
    assert not text.external_loads('<math xmlns="http://www.w3.org/1998/Math/MathML">')


def test_the_copy_buttons_text_is_left_out_of_search():
    page = ('<pre>x = 1</pre><div class="clipboard-copy-txt" id="cell-1">x = 1</div>'
            '<div class="clipboard-copy-txt" data-search-exclude id="cell-2">y</div>')
    out = text.unsearched_copies(page)
    assert out.count("data-search-exclude") == 2 and out.count("clipboard-copy-txt") == 2
    assert text.unsearched_copies(out) == out


def test_tex_becomes_mathml_outside_code():
    out = text.render_math("<p>$$t \\ge \\frac{F}{P}$$ and $x_i$</p><code>$HOME$</code>")
    assert out.count("<math") == 2
    assert "<code>$HOME$</code>" in out


def test_viewer_comment_becomes_the_inline_viewer(monkeypatch):
    monkeypatch.setattr(hooks.STATE, "viewers", hooks.load_viewers())
    monkeypatch.setattr(hooks.STATE, "embedded", set())
    page = hooks.VIEWER_COMMENT.sub(lambda m: hooks.viewer_html(m.group(1)),
                                    "<p>a</p><!-- viewer: tiled-matmul --><!-- viewer: nope -->")
    assert page.count('<figure class="ks-viewer-embed" data-viewer="tiled-matmul">') == 1
    assert '<script type="module">' in page and "<iframe" not in page
    assert hooks.STATE.embedded == {"tiled-matmul"}


def test_viewers_manifest_targets_are_traceable():
    import kernelsim

    for name, v in hooks.load_viewers().items():
        fn, args = v.target()
        t = kernelsim.trace(fn, *args, model=v.model, chip=v.chip)
        assert t.calls and t.calls[v.call].steps >= 4, name


def test_exercise_pages_disappear_without_assignments(tmp_path, monkeypatch):
    monkeypatch.setattr(content, "EXERCISES_DIR", tmp_path)
    assert content.assignments() == []
    (tmp_path / "source" / "01_empty").mkdir(parents=True)
    assert content.assignments() == []
    text = pages.exercises_index_md([])
    assert "No assignments yet" in text


def test_statement_never_holds_solution_cells(tmp_path, monkeypatch):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Assignment 9 — demo\n\nDo the thing."),
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 42\n"
                                  "    ### END SOLUTION"),
        nbformat.v4.new_markdown_cell("my written answer: SECRET",
                                      metadata={"nbgrader": {"solution": True}}),
    ]
    folder = tmp_path / "source" / "09_demo"
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "demo.ipynb")
    monkeypatch.setattr(content, "EXERCISES_DIR", tmp_path)
    (a,) = content.assignments()
    assert a.title == "Assignment 9 — demo" and a.release is None
    page = pages.assignment_md(a)
    assert "Do the thing." in page
    assert "SECRET" not in page and "42" not in page and "SOLUTION" not in page
    assert "not been released" in page


def test_docstrings_become_markdown_lists():
    doc = """Analyse calls.

    model: ``"tpu"`` (sequential) or ``"gpu"``
        (one program per point).
    strict: raise instead.
    """
    md = pages.doc_md(doc)
    assert md.startswith("Analyse calls.")
    assert '- model: `"tpu"` (sequential) or `"gpu"` (one program per point).' in md
    assert "- strict: raise instead." in md


def test_lesson_cache_is_per_kernelsim_version(tmp_path):
    stale = tmp_path / "kernelsim-000000000000"
    stale.mkdir()
    here = hooks.lesson_cache_dir(tmp_path, SETTINGS)
    assert here.name.startswith("kernelsim-") and here == hooks.lesson_cache_dir(tmp_path,
                                                                                 SETTINGS)
    assert not stale.exists()


def test_lesson_cache_follows_what_a_lesson_page_is_made_from(tmp_path, monkeypatch):
    """The local cache and the shipped pages share one definition of a lesson's sources
    (``shipped_lessons.sources_digest``: borrowed lessons and bench inputs too): when one
    lesson's sources change, the cache made from the old ones is not used."""
    before = hooks.lesson_cache_dir(tmp_path, SETTINGS)
    before.mkdir()
    digest = shipped_lessons.sources_digest

    def borrowed_lesson_changed(lesson, settings):
        return "changed" if lesson.name.startswith("08-") else digest(lesson, settings)

    monkeypatch.setattr(shipped_lessons, "sources_digest", borrowed_lesson_changed)
    assert hooks.lesson_cache_dir(tmp_path, SETTINGS) != before
    assert not before.exists()


def test_exercise_table_shows_the_lesson_each_assignment_practises():
    """Every row of the exercises' index links the lessons ``grader.syllabus`` names, by title;
    the course map lists each lesson's assignments (lesson 5 has two, and lesson 12 the
    assignment of lesson 8, whose backward task practises it)."""
    from grader import syllabus

    ls = content.lessons()
    asg = content.assignments(ls)
    index = pages.exercises_index_md(asg)
    by_number = {lesson.number: lesson for lesson in ls}
    for a in asg:
        row = next(line for line in index.splitlines() if f"]({a.name}.md)" in line)
        for number in syllabus.lessons_of(a.name):
            lesson = by_number[number]
            assert f"[{lesson.nav_title}](../{lesson.src_uri})" in row, row
        later = syllabus.later_tasks(a.name)  # tasks that wait for a later lesson say so
        assert later is None or later in row, row
    course_map = pages.course_map_md(ls, asg, [])
    row = next(line for line in course_map.splitlines() if "lessons/05-" in line)
    assert "exercises/04_memory_spaces.md" in row and "exercises/08_manual_dma.md" in row, row
    for stem in ("lessons/08-", "lessons/12-"):
        row = next(line for line in course_map.splitlines() if stem in line)
        assert "exercises/07_flash_attention.md" in row, row
