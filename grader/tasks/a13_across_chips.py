"""Assignment 13, across chips: lesson 14's remote copies, in a ring reduce-scatter over four
devices (``jax.shard_map``), one way round the ring and then both ways at once; then with two
receive slots whatever the ring's length, the receiver telling its sender when a slot is free
(a semaphore signalled on another device), and an all-reduce as that reduce-scatter followed by
an all-gather, its ``pl.CostEstimate`` saying what it sends.

Each of the ``N = 4`` devices holds an ``(N * m, n)`` array of partial sums; afterwards device
``d`` holds chunk ``d`` (``m`` rows) summed over the devices. ``x`` stacks the devices' arrays
(``(N * N * m, n)``), the result what each holds afterwards (``(N * m, n)``).

The checks need four devices in the checking process (``grader.devices``: the grader's jailed
processes and ``pallas-course check`` start with four CPU devices), and run every case in TPU
interpret mode with its race detector on (``calling.with_race_detector``), which fails a
kernel that overwrites a buffer its owner may still be reading. The rules read kernelsim's
remote copies, per device (``verdict.RemoteCopy``): how many, how large, to which neighbour,
at which step, and that each is waited on.

- ``ring_reduce_scatter``: ``N - 1`` copies of one chunk, one per step, all to the right-hand
  neighbour: ``(N - 1) * m * n`` elements in all, the least a reduce-scatter sends.
- ``bidirectional_reduce_scatter``: the same bytes in ``2 (N - 1)`` half-chunk copies, two per
  step, one to each neighbour, so both directions of every link carry data at every step.
- ``two_slot_reduce_scatter``: task 1's copies, received into two slots of one chunk each,
  used in turn: VMEM that does not grow with ``N``. A sender that fills a slot its neighbour
  is still reading fails the race detector; the rules count the places the copies land.
- ``ring_all_reduce``: the two-slot reduce-scatter, then ``N - 1`` more one-chunk copies to the
  right that pass the summed chunks round (an all-gather into the output): every device ends
  with the whole sum. Each call's ``pl.CostEstimate(remote_bytes_transferred=...)`` is what it
  sends (tasks 3 and 4).
"""

from __future__ import annotations

from collections import Counter

import jax.numpy as jnp

from grader import calling
from grader.devices import devices_of
from grader.tasks.core import Rule, make_case, nbytes_of, register_task

A13 = "13_across_chips"
DEVICES = devices_of(A13)  # the ring's length: the devices every check runs on


def _reference(x):
    """What the devices hold afterwards: each one's chunk summed over the devices, stacked."""
    return x.astype(jnp.float32).reshape(DEVICES, -1, x.shape[1]).sum(0).astype(x.dtype)


def _chunk(case) -> tuple[int, int]:
    """A case's chunk: (rows, columns)."""
    rows, n = case.arrays["x"]
    return rows // DEVICES // DEVICES, n


def _pairs(copies, right: int, left: int) -> list[str | None]:
    """Per ring step, the two copies a device starts (in the order the body starts them):
    what keeps them from carrying data both ways at once, None when nothing does."""
    ordered = sorted(copies, key=lambda r: (r.start_step, r.start_pos))
    out = []
    for first, second in zip(ordered[::2], ordered[1::2], strict=True):
        if {first.dst_device, second.dst_device} != {right, left}:
            out.append(f"both copies go to device {first.dst_device}"
                       if first.dst_device == second.dst_device else
                       f"copies to devices {first.dst_device} and {second.dst_device}")
        elif first.wait_step is not None and (first.wait_step, first.wait_pos) < (
                second.start_step, second.start_pos):
            out.append(f"the copy to device {first.dst_device} is waited on before the one "
                       f"to device {second.dst_device} starts")
        else:
            out.append(None)
    return out


def _all_reduced(x):
    """What the devices hold after an all-reduce: each the whole sum, stacked."""
    return jnp.tile(_reference(x), (DEVICES, 1))


