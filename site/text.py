"""Text passes over rendered pages: TeX to MathML (no MathJax), CDN scripts out, loads from
other hosts found (the site works offline), and links written for the repository
(``../exercises/``) pointed at the site's pages."""

from __future__ import annotations

import html
import logging
import posixpath
import re

from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.pallas_course")


_CODE_SPLIT = re.compile(r"(<pre\b.*?</pre>|<code\b.*?</code>|<script\b.*?</script>|"
                         r"<style\b.*?</style>|<math\b.*?</math>)", re.DOTALL | re.IGNORECASE)
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
_INLINE_MATH = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n<>]+?)(?<=\S)\$(?![\w$])")


def _tex(tex: str, display: bool) -> str:
    tex = html.unescape(tex).strip()
    try:
        from latex2mathml.converter import convert  # optional: the site extra's
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


# mkdocs-jupyter puts each code cell on a page twice: highlighted, and as plain text in a hidden
# div that the copy button reads. The search index took both: a third of its 0.9 MB, which each
# page's search worker fetches and indexes when the page loads (0.2-0.5 s of CPU).
_COPY_TEXT = re.compile(r'<div class="clipboard-copy-txt"(?![^>]*data-search-exclude)')


def unsearched_copies(text: str) -> str:
    """The copy buttons' hidden cell sources marked ``data-search-exclude`` (mkdocs-material's
    search skips such an element), so the search index holds each cell's code once."""
    return _COPY_TEXT.sub('<div class="clipboard-copy-txt" data-search-exclude', text)


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
