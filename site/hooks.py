"""mkdocs hook of the pallas-course site (``hooks: [site/hooks.py]`` in mkdocs.yml).

What it adds to the pages under ``site/docs``:

* every ``lessons/NN-slug.py`` as a page ``lessons/NN-slug/``, rendered and executed by
  mkdocs-jupyter (the kernel runs in ``lessons/``, as in JupyterLab), listed in the nav's
  "Lessons" section in number order;
* one page per assignment found under ``exercises/source/<assignment>/``: its statement (the
  notebook's markdown cells, from the released student notebook when there is one) and a
  download link to ``exercises/release/<assignment>/<name>.ipynb``. Solution cells, hidden
  tests and the instructor's ``.py`` twins are never read into a page;
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
import inspect
import json
import logging
import os
import posixpath
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.pallas_course")

SITE = Path(__file__).resolve().parent
REPO = SITE.parent
LESSONS_DIR = REPO / "lessons"
EXERCISES_DIR = REPO / "exercises"
LESSON_GLOB = "[0-9][0-9]-*.py"
LESSONS_PLACEHOLDER = "<!-- lessons -->"
VIEWER_COMMENT = re.compile(r"<!--\s*viewer:\s*([\w-]+)\s*-->")
SUMMARY_COMMENT = re.compile(r"<!--\s*trace-summary:\s*([\w-]+)\s*-->")


# --- what exists --------------------------------------------------------------------------

def _slug_words(name: str) -> str:
    """``02-first-kernel`` and ``01_first_kernel`` both give ``first-kernel``."""
    return re.sub(r"^\d+[-_]", "", name).replace("_", "-").lower()


@dataclass
class Lesson:
    path: Path
    number: int
    title: str          # the H1 without "Lesson N —"
    markdown: str       # all markdown cells, for the course map and the glossary index

    stem = property(lambda self: self.path.stem)
    src_uri = property(lambda self: f"lessons/{self.path.name}")
    nav_title = property(lambda self: f"{self.number}. {self.title}")


def _percent_markdown(text: str) -> str:
    """The markdown cells of a jupytext percent file, comment marks removed."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("# %%"):
            inside = "[markdown]" in line
            continue
        if inside:
            out.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    return "\n".join(out)


def lessons() -> list[Lesson]:
    found = []
    for path in sorted(LESSONS_DIR.glob(LESSON_GLOB)):
        text = path.read_text(encoding="utf-8")
        markdown = _percent_markdown(text)
        h1 = re.search(r"^# (.+)$", markdown, re.MULTILINE)
        title = h1.group(1).strip() if h1 else path.stem
        title = re.sub(r"^Lesson\s+\d+\s*[—–:-]\s*", "", title)
        found.append(Lesson(path, int(path.name[:2]), title, markdown))
    return found


@dataclass
class Assignment:
    name: str                        # folder under exercises/source
    notebook: str                    # notebook file name, e.g. first_kernel.ipynb
    title: str
    statement: list[str]             # markdown cells a learner sees
    release: Path | None             # the student notebook, when it has been released
    lesson: Lesson | None = None

    src_uri = property(lambda self: f"exercises/{self.name}.md")
    download_uri = property(lambda self: f"exercises/{self.name}/{self.notebook}")


def _statement_cells(nb: Any, from_source: bool) -> list[str]:
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") or meta.get("grade"):
            continue  # a written answer is a solution in the instructor's copy
        source = cell.source
        if from_source and ("BEGIN SOLUTION" in source or "BEGIN HIDDEN TESTS" in source):
            continue
        cells.append(source)
    return cells


def assignments(by_slug: dict[str, Lesson] | None = None) -> list[Assignment]:
    """Assignments with a notebook under exercises/source/, in folder order."""
    import jupytext
    import nbformat

    found = []
    source_root = EXERCISES_DIR / "source"
    if not source_root.is_dir():
        return found
    for folder in sorted(p for p in source_root.iterdir() if p.is_dir()):
        notebooks = sorted(folder.glob("*.ipynb")) or sorted(folder.glob("*.py"))
        if not notebooks:
            continue
        stem = notebooks[0].stem
        release = EXERCISES_DIR / "release" / folder.name / f"{stem}.ipynb"
        if release.is_file():
            nb, from_source = nbformat.read(release, as_version=4), False
        else:
            release = None
            nb, from_source = jupytext.read(notebooks[0]), True
        cells = _statement_cells(nb, from_source)
        h1 = next((m.group(1).strip() for c in cells
                   if (m := re.search(r"^# (.+)$", c, re.MULTILINE))), folder.name)
        found.append(Assignment(folder.name, f"{stem}.ipynb", h1, cells, release,
                                (by_slug or {}).get(_slug_words(folder.name))))
    return found


