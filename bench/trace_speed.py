"""How long kernelsim.trace takes, against running the same kernel in TPU interpret mode.

Table 1: a 1024^3 f32 matmul with 128^3 blocks (512 steps) and a 4096^3 one (32,768 steps).
Trace times are the median of 5 runs in this process after one warm-up; the interpret-mode
run is one call (its first, including compilation, which is what a learner waits for).

Table 2: a paged-gather kernel with 2,048 and 8,192 body DMAs (one per grid step, from an HBM
page pool as large as the DMA count): the trace must stay linear in the DMAs.

Table 3 ("real code"): JAX's bundled TPU Pallas ops (tests/kernelsim/test_bundled_ops.py) and
the kernels transcribed from JAX's Pallas tests (tests/kernelsim/test_jax_test_kernels.py),
and, where each is installed, third-party libraries' public Pallas TPU kernels (``THIRD_PARTY``):
tokamax's ops forward and backward (tests/kernelsim/test_tokamax.py, under
``tokamax.config.cross_compile``; interpreted on ``kernelsim.trace.abstract_tpu()``, as they ask
which TPU they target), flywheel-tpu's attention (test_flywheel.py) and deltanet-tpu's chunked
linear attention (test_deltanet.py), each measured *cold*:
every number comes from a fresh Python process that imports JAX, builds the case's function
and operands, and then times exactly one thing -- either
``kernelsim.trace(fn, *args)``, or ``fn(*args)`` under ``pltpu.force_tpu_interpret_mode()``
(the function as its author wrote it, jitted or not, with every pallas_call interpreted; its
outputs awaited). The two never share a process, so neither warms a cache for the other.
A third fresh process times ``jax.make_jaxpr(fn)(*args)`` alone: the tracing of the program
that kernelsim's trace starts with and the interpreter pays too, so interpret / make_jaxpr
(the *ceiling*) is the speed-up a tracer whose own analysis took no time would reach.
``--repeat N`` takes each number N times, each in a fresh process, and reports the median.
Cases interpret mode cannot run on a CPU (emit_pipeline needs a TPU device kind) are traced
and listed, but have no speedup. The medians and the slowest case are also printed per
source (a library, or JAX's ops and tests); a run that includes third-party cases also writes
them, per library and with the machine's load, to bench/recorded/trace_speed-third-party-cpu.json.

``--sizes production`` builds each third-party case at a size the library's users run
(bench/production_sizes.py: from its benchmark specs or README; the same op as its test, larger
operands) and records to trace_speed-third-party-production-cpu.json: at the tests' sizes a cold
trace is mostly JAX tracing the library's Python, which the interpreter pays too, while
interpreting grows with the grid steps a real size has.

Usage: python bench/trace_speed.py [--no-interpret] [--only SUBSTRING[,...]] [--repeat N]
                                   [--sizes tests|production]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "kernelsim"))
from _report import write  # noqa: E402


def _time(fn, repeat: int) -> tuple[float, float]:
    """(first call seconds, median of the next ``repeat`` calls)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def matmul_table(interpret: bool) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu

    import kernelsim
    from kernelsim import examples as ex

    rows = []
    for n in (1024, 4096):
        x = jnp.zeros((n, n), jnp.float32)
        fn = functools.partial(ex.matmul, bm=128, bk=128, bn=128)
        first, median = _time(lambda fn=fn, x=x: kernelsim.trace(fn, x, x), repeat=5)
        steps = kernelsim.trace(fn, x, x).calls[0].steps
        row = {"matmul": f"{n}^3 / 128^3", "steps": steps, "trace_first_s": first,
               "trace_median_s": median, "interpret_s": None, "speedup": None}
        if n == 1024 and interpret:
            xr = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
            run = functools.partial(ex.matmul, bm=128, bk=128, bn=128,
                                    interpret=pltpu.InterpretParams())
            t0 = time.perf_counter()
            jax.block_until_ready(run(xr, xr))
            row["interpret_s"] = time.perf_counter() - t0
            row["speedup"] = row["interpret_s"] / median
        rows.append(row)
    write("trace_speed", rows, {"goals": {"speedup_1024": ">= 100", "trace_4096_s": "<= 2"}})


