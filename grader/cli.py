"""`pallas-course`: the course's command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import site


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pallas-course", description=__doc__)
    parser.add_argument("--course", type=Path, default=None,
                        help="nbgrader course root (default: $PALLAS_COURSE_ROOT or exercises/)")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-site", help="build the website into build/site")
    b.add_argument("--no-strict", action="store_true", help="do not fail on mkdocs warnings")
    s = sub.add_parser("serve", help="serve the site (8000) and JupyterLab (8888) on 127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--lab-port", type=int, default=8888)
    s.add_argument("--no-build", action="store_true", help="serve build/site as it is")
    r = sub.add_parser("release", help="generate student versions into exercises/release/")
    r.add_argument("assignment", nargs="?")
    c = sub.add_parser("collect", help="copy <student>/<assignment>/<nb>.ipynb (folder or zip) "
                       "into submitted/")
    c.add_argument("path", type=Path)
    a = sub.add_parser("autograde", help="autograde submissions, N at a time")
    a.add_argument("assignment", nargs="?")
    a.add_argument("--workers", type=int, default=1)
    a.add_argument("--timeout", type=float, default=900, help="seconds per submission")
    a.add_argument("--resume", action="store_true",
                   help="skip submissions that already have a status (after an interruption)")
    f = sub.add_parser("feedback", help="HTML feedback without hidden tests")
    f.add_argument("assignment", nargs="?")
    e = sub.add_parser("export", help="grades CSV (nbgrader's columns plus status "
                       "and reason)")
    e.add_argument("--to", type=Path, required=True)
    k = sub.add_parser("check", help="run a notebook's visible tests in a fresh kernel")
    k.add_argument("notebook", type=Path)
    rf = sub.add_parser("refs", help="regenerate reference outputs under exercises/refs/")
    rf.add_argument("only", nargs="*", help="task ids or assignments (default: all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "build-site":
        site.build_site(strict=not args.no_strict)
        return 0
    if args.command == "serve":
        return site.serve(port=args.port, lab_port=args.lab_port, build=not args.no_build)

    from grader import grading, refs

    root = (args.course or refs.course_root()).resolve()
    try:
        if args.command == "release":
            grading.release(root, args.assignment)
        elif args.command == "collect":
            grading.collect(root, args.path)
        elif args.command == "autograde":
            res = grading.autograde(root, args.assignment, workers=args.workers,
                                    timeout=args.timeout, resume=args.resume)
            return 0 if all(r["status"] in ("graded",) for r in res) else 3
        elif args.command == "feedback":
            grading.feedback(root, args.assignment)
        elif args.command == "export":
            grading.export(root, args.to)
        elif args.command == "check":
            return grading.check_notebook(args.notebook)
        elif args.command == "refs":
            refs.generate(root, set(args.only) or None)
        else:
            raise AssertionError(args.command)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"pallas-course {args.command}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