def ring_rules(t, case, inputs, directions: int, rounds: int = 1) -> list[Rule]:
    """The rules on each device's remote copies for ``rounds`` passes round the ring in one
    kernel (1: a reduce-scatter; 2: a reduce-scatter then an all-gather), each in
    ``directions`` (1: to the right only; 2: half of each chunk each way)."""
    m, n = _chunk(case)
    steps = rounds * (DEVICES - 1)
    share = steps * nbytes_of((m, n), case.dtype)  # each device's share: N - 1 chunks a pass
    per_copy = share // (steps * directions)
    devices = sorted(c.device for c in t.calls if c.device is not None)
    rules = [Rule("one kernel per device", f"one pallas_call inside jax.shard_map on each of "
                  f"the {DEVICES} devices", f"{len(t.calls)} call(s), on devices {devices}"
                  if t.calls else "none", devices == list(range(DEVICES)))]
    if not rules[0].ok:
        return rules
    sent = {d: [r for c in t.calls if c.device == d for r in c.remote_copies]
            for d in range(DEVICES)}
    wrong_count, wrong_size, wrong_way, unwaited, per_step, totals = [], [], [], [], [], []
    for d, copies in sent.items():
        totals.append(f"device {d}: {sum(r.bytes for r in copies):,} B")
        if len(copies) != steps * directions:
            wrong_count.append(f"device {d} starts {len(copies)}")
        sizes = sorted({r.bytes for r in copies})
        if sizes and sizes != [per_copy]:
            wrong_size.append(f"device {d}: {', '.join(f'{b:,}' for b in sizes)} B")
        to = Counter(r.dst_device for r in copies)
        right, left = (d + 1) % DEVICES, (d - 1) % DEVICES
        wanted = {right: steps} if directions == 1 else {right: steps, left: steps}
        if copies and dict(to) != wanted:
            wrong_way.append(f"device {d} sends to " + ", ".join(
                f"device {k} ({v}x)" for k, v in sorted(to.items())))
        never = sum(r.wait_step is None for r in copies)
        if never:
            unwaited.append(f"device {d}: {never} of its {len(copies)} copies never waited")
        if directions == 2 and len(copies) == 2 * steps:
            per_step += [f"device {d}, step {s}: {why}"
                         for s, why in enumerate(_pairs(copies, right, left)) if why]
    neighbours = ("its right-hand neighbour, (d + 1) mod N" if directions == 1 else
                  f"each neighbour {steps} times: (d + 1) mod N and (d - 1) mod N")
    rules += [
        Rule("remote copies per device", f"{steps * directions} "
             f"({'one' if directions == 1 else 'two'} per step, {steps} steps)",
             "; ".join(wrong_count) or "so many", not wrong_count),
        Rule("bytes each device sends", f"{share:,} B: its share, {steps} chunks of "
             f"({m}, {n}), never the whole array", "; ".join(totals),
             all(sum(r.bytes for r in copies) == share for copies in sent.values())),
        Rule("size of each remote copy", f"{per_copy:,} B: "
             + (f"one ({m}, {n}) chunk" if directions == 1 else
                f"half a chunk, ({m // 2}, {n})"),
             "; ".join(wrong_size) or "so large", not wrong_size),
        Rule("where the copies go", f"device d sends to {neighbours}",
             "; ".join(wrong_way) or "there", not wrong_way),
        Rule("every remote copy waited", "each copy's .wait() in the kernel (it waits for your "
             "send to leave and for your neighbour's copy into you to arrive)",
             "; ".join(unwaited) or "they are", not unwaited)]
    if directions == 2:
        rules.append(Rule("both directions at every step", "each step starts one copy to "
                          "each neighbour, then waits for both", "; ".join(per_step)
                          or "they do", not per_step))
    return rules


def two_slot_rule(t) -> Rule:
    """Each scratch buffer that remote copies land in takes them in at most two places (two
    slots), so a device's VMEM does not grow with the ring's length."""
    found = []
    for c in sorted(t.calls, key=lambda c: c.device):
        scratch = {o.name for o in c.operands if o.role == "scratch"}
        for ref in sorted({r.dst for r in c.remote_copies if r.dst in scratch}):
            places = {r.dst_start for r in c.remote_copies if r.dst == ref}
            if len(places) > 2:
                found.append(f"device {c.device}: copies land in {len(places)} places of {ref}")
    return Rule("two receive slots", "the copies into a scratch buffer land in two slots "
                "of one chunk each, used in turn, whatever the number of devices",
                "; ".join(found) or "they do", not found)


