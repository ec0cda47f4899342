"""How many devices an assignment's checks run on, and the environment that gives a process
that many CPU devices.

XLA reads its number of host (CPU) devices once, from ``XLA_FLAGS``, when JAX's CPU backend
starts: a process whose checks need a ring of devices (assignment 13's kernels inside
``jax.shard_map``) must be started with the flag, since setting it after JAX was imported
does nothing. ``grader.tasks.Task.devices`` reads ``DEVICES``; the grader's jailed processes
(``grader.jail.trusted``) and ``pallas-course check``'s kernel (``grader.learner.check``)
start with ``cpu_devices_env``. Imports nothing of the grader.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# assignment (its folder under exercises/source/) -> the devices its checks run on; one
# where it is not named
DEVICES: dict[str, int] = {"13_across_chips": 4}
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def devices_of(assignment: str) -> int:
    """How many devices ``assignment``'s checks run on."""
    return DEVICES.get(assignment, 1)


def assignment_of_notebook(stem: str) -> str | None:
    """The assignment whose notebook is named ``stem`` (``across_chips`` for
    ``13_across_chips``); None for any other name."""
    return next((a for a in DEVICES if a.split("_", 1)[1] == stem), None)


def cpu_devices_env(env: Mapping[str, str], devices: int) -> dict[str, str]:
    """``env`` with ``XLA_FLAGS`` asking for ``devices`` CPU devices (a count it asked for
    before replaced, its other flags kept); ``env`` itself for one device."""
    out = dict(env)
    if devices <= 1:
        return out
    kept = re.sub(rf"{DEVICE_COUNT_FLAG}=\S*", "", out.get("XLA_FLAGS", "")).split()
    out["XLA_FLAGS"] = " ".join([*kept, f"{DEVICE_COUNT_FLAG}={devices}"])
    return out
