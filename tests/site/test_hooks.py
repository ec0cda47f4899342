"""Unit tests of site/hooks.py: fast, no build."""

from __future__ import annotations

import pytest
from sitetools import REPO, load_hooks

hooks = load_hooks()


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
    got = hooks.repo_target_to_site(repo_path, {"03-tiling"}, {"01_first_kernel", "02_tiling"})
    assert got == site_path


def test_lesson_links_are_rewritten_relative_to_the_page():
    text = '<a href="../exercises/">x</a> <a href="04-index-maps.py#grid">y</a> ' \
           '<a href="https://docs.jax.dev/">z</a> <a href="#top">t</a>'
    out = hooks.rewrite_repo_links(text, "lessons/03-tiling/", "lessons", {"04-index-maps"},
                                   set())
    assert 'href="../../exercises/"' in out
    assert 'href="../04-index-maps/#grid"' in out
    assert 'href="https://docs.jax.dev/"' in out and 'href="#top"' in out


def test_cdn_scripts_are_stripped_and_external_loads_found():
    page = ('<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js"> '
            '</script><script type="text/x-mathjax-config">init()</script>'
            '<script type="module">const m = (await import("https://cdn.example/m.mjs"));'
            '</script><p>keep</p><a href="https://docs.jax.dev/">a link is fine</a>')
    assert hooks.external_loads(page)
    out = hooks.strip_cdn(page)
    assert "<p>keep</p>" in out and "mathjax" not in out.lower() and "import(" not in out
    assert hooks.external_loads(out) == []
    assert hooks.external_loads('<link rel="stylesheet" href="//fonts.example/css">')
    assert not hooks.external_loads('<math xmlns="http://www.w3.org/1998/Math/MathML">')


def test_tex_becomes_mathml_outside_code():
    out = hooks.render_math("<p>$$t \\ge \\frac{F}{P}$$ and $x_i$</p><code>$HOME$</code>")
    assert out.count("<math") == 2
    assert "<code>$HOME$</code>" in out


def test_player_embed_or_notice():
    player = hooks._load_players().manifest["tiled-add"]
    available = hooks.Players({"tiled-add": player}, True)
    html = hooks._player_html("tiled-add", "lessons/03-tiling/", available)
    assert 'src="../../players/tiled-add.html"' in html
    missing = hooks.Players({"tiled-add": player}, False, "no to_html")
    assert "<iframe" not in hooks._player_html("tiled-add", "lessons/03-tiling/", missing)


def test_players_manifest_targets_are_traceable():
    import kernelsim

    for name, p in hooks._load_players().manifest.items():
        fn, args = p.target()
        t = kernelsim.trace(fn, *args, model=p.model, chip=p.chip)
        assert t.calls and t.calls[p.call].steps >= 4, name
        if p.lesson:
            assert (REPO / "lessons" / f"{p.lesson}.py").is_file(), f"{name}: {p.lesson}"


def test_players_step_is_skipped_with_a_reason_without_to_html(monkeypatch, capsys):
    from kernelsim.trace import Trace

    monkeypatch.delattr(Trace, "to_html", raising=False)
    players = hooks._load_players()
    assert not players.available and "to_html" in players.reason


def test_exercise_pages_disappear_without_assignments(tmp_path, monkeypatch):
    monkeypatch.setattr(hooks, "EXERCISES_DIR", tmp_path)
    assert hooks.assignments() == []
    (tmp_path / "source" / "01_empty").mkdir(parents=True)
    assert hooks.assignments() == []
    text = hooks.exercises_index_md([])
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
    monkeypatch.setattr(hooks, "EXERCISES_DIR", tmp_path)
    (a,) = hooks.assignments()
    assert a.title == "Assignment 9 — demo" and a.release is None
    page = hooks.assignment_md(a)
    assert "Do the thing." in page
    assert "SECRET" not in page and "42" not in page and "SOLUTION" not in page
    assert "not been released" in page


def test_docstrings_become_markdown_lists():
    doc = """Analyse calls.

    model: ``"tpu"`` (sequential) or ``"gpu"``
        (one program per point).
    strict: raise instead.
    """
    md = hooks._doc_md(doc)
    assert md.startswith("Analyse calls.")
    assert '- model: `"tpu"` (sequential) or `"gpu"` (one program per point).' in md
    assert "- strict: raise instead." in md
