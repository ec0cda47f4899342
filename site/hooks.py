"""mkdocs hook of the pallas-course site (``hooks: [site/hooks.py]`` in mkdocs.yml): the build's
events. What the site is made from is ``site/content.py``, the pages it generates
``site/pages.py``, the passes over rendered text ``site/text.py``.

What it adds to the pages under ``site/docs``:

* every ``lessons/NN-slug.py`` as a page ``lessons/NN-slug/``, rendered and executed by
  mkdocs-jupyter (the kernel runs in ``lessons/``, as in JupyterLab), listed in the nav's
  "Lessons" section in number order;
* one page per assignment found under ``exercises/source/<assignment>/``: its statement (the
  notebook's markdown cells, from the released student notebook when there is one) and a
  download link to ``exercises/release/<assignment>/<name>.ipynb``. Solution cells, hidden
  tests and the instructor's ``.py`` twins are never read into a page;
* every lesson as a notebook to download beside its page, with links that open it in Colab
  and Kaggle when mkdocs.yml names a GitHub ``repo_url`` (``site/notebooks.py``);
* the course map (lessons, assignments and glossary terms) and the kernelsim API reference,
  generated from what exists;
* kernelsim viewers: lessons show them with ``Trace.show()`` (the standalone viewer, inline,
  under the build's nbclient); a page under ``site/docs`` places one of ``site/viewers.py``
  with ``<!-- viewer: NAME -->`` and its summary table with ``<!-- trace-summary: NAME -->``;
* an offline guarantee: CDN scripts that nbconvert's template adds to notebook pages
  (MathJax, mermaid, require.js, widget managers) are removed, TeX in ``$$...$$`` / ``$...$``
  becomes MathML at build time, and the build fails if any page still loads a resource from
  another host.
"""

from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import logging
import os
import posixpath
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

from grader import sources
from grader.website import shipped_lessons

log = logging.getLogger("mkdocs.hooks.pallas_course")

SITE = Path(__file__).resolve().parent  # to load the other rooms; they name the repository
LESSONS_PLACEHOLDER = "<!-- lessons -->"
VIEWER_COMMENT = re.compile(r"<!--\s*viewer:\s*([\w-]+)\s*-->")
SUMMARY_COMMENT = re.compile(r"<!--\s*trace-summary:\s*([\w-]+)\s*-->")


# --- viewers ------------------------------------------------------------------------------