def remote_bytes_rule(t) -> Rule:
    """Each call's ``pl.CostEstimate(remote_bytes_transferred=...)`` is what kernelsim sees it
    send to other devices."""
    wrong = []
    for c in sorted(t.calls, key=lambda c: c.device):
        sends = sum(r.bytes for r in c.remote_copies)
        said = c.cost_estimate_remote_bytes
        if said != sends:
            wrong.append(f"`{c.name}` on device {c.device} sends {sends:,} B and says "
                         + ("nothing (no pl.CostEstimate)" if said is None else f"{said:,} B"))
    return Rule("pl.CostEstimate's remote_bytes_transferred", "each call's estimate: the bytes "
                "it sends to other devices", "; ".join(wrong) or "it is", not wrong)


def two_slot_rules(t, case, inputs, rounds: int) -> list[Rule]:
    """Tasks 3 and 4: the one-way ring's rules over ``rounds`` passes, the two slots, and each
    call's estimate of the bytes it sends."""
    rules = ring_rules(t, case, inputs, directions=1, rounds=rounds)
    if not rules[0].ok:
        return rules
    return [*rules, two_slot_rule(t), remote_bytes_rule(t)]


def _x(m: int, n: int) -> dict[str, tuple[int, int]]:
    """The input of a case whose chunks are (m, n): each device's (N * m, n) shard of x."""
    return {"x": (DEVICES * DEVICES * m, n)}


# Tasks 3 and 4's cases are smaller than tasks 1 and 2's (the references ship in the
# repository): the same dtypes and a third chunk height.
# bfloat16 partial sums are rounded at every hop of the ring, where the reference rounds once:
# of positive values ("positive") every partial sum is smaller than the total, which bounds
# those roundings (TOLERANCES' "ring"); of N(0, 1) values a partial sum can be far larger than
# the total it cancels to. Each case is written out, hidden ones flagged in place: the student
# copy cuts those lines (grader.learner.dist.strip_hidden_cases).


register_task(
    id="ring_reduce_scatter", assignment=A13,
    title="A ring reduce-scatter: one remote copy a step to the right-hand neighbour",
    reference=_reference, tolerance="ring", kernel_ops=(("add",),),
    invoke=calling.with_race_detector,
    cases=(
        make_case("v0", 13, "float32", _x(16, 128)),
        make_case("h0", 131, "float32", _x(16, 256), True),
        make_case("h1", 132, "bfloat16", _x(32, 128), True, "positive"),
        make_case("h2", 133, "float32", _x(32, 128), True),
    ),
    structure=lambda t, case, inputs: ring_rules(t, case, inputs, directions=1),
)
register_task(
    id="bidirectional_reduce_scatter", assignment=A13,
    title="The same reduce-scatter both ways round the ring: half of each chunk each way",
    reference=_reference, tolerance="ring", kernel_ops=(("add",),),
    invoke=calling.with_race_detector,
    cases=(
        make_case("v0", 1013, "float32", _x(16, 128)),
        make_case("h0", 1131, "float32", _x(16, 256), True),
        make_case("h1", 1132, "bfloat16", _x(32, 128), True, "positive"),
        make_case("h2", 1133, "float32", _x(32, 128), True),
    ),
    structure=lambda t, case, inputs: ring_rules(t, case, inputs, directions=2),
)
register_task(
    id="two_slot_reduce_scatter", assignment=A13,
    title="The ring reduce-scatter with two receive slots and a semaphore saying one is free",
    reference=_reference, tolerance="ring", kernel_ops=(("add",),),
    invoke=calling.with_race_detector,
    cases=(
        make_case("v0", 2013, "float32", _x(16, 128)),
        make_case("h0", 2131, "float32", _x(8, 256), True),
        make_case("h1", 2132, "bfloat16", _x(16, 128), True, "positive"),
        make_case("h2", 2133, "float32", _x(24, 128), True),
    ),
    structure=lambda t, case, inputs: two_slot_rules(t, case, inputs, rounds=1),
)
register_task(
    id="ring_all_reduce", assignment=A13,
    title="An all-reduce: the two-slot reduce-scatter, then an all-gather round the ring",
    reference=_all_reduced, tolerance="ring", kernel_ops=(("add",),),
    invoke=calling.with_race_detector,
    cases=(
        make_case("v0", 3013, "float32", _x(16, 128)),
        make_case("h0", 3131, "float32", _x(8, 256), True),
        make_case("h1", 3132, "bfloat16", _x(16, 128), True, "positive"),
        make_case("h2", 3133, "float32", _x(24, 128), True),
    ),
    structure=lambda t, case, inputs: two_slot_rules(t, case, inputs, rounds=2),
)
