"""The lessons' executed pages, shipped in the repository (``site/executed/``), so that a fresh
clone serves the whole site without executing sixteen lessons first.

Each lesson's file holds the page mkdocs-jupyter made when it executed the lesson (HTML, table
of contents, title) and ``sources``: the digest of everything that page came from
(``sources_digest``, over ``grader.sources.lesson_inputs``). nbconvert's stylesheet and
scripts, which open every such page and are the bulk of it, are stored once
(``head-<digest>.html``).

``grader.website.site.render_lessons`` copies a shipped page into mkdocs-jupyter's cache when its
``sources`` are the present ones (``seed``); a lesson that changed executes as before. A page is
only ever shipped right after its lesson executed (``ship``), so a shipped page is never older
than what it claims to come from. ``python -m grader.website.ship_lessons`` executes the lessons
whose shipped pages are stale and ships them (seconds when none is); a test fails while any is
stale. The lesson tests execute every lesson regardless (``prerender_lessons(fresh=True)``).
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from grader.sources import REPO, files_digest, lesson_inputs, lessons

STORE = REPO / "site" / "executed"
REFRESH = "python -m grader.website.ship_lessons"
# where nbconvert's head (stylesheets, the copy button's script) ends and the notebook begins
BODY_START = '<div class="jupyter-wrapper">'


def sources_digest(lesson: Path, settings: dict[str, Any]) -> str:
    """sha256 of the lesson's inputs (``lesson_inputs``), mkdocs-jupyter's ``settings`` for the
    lessons (the plugin's configuration, less its cache folder) and the JAX and jaxlib
    versions that run it."""
    wanted = {k: v for k, v in settings.items() if k != "cache_dir"}
    return files_digest(lesson_inputs(lesson), json.dumps(
        {"jax": version("jax"), "jaxlib": version("jaxlib"), "mkdocs-jupyter": wanted},
        sort_keys=True, default=repr).encode())


def plugin_settings() -> dict[str, Any]:
    """mkdocs-jupyter's configuration, as mkdocs.yml sets it."""
    from mkdocs.config import load_config  # optional: mkdocs comes with the site extra

    return dict(load_config(str(REPO / "mkdocs.yml")).plugins["mkdocs-jupyter"].config)


def _entry_file(lesson: Path, store: Path) -> Path:
    return store / f"{lesson.stem}.json"


def _shipped(lesson: Path, store: Path) -> dict[str, Any] | None:
    path = _entry_file(lesson, store)
    return json.loads(path.read_text()) if path.is_file() else None


def is_current(lesson: Path, settings: dict[str, Any], store: Path = STORE) -> bool:
    """True when ``lesson`` has a shipped page made from its present sources."""
    entry = _shipped(lesson, store)
    return entry is not None and entry["sources"] == sources_digest(lesson, settings)


def stale(settings: dict[str, Any], store: Path = STORE) -> list[str]:
    """The lessons without a current shipped page."""
    return [p.name for p in lessons() if not is_current(p, settings, store)]


def seed(lesson: Path, settings: dict[str, Any], cache_file: Path, store: Path = STORE) -> bool:
    """Write the shipped page of ``lesson`` to ``cache_file`` (mkdocs-jupyter's cache entry for
    it) when it is current; returns whether it did."""
    if not is_current(lesson, settings, store):
        return False
    entry = _shipped(lesson, store)
    head = (store / f"head-{entry['head']}.html").read_text(encoding="utf-8") \
        if entry["head"] else ""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps({"content": head + entry["body"],
                                      "toc_tokens": entry["toc_tokens"],
                                      "title": entry["title"]}), encoding="utf-8")
    return True


def ship(lesson: Path, settings: dict[str, Any], cache_file: Path, store: Path = STORE) -> None:
    """Store mkdocs-jupyter's cache entry ``cache_file``, just made by executing ``lesson``, as
    its shipped page."""
    cached = json.loads(cache_file.read_text(encoding="utf-8"))
    content = cached["content"]
    cut = content.find(BODY_START)
    head, body = (content[:cut], content[cut:]) if cut > 0 else ("", content)
    head_id = hashlib.sha256(head.encode()).hexdigest()[:12] if head else None
    store.mkdir(parents=True, exist_ok=True)
    if head_id and not (store / f"head-{head_id}.html").exists():
        (store / f"head-{head_id}.html").write_text(head, encoding="utf-8")
    _entry_file(lesson, store).write_text(json.dumps(
        {"lesson": lesson.name, "sources": sources_digest(lesson, settings), "head": head_id,
         "title": cached["title"], "toc_tokens": cached["toc_tokens"], "body": body},
        indent=0) + "\n", encoding="utf-8")


def prune(store: Path = STORE) -> list[Path]:
    """Remove shipped pages of lessons that no longer exist and heads no page uses; returns
    what it removed."""
    names = {p.stem for p in lessons()}
    removed = [p for p in store.glob("[0-9][0-9]-*.json") if p.stem not in names]
    used = {json.loads(p.read_text())["head"] for p in store.glob("[0-9][0-9]-*.json")
            if p.stem in names}
    removed += [p for p in store.glob("head-*.html")
                if p.stem.removeprefix("head-") not in used]
    for path in removed:
        path.unlink()
    return removed
