"""The instructor's page (issue 52): one assignment through nbgrader's Formgrader in chromium at
1280 px, on the class ``deploy/setup-class.sh --demo 1`` makes (real accounts, PAM logins through
the hub's login form), as the README's "A term" tells a first-time instructor: release the
student notebooks, Release and Collect in the Formgrader, autograde and feedback with
``pallas-course`` (and the Formgrader's Autograde button once more), the score on the
Formgrader's pages, the learner's feedback and her row in the export.

Each page is saved as build/screenshots/formgrader-*.png, to look at."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clustertools import (
    COURSE_ID,
    L1,
    NEEDS_ROOT_AND_CLASS_PACKAGES,
    REPO,
    TEACHER,
    A,
    Class,
    free_port,
    hand_in,
    setup_class,
)
from sitetools import watch

pytestmark = [pytest.mark.slow, NEEDS_ROOT_AND_CLASS_PACKAGES]

SHOTS = REPO / "build" / "screenshots"
VIEWPORT = {"width": 1280, "height": 900}
# ms the Formgrader may take to answer a button (release, collect, autograde run nbgrader)
BUTTON_MS = 300_000


@pytest.fixture(scope="module")
def one_learner_class():
    """An instructor and one learner, their servers started; removed at the end."""
    if Path("/var/lib/pallas-course").exists():
        pytest.skip("a class is set up on this machine already: not touching it")
    try:
        res = setup_class("--demo", "1", "--hub-port", str(free_port(3)),
                          "--dask-port", str(free_port()))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
        k = Class()
        k.start_servers(TEACHER, L1)
        yield k
    finally:
        res = setup_class("--remove")
        assert res.returncode == 0, res.stdout + res.stderr


def shot(page, name: str, whole_page: bool = True) -> None:
    """build/screenshots/formgrader-``name``.png: the whole page, or what the window shows (a
    dialog, whose backdrop covers only the window)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"formgrader-{name}.png"), full_page=whole_page)


def press(page, row, cell: str, says: str, name: str) -> None:
    """Press the button in ``row``'s column ``cell`` (a table of Manage Assignments or Manage
    Submissions); its dialog must say ``says`` (nbgrader's success dialog, its log below);
    screenshot ``name``; close it."""
    row.locator(f"td.{cell} a").click()
    dialog = page.locator("#success-modal, #error-modal").first
    dialog.wait_for(state="visible", timeout=BUTTON_MS)
    # the dialog fades in (Bootstrap's .fade): the screenshot once it is opaque
    page.wait_for_function("() => getComputedStyle(document.querySelector("
                           "'#success-modal, #error-modal')).opacity === '1'", timeout=30_000)
    text = dialog.inner_text()
    assert says in text, text
    shot(page, name, whole_page=False)
    dialog.locator("button.close").first.click()
    dialog.wait_for(state="detached", timeout=30_000)


def assignment_row(page):
    page.locator("#main-table td.name", has_text=A).first.wait_for(timeout=60_000)
    return page.locator("#main-table tr", has=page.locator("td.name", has_text=A))


def test_one_assignment_through_the_formgrader_at_1280_px(one_learner_class, browser):
    k = one_learner_class
    k.pallas(TEACHER, "release", A)  # README: the student notebooks, recorded in the gradebook
    context = browser.new_context(viewport=VIEWPORT)
    watched = watch(context)
    page = watched.page
    try:
        # the hub's login form, as the instructor's real account
        page.goto(f"{k.url}/hub/login")
        page.fill("input[name=username]", TEACHER)
        page.fill("input[name=password]", k.passwords[TEACHER])
        page.locator("form input[type=submit], form button[type=submit]").first.click()
        page.wait_for_url(re.compile(rf"/user/{TEACHER}/"), timeout=120_000)
        formgrader = f"{k.url}/user/{TEACHER}/formgrader"

        # where the README sends a new instructor: JupyterLab's Nbgrader menu -> Formgrader
        page.goto(f"{k.url}/user/{TEACHER}/lab")
        page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").first.click(timeout=120_000)
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Formgrader$")).first.click()
        framed = page.frame_locator("iframe").first
        framed.locator("h1", has_text="Manage Assignments").wait_for(timeout=60_000)
        framed.locator("#main-table td.name", has_text=A).first.wait_for(timeout=60_000)
        shot(page, "0-lab-formgrader-tab", whole_page=False)

        # Manage Assignments: the course's first assignment, not yet in the exchange
        page.goto(f"{formgrader}/manage_assignments")
        row = assignment_row(page)
        assert row.count() == 1
        assert row.locator("td.release span.glyphicon-cloud-upload").count() == 1
        shot(page, "1-manage-assignments")

        press(page, row, "release", f"Successfully released '{A}'", "2-released")
        assert (k.exchange / "outbound" / A).is_dir()
        assert row.locator("td.status").inner_text().strip() == "released"

        hand_in(k, L1, wrong=False)  # the learner fetches, solves and submits through her hub

        page.reload()
        row = assignment_row(page)
        press(page, row, "collect", f"Successfully collected submissions of '{A}'",
              "3-collected")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#main-table td.num-submissions')]"
            ".some(td => td.textContent.trim() === '1')", timeout=60_000)
        shot(page, "4-one-submission")

        # autograde: the course's trusted pipeline on the cluster (README, "A term")
        k.pallas(TEACHER, "autograde", A, "--scheduler", k.env["PALLAS_COURSE_SCHEDULER"])

        page.goto(f"{formgrader}/manage_submissions/{A}")
        learner = page.locator("#main-table tr", has=page.locator("td.student-id",
                                                                 has_text=L1))
        learner.first.wait_for(timeout=60_000)
        assert learner.locator("td.score").inner_text().strip() == "9 / 9"
        assert learner.locator("td.status").inner_text().strip() == "graded"
        shot(page, "5-submissions-graded")
        # the Formgrader's Autograde button grades again with the same trusted pipeline, in
        # the instructor's own server: the same score
        press(page, learner, "autograde",
              f"Successfully autograded '{A}' for student '{L1}'", "5b-autograde-button")
        page.reload()
        learner.first.wait_for(timeout=60_000)
        assert learner.locator("td.score").inner_text().strip() == "9 / 9"

        page.goto(f"{formgrader}/gradebook/{A}")
        notebook = page.locator("#main-table tr", has=page.locator("td.name")).first
        notebook.wait_for(timeout=60_000)
        assert "9" in notebook.locator("td.avg-score").inner_text()
        shot(page, "6-gradebook")

        page.goto(f"{formgrader}/manage_students")
        student = page.locator("#main-table tr", has=page.locator("td.id", has_text=L1))
        student.first.wait_for(timeout=60_000)
        assert student.locator("td.score").inner_text().strip() == "9 / 9"
        shot(page, "7-students")

        res = k.pallas(TEACHER, "feedback", A)
        assert "released to the exchange" in res.stdout, res.stdout
        k.api("POST", f"/user/{L1}/assignments/fetch_feedback", L1,
              json={"course_id": COURSE_ID, "assignment_id": A})
        (fed,) = Path(f"/home/{L1}/{COURSE_ID}/{A}/feedback").rglob("*.html")
        assert "(Score: 9.0 / 9.0)" in fed.read_text()
        page.goto(f"{formgrader}/manage_assignments")
        assignment_row(page)
        shot(page, "8-after-feedback")
    finally:
        context.close()
    watched.check()

    rows = k.exported("formgrader")
    assert (float(rows[L1]["score"]), rows[L1]["status"]) == (9.0, "graded"), rows[L1]
