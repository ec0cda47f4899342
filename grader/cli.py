"""`pallas-course`: the course's command line."""

from __future__ import annotations

import argparse
import sys

from grader import site


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pallas-course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-site", help="build the website into build/site")
    b.add_argument("--no-strict", action="store_true", help="do not fail on mkdocs warnings")
    s = sub.add_parser("serve", help="serve the site (8000) and JupyterLab (8888) on 127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--lab-port", type=int, default=8888)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "build-site":
        site.build_site(strict=not args.no_strict)
        return 0
    if args.command == "serve":
        return site.serve(port=args.port, lab_port=args.lab_port)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
