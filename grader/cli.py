"""`pallas-course`: the course's command line.

The course (nbgrader's course root: ``nbgrader_config.py`` beside ``source/``) is found like
nbgrader finds its config: from the current directory and its parents (a course root, or a
checkout holding one in ``exercises/``), unless ``--course DIR`` or ``$PALLAS_COURSE_ROOT``
names it. Nothing is written outside that course, the workspace or the folder you name.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grader.learner import check
from grader.website import site

COURSE_MARKER = "nbgrader_config.py"


class CourseNotFound(FileNotFoundError):
    pass


def is_course(d: Path) -> bool:
    return (d / COURSE_MARKER).is_file() and (d / "source").is_dir()


def find_course(start: Path) -> Path:
    """The course root at or above ``start``: a course itself, or a checkout's ``exercises/``."""
    start = start.resolve()
    for d in (start, *start.parents):
        if is_course(d):
            return d
        if is_course(d / "exercises"):
            return d / "exercises"
    raise CourseNotFound(
        f"no course at or above {start} (a folder with {COURSE_MARKER} and source/, or a "
        "checkout with exercises/): cd into the course, or pass --course DIR")


def course_root(option: Path | None) -> Path:
    if option is not None:
        root = option.resolve()
        if not is_course(root):
            raise CourseNotFound(f"--course {option}: no {COURSE_MARKER} and source/ there")
        return root
    env = os.environ.get("PALLAS_COURSE_ROOT")
    return Path(env).resolve() if env else find_course(Path.cwd())