def dma_count_table() -> None:
    """Trace time of a paged-gather kernel (one body DMA per grid step from an HBM page pool
    that grows with the DMA count): work per DMA must not grow with the pool."""
    from test_interpret_dmas import paged_case

    import kernelsim

    rows = []
    for batch, per_seq in ((8, 256), (16, 512)):
        fn, args = paged_case(batch, per_seq)
        t0 = time.perf_counter()
        t = kernelsim.trace(fn, *args)
        seconds = time.perf_counter() - t0
        rows.append({"kernel": f"paged gather {batch} x {per_seq}",
                     "dmas": len(t.calls[0].call.body_copies),
                     "pool_bytes": int(args[1].nbytes), "trace_first_s": seconds})
        print(f"  {rows[-1]}", flush=True)
    write("trace_speed_dmas", rows, {"goals": {"trace_8192_dmas_s": "<= 5"}})


def _suite(sizes: str = "tests", case: str | None = None) -> dict[str, tuple[str, object]]:
    """case name -> (where it comes from, builder returning (fn, args)). ``sizes``: the
    third-party ops at their tests' shapes, or at ``production`` ones (production_sizes.py;
    JAX's ops and test kernels keep their shapes either way). With ``case`` (a child process
    measuring one), no library but the case's own is imported: importing tokamax loads JAX's
    lowering modules, which would take ~0.15 s off every other case's cold interpreted run."""
    from production_sizes import PRODUCTION
    from test_bundled_ops import TPU_OPS
    from test_jax_test_kernels import CASES

    suite = {f"op:{name}": ("jax op", build) for name, build in TPU_OPS.items()}
    suite.update({f"test:{name}": ("jax test", build) for name, (build, _) in CASES.items()})
    for library, module in THIRD_PARTY.items():  # where the library is installed
        if importlib.util.find_spec(library.replace("-", "_")) is None or (
                case is not None and not case.startswith(f"{library}:")):
            continue
        cases = importlib.import_module(module)
        for name, build in cases.OPS.items():
            if name in getattr(cases, "NOT_INTERPRETED", {}):
                continue  # traced in its test; TPU interpret mode cannot run it on a CPU
            sized = PRODUCTION[library][name] if sizes == "production" else build
            suite[f"{library}:{name}:fwd"] = (library, functools.partial(_forward, sized))
            if _differentiable(module, name, build):
                suite[f"{library}:{name}:bwd"] = (library, functools.partial(_backward, sized))
    return suite


# Third-party libraries installed from the package index: library -> its test module, whose
# OPS maps an op name to a builder of (op, argnums to differentiate, operands).
THIRD_PARTY = {"tokamax": "test_tokamax", "flywheel-tpu": "test_flywheel",
               "deltanet-tpu": "test_deltanet"}


def _differentiable(module: str, name: str, build) -> bool:
    """The op has a backward the library implements with kernels of its own: a tokamax op that
    names arguments to differentiate (test_tokamax's forward-only ops name none); flywheel's
    dense attention (its varlen and decode kernels are forward-only); deltanet's chunk_gdn
    (its variants run the same kernels)."""
    if module == "test_tokamax":
        return bool(build()[1])
    return {"test_flywheel": name == "flash_attn_func",
            "test_deltanet": name == "chunk_gdn"}[module]


def _forward(build):
    op, _, args = build()
    return op, args


def _backward(build):
    import jax

    op, wrt, args = build()
    return jax.grad(lambda *a: op(*a).sum(), argnums=wrt), args


