"""Kernel bodies a learner did not write: the course's own and those of the Pallas ops JAX ships.

"Kernels are your own" (``core.own_kernels``) compares each kernel body a submission runs with
these, by fingerprint (``grader.facts.fingerprint``: the body's jaxpr up to the names of its
variables, dead code and the numbers in it), so a body copied as source text and re-created
with ``exec`` (whose debug info then points at the notebook), pasted or renamed is still
recognised, at any size.

The fingerprints are stored in ``shipped_kernels.json`` beside this module, made by
``python -m grader.tasks.collect_shipped`` from:

- ``kernelsim.examples`` and the grader's own kernels (``core.tiled_matmul_call``);
- the kernels the lessons define (``lessons/*.py``: every ``pallas_call`` and Mosaic GPU
  ``plgpu.kernel`` a lesson runs);
- JAX's bundled Pallas ops (``jax.experimental.pallas.ops``) that compute what a task asks:
  TPU matmul and flash attention, GPU softmax, layer norm, RMS norm and attention.

One kind of shipped body passes: the body a task's text gives (``Task.given_body``, a line
as short as ``o_ref[...] = x_ref[...] + y_ref[...]``, which its instructor solution holds
verbatim), for that task alone (``allowed``). The collector refuses any other instructor
solution whose body the course ships, as an honest learner would lose marks for it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

STORE = Path(__file__).with_name("shipped_kernels.json")


@functools.cache
def _stored() -> dict:
    return json.loads(STORE.read_text())


def known() -> dict[str, str]:
    """fingerprint -> where the body ships (the stored corpus)."""
    return _stored()["kernels"]


def allowed(task_id: str) -> frozenset[str]:
    """The fingerprints of the shipped bodies ``task_id``'s text gives (its allow-list)."""
    return frozenset(_stored().get("given", {}).get(task_id, ()))


def stored_digest() -> str | None:
    return _stored().get("sources")