def checkout(root: Path) -> Path:
    """Where the lessons are: the checkout around the course, else the installed package's."""
    from grader.verdict import refs  # NumPy: `pallas-course check` and `serve` start without it

    return root.parent if (root.parent / "lessons").is_dir() else refs.REPO


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pallas-course", description=__doc__)
    parser.add_argument("--course", type=Path, default=None,
                        help="nbgrader course root (default: $PALLAS_COURSE_ROOT, else found "
                        "from the current directory upwards)")
    parser.add_argument("--db", default=None, metavar="URL",
                        help="the gradebook (nbgrader's db_url), e.g. postgresql://USER@HOST/DB "
                        "(default: $PALLAS_COURSE_DB, else gradebook.db, SQLite, in the course)")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-site", help="build the website into build/site (the lessons "
                       "executed in parallel, one process per CPU)")
    b.add_argument("--no-strict", action="store_true", help="do not fail on mkdocs warnings")
    b.add_argument("--site-dir", type=Path, default=site.SITE_DIR,
                   help="where to build it (default: build/site)")
    s = sub.add_parser("serve", help="serve the site (8000) and JupyterLab (8888) on 127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--lab-port", type=int, default=8888)
    s.add_argument("--no-build", action="store_true", help="serve build/site as it is")
    s.add_argument("--workspace", type=Path, default=None,
                   help="folder JupyterLab opens (default: workspace/ of the checkout)")
    w = sub.add_parser("workspace", help="copy lessons and exercise notebooks into a learner's "
                       "workspace; a file you edited is never changed (nbgrader's release "
                       "output goes to build/logs/release.log)")
    w.add_argument("dir", type=Path, nargs="?", help="default: workspace/ of the checkout "
                   "holding the course, else ./workspace")
    w.add_argument("--update", action="store_true",
                   help="also update the files you never edited, and offer newer course "
                   "versions of the ones you did beside them (<name>.new.*)")
    d = sub.add_parser("dist", help="a student distribution (folder or .zip): lessons, student "
                       "notebooks, visible references, kernelsim; no solutions or hidden tests")
    d.add_argument("--to", type=Path, required=True)
    r = sub.add_parser("release", help="generate student versions into exercises/release/")
    r.add_argument("assignment", nargs="?")
    c = sub.add_parser("collect", help="copy <student>/<assignment>/<nb>.ipynb (folder or zip) "
                       "into submitted/")
    c.add_argument("path", type=Path)
    c.add_argument("--archive-dates", action="store_true",
                   help="record each file's date in the zip or folder as its submission time "
                   "(set by the submitter) instead of the time of collection")
    a = sub.add_parser("autograde", help="autograde submissions, N at a time")
    a.add_argument("assignment", nargs="?")
    a.add_argument("--workers", type=int, default=1)
    a.add_argument("--timeout", type=float, default=900, help="seconds per submission")
    a.add_argument("--scheduler", metavar="tcp://HOST:8786", default=None,
                   help="grade on this Dask cluster instead of --workers local processes "
                   "(deploy/README.md)")
    a.add_argument("--student", metavar="ID", default=None,
                   help="grade this student's submissions only (again, if graded before)")
    a.add_argument("--resume", action="store_true",
                   help="grade only submissions without a status, or whose status is error "
                   "or crashed (after an interruption or an infrastructure fault)")
    g = sub.add_parser("grade-on-submit", help="a class's submissions graded as they come: "
                       "each new submission of ASSIGNMENT collected from the exchange, graded "
                       "on the Dask cluster and its feedback released to its learner within a "
                       "minute, by the watcher deploy/setup-class.sh runs (off by default; "
                       "without arguments: what is on)")
    g.add_argument("assignment", nargs="?")
    g.add_argument("--all", action="store_true",
                   help="every assignment of the course, those added later included")
    g.add_argument("--off", action="store_true", help="turn it off again")
    wa = sub.add_parser("watch", help="the grading-on-submit service (deploy/setup-class.sh "
                        "runs it as the grading account): looks at the exchange every few "
                        "seconds until stopped")
    wa.add_argument("--scheduler", metavar="tls://HOST:8786",
                    default=os.environ.get("PALLAS_COURSE_SCHEDULER"),
                    help="the Dask cluster that grades (default: $PALLAS_COURSE_SCHEDULER)")
    f = sub.add_parser("feedback", help="HTML feedback without hidden tests")
    f.add_argument("assignment", nargs="?")
    e = sub.add_parser("export", help="grades CSV (nbgrader's columns plus status "
                       "and reason)")
    e.add_argument("--to", type=Path, required=True)
    e.add_argument("--lms", choices=("canvas", "moodle"), default=None,
                   help="a table that Canvas's or Moodle's gradebook imports (one row per "
                   "student, one column per assignment) instead of nbgrader's CSV")
    x = sub.add_parser("extend", help="give a student more time on an assignment: the late "
                       "policy counts from the due date plus the extension; a graded "
                       "submission's grade and feedback are updated at once")
    x.add_argument("student")
    x.add_argument("assignment")
    x.add_argument("--hours", type=float, required=True,
                   help="hours past the due date (0 takes the extension back)")
    ro = sub.add_parser("roster", help="learners' names and e-mails into the gradebook, for "
                        "the exports (CSV with a header: id,first_name,last_name,email)")
    ro.add_argument("path", type=Path)
    rp = sub.add_parser("report", help="an HTML class report of an assignment: per task how "
                        "many passed and the most frequent failure, grading time")
    rp.add_argument("assignment")
    rp.add_argument("--to", type=Path, default=None,
                    help="default: reports/<assignment>.html in the course")
    check.add_command(sub)
    rf = sub.add_parser("refs", help="regenerate reference outputs under exercises/refs/")
    rf.add_argument("only", nargs="*", help="task ids or assignments (default: all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "build-site":
        site.build_site(strict=not args.no_strict, site_dir=args.site_dir.resolve())
        return 0
    if args.command == "serve":
        return site.serve(port=args.port, lab_port=args.lab_port, build=not args.no_build,
                          workspace_dir=args.workspace)
    if args.command == "check":
        return check.run(args.notebook, args.verbose)

    if args.db:
        from grader.logistics.submission import DB_ENV  # the logistics room: seconds

        os.environ[DB_ENV] = args.db  # read by every nbgrader process, via its config
    try:
        root = course_root(args.course)
        if args.command == "workspace":
            from grader.learner import workspace  # this command's alone: the others start faster

            repo = checkout(root)
            # the checkout's workspace/ when the course is in one, else one where you stand:
            # never inside the installed package's folder for a course outside it
            default = (repo if repo == root.parent else Path.cwd()) / "workspace"
            site.LOG_DIR.mkdir(parents=True, exist_ok=True)
            release_log = site.LOG_DIR / "release.log"
            with release_log.open("a") as out:
                workspace.create((args.dir or default).resolve(), root, repo,
                                 update=args.update,
                                 release_log=lambda line: print(line, file=out, flush=True))
        elif args.command == "dist":
            from grader.learner import dist  # this command's alone: the others start faster

            dist.build(root, checkout(root), args.to.resolve())
        else:
            return _grading_command(args, root)
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        print(f"pallas-course {args.command}: {e}", file=sys.stderr)
        return 2
    return 0


def _grading_command(args: argparse.Namespace, root: Path) -> int:
    """The instructor's commands (grading and its imports take seconds: make start's
    workspace step does without them when nothing needs releasing)."""
    from grader.logistics import batch, shared  # seconds: the instructor's commands only

    shared.share_with_group(root)  # the grading account and the other instructors write here too
    if args.command == "release":
        batch.release(root, args.assignment)
    elif args.command == "collect":
        from grader.logistics import collect  # this command's alone: the others start faster

        collect.collect(root, args.path, archive_dates=args.archive_dates)
    elif args.command == "autograde":
        res = batch.autograde(root, args.assignment, workers=args.workers,
                                timeout=args.timeout, resume=args.resume,
                                scheduler=args.scheduler,
                                students=[args.student] if args.student else None)
        return 0 if all(r["status"] in ("graded",) for r in res) else 3
    elif args.command == "feedback":
        batch.feedback(root, args.assignment)
    elif args.command == "grade-on-submit":
        from grader.logistics import on_submit  # these commands' alone: the others start faster

        if args.all and args.assignment:
            raise ValueError("name an assignment or --all, not both")
        if args.all or args.assignment:
            on_submit.turn(root, args.assignment, on=not args.off)
        elif args.off:
            raise ValueError("--off needs an assignment or --all")
        print(f"grading on submit is {on_submit.describe(on_submit.setting(root))}; "
              f"{on_submit.last_seen(root)}")
    elif args.command == "watch":
        from grader.logistics import on_submit  # these commands' alone: the others start faster

        if not args.scheduler:
            raise ValueError("--scheduler (or $PALLAS_COURSE_SCHEDULER) names the Dask cluster")
        on_submit.watch(root, args.scheduler)
    elif args.command == "export":
        batch.export(root, args.to, lms=args.lms)
    elif args.command == "extend":
        batch.extend(root, args.student, args.assignment, args.hours)
    elif args.command == "roster":
        from grader.gradebook import roster  # this command's alone: the others start faster

        learners = roster.read(args.path)  # a bad line is named before the gradebook is touched
        res = batch.run_worker(root, "roster", str(args.path.resolve()))
        if not res.get("success"):
            raise RuntimeError(f"the roster could not be imported: {res.get('error')}")
        print(f"{len(learners)} learner(s) in the gradebook with their names and e-mails")
    elif args.command == "report":
        from grader.logistics import report  # this command's alone: the others start faster

        report.write(root, args.assignment,
                     args.to or root / "reports" / f"{args.assignment}.html")
    elif args.command == "refs":
        from grader.verdict import write_refs  # this command's alone: it imports the tasks

        write_refs.generate(root, set(args.only) or None)
    else:
        raise AssertionError(args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
