"""The built site: every lesson and assignment has its page, every internal link resolves,
nothing loads from another host, and no solution or hidden test reaches build/site/."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlparse

import jupytext
import nbformat
import pytest
from sitetools import REPO, load_site

LESSONS = sorted((REPO / "lessons").glob("[0-9][0-9]-*.py"))
SOURCE = REPO / "exercises" / "source"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def test_strict_build_has_every_lesson(built_site, build_info):
    assert build_info["lessons"] == [p.stem for p in LESSONS]
    for p in LESSONS:
        page = built_site / "lessons" / p.stem / "index.html"
        assert page.is_file(), f"no page for {p.name}"
        text = page.read_text()
        assert "jp-Notebook" in text, f"{p.name} was not rendered as a notebook"
        assert (built_site / "lessons" / p.stem / p.name).is_file(), "no .py download"


def test_every_lesson_page_offers_its_notebook(built_site):
    """The lesson as .ipynb beside its page, linked from its header: its cells after the setup
    cell. Colab and Kaggle links appear exactly when mkdocs.yml names a GitHub repo_url."""
    from mkdocs.config import load_config  # the site extra's, as the build's

    config = load_config(str(REPO / "mkdocs.yml"))
    notebooks = load_site("notebooks")
    hosted = bool(notebooks.github_repo(config["repo_url"]))
    for p in LESSONS:
        page = (built_site / "lessons" / p.stem / "index.html").read_text()
        assert f'<a href="{p.stem}.ipynb" download>' in page, f"{p.name}: no notebook link"
        nb = nbformat.read(built_site / "lessons" / p.stem / f"{p.stem}.ipynb", as_version=4)
        assert nb.cells[0].source == notebooks.setup_cell(config["repo_url"])
        assert [c.source for c in nb.cells[1:]] == [c.source for c in jupytext.read(p).cells]
        assert ("Open in Colab" in page and "Open in Kaggle" in page) == hosted, p.name


def test_the_search_index_holds_a_code_cell_once(built_site):
    """The copy button's hidden copy of each code cell stays out of the search index, which
    every page's search worker parses when it loads."""
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    for p in LESSONS:
        text = next(d["text"] for d in docs if d["location"] == f"lessons/{p.stem}/")
        first = next(c.source for c in jupytext.read(p).cells
                     if c.cell_type == "code" and "import" in c.source)
        line = next(x for x in first.splitlines() if x.startswith("import "))
        assert text.count(line) == 1, f"{p.name}: {line!r} indexed {text.count(line)} times"


def test_nav_lists_lessons_in_order(built_site):
    index = (built_site / "index.html").read_text()
    hrefs = re.findall(r'href="(lessons/\d\d-[^"/]+/)"', index)
    seen = list(dict.fromkeys(hrefs))
    assert seen == [f"lessons/{p.stem}/" for p in LESSONS]


def _assignment_dirs() -> list[Path]:
    if not SOURCE.is_dir():
        return []
    return [d for d in sorted(SOURCE.iterdir())
            if d.is_dir() and (list(d.glob("*.ipynb")) or list(d.glob("*.py")))]


def test_one_page_per_assignment(built_site, build_info):
    names = [d.name for d in _assignment_dirs()]
    assert build_info["assignments"] == names
    index = (built_site / "exercises" / "index.html").read_text()
    for name in names:
        page = built_site / "exercises" / name / "index.html"
        assert page.is_file(), name
        assert f'href="{name}/"' in index, f"exercises index does not link {name}"
    for name in build_info["released"]:
        release = next((REPO / "exercises" / "release" / name).glob("*.ipynb"))
        copy = built_site / "exercises" / name / release.name
        assert copy.read_bytes() == release.read_bytes(), "download differs from the release"
        assert f'href="{release.name}"' in (built_site / "exercises" / name /
                                            "index.html").read_text()


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "link", "script", "img", "iframe", "source"):
                self.links.append(a[key])


def _parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def test_every_internal_link_resolves(built_site):
    root = "http://site.invalid/"
    pages = sorted(built_site.rglob("*.html"))
    parsed = {path: _parse(path) for path in pages}
    broken = []
    for path, p in parsed.items():
        rel = path.relative_to(built_site).as_posix()
        page_url = urljoin(root, rel)
        for link in p.links:
            url, frag = urldefrag(urljoin(page_url, link))
            if not url.startswith(root):
                continue  # another site (a link, never a load: see test_nothing_loads_...)
            target = built_site / unquote(urlparse(url).path[1:])
            if target.is_dir() or url.endswith("/"):
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{rel}: {link}")
            elif frag and target.suffix == ".html" and target in parsed and \
                    frag not in parsed[target].ids:
                broken.append(f"{rel}: {link} (no #{frag})")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:40])


