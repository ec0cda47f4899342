"""Assignment 13 (across chips): the instructor's ring reduce-scatters and all-reduce pass on
every case, the blank fails, and plausible wrong answers (the wrong neighbour, a missing wait,
one buffer for every step, the whole array sent, one way where both are asked, a buffer per
step where two slots are asked, two slots with no semaphore saying a slot is free, an
all-reduce whose estimate leaves out what it sends) fail with a message that says what is
wrong.

The checks need four devices, which JAX reads once, when it starts: this file runs itself
(``python tests/grader/tasks/test_across_chips_tasks.py``) in one child process with four CPU
devices (``grader.devices.cpu_devices_env``), which runs the notebook once, checks every function
and prints the messages as JSON; the tests read them. Planted mistakes are edits of the notebook's
own source, so what is tested is what learners get.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "13_across_chips"
TASKS = ["ring_reduce_scatter", "bidirectional_reduce_scatter", "two_slot_reduce_scatter",
         "ring_all_reduce"]
RING, BOTH = "ring_reduce_scatter_solution", "bidirectional_reduce_scatter_solution"
SLOTS, ALL = "two_slot_reduce_scatter_solution", "ring_all_reduce_solution"

pytestmark = pytest.mark.interpret


def planted_variants(ns: dict, planted) -> dict[str, tuple[str, object]]:
    """name -> (task, function): the mistakes the tests expect to fail."""
    def whole_array(x, interpret=ns["TPU_INTERPRET"]):
        """Right values, but every device sends its whole (N * m, n) array round the ring and
        sums all of them: an all-gather of the partial sums, N times the bytes."""
        devices = ns["DEVICES"]
        jax, pl, pltpu = ns["jax"], ns["pl"], ns["pltpu"]

        def kernel(x_ref, o_ref, arrays, send_sems, recv_sems):
            me = jax.lax.axis_index("x")
            right = jax.lax.rem(me + 1, devices)
            rows = o_ref.shape[0]
            arrays[me] = x_ref[...]
            for step in range(devices - 1):
                held = jax.lax.rem(me - step + devices, devices)
                copy = pltpu.make_async_remote_copy(arrays.at[held], arrays.at[held],
                                                    send_sems.at[step], recv_sems.at[step],
                                                    device_id={"x": right})
                copy.start()
                copy.wait()
            total = arrays[0]
            for d in range(1, devices):
                total = total + arrays[d]
            o_ref[...] = total[pl.ds(me * rows, rows), :]

        def local(x):
            rows = x.shape[0] // devices
            vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
            return pl.pallas_call(
                kernel, out_shape=jax.ShapeDtypeStruct((rows, x.shape[1]), x.dtype),
                in_specs=[vmem], out_specs=vmem,
                scratch_shapes=[pltpu.VMEM((devices, *x.shape), x.dtype),
                                pltpu.SemaphoreType.DMA((devices - 1,)),
                                pltpu.SemaphoreType.DMA((devices - 1,))],
                interpret=interpret)(x)

        return jax.shard_map(local, mesh=ns["mesh"], in_specs=ns["P"]("x"),
                             out_specs=ns["P"]("x"), check_vma=False)(x)

    def blank(x, interpret=None):
        raise NotImplementedError

    return {
        "wrong_neighbour": ("ring_reduce_scatter", planted(
            RING, ("right = jax.lax.rem(me + 1, DEVICES)",
                   "right = jax.lax.rem(me - 1 + DEVICES, DEVICES)"))),
        "missing_wait": ("ring_reduce_scatter", planted(
            RING, ("            copy.wait()  # my send", "            pass  # my send"))),
        "one_buffer": ("ring_reduce_scatter", planted(
            RING, ("send.at[step], recv.at[step],", "send.at[step], recv.at[0],"),
            ("recv[step - 1]", "recv[0]"), ("recv[DEVICES - 2]", "recv[0]"))),
        "whole_array": ("ring_reduce_scatter", whole_array),
        "blank": ("ring_reduce_scatter", blank),
        "one_way": ("bidirectional_reduce_scatter", ns["ring_reduce_scatter"]),
        "both_right": ("bidirectional_reduce_scatter", planted(
            BOTH, ("(jax.lax.rem(me - 1 + DEVICES, DEVICES),",
                   "(jax.lax.rem(me + 1, DEVICES),"))),
        "waits_before_the_other_start": ("bidirectional_reduce_scatter", planted(
            BOTH, ("            for copy in copies:\n                copy.start()  # both "
                   "directions of both links carry data at once\n            for copy in "
                   "copies:\n                copy.wait()",
                   "            for copy in copies:\n                copy.start()\n"
                   "                copy.wait()"))),
        "a_buffer_per_step": ("two_slot_reduce_scatter", ns["ring_reduce_scatter"]),
        "no_free_slot_signal": ("two_slot_reduce_scatter", planted(
            SLOTS, ("        if 1 <= step <= DEVICES - 3:", "        if False:"),
            ("        if step >= 2:  # my right", "        if False:  # my right"))),
        "no_remote_bytes_estimate": ("ring_all_reduce", planted(
            ALL, ("remote_bytes_transferred=2 * (DEVICES - 1) * chunk_bytes", ""))),
        "reduce_scatter_only": ("ring_all_reduce", ns["two_slot_reduce_scatter"]),
    }


def main() -> None:
    """The child: four CPU devices; every check's outcome as one line of JSON."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gradertools
    import jax
    import numpy as np

    from grader import tasks
    from grader.calling import Traced, trace_case
    from grader.facts import work
    from grader.jail import wire
    from grader.jail.checker import known_primitives, python_at_run_time
    from grader.learner import course

    ns = gradertools.run(ASSIGNMENT)

    def outcome(task, fn, hidden=False):
        try:
            course.check(task, fn, hidden=hidden, quiet=True)
        except course.CheckFailed as e:
            return str(e)
        return None

    out: dict = {"devices": jax.device_count(),
                 "solutions": {f"{t}/{h}": outcome(t, ns[t], h) for t in TASKS
                               for h in (False, True)}}
    out["planted"] = {name: outcome(task, fn) for name, (task, fn) in planted_variants(
        ns, lambda cell, *edits: gradertools.planted(ASSIGNMENT, ns, cell, *edits)).items()}
    # the program as the grader's processes pass it: traced in the notebook's, pickled, read
    # back by the checker's allow-list and run there
    task = tasks.get("bidirectional_reduce_scatter")
    case = next(c for c in task.cases if c.name == "v0")
    arrays = [jax.numpy.asarray(v) for v in task.inputs(case).values()]
    traced = trace_case(task, ns["bidirectional_reduce_scatter"], arrays, case.params)
    program = wire.loads(wire.dumps(traced.program))
    run = work.run_traced(Traced(program, arrays))
    out["wired"] = {"refused": python_at_run_time(program, known_primitives()), "error": run.error,
                    "max_error": float(np.abs(run.output - np.asarray(task.expected(
                        case, task.inputs(case)))).max()) if run.error is None else None}
    print(json.dumps(out))