@dataclass
class Term:
    name: str
    anchor: str
    pattern: re.Pattern


def glossary_terms() -> list[Term]:
    """The ``## Term {#anchor}`` headings of site/docs/glossary.md."""
    text = (SITE / "docs" / "glossary.md").read_text(encoding="utf-8")
    terms = []
    for m in re.finditer(r"^## (.+?) \{#([\w-]+)\}\s*$", text, re.MULTILINE):
        name = m.group(1).strip()
        words = r"\s+".join(re.escape(w) for w in name.split())
        flags = 0 if any(c.isupper() for c in name[1:]) else re.IGNORECASE
        terms.append(Term(name, m.group(2), re.compile(rf"\b{words}\w*", flags)))
    return terms


# --- viewers ------------------------------------------------------------------------------

def site_module(name: str):
    """``site/NAME.py`` as a module (``site`` is not a package, and would shadow the
    stdlib's)."""
    spec = importlib.util.spec_from_file_location(f"pallas_course_site_{name}",
                                                  SITE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_viewers() -> dict[str, Any]:
    """``site/viewers.py``'s VIEWERS: name -> Viewer."""
    return dict(site_module("viewers").VIEWERS)


def _viewer_trace(name: str):
    """The Trace of viewer ``name``'s target, or None (with a warning) if it is not named."""
    import kernelsim

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


# --- text helpers -------------------------------------------------------------------------

_CODE_SPLIT = re.compile(r"(<pre\b.*?</pre>|<code\b.*?</code>|<script\b.*?</script>|"
                         r"<style\b.*?</style>|<math\b.*?</math>)", re.DOTALL | re.IGNORECASE)
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
_INLINE_MATH = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n<>]+?)(?<=\S)\$(?![\w$])")


