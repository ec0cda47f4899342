"""A learner's files are never overwritten: not by `make start`'s set-up step, not by `release`,
not by `workspace --update`; and the CLI acts on the course where it stands (or --course),
never on the repository's when run from outside it."""

from __future__ import annotations

import json
import re

import pytest
from wstools import REPO, add_assignment, cli, make_course, ok

from grader import cli as course_cli

A1, A2 = "01_first_kernel", "02_tiling"
MINE = "def add(x, y):\n    # my own solution, typed in JupyterLab\n    return x + y\n"


def _edit_solution(nb_path) -> str:
    """Put ``MINE`` into the notebook's first solution cell, as JupyterLab would save it."""
    nb = json.loads(nb_path.read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    cell["source"] = MINE
    nb_path.write_text(json.dumps(nb, indent=1))
    return nb_path.read_text()


def test_make_start_runs_the_workspace_step_and_no_release():
    recipe = re.search(r"^start:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert recipe, "no start target in the Makefile"
    steps = recipe.group(1)
    assert "grader.cli workspace" in steps and "grader.cli release" not in steps, steps


def _files(root) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


def test_learner_edits_survive_start_release_and_update(tmp_path):
    course = make_course(tmp_path / "exercises", [A1])
    home = tmp_path / "home"
    home.mkdir()
    repo_ws = _files(REPO / "workspace") if (REPO / "workspace").exists() else None
    # make start's set-up step, for a course outside any checkout: ./workspace, not the repo's
    ok(cli("--course", str(course), "workspace", cwd=home))
    ws = home / "workspace"
    assert (_files(REPO / "workspace") if (REPO / "workspace").exists() else None) == repo_ws
    nb = ws / "exercises" / A1 / "first_kernel.ipynb"
    lesson = ws / "lessons" / "02-first-kernel.py"
    assert (ws / "exercises" / A1 / "refs" / "manifest.json").exists()
    edited = _edit_solution(nb)
    lesson.write_text(lesson.read_text() + "\n# my note\n")
    lesson_text = lesson.read_text()
    # someone also worked in nbgrader's release/ folder, as the old make start suggested
    released = course / "release" / A1 / "first_kernel.ipynb"
    released_edit = _edit_solution(released)

    ok(cli("workspace", str(ws), cwd=course))  # the next make start
    # an instructor's release, from a folder outside the repository, writes only in the course
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    repo_before, ws_before = _files(REPO / "exercises"), _files(ws)
    out = ok(cli("--course", str(course), "release", cwd=elsewhere))
    assert _files(REPO / "exercises") == repo_before, "release wrote into the repository"
    assert _files(ws) == ws_before and not any(elsewhere.iterdir())
    assert nb.read_text() == edited and lesson.read_text() == lesson_text
    kept = course / "release-kept" / A1 / "first_kernel.ipynb"
    assert kept.read_text() == released_edit, out
    assert "kept release/01_first_kernel/first_kernel.ipynb" in out, out
    assert MINE not in released.read_text()  # release/ holds the fresh student version again

    # the course grows: a new assignment, and a changed statement in the first one
    add_assignment(course, A2)
    src = course / "source" / A1 / "first_kernel.py"
    src.write_text(src.read_text().replace("# # Assignment 1", "# # Assignment 1 (revised)", 1))
    out = ok(cli("workspace", str(ws), "--update", cwd=course))
    assert (ws / "exercises" / A2 / "tiling.ipynb").exists(), out
    assert nb.read_text() == edited and lesson.read_text() == lesson_text
    offered = ws / "exercises" / A1 / "first_kernel.new.ipynb"
    assert "(revised)" in offered.read_text(), out
    assert "newer course version: exercises/01_first_kernel/first_kernel.new.ipynb" in out
    # and a plain run after that adds nothing and changes nothing
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    ok(cli("workspace", str(ws), cwd=course))
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before


def test_course_is_found_from_where_you_stand(tmp_path, monkeypatch, capsys):
    course = make_course(tmp_path / "checkout" / "exercises", [A1])
    assert course_cli.find_course(course / "source" / A1) == course
    assert course_cli.find_course(tmp_path / "checkout") == course
    with pytest.raises(course_cli.CourseNotFound, match="pass --course DIR"):
        course_cli.find_course(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PALLAS_COURSE_ROOT", raising=False)
    assert course_cli.main(["release"]) == 2
    assert "no course at or above" in capsys.readouterr().err
    assert course_cli.main(["--course", str(tmp_path), "release"]) == 2
    assert "no nbgrader_config.py and source/" in capsys.readouterr().err


def test_update_never_overwrites_an_offered_version_either(tmp_path):
    """Without nbgrader: a course whose release/ is up to date, changed twice under --update."""
    from grader.learner import workspace
    from grader.logistics import releases

    root, repo = tmp_path / "course", tmp_path / "checkout"
    (root / "source" / "a1").mkdir(parents=True)
    (root / "source" / "a1" / "nb.py").write_text("# %%\n")
    (root / "release" / "a1").mkdir(parents=True)
    (repo / "lessons").mkdir(parents=True)
    (repo / "lessons" / "_course.py").write_text("")
    released = root / "release" / "a1" / "nb.ipynb"

    def release(text: str) -> None:
        released.write_text(text)
        releases.record_release(root, ["a1"])

    release("v1")
    ws = tmp_path / "ws"
    workspace.create(ws, root, repo, log=lambda _: None)
    mine = ws / "exercises" / "a1" / "nb.ipynb"
    mine.write_text("my work")
    release("v2")
    assert workspace.create(ws, root, repo, update=True, log=lambda _: None)["offered"] == [
        "exercises/a1/nb.new.ipynb"]
    (ws / "exercises" / "a1" / "nb.new.ipynb").write_text("my work on v2")
    release("v3")
    workspace.create(ws, root, repo, update=True, log=lambda _: None)
    assert mine.read_text() == "my work"
    assert (ws / "exercises" / "a1" / "nb.new.ipynb").read_text() == "my work on v2"
    assert (ws / "exercises" / "a1" / "nb.new2.ipynb").read_text() == "v3"
    before = {p: p.read_text() for p in ws.rglob("*.ipynb")}
    workspace.create(ws, root, repo, update=True, log=lambda _: None)  # nothing new: no change
    assert {p: p.read_text() for p in ws.rglob("*.ipynb")} == before


def test_update_replaces_in_place_what_the_learner_never_edited(tmp_path, monkeypatch):
    """A lesson and a notebook nobody touched take the course's new version in place; an edited
    one keeps the learner's work and gets the new version beside it. The README says where to
    ask."""
    from grader.learner import workspace
    from grader.logistics import releases

    monkeypatch.setenv(workspace.HELP_URL_ENV, "https://forum.example/pallas")
    root, repo = tmp_path / "course", tmp_path / "checkout"
    (root / "source" / "a1").mkdir(parents=True)
    (root / "source" / "a1" / "nb.py").write_text("# %%\n")
    (root / "release" / "a1").mkdir(parents=True)
    (repo / "lessons").mkdir(parents=True)
    lesson_src = repo / "lessons" / "01-intro.py"
    lesson_src.write_text("# lesson v1\n")
    (repo / "lessons" / "_course.py").write_text("")

    def release(version: str) -> None:
        for name in ("nb", "other"):
            (root / "release" / "a1" / f"{name}.ipynb").write_text(f"{name} {version}")
        releases.record_release(root, ["a1"])
        lesson_src.write_text(f"# lesson {version}\n")

    release("v1")
    ws = tmp_path / "ws"
    workspace.create(ws, root, repo, log=lambda _: None)
    assert "Stuck? Ask here: https://forum.example/pallas" in (ws / "README.md").read_text()
    mine = ws / "exercises" / "a1" / "nb.ipynb"
    mine.write_text("my work")
    release("v2")
    done = workspace.create(ws, root, repo, update=True, log=lambda _: None)
    assert sorted(done["updated"]) == ["exercises/a1/other.ipynb", "lessons/01-intro.py"]
    assert done["offered"] == ["exercises/a1/nb.new.ipynb"]
    assert (ws / "exercises" / "a1" / "other.ipynb").read_text() == "other v2"
    assert (ws / "lessons" / "01-intro.py").read_text() == "# lesson v2\n"
    assert not (ws / "lessons" / "01-intro.new.py").exists()
    assert mine.read_text() == "my work"
    (ws / "exercises" / "a1" / "other.ipynb").write_text("now I work here")
    release("v3")
    done = workspace.create(ws, root, repo, update=True, log=lambda _: None)
    assert (ws / "exercises" / "a1" / "other.ipynb").read_text() == "now I work here"
    assert "exercises/a1/other.new.ipynb" in done["offered"]