def _library_context(case: str, what: str):
    """tokamax runs its TPU kernels on a CPU only when asked to cross-compile, and its kernels
    ask which TPU they target: interpreted, they run on an abstract TPU (``kernelsim.trace``
    finds that out by itself). deltanet-tpu warns that it runs on a CPU."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore", UserWarning)
    if case.startswith("tokamax:"):
        import tokamax

        from kernelsim.trace import abstract_tpu

        stack.enter_context(tokamax.config.cross_compile(True))
        if what != "trace":
            stack.enter_context(abstract_tpu())
    return stack


def measure_one(case: str, what: str, sizes: str) -> dict:
    """In this (fresh) process: build ``case`` and time one trace or one interpreted run."""
    import jax
    from jax.experimental.pallas import tpu as pltpu

    _, build = _suite(sizes, case)[case]
    if what == "jaxpr":
        with _library_context(case, what):
            fn, args = _built(build)
            t0 = time.perf_counter()
            jax.make_jaxpr(fn)(*args)
        return {"seconds": time.perf_counter() - t0}
    if what == "trace":
        import kernelsim

        with _library_context(case, what):
            fn, args = _built(build)
            t0 = time.perf_counter()
            trace = kernelsim.trace(fn, *args)
            seconds = time.perf_counter() - t0
        return {"seconds": seconds, "grid_steps": sum(c.steps for c in trace.calls),
                "operands": [f"{a.dtype}{list(a.shape)}" for a in jax.tree_util.tree_leaves(args)
                             if isinstance(a, jax.Array)]}
    # pl.pallas_call reads the forced mode when the call is made, so build inside it too
    with pltpu.force_tpu_interpret_mode(), _library_context(case, what):
        fn, args = _built(build)
        t0 = time.perf_counter()
        try:
            jax.block_until_ready(fn(*args))
        except Exception as err:  # noqa: BLE001 - reported as "cannot interpret here"
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return {"seconds": None, "error": (lines[-1] if lines else type(err).__name__)}
    return {"seconds": time.perf_counter() - t0}


def _built(build):
    """``build()``'s function and operands, the operands computed before any timing."""
    import jax

    fn, args = build()
    jax.block_until_ready([a for a in jax.tree_util.tree_leaves(args)
                           if isinstance(a, jax.Array)])
    return fn, args


def _in_fresh_process(case: str, what: str, sizes: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", case, what, "--sizes", sizes],
                         cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return {"seconds": None, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])


def _median_cold(case: str, what: str, repeat: int, sizes: str) -> dict:
    """The median of ``repeat`` cold measurements, each in its own fresh process."""
    runs = [_in_fresh_process(case, what, sizes) for _ in range(repeat)]
    times = [r["seconds"] for r in runs if r["seconds"] is not None]
    if len(times) < len(runs):
        return next(r for r in runs if r["seconds"] is None)
    return {**runs[0], "seconds": statistics.median(times)}


def real_code_table(only: str | None, repeat: int, sizes: str) -> None:
    rows, load_at_start = [], os.getloadavg()
    sized = {}  # third-party case -> its operands and grid steps, for the record
    for case, (source, _) in _suite(sizes).items():
        if only and not any(part in case for part in only.split(",")):
            continue
        traced = _median_cold(case, "trace", repeat, sizes)
        if traced["seconds"] is None:
            raise SystemExit(f"{case}: kernelsim.trace failed: {traced['error']}")
        interp = _median_cold(case, "interpret", repeat, sizes)
        jaxpr = _median_cold(case, "jaxpr", repeat, sizes)["seconds"]
        speedup = ceiling = None
        if interp["seconds"] is not None:
            speedup = interp["seconds"] / traced["seconds"]
            ceiling = interp["seconds"] / jaxpr if jaxpr else None
        rows.append({"case": case, "source": source, "trace_cold_s": traced["seconds"],
                     "interpret_cold_s": interp["seconds"], "speedup": speedup,
                     "jaxpr_cold_s": jaxpr, "ceiling": ceiling,
                     "note": interp.get("error", "")[:60]})
        print(f"  {case}: trace {traced['seconds']:.3f} s, interpret "
              f"{interp['seconds'] if interp['seconds'] is None else round(interp['seconds'], 3)}"
              f" s, make_jaxpr {jaxpr if jaxpr is None else round(jaxpr, 3)} s", flush=True)
        if source in THIRD_PARTY:  # recorded as it goes: a production-size run takes ~40 min
            sized[case] = {k: traced[k] for k in ("grid_steps", "operands")}
            _record_third_party(rows, sized, repeat, sizes, load_at_start, finished=False)
    per_source = _per_source(rows)
    for source, s in per_source.items():
        ceiling = "" if s["median_ceiling"] is None else f" (ceiling {s['median_ceiling']:.1f}x)"
        print(f"  {source}: median {s['median_speedup']:.1f}x{ceiling}, slowest "
              f"{s['slowest_speedup']:.1f}x "
              f"({s['slowest_case']}) over {s['compared']} cases")
    if sized:
        _record_third_party(rows, sized, repeat, sizes, load_at_start, finished=True)
    speedups = sorted(r["speedup"] for r in rows if r["speedup"] is not None)
    summary = {"cases": len(rows), "compared": len(speedups),
               "median_speedup": statistics.median(speedups) if speedups else None,
               "slowest_speedup": speedups[0] if speedups else None,
               "slower_than_interpreting": sum(s < 1 for s in speedups)}
    rows.append({"case": "median", "source": "", "trace_cold_s": None, "interpret_cold_s": None,
                 "speedup": summary["median_speedup"], "jaxpr_cold_s": None, "ceiling": None,
                 "note": f"{len(speedups)} compared"})
    write("trace_speed_real_code", rows,
          {"goals": {"median_speedup": ">= 20", "slowest_speedup": "> 1"},
           "cold_runs_per_number": repeat, "sizes": sizes, **summary})


