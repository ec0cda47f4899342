"""bench/ci_cpu.py charges each process's CPU to the suite process it descends from and to its
program, and sees a process that works while it samples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ci_cpu", REPO / "bench" / "ci_cpu.py")
ci_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_cpu)


def test_a_jailed_check_is_charged_to_the_pytest_process_that_started_it():
    """Through its jail's bwrap, which itself spends no CPU."""
    processes = [
        {"pid": 10, "ppid": 1, "cpu_s": 1.0,
         "cmdline": ".venv/bin/python -m pytest --junitxml=build/junit.xml"},
        {"pid": 11, "ppid": 1, "cpu_s": 2.0,
         "cmdline": ".venv/bin/python -m pytest --junitxml=build/junit-side.xml tests/site"},
        {"pid": 20, "ppid": 10, "cpu_s": 0.0, "cmdline": "bwrap --die-with-parent"},
        {"pid": 21, "ppid": 20, "cpu_s": 4.0, "cmdline": "python -m grader.jail.checker"},
        {"pid": 22, "ppid": 20, "cpu_s": 3.0, "cmdline": "python -m grader.jail.checker"},
        {"pid": 30, "ppid": 11, "cpu_s": 5.0, "cmdline": "/usr/lib/chromium/chromium --type=x"},
        {"pid": 40, "ppid": 1, "cpu_s": 6.0, "cmdline": ".venv/bin/python -m pip install -e ."},
        {"pid": 41, "ppid": 1, "cpu_s": 0.5,
         "cmdline": ".venv-compat/bin/python -m pip install -q jax[cpu]==0.10.2 ipykernel>=6"},
        {"pid": 23, "ppid": 20, "cpu_s": 0.8, "cmdline": "python -c import jax, "
         "jax.experimental.pallas, numpy, kernelsim, grader.jail.replay, "
         "grader.jail.checker, grader.tasks"},
    ]
    rows = {(r["suite_process"], r["program"]): (r["processes"], r["cpu_s"])
            for r in ci_cpu.cpu_by_program(processes)}
    assert rows[("main", "checker")] == (2, 7.0)
    assert rows[("side", "chromium")] == (1, 5.0)
    assert rows[("other", "pip")] == (2, 6.5)
    assert rows[("main", "jail preflight")] == (1, 0.8)
    assert next(iter(rows)) == ("main", "checker")  # most first


def test_a_sample_sees_a_working_child():
    work = ("import time\nwhile time.process_time() < 0.5:\n    pass\ntime.sleep(1.5)\n")
    taken = ci_cpu.sample([sys.executable, "-c", work])
    assert taken["returncode"] == 0
    (child,) = [p for p in taken["processes"] if p["cmdline"].endswith("time.sleep(1.5)")]
    assert child["cpu_s"] >= 0.4 and taken["busy_cpu_s"] >= child["cpu_s"]