def test_nothing_loads_from_another_host(built_site):
    text, loads = load_site("text"), []
    for path in sorted(built_site.rglob("*")):
        if path.suffix in (".html", ".css", ".js") and path.is_file():
            for load in text.external_loads(path.read_text(encoding="utf-8", errors="replace")):
                loads.append(f"{path.relative_to(built_site)}: {load}")
    assert not loads, "\n".join(loads[:20])


def _solution_lines() -> set[str]:
    """Lines of solution regions and hidden tests in exercises/source that appear nowhere a
    learner may legitimately see them (lessons, kernelsim, the released notebooks, the task
    texts)."""
    lines: set[str] = set()
    stated: list[str] = []  # the task texts: what they show a learner is no answer leaked
    for d in _assignment_dirs():
        for nb_path in [*d.glob("*.ipynb"), *d.glob("*.py")]:
            try:
                nb = (nbformat.read(nb_path, as_version=4) if nb_path.suffix == ".ipynb"
                      else jupytext.read(nb_path))
            except Exception:  # noqa: BLE001 - a half-written notebook has nothing to leak
                continue
            stated += [c.source.replace("`", "") for c in nb.cells if c.cell_type == "markdown"]
            for cell in nb.cells:
                inside = False
                for line in cell.source.splitlines():
                    s = line.strip()
                    if "BEGIN SOLUTION" in s or "BEGIN HIDDEN TESTS" in s:
                        inside = True
                    elif "END SOLUTION" in s or "END HIDDEN TESTS" in s:
                        inside = False
                    elif inside and len(s) >= 24 and not s.startswith("#"):
                        lines.add(s)
    # whitespace runs as one space: the site's search index joins a lesson's wrapped lines
    public = re.sub(r"\s+", " ", "\n".join(p.read_text(errors="replace") for p in [
        *(REPO / "lessons").glob("*.py"), *(REPO / "kernelsim").rglob("*.py"),
        *(REPO / "exercises" / "release").rglob("*.ipynb")]) + "\n" + "\n".join(stated))
    from grader import tasks

    given = {x.strip() for t in tasks.TASKS for x in t.given_body.splitlines()}  # texts show them
    return {s for s in lines if re.sub(r"\s+", " ", s) not in public and s not in given}


def _strings(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def _site_text(path: Path) -> str:
    """A built file's text as a reader sees it: JSON strings joined, tags removed."""
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in (".json", ".ipynb"):
        try:
            raw = "\n".join(_strings(json.loads(raw)))
        except ValueError:
            pass
    text = html.unescape(re.sub(r"<[^>]+>", "", raw))
    return re.sub(r"[ \t]+", " ", text)


def test_no_solution_or_hidden_test_on_the_site(built_site):
    secrets = _solution_lines()
    if not _assignment_dirs():
        pytest.skip("no assignment under exercises/source yet: only the markers are searched")
    found = []
    for path in sorted(built_site.rglob("*")):
        if not path.is_file() or path.suffix not in (".html", ".json", ".ipynb", ".js", ".py",
                                                     ".txt", ".xml", ".md"):
            continue
        raw = path.read_text(encoding="utf-8", errors="replace")
        text = _site_text(path)
        for marker in MARKERS:
            if marker in raw or marker in text:
                found.append(f"{path.relative_to(built_site)}: marker {marker!r}")
        for line in secrets:
            if line in text or line in raw:
                found.append(f"{path.relative_to(built_site)}: solution line {line!r}")
    assert not found, "\n".join(found[:20])
    print(f"searched build/site for {len(MARKERS)} markers and {len(secrets)} solution lines")


def test_glossary_defines_every_term_with_a_jax_link(built_site):
    text = (REPO / "site" / "docs" / "glossary.md").read_text()
    wanted = ["Grid", "Block", "BlockSpec", "Index map", "HBM", "VMEM", "SMEM",
              "Scalar prefetch", "Revisit", "Arithmetic intensity", "Roofline"]
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    names = [s.split(" {#")[0] for s in sections]
    assert names == wanted
    for s in sections:
        assert re.search(r"\(https://docs\.jax\.dev/en/latest/pallas/[^)]+\)", s), s[:40]
    page = (built_site / "glossary" / "index.html").read_text()
    try:
        import latex2mathml  # noqa: F401 - the hook's TeX -> MathML converter
    except ImportError:
        assert '<code class="tex">' in page, "without latex2mathml, TeX shows as code"
        pytest.skip("latex2mathml is not installed: formulas are shown as TeX source")
    assert "<math" in page, "the roofline formula was not rendered to MathML"


def test_api_reference_covers_kernelsim_entry_points(built_site):
    page = (built_site / "kernelsim" / "api" / "index.html").read_text()
    for name in ("trace", "run", "Trace", "CallTrace", "StepEvent", "to_html", "tpu-v5e",
                 "kernelsim trace"):
        assert name in page, name
