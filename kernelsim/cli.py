"""`kernelsim`: trace a pallas_call from the shell.

TARGET is ``FILE.py:FUNC``; FUNC takes no arguments and returns ``(fn, args)``, where ``fn`` is
the function that calls ``pl.pallas_call`` and ``args`` a tuple of concrete arrays.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from kernelsim.chips import CHIPS
from kernelsim.errors import TraceError


def load_target(spec: str) -> tuple[Any, tuple]:
    """Import FILE.py and call FUNC(); returns its ``(fn, args)``. Raises TraceError."""
    path_text, sep, func_name = spec.rpartition(":")
    if not sep or not path_text or not func_name:
        raise TraceError(f"target {spec!r} is not FILE.py:FUNC")
    path = Path(path_text)
    if not path.is_file():
        raise TraceError(f"target file {path} does not exist")
    # Registered under its own name while it runs: dataclasses (with postponed annotations)
    # and pickling look a class's module up in sys.modules.
    name = f"kernelsim_target_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        module_spec.loader.exec_module(module)
        func = getattr(module, func_name, None)
        if not callable(func):
            raise TraceError(f"{path} has no function {func_name!r}")
        result = func()
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 - the target's own error, reported as such
        raise TraceError(f"running {spec} raised {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
    if not (isinstance(result, tuple) and len(result) == 2 and callable(result[0])):
        raise TraceError(f"{spec} must return (fn, args); it returned {type(result).__name__}")
    fn, args = result
    return fn, tuple(args)


MEASURE_HELP = ("run the target (kernelsim.run) and time each call compiled on the accelerator, "
                "shown beside the estimate (without one: says none is present)")


def _analysed(args, fn, fn_args, strict: bool = False):
    """The target's Trace: analysed only, or run and timed (``--measure``)."""
    from kernelsim.trace import run, trace  # starts JAX: `python -m kernelsim --help` does not

    if args.measure:
        return run(fn, *fn_args, model=args.model, chip=args.chip, strict=strict,
                   measure=True)[1]
    return trace(fn, *fn_args, model=args.model, chip=args.chip, strict=strict)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelsim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace", help="per-call traffic summary (index maps only, no kernel run)")
    t.add_argument("target", metavar="FILE.py:FUNC")
    t.add_argument("--model", choices=("tpu", "gpu"), default="tpu")
    t.add_argument("--chip", choices=sorted(CHIPS), default=None)
    t.add_argument("--steps", type=int, default=3, help="first and last N steps to list")
    t.add_argument("--json", action="store_true", help="print Trace.to_dict() as JSON")
    t.add_argument("--strict", action="store_true", help="exit 2 on any warning")
    t.add_argument("--measure", action="store_true", help=MEASURE_HELP)
    v = sub.add_parser("verify", help="compare the model with TPU interpret mode's DMAs")
    v.add_argument("target", metavar="FILE.py:FUNC")
    h = sub.add_parser("html", help="write the self-contained HTML step viewer")
    h.add_argument("target", metavar="FILE.py:FUNC")
    h.add_argument("-o", "--output", required=True, metavar="OUT.html")
    h.add_argument("--model", choices=("tpu", "gpu"), default="tpu")
    h.add_argument("--chip", choices=sorted(CHIPS), default=None)
    h.add_argument("--call", type=int, default=0, help="which pallas_call (0-based)")
    h.add_argument("--fragment", action="store_true", help="an embeddable <div>, not a page")
    h.add_argument("--measure", action="store_true", help=MEASURE_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        fn, fn_args = load_target(args.target)
        if args.command == "trace":
            t = _analysed(args, fn, fn_args, args.strict)
            print(json.dumps(t.to_dict(), indent=2) if args.json else t.summary(args.steps))
            return 0
        if args.command == "html":
            t = _analysed(args, fn, fn_args)
            if not 0 <= args.call < len(t.calls):
                raise TraceError(f"--call {args.call}: the target has {len(t.calls)} call(s)")
            size = len(t.to_html(args.output, args.call, args.fragment).encode())
            print(f"wrote {args.output} ({size:,} bytes, {t.calls[args.call].steps:,} steps)")
            return 0
        if args.command == "verify":
            from kernelsim.verify import verify  # this command's alone

            result = verify(fn, *fn_args)
            print(result.report())
            return 0 if result.ok else 1
    except TraceError as e:
        print(f"kernelsim: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - any other failure is kernelsim's, said plainly
        print(f"kernelsim: error: {args.command} {args.target} failed inside kernelsim: "
              f"{type(e).__name__}: {e}\nThis is a kernelsim bug; please report it with the "
              "target file.", file=sys.stderr)
        return 3
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