def _per_source(rows: list[dict]) -> dict[str, dict]:
    """Per source (a library, or JAX's ops and tests): median and slowest speed-up, which case
    is slowest, and the median ceiling (interpret / make_jaxpr: no tracer's analysis is free)."""
    out = {}
    for source in dict.fromkeys(r["source"] for r in rows):
        compared = [r for r in rows if r["source"] == source and r["speedup"] is not None]
        if compared:
            slowest = min(compared, key=lambda r: r["speedup"])
            out[source] = {"compared": len(compared),
                           "median_speedup": statistics.median(r["speedup"] for r in compared),
                           "slowest_speedup": slowest["speedup"], "slowest_case": slowest["case"],
                           "median_ceiling": statistics.median(ceilings) if (ceilings := [
                               r["ceiling"] for r in compared if r["ceiling"]]) else None}
    return out


def _record_third_party(rows: list[dict], sized: dict[str, dict], repeat: int, sizes: str,
                        load_at_start: tuple[float, float, float], finished: bool) -> None:
    """The third-party rows (with each case's operands and grid steps), per-library figures and
    the machine's load, kept in the repository (bench/recorded/): the libraries are not installed
    in CI, so this is their record. ``finished`` is False while the run is still going."""
    versions = {}
    for library in THIRD_PARTY:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[library] = importlib.metadata.version(library)
    third = [{**r, **sized[r["case"]]} for r in rows if r["source"] in THIRD_PARTY]
    speedups = [r["speedup"] for r in third if r["speedup"] is not None]
    production = sizes == "production"
    payload = {"benchmark": "trace_speed third-party libraries, CPU"
                            + (", production sizes" if production else ""),
               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "how": "cold: each number the median of cold_runs_per_number fresh processes "
                      "(trace vs one run in TPU interpret mode): python bench/trace_speed.py "
                      + " ".join(sys.argv[1:]),
               "sizes": ("production_sizes.py: each op at a size from the library's benchmark "
                         "specs or README" if production else "the tests' OPS"),
               "finished": finished, "cold_runs_per_number": repeat, "versions": versions,
               "jax": importlib.metadata.version("jax"), "cpus": os.cpu_count(),
               "load_average_1_5_15": {"start": load_at_start, "end": os.getloadavg()},
               "per_library": {k: v for k, v in _per_source(third).items() if k in THIRD_PARTY},
               "median_speedup": statistics.median(speedups) if speedups else None,
               "slowest_speedup": min(speedups) if speedups else None, "rows": third}
    everything = [r["speedup"] for r in rows if r["speedup"] is not None]
    if len(everything) > len(speedups):  # JAX's ops and test kernels ran too: all suites
        payload["all_suites"] = {"compared": len(everything),
                                 "median_speedup": statistics.median(everything),
                                 "slowest_speedup": min(everything),
                                 "per_source": _per_source(rows)}
    name = "trace_speed-third-party" + ("-production" if production else "") + "-cpu.json"
    path = ROOT / "bench" / "recorded" / name
    path.write_text(json.dumps(payload, indent=2) + "\n")
    if finished:
        print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-interpret", action="store_true",
                        help="only table 1's trace times (no interpreter, no real-code table)")
    parser.add_argument("--only", help="real-code cases whose name contains this (or any of "
                        "several, comma-separated: tokamax:,flywheel-tpu:,deltanet-tpu:)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="fresh processes per real-code number (the median is reported)")
    parser.add_argument("--sizes", choices=("tests", "production"), default="tests",
                        help="third-party ops at their tests' shapes, or at production ones "
                        "(bench/production_sizes.py: a cold interpreted run takes minutes)")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_one(*args.child, args.sizes)))
        return
    if not args.only:
        matmul_table(not args.no_interpret)
        dma_count_table()
    if not args.no_interpret:
        real_code_table(args.only, args.repeat, args.sizes)


if __name__ == "__main__":
    main()