@pytest.fixture(scope="module")
def results() -> dict:
    from grader.devices import cpu_devices_env

    env = cpu_devices_env({**os.environ, "PYTHONPATH": str(ROOT)}, 4)
    done = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_checks_ran_on_four_devices(results):
    assert results["devices"] == 4


def test_every_task_has_a_solution_and_tests():
    import gradertools

    from grader import tasks

    assert [t.id for t in tasks.TASKS if t.assignment == ASSIGNMENT] == TASKS
    cells = gradertools.cells(ASSIGNMENT)
    for task in TASKS:
        assert {f"{task}_solution", f"{task}_visible", f"{task}_hidden"} <= set(cells), task
        assert tasks.get(task).devices == 4


@pytest.mark.parametrize("check", [f"{t}/{h}" for t in TASKS for h in (False, True)])
def test_the_reference_solution_passes(results, check):
    assert results["solutions"][check] is None, results["solutions"][check]


def test_the_program_crosses_to_the_checker_and_runs_there(results):
    """A shard_map's program (its mesh, its devices) passes the checker's unpickler and runs."""
    wired = results["wired"]
    assert wired["refused"] is None and wired["error"] is None, wired
    assert wired["max_error"] < 1e-4


def _failed(results, name: str, *expected: str) -> str:
    message = results["planted"][name]
    assert message is not None, f"{name} passed"
    for text in expected:
        assert text in message, message
    return message


def test_the_blank_is_not_implemented(results):
    assert results["planted"]["blank"] == "ring_reduce_scatter: not implemented yet"


def test_the_wrong_neighbour_fails(results):
    _failed(results, "wrong_neighbour", "wrong values for case v0",
            "[FAIL] where the copies go", "device 0 sends to device 3 (3x)")


def test_a_missing_wait_fails(results):
    """The sum read from the receive buffer before the neighbour's copy has landed (in
    interpret mode a copy never waited on never lands): wrong values, and the rule names the
    copies never waited."""
    _failed(results, "missing_wait", "[FAIL] every remote copy waited",
            "device 0: 3 of its 3 copies never waited")


