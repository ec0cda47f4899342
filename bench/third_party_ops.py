"""tokamax's public TPU ops on a CPU: does TPU interpret mode run each one, does kernelsim trace
it, and are kernelsim's pipeline copies and kernel-body DMAs the interpreter's?

Cases are tests/kernelsim/test_tokamax.py's ``OPS`` (small shapes), forward and, where the op
has one, backward, run under ``tokamax.config.cross_compile(True)`` on the op's chip
(``CHIPS``; v5e otherwise). Each case runs in a fresh process (a crashed or stuck interpreter
costs one row): ``kernelsim.trace``, then ``kernelsim.verify`` (which runs the case in TPU
interpret mode and compares); where verify raises, the case is run once more under
``pltpu.force_tpu_interpret_mode()`` alone, to tell an interpreter failure from kernelsim's.
Bytes are the interpreter's (pipeline copies plus body DMAs).

Needs tokamax 0.0.17 and jax 0.12.0.1 (see bench/README.md for the venv). Usage:
  python bench/third_party_ops.py [--only SUBSTRING] [--out PATH]
writes bench/results/tokamax-0.0.17-cpu.json (the recorded run: bench/recorded/).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "kernelsim"))
from _report import write  # noqa: E402

CASE_TIMEOUT_S = 900


def _last_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


def run_case(name: str, direction: str) -> dict:
    """In this (fresh) process: trace and verify one op in one direction."""
    import jax
    import tokamax
    from jax.experimental.pallas import tpu as pltpu
    from test_tokamax import CHIPS, OPS, differentiated

    import kernelsim
    from kernelsim.trace import abstract_tpu
    from kernelsim.verify import verify

    chip = CHIPS.get(name, "tpu-v5e")
    row = {"op": name, "direction": direction, "chip": chip}
    with tokamax.config.cross_compile(True):
        fn, args = differentiated(OPS[name], direction)
        try:
            t = kernelsim.trace(fn, *args, chip=chip)
            row.update(traced="yes", calls=len(t.calls),
                       body_dmas=sum(len(c.call.body_copies) for c in t.calls))
        except Exception as err:  # noqa: BLE001 - recorded as the row's reason
            row.update(traced=_last_line(err), calls=None, body_dmas=None)
        fn, args = differentiated(OPS[name], direction)  # some ops donate their inputs
        try:
            v = verify(fn, *args, chip=chip)
        except Exception as err:  # noqa: BLE001
            row["verify_error"] = _last_line(err)
            fn, args = differentiated(OPS[name], direction)
            try:
                with pltpu.force_tpu_interpret_mode(), abstract_tpu(chip):
                    jax.block_until_ready(fn(*args))
                row["interpreter_ran"] = "yes"
            except Exception as ierr:  # noqa: BLE001
                row["interpreter_ran"] = _last_line(ierr)
            return row
    row.update(interpreter_ran="yes", interpreter_calls=len(v.trace.calls),
               pipeline_copies_equal=all(c.copies_match and c.bytes_match for c in v.checks),
               body_dmas_equal=all(d.ok for d in v.body_dma_checks),
               pipeline_copies=sum(len(c.interpreter_copies) for c in v.checks),
               interpreter_body_dmas=sum(len(d.interpreter_bytes) for d in v.body_dma_checks),
               bytes=sum(c.interpreter_bytes for c in v.checks)
               + sum(sum(d.interpreter_bytes) for d in v.body_dma_checks))
    return row


def _cases(only: str | None) -> list[tuple[str, str]]:
    import tokamax
    from test_tokamax import OPS

    cases = []
    with tokamax.config.cross_compile(True):
        for name, build in OPS.items():
            directions = ("fwd", "bwd") if build()[1] else ("fwd",)
            cases += [(name, d) for d in directions if not only or only in f"{name}:{d}"]
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the cases whose 'op:direction' contains this")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # op:direction, in a child process
    a = parser.parse_args()
    if a.case:
        print(json.dumps(run_case(*a.case.split(":"))))
        return
    import jax
    import tokamax

    rows = []
    for name, direction in _cases(a.only):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--case", f"{name}:{direction}"],
                                  capture_output=True, text=True, timeout=CASE_TIMEOUT_S,
                                  cwd=ROOT)
            lines = proc.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "op": name, "direction": direction,
                "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"op": name, "direction": direction, "error": f"over {CASE_TIMEOUT_S} s"}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = ["op", "direction", "chip", "traced", "interpreter_ran", "calls", "body_dmas",
            "pipeline_copies_equal", "body_dmas_equal", "pipeline_copies",
            "interpreter_body_dmas", "bytes", "verify_error", "error", "seconds"]
    rows = [{k: r.get(k) for k in keys} for r in rows]
    versions = {"tokamax": tokamax.__version__, "jax": jax.__version__}
    path = write(f"tokamax-{tokamax.__version__}-cpu", rows, {"versions": versions})
    if a.out:
        a.out.write_text(path.read_text())


if __name__ == "__main__":
    main()