def _tex(tex: str, display: bool) -> str:
    tex = html.unescape(tex).strip()
    try:
        from latex2mathml.converter import convert
    except ImportError:
        return f'<code class="tex">{html.escape(tex)}</code>'
    try:
        return convert(tex, display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - leave unparsable TeX readable
        log.info("could not convert TeX %r to MathML; shown as text", tex)
        return f'<code class="tex">{html.escape(tex)}</code>'


def render_math(text: str) -> str:
    """TeX between ``$$``/``$`` outside code becomes MathML (no MathJax, no network)."""
    parts = _CODE_SPLIT.split(text)
    for i in range(0, len(parts), 2):
        part = _DISPLAY_MATH.sub(lambda m: _tex(m.group(1), True), parts[i])
        parts[i] = _INLINE_MATH.sub(lambda m: _tex(m.group(1), False), part)
    return "".join(parts)


_CDN_SCRIPTS = [
    # <script src="https://..."></script>
    re.compile(r"<script\b[^>]*\bsrc=[\"']https?://[^\"']*[\"'][^>]*>\s*</script>",
               re.IGNORECASE),
    # MathJax 2 configuration that only works with the CDN script
    re.compile(r"<script type=\"text/x-mathjax-config\">.*?</script>", re.DOTALL),
    # inline module scripts that import from a CDN (nbconvert's mermaid loader)
    re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?import\(\s*[\"']https?://"
               r"(?:(?!</script>).)*</script>", re.DOTALL),
    re.compile(r"<!-- (?:Load mathjax|MathJax configuration|End of mathjax configuration)"
               r" -->"),
]

# resources a browser would load on its own (links to other sites are fine, loads are not)
EXTERNAL_LOAD = re.compile(
    r"<(?:script|img|iframe|audio|video|source|embed|track)\b[^>]*\bsrc=[\"']"
    r"(?:https?:)?//(?!127\.0\.0\.1|localhost)[^\"']+"
    r"|<link\b[^>]*\bhref=[\"'](?:https?:)?//(?!127\.0\.0\.1|localhost)[^\"']+"
    r"|@import\s+(?:url\()?[\"']?(?:https?:)?//(?!127\.0\.0\.1|localhost)"
    r"|url\(\s*[\"']?(?:https?:)?//(?!127\.0\.0\.1|localhost|www\.w3\.org)"
    r"|import\(?\s*[\"'](?:https?:)?//(?!127\.0\.0\.1|localhost)",
    re.IGNORECASE)


def strip_cdn(text: str) -> str:
    for pattern in _CDN_SCRIPTS:
        text = pattern.sub("", text)
    return text


def external_loads(text: str) -> list[str]:
    return [m.group(0)[:160] for m in EXTERNAL_LOAD.finditer(text)]


def repo_target_to_site(repo_path: str, lesson_stems: set[str],
                        assignment_names: set[str]) -> str | None:
    """Site path (from the site root) of a repository path a notebook links to, or None."""
    path, _, anchor = repo_path.partition("#")
    path = posixpath.normpath(path) + ("/" if path.endswith("/") else "")
    anchor = f"#{anchor}" if anchor else ""
    if path.rstrip("/") in ("exercises", "exercises/release", "exercises/source"):
        return "exercises/" + anchor
    m = re.fullmatch(r"exercises/(?:release/|source/)?([^/]+)(?:/.*)?", path)
    if m:
        name = m.group(1)
        return (f"exercises/{name}/" if name in assignment_names else "exercises/") + anchor
    m = re.fullmatch(r"lessons/(\d\d-[^/]+?)(?:\.py|\.ipynb)?/?", path)
    if m and m.group(1) in lesson_stems:
        return f"lessons/{m.group(1)}/{anchor}"
    if path.rstrip("/") == "lessons":
        return "course-map/" + anchor
    return None


_HREF = re.compile(r"(<a\b[^>]*\bhref=)([\"'])([^\"']*)\2")


def rewrite_repo_links(text: str, page_url: str, base_repo_dir: str,
                       lesson_stems: set[str], assignment_names: set[str]) -> str:
    """Relative links written for the repository (``../exercises/``) point at site pages."""

    def fix(m: re.Match) -> str:
        href = m.group(3)
        if not href or re.match(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", href, re.IGNORECASE):
            return m.group(0)
        target = posixpath.normpath(posixpath.join(base_repo_dir, href)) + (
            "/" if href.split("#")[0].endswith("/") else "")
        if "#" in href:
            target = posixpath.normpath(posixpath.join(base_repo_dir, href.split("#")[0])) + \
                "#" + href.split("#", 1)[1]
        site_path = repo_target_to_site(target, lesson_stems, assignment_names)
        if site_path is None:
            log.info("link %r on %s names no page of the site; left as written", href, page_url)
            return m.group(0)
        rel = get_relative_url(site_path.split("#")[0] or ".", page_url)
        if site_path.endswith("/") and not rel.endswith("/"):
            rel += "/"
        if "#" in site_path:
            rel += "#" + site_path.split("#", 1)[1]
        return f"{m.group(1)}{m.group(2)}{rel}{m.group(2)}"

    return _HREF.sub(fix, text)


# --- generated pages ----------------------------------------------------------------------

def _md_link(text: str, target: str) -> str:
    return f"[{text}]({target})"


def course_map_md(ls: list[Lesson], asg: list[Assignment], terms: list[Term]) -> str:
    by_lesson = {a.lesson.stem: a for a in asg if a.lesson}
    first: dict[str, str] = {}
    uses: dict[str, list[Term]] = {}
    for lesson in ls:
        found = [t for t in terms if t.pattern.search(lesson.markdown)]
        uses[lesson.stem] = found
        for t in found:
            first.setdefault(t.name, lesson.stem)
    lines = [
        "# Course map",
        "",
        f"{len(ls)} lessons, each a notebook you can read here or run in JupyterLab, and after "
        "most of them an assignment that is graded on values *and* on the kernel's block traffic. "
        "A concept in **bold** is introduced by that lesson; the others it uses again.",
        "",
        "| Lesson | Assignment | Concepts |",
        "| --- | --- | --- |",
    ]
    for lesson in ls:
        a = by_lesson.get(lesson.stem)
        a_cell = _md_link(a.title, f"{a.src_uri}") if a else "—"
        concepts = ", ".join(
            (f"**[{t.name}](glossary.md#{t.anchor})**" if first.get(t.name) == lesson.stem
             else f"[{t.name}](glossary.md#{t.anchor})") for t in uses[lesson.stem]) or "—"
        lines.append(f"| {_md_link(lesson.nav_title, lesson.src_uri)} | {a_cell} | {concepts} |")
    orphans = [a for a in asg if a.lesson is None]
    if orphans:
        lines += ["", "Assignments without a matching lesson: "
                  + ", ".join(_md_link(a.title, a.src_uri) for a in orphans) + "."]
    lines += ["", "## Where each concept appears", "",
              "| Concept | Introduced in | Used again in |", "| --- | --- | --- |"]
    titles = {lesson.stem: lesson for lesson in ls}
    for t in terms:
        where = [s for s, found in uses.items() if t in found]
        if not where:
            lines.append(f"| [{t.name}](glossary.md#{t.anchor}) | — | — |")
            continue
        intro = titles[where[0]]
        again = ", ".join(_md_link(str(titles[s].number), titles[s].src_uri)
                          for s in where[1:]) or "—"
        lines.append(f"| [{t.name}](glossary.md#{t.anchor}) | "
                     f"{_md_link(intro.nav_title, intro.src_uri)} | {again} |")
    return "\n".join(lines) + "\n"


def exercises_index_md(asg: list[Assignment]) -> str:
    lines = [
        "# Exercises",
        "",
        "The exercises are [nbgrader](https://nbgrader.readthedocs.io/) notebooks. Each task "
        "has a cell that checks your kernel on small visible cases and prints what kernelsim "
        "sees; hidden cases (other shapes, ragged edges, bfloat16, more seeds) run when the "
        "assignment is graded.",
        "",
        "Work on them in JupyterLab: `make start` copies them into your workspace "
        "(`workspace/exercises/`, never overwritten) and serves it on "
        "[127.0.0.1:8888](http://127.0.0.1:8888/lab/tree/exercises).",
        "",
    ]
    if not asg:
        lines += ["!!! note \"No assignments yet\"",
                  "    No assignment has been written yet: this page lists them as they appear "
                  "under `exercises/source/`.", ""]
        return "\n".join(lines)
    lines += ["| Assignment | After lesson | Student notebook |", "| --- | --- | --- |"]
    for a in asg:
        lesson = _md_link(a.lesson.nav_title, f"../{a.lesson.src_uri}") if a.lesson else "—"
        nb = (_md_link(a.notebook, a.download_uri.removeprefix("exercises/")) if a.release
              else "not released yet")
        lines.append(f"| {_md_link(a.title, a.name + '.md')} | {lesson} | {nb} |")
    return "\n".join(lines) + "\n"


def _demote(cell: str) -> str:
    """Headings of a statement cell, one level down (the page has its own H1)."""
    return re.sub(r"^(#{1,5}) ", r"#\1 ", cell, flags=re.MULTILINE)


def assignment_md(a: Assignment) -> str:
    lines = [f"# {a.title}", ""]
    get = ["!!! info \"Get the notebook\""]
    if a.release:
        get.append(f"    Download [{a.notebook}]({a.name}/{a.notebook}), or open "
                   f"[`exercises/{a.name}/{a.notebook}`](http://127.0.0.1:8888/lab/tree/"
                   f"exercises/{a.name}/{a.notebook}) in JupyterLab (`make start` copies it into "
                   "your workspace and serves it on 127.0.0.1:8888).")
    else:
        get.append("    The student notebook has not been released yet (nbgrader writes it to "
                   f"`exercises/release/{a.name}/{a.notebook}`); the statement below is read "
                   "from the assignment's source without its solution cells.")
    if a.lesson:
        get.append(f"    It practises [{a.lesson.nav_title}](../{a.lesson.src_uri}).")
    lines += ["\n".join(get), ""]
    cells = list(a.statement)
    if cells and cells[0].lstrip().startswith("# "):
        cells[0] = re.sub(r"^\s*# .+\n?", "", cells[0], count=1)
    lines += [_demote(c) for c in cells if c.strip()]
    return "\n\n".join(lines) + "\n"


def lessons_list_md(ls: list[Lesson]) -> str:
    return "\n".join(f"{lesson.number}. [{lesson.title}]({lesson.src_uri})" for lesson in ls)


# --- API reference ------------------------------------------------------------------------

API_MODULES = [
    ("kernelsim", ["trace", "run"]),
    ("kernelsim.trace", ["Trace", "CallTrace"]),
    ("kernelsim.schedule", ["StepEvent"]),
    ("kernelsim.cost", ["CallCost", "OperandCost"]),
    ("kernelsim.chips", ["Chip", "get_chip"]),
    ("kernelsim.backend", ["Execution", "platform", "choose"]),
    ("kernelsim.verify", ["verify", "Verification", "OperandCheck"]),
    ("kernelsim.access", ["AccessLog", "Access", "PrefetchReads"]),
    ("kernelsim.errors", ["TraceError"]),
]


_ITEM = re.compile(r"^(?:[*-] |[A-Za-z_][\w ,/()]*: )")


def _doc_md(doc: str | None) -> str:
    """A docstring as markdown: ``x`` -> `x`; ``name: text`` and ``* text`` lines -> a list."""
    if not doc:
        return ""
    doc = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(doc))
    out = []
    for para in re.split(r"\n\s*\n", doc):
        items: list[str] = []
        for line in para.splitlines():
            if items and (line[:1].isspace() or not _ITEM.match(line)):
                items[-1] += " " + line.strip()
            else:
                items.append(line.strip())
        if len(items) == 1:
            out.append(items[0])
            continue
        block = [] if _ITEM.match(items[0]) else [items.pop(0), ""]
        block += ["- " + re.sub(r"^[*-] ", "", i) for i in items]
        out.append("\n".join(block))
    return "\n\n".join(out)


class _Raw(str):
    """An annotation kept as text (``from __future__ import annotations``), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def raw(a):
        return _Raw(a) if isinstance(a, str) else a

    sig = sig.replace(parameters=[p.replace(annotation=raw(p.annotation))
                                  for p in sig.parameters.values()],
                      return_annotation=raw(sig.return_annotation))
    return str(sig)


def _code(text: str) -> str:
    return f"```python\n{text}\n```"


def _members(cls: type) -> list[tuple[str, Any]]:
    members = []
    for name, value in cls.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value) or \
                isinstance(value, (classmethod, staticmethod)):
            members.append((name, value))
    return members


def api_md() -> str:
    lines = ["# kernelsim API reference", "",
             "Generated from kernelsim's docstrings and signatures when the site is built. "
             "The [guide](index.md) shows how the pieces fit together.", ""]
    for module_name, names in API_MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 - report, do not hide, a broken module
            raise PluginError(f"API reference: cannot import {module_name}: {err}") from err
        lines += [f"## `{module_name}`", "", _doc_md(module.__doc__), ""]
        for name in names:
            obj = getattr(module, name, None)
            if obj is None:
                log.info("API reference: %s has no %s", module_name, name)
                continue
            anchor = f"{module_name}.{name}".replace(".", "-").lower()
            if inspect.isclass(obj):
                kind = "exception" if issubclass(obj, BaseException) else "class"
                sig = "" if kind == "exception" else _signature(obj)
                doc = obj.__doc__ if obj.__doc__ and not obj.__doc__.startswith(f"{name}(") \
                    else ""
                lines += [f"### {kind} `{name}` {{#{anchor}}}", "",
                          _code(f"{kind} {name}{sig}"), "", _doc_md(doc), ""]
                for mname, member in _members(obj):
                    if isinstance(member, property):
                        lines += [f"- **`{mname}`** (property)"
                                  + (f": {_doc_md(member.__doc__)}" if member.__doc__ else "")]
                    else:
                        fn = member.__func__ if isinstance(member, (classmethod,
                                                                    staticmethod)) else member
                        doc = _doc_md(fn.__doc__).replace("\n", "\n    ")
                        lines += [f"- **`{mname}{_signature(fn)}`**"
                                  + (f"\n\n    {doc}\n" if doc else "")]
                lines.append("")
            else:
                lines += [f"### `{name}` {{#{anchor}}}", "", _code(f"{name}{_signature(obj)}"),
                          "", _doc_md(obj.__doc__), ""]
    lines += chips_md()
    lines += cli_md()
    return "\n".join(lines) + "\n"


def chips_md() -> list[str]:
    from kernelsim.chips import CHIPS

    lines = ["## Chips (`kernelsim.chips.CHIPS`) {#chips}", "",
             "| name | kind | bf16 peak (TFLOP/s) | f32 peak (TFLOP/s) | HBM (GB/s) | "
             "on-chip (VMEM / shared) | SMEM | ridge (FLOP/byte) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for chip in CHIPS.values():
        lines.append(
            f"| `{chip.name}` | {chip.kind} | {chip.peak_flops_bf16 / 1e12:g} | "
            f"{chip.peak_flops_f32 / 1e12:g} | {chip.hbm_bytes_per_second / 1e9:g} | "
            f"{_bytes(chip.vmem_bytes)} | {_bytes(chip.smem_bytes)} | "
            f"{chip.ridge_flops_per_byte:.0f} |")
    lines += ["", "Sources of these numbers:", ""]
    for chip in CHIPS.values():
        lines.append(f"- `{chip.name}`: " + "; ".join(chip.sources))
    return lines + [""]


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def cli_md() -> list[str]:
    from kernelsim import cli

    parser = cli._parser()
    lines = ["## Command line (`kernelsim`)", "", "```text", parser.format_help().rstrip(),
             "```", ""]
    for action in parser._subparsers._group_actions:  # argparse keeps subparsers here
        for name, sub in action.choices.items():
            lines += [f"### `kernelsim {name}`", "", "```text", sub.format_help().rstrip(),
                      "```", ""]
    return lines


# --- mkdocs events ------------------------------------------------------------------------

class _State:
    lessons: list[Lesson] = []
    assignments: list[Assignment] = []
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
    ls = lessons()
    by_slug = {_slug_words(lesson.stem): lesson for lesson in ls}
    STATE.lessons = ls
    STATE.assignments = assignments(by_slug)
    STATE.viewers = load_viewers()
    STATE.embedded = set()
    STATE.readable = site_module("readable").readable
    # the executing kernel imports kernelsim (installed) and lessons/_course.py
    path = os.environ.get("PYTHONPATH", "")
    if str(LESSONS_DIR) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(LESSONS_DIR), path) if p)
    # mkdocs-jupyter resolves its cache_dir against the working directory, and lessons render
    # with lessons/ as working directory (on_pre_page): pin the cache to the repository's root
    jupyter = config["plugins"].get("mkdocs-jupyter")
    if jupyter is not None and not os.path.isabs(jupyter.config["cache_dir"]):
        jupyter.config["cache_dir"] = str(lesson_cache_dir(REPO / jupyter.config["cache_dir"]))
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
    files.append(File.generated(config, "course-map.md",
                                content=course_map_md(STATE.lessons, STATE.assignments,
                                                      glossary_terms())))
    files.append(File.generated(config, "exercises/index.md",
                                content=exercises_index_md(STATE.assignments)))
    for a in STATE.assignments:
        files.append(File.generated(config, a.src_uri, content=assignment_md(a)))
        if a.release:
            files.append(File.generated(config, a.download_uri, abs_src_path=str(a.release)))
    files.append(File.generated(config, "kernelsim/api.md", content=api_md()))
    return files


def lesson_cache_dir(root: Path) -> Path:
    """The folder of executed lessons for the present kernelsim: mkdocs-jupyter keys its cache
    on the notebook alone, but a lesson's outputs (figures, the viewer's inline module and
    data) also come from kernelsim and lessons/_course.py. Folders of other versions go."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "kernelsim").rglob("*.py"), *(REPO / "kernelsim").rglob("*.js"),
                        LESSONS_DIR / "_course.py"]):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
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
            os.chdir(LESSONS_DIR)
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
        content = strip_cdn(content)
        content = rewrite_repo_links(content, page.url, "lessons",
                                     {lesson.stem for lesson in STATE.lessons},
                                     {a.name for a in STATE.assignments})
        fix_notebook_toc(page, content)
        content = lesson_header(page) + STATE.readable(content)
    content = VIEWER_COMMENT.sub(lambda m: viewer_html(m.group(1)), content)
    return render_math(content)


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


def lesson_header(page) -> str:
    name = Path(page.file.src_uri).name
    return ('<div class="lesson-run admonition tip"><p class="admonition-title">'
            "Run this lesson yourself</p><p>"
            f'<code>make start</code>, then open <code>lessons/{name}</code> in '
            f'<a href="http://127.0.0.1:8888/lab/tree/lessons/{name}">JupyterLab</a> (it opens '
            "as a notebook). The outputs below were computed when this site was built.</p>"
            "</div>")


def on_post_build(config):
    site_dir = Path(config["site_dir"])
    problems = []
    for path in sorted(site_dir.rglob("*.html")):
        for load in external_loads(path.read_text(encoding="utf-8", errors="replace")):
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