def test_one_receive_buffer_for_every_step_races(results):
    """A neighbour one step ahead overwrites the buffer before its owner has read it: the
    race detector's report, without the interpreter's traceback, and the hint."""
    message = _failed(results, "one_buffer", "RaceDetected: write of", "(RACE DETECTED)",
                      "Hint: TPU interpret mode's race detector", "give each step its own")
    assert "Traceback" not in message, message


def test_sending_the_whole_array_fails_on_its_bytes(results):
    """Right values (after the race just before it: the grader resets TPU interpret mode's
    state after a failed case), four times the bytes."""
    message = _failed(results, "whole_array", "[FAIL] bytes each device sends",
                      "device 0: 98,304 B", "required 24,576 B: its share")
    assert "wrong values" not in message and "raised" not in message, message


def test_one_way_where_both_are_asked_fails(results):
    """Its message shows the kernel's table once, not once per device, and what each device
    sends."""
    message = _failed(results, "one_way", "[FAIL] where the copies go",
                      "[FAIL] size of each remote copy", "[FAIL] remote copies per device",
                      "`kernel` on device 3: 3 remote copies, 24,576 B sent, to device(s) 0")
    assert message.count("your call of `kernel` (grid ()) on each device (device 0's shown)") \
        == message.count("your call of") == 1, message


def test_both_halves_to_the_right_fail(results):
    _failed(results, "both_right", "[FAIL] where the copies go")


def test_waiting_before_the_other_direction_starts_fails(results):
    message = _failed(results, "waits_before_the_other_start",
                      "[FAIL] both directions at every step")
    assert "wrong values" not in message and message.count("[FAIL]") == 1, message


def test_a_buffer_per_step_fails_the_two_slots(results):
    """Task 1's kernel: right values, but its receive buffer grows with the ring."""
    message = _failed(results, "a_buffer_per_step", "[FAIL] two receive slots",
                      "device 0: copies land in 3 places of recv")
    assert "wrong values" not in message, message


def test_two_slots_without_the_free_signal_race(results):
    """A sender that refills a slot its neighbour may still be reading: the race detector
    fails it, although the values happen to come out right in interpret mode."""
    _failed(results, "no_free_slot_signal", "RaceDetected", "(RACE DETECTED)")


def test_an_all_reduce_must_say_what_it_sends(results):
    """An estimate that leaves remote_bytes_transferred at its default, 0."""
    message = _failed(results, "no_remote_bytes_estimate",
                      "[FAIL] pl.CostEstimate's remote_bytes_transferred",
                      "`kernel` on device 0 sends 49,152 B and says 0 B")
    assert message.count("[FAIL]") == 1 and "wrong values" not in message, message


def test_a_reduce_scatter_is_no_all_reduce(results):
    _failed(results, "reduce_scatter_only", "shape (64, 128) but expected (256, 128)",
            "[FAIL] remote copies per device: required 6 (one per step, 6 steps)")


def test_the_device_flag_replaces_a_count_and_keeps_other_flags():
    from grader.devices import cpu_devices_env

    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x",
           "HOME": "/h"}
    assert cpu_devices_env(env, 4) == {
        "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4",
        "HOME": "/h"}
    assert cpu_devices_env({"HOME": "/h"}, 1) == {"HOME": "/h"}


def test_the_graders_processes_get_four_devices_for_these_checks_alone():
    """Both jailed processes of a run start with the devices its checks need: four where one
    is assignment 13's, none asked for otherwise."""
    from grader.jail.trusted import run_env

    flag = "--xla_force_host_platform_device_count=4"
    assert flag in run_env(["elementwise", "ring_reduce_scatter"])["XLA_FLAGS"]
    assert "XLA_FLAGS" not in run_env(["elementwise"]) and "XLA_FLAGS" not in run_env([])


def test_pallas_course_check_gives_the_notebooks_kernel_four_devices():
    """By the assignment's folder, or by the notebook's name where a learner moved it."""
    from grader.learner.check import devices_of_notebook

    assert devices_of_notebook(Path("ws/exercises/13_across_chips/across_chips.ipynb")) == 4
    assert devices_of_notebook(Path("/home/me/copy/across_chips.ipynb")) == 4
    assert devices_of_notebook(Path("ws/exercises/08_manual_dma/manual_dma.ipynb")) == 1


if __name__ == "__main__":
    main()
