"""The lessons' executed pages shipped in site/executed/ (``grader.website.shipped_lessons``):
current for every lesson, handed to the build only when made from the present sources, and stored so
that the build gets back exactly the page the lesson's execution made."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from grader import sources
from grader.website import shipped_lessons
from grader.website.shipped_lessons import BODY_START, REFRESH

LESSON = sources.lessons()[0]
SETTINGS = {"execute": True, "toc_depth": 2, "cache_dir": "/anywhere"}
PAGE = {"content": "<style>nb { }</style>\n" + BODY_START + "<h1 id='a'>A</h1></div>",
        "toc_tokens": [{"level": 1, "id": "a", "name": "A", "children": []}], "title": "A"}


def test_every_lesson_has_a_current_shipped_page():
    """A fresh clone's site shows these pages without executing the lessons: after changing a
    lesson, _course.py, kernelsim or JAX, ship the lessons again."""
    stale = shipped_lessons.stale(shipped_lessons.plugin_settings())
    assert not stale, f"shipped lesson pages are stale for {', '.join(stale)}: run `{REFRESH}` " \
        "(it executes those lessons only) and commit site/executed/"


def test_a_clones_build_takes_the_shipped_page_and_executes_nothing(tmp_path, monkeypatch):
    """What a fresh clone's build does with a lesson missing from the cache: mkdocs-jupyter's
    page hook finds the shipped page where it looks for its own entry, and executes nothing."""
    from mkdocs_jupyter import convert

    from grader.website import site

    if not shipped_lessons.is_current(LESSON, shipped_lessons.plugin_settings()):
        pytest.skip("stale: test_every_lesson_has_a_current_shipped_page says what to do")

    def executes(*args, **kwargs):
        raise AssertionError("the hook executed the lesson")

    def with_empty_cache(config=site.lesson_pages_config):
        config, jupyter = config()
        jupyter.config["cache_dir"] = str(tmp_path / "cache")
        return config, jupyter

    monkeypatch.setattr(convert, "nb2html", executes)
    monkeypatch.setattr(site, "lesson_pages_config", with_empty_cache)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # the hooks add lessons/
    site.render_lessons([LESSON.name], tmp_path / "report.jsonl")
    cache_file = site.lesson_cache_file(with_empty_cache()[1], LESSON.name)
    run = site.LessonRun(**json.loads((tmp_path / "report.jsonl").read_text()))
    assert (run.source, run.error) == ("shipped", None)
    entry = json.loads((shipped_lessons.STORE / f"{LESSON.stem}.json").read_text())
    assert json.loads(cache_file.read_text())["content"].endswith(entry["body"])


@pytest.fixture
def shipped(tmp_path):
    """LESSON's page, as its execution left it in the cache, shipped into a store in tmp."""
    cache_file, store = tmp_path / "made.json", tmp_path / "store"
    cache_file.write_text(json.dumps(PAGE))
    shipped_lessons.ship(LESSON, SETTINGS, cache_file, store)
    return store


def test_a_shipped_page_seeds_the_cache_with_what_execution_made(shipped, tmp_path):
    cache_file = tmp_path / "cache" / "key.json"
    assert shipped_lessons.seed(LESSON, {**SETTINGS, "cache_dir": "/elsewhere"}, cache_file,
                                shipped)
    assert json.loads(cache_file.read_text()) == PAGE
    heads = list(shipped.glob("head-*.html"))
    assert [h.read_text() for h in heads] == ["<style>nb { }</style>\n"]  # stored once


def test_a_page_made_from_other_sources_is_never_seeded(shipped, tmp_path):
    cache_file = tmp_path / "cache" / "key.json"
    assert not shipped_lessons.seed(LESSON, {**SETTINGS, "toc_depth": 3}, cache_file, shipped)
    entry = shipped / f"{LESSON.stem}.json"
    entry.write_text(entry.read_text().replace('"sources": "', '"sources": "0'))
    assert not shipped_lessons.seed(LESSON, SETTINGS, cache_file, shipped)
    assert not cache_file.exists()
    assert shipped_lessons.stale(SETTINGS, shipped)[0] == LESSON.name


def test_a_lesson_depends_on_the_lessons_it_takes_functions_from():
    lesson12 = sources.LESSONS_DIR / "12-production.py"
    names = {p.name for p in sources.lesson_inputs(lesson12)}
    assert {"12-production.py", "08-flash-attention.py", "_course.py"} <= names
    assert "viewer.js" in names and "09-debugging.py" not in names


def test_a_lesson_depends_on_the_bench_modules_it_imports_and_the_records_it_reads():
    lesson16 = sources.LESSONS_DIR / "16-mosaic-gpu.py"
    names = {p.name for p in sources.lesson_inputs(lesson16)}
    assert {"gpu_kernels.py", "gpu_perf-h200.json"} <= names
    # a standard module of the same name as nothing in bench/ is not an input
    assert "json.py" not in names and "grading.py" not in names


def test_files_digest_is_each_files_path_and_bytes_in_path_order():
    """The one digest of "made from these files" (shipped pages, the shipped-kernels corpus, the
    local lesson cache): its format is what every stored digest was made with, so it must not
    drift, and the order files are named in must not matter."""
    course = sources.LESSONS_DIR / "_course.py"
    by_hand = hashlib.sha256(b"header")
    for path in sorted([course, LESSON]):
        by_hand.update(b"\0" + path.relative_to(sources.REPO).as_posix().encode() + b"\0")
        by_hand.update(path.read_bytes())
    digest = sources.files_digest([LESSON, course, LESSON], b"header")
    assert digest == by_hand.hexdigest()
    assert sources.files_digest([LESSON], b"header") != digest


def test_prune_removes_pages_of_gone_lessons_and_unused_heads(shipped):
    (shipped / "99-gone.json").write_text(json.dumps({"head": "feedfeedfeed"}))
    (shipped / "head-feedfeedfeed.html").write_text("<style></style>")
    removed = {p.name for p in shipped_lessons.prune(shipped)}
    assert removed == {"99-gone.json", "head-feedfeedfeed.html"}
    assert (shipped / f"{LESSON.stem}.json").exists() and list(shipped.glob("head-*.html"))