def site_module(name: str):
    """``site/NAME.py`` as a module (``site`` is not a package, and would shadow the
    stdlib's)."""
    if f"pallas_course_site_{name}" in sys.modules:  # one copy, shared with the tests
        return sys.modules[f"pallas_course_site_{name}"]
    spec = importlib.util.spec_from_file_location(f"pallas_course_site_{name}",
                                                  SITE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# the rooms of the site's build: what exists, the generated pages, the text passes
site_content = site_module("content")
site_pages = site_module("pages")
site_text = site_module("text")
site_notebooks = site_module("notebooks")
REPO = site_content.REPO


def load_viewers() -> dict[str, Any]:
    """``site/viewers.py``'s VIEWERS: name -> Viewer."""
    return dict(site_module("viewers").VIEWERS)


def _viewer_trace(name: str):
    """The Trace of viewer ``name``'s target, or None (with a warning) if it is not named."""
    import kernelsim  # starts JAX: only a page with a viewer needs it

    v = STATE.viewers.get(name)
    if v is None:
        log.warning("%r is not named in site/viewers.py", name)
        return None, None
    fn, args = v.target()
    return v, kernelsim.trace(fn, *args, model=v.model, chip=v.chip)


def viewer_html(name: str) -> str:
    """Viewer ``name`` as a captioned figure holding the standalone viewer (module inline)."""
    v, t = _viewer_trace(name)
    if t is None:
        return ""
    STATE.embedded.add(name)
    return (f'<figure class="ks-viewer-embed" data-viewer="{name}">'
            f"{t.to_html(call=v.call, fragment=True)}"
            f"<figcaption>{html.escape(v.title)}</figcaption></figure>")


# --- mkdocs events ------------------------------------------------------------------------

class _State:
    lessons: list[site_content.Lesson] = []
    assignments: list[site_content.Assignment] = []
    viewers: dict[str, Any] = {}
    embedded: set[str] = set()
    readable: Any = None  # site/readable.py's readable(content)


STATE = _State()


def _fill_nav(nav: list, section: str, entries: list[dict]) -> None:
    for item in nav:
        if isinstance(item, dict) and section in item:
            item[section] = entries or [{"None yet": "exercises/index.md"}]
            return


def on_config(config):
    ls = site_content.lessons()
    STATE.lessons = ls
    STATE.assignments = site_content.assignments(ls)
    STATE.viewers = load_viewers()
    STATE.embedded = set()
    STATE.readable = site_module("readable").readable
    # the executing kernel imports kernelsim (installed) and lessons/_course.py
    path = os.environ.get("PYTHONPATH", "")
    lessons_dir = str(site_content.LESSONS_DIR)
    if lessons_dir not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (lessons_dir, path) if p)
    # mkdocs-jupyter resolves its cache_dir against the working directory, and lessons render
    # with lessons/ as working directory (on_pre_page): pin the cache to the repository's root
    jupyter = config["plugins"].get("mkdocs-jupyter")
    if jupyter is not None and not os.path.isabs(jupyter.config["cache_dir"]):
        jupyter.config["cache_dir"] = str(lesson_cache_dir(REPO / jupyter.config["cache_dir"],
                                                           dict(jupyter.config)))
    nav = config.get("nav")
    if nav:
        _fill_nav(nav, "Lessons", [{lesson.nav_title: lesson.src_uri} for lesson in ls])
        _fill_nav(nav, "Exercises", [{"All assignments": "exercises/index.md"}] +
                  [{a.title: a.src_uri} for a in STATE.assignments])
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which claims the notebook files
def on_files(files: Files, config) -> Files:
    for lesson in STATE.lessons:
        files.append(File(lesson.src_uri, src_dir=str(REPO), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
        files.append(File.generated(config, site_notebooks.notebook_uri(lesson.path),
                                    content=site_notebooks.lesson_notebook(
                                        lesson.path, config.get("repo_url"))))
    files.append(File.generated(config, "course-map.md",
                                content=site_pages.course_map_md(
                                    STATE.lessons, STATE.assignments,
                                    site_content.glossary_terms())))
    files.append(File.generated(config, "exercises/index.md",
                                content=site_pages.exercises_index_md(STATE.assignments)))
    for a in STATE.assignments:
        files.append(File.generated(config, a.src_uri, content=site_pages.assignment_md(a)))
        if a.release:
            files.append(File.generated(config, a.download_uri, abs_src_path=str(a.release)))
    files.append(File.generated(config, "kernelsim/api.md", content=site_pages.api_md()))
    return files


def lesson_cache_dir(root: Path, settings: dict[str, Any]) -> Path:
    """The folder of executed lessons made from the present sources: mkdocs-jupyter keys its
    cache on the notebook alone, but a lesson's page also comes from what
    ``grader.website.shipped_lessons.sources_digest`` covers (the lessons it takes functions from,
    lessons/_course.py, kernelsim, the bench inputs it reads, JAX), the same definition that
    decides whether its shipped page is current. ``settings``: mkdocs-jupyter's. Folders made
    from other sources go."""
    digest = hashlib.sha256("".join(
        shipped_lessons.sources_digest(lesson, settings)
        for lesson in sources.lessons()).encode())
    here = root / f"kernelsim-{digest.hexdigest()[:12]}"
    for old in root.glob("kernelsim-*"):
        if old != here:
            shutil.rmtree(old, ignore_errors=True)
    return here


def _is_lesson(page) -> bool:
    return page.file.src_uri.startswith("lessons/") and page.file.src_uri.endswith(".py")


@event_priority(-100)  # after mkdocs-jupyter has replaced page.render
def on_pre_page(page, config, files):
    if _is_lesson(page):
        render = page.render

        def render_in_lessons_dir(config, files):
            # JupyterLab starts a notebook's kernel in the notebook's folder: do the same
            cwd = os.getcwd()
            os.chdir(site_content.LESSONS_DIR)
            try:
                return render(config, files)
            finally:
                os.chdir(cwd)

        page.render = render_in_lessons_dir
    return page


def on_page_markdown(markdown: str, page, config, files) -> str:
    if LESSONS_PLACEHOLDER in markdown:
        rel = posixpath.dirname(page.file.src_uri)
        items = "\n".join(f"{lesson.number}. [{lesson.title}]"
                          f"({posixpath.relpath(lesson.src_uri, rel or '.')})"
                          for lesson in STATE.lessons)
        markdown = markdown.replace(LESSONS_PLACEHOLDER, items or "*No lessons yet.*")
    return SUMMARY_COMMENT.sub(lambda m: trace_summary_md(m.group(1)), markdown)


def trace_summary_md(name: str) -> str:
    """``Trace.summary(steps=2)`` of viewer ``name``'s target, as a text block."""
    _, t = _viewer_trace(name)
    return "" if t is None else "```text\n" + t.summary(steps=2).rstrip() + "\n```"


def on_page_content(content: str, page, config, files) -> str:
    if _is_lesson(page):
        content = site_text.unsearched_copies(site_text.strip_cdn(content))
        content = site_text.rewrite_repo_links(content, page.url, "lessons",
                                     {lesson.stem for lesson in STATE.lessons},
                                     {a.name for a in STATE.assignments})
        fix_notebook_toc(page, content)
        content = lesson_header(page, config) + STATE.readable(content)
    content = VIEWER_COMMENT.sub(lambda m: viewer_html(m.group(1)), content)
    return site_text.render_math(content)


_HEADING = re.compile(r"<h([1-6])\b[^>]*\bid=[\"']([^\"']+)[\"'][^>]*>(.*?)</h\1>", re.DOTALL)


def _flat_toc(items) -> list:
    out = []
    for item in items:
        out.append(item)
        out += _flat_toc(item.children)
    return out


def fix_notebook_toc(page, content: str) -> None:
    """mkdocs-jupyter slugs the TOC from markdown whose inline code it dropped, so a heading
    like "`pallas_call` turns ..." gets a TOC anchor the page does not have: take ids and
    titles from the rendered headings instead, in order and level by level."""
    items = _flat_toc(page.toc)
    headings = [(int(m.group(1)), m.group(2),
                 html.unescape(re.sub(r"<[^>]+>|¶", "", m.group(3))).strip())
                for m in _HEADING.finditer(content)]
    ids = {h[1] for h in headings}
    wanted = [h for h in headings if h[0] <= max((i.level for i in items), default=0)]
    if len(wanted) == len(items) and all(h[0] == i.level for h, i in zip(wanted, items,
                                                                         strict=True)):
        for (_, hid, title), item in zip(wanted, items, strict=True):
            item.id, item.title = hid, title
        return
    for item in items:  # the outputs hold headings too: match by id where possible
        if item.id not in ids:
            match = next((h for h in headings if h[0] == item.level and
                          h[1].endswith(item.id)), None)
            if match:
                item.id, item.title = match[1], match[2]


def lesson_header(page, config) -> str:
    """How to run the lesson: in the course's JupyterLab, as a downloaded notebook, or, when
    the site knows its GitHub repository, in Colab or Kaggle."""
    path = Path(page.file.src_uri)
    notebook = site_notebooks.notebook_uri(path)
    href = html.escape(get_relative_url(notebook, page.url))
    hosted = site_notebooks.hosted_links(config.get("repo_url"),
                                         config.get("remote_branch") or "gh-pages", notebook)
    runtimes = " or ".join(f'<a href="{html.escape(url)}">Open in {name}</a>'
                           for name, url in hosted)
    take_away = (f'Or download <a href="{href}" download>{html.escape(path.stem)}.ipynb</a>'
                 + (f" &middot; {runtimes} (pick a TPU runtime; the first cell installs the "
                    "course there, keeping the runtime's own JAX)" if runtimes else "") + ".")
    return ('<div class="lesson-run admonition tip"><p class="admonition-title">'
            "Run this lesson yourself</p><p>"
            f'<code>make start</code>, then open <code>lessons/{path.name}</code> in '
            f'<a href="http://127.0.0.1:8888/lab/tree/lessons/{path.name}">JupyterLab</a> (it '
            "opens as a notebook). The outputs below were computed when this site was built."
            f'</p><p class="lesson-take-away">{take_away}</p></div>')


def on_post_build(config):
    site_dir = Path(config["site_dir"])
    problems = []
    for path in sorted(site_dir.rglob("*.html")):
        for load in site_text.external_loads(path.read_text(encoding="utf-8", errors="replace")):
            problems.append(f"{path.relative_to(site_dir)}: {load}")
    if problems:
        raise PluginError("pages load resources from other hosts (the site must work offline):"
                          "\n  " + "\n  ".join(problems[:20]))
    (site_dir / "build-info.json").write_text(json.dumps({
        "lessons": [lesson.stem for lesson in STATE.lessons],
        "assignments": [a.name for a in STATE.assignments],
        "released": [a.name for a in STATE.assignments if a.release],
        "viewers": sorted(STATE.embedded),
    }, indent=2))
