"""Kernel bodies a learner did not write: the course's own and those of the Pallas ops JAX ships.

"Kernels are your own" (``core.work_rules``) compares each kernel body a submission runs with
these, by fingerprint (``grader.grading.fingerprint``: the body's jaxpr up to the names of its
variables, dead code and the numbers in it), so a body copied as source text and re-created
with ``exec`` (whose debug info then points at the notebook) is still recognised.

The fingerprints are stored in ``shipped_kernels.json`` beside this module, made by
``python -m grader.tasks.collect_shipped`` from:

- ``kernelsim.examples`` and the grader's own kernels (``core.tiled_matmul_call``);
- the kernels the lessons define (``lessons/*.py``: every ``pallas_call`` and Mosaic GPU
  ``plgpu.kernel`` a lesson runs);
- JAX's bundled Pallas ops (``jax.experimental.pallas.ops``) that compute what a task asks:
  TPU matmul and flash attention, GPU softmax, layer norm, RMS norm and attention.

Two kinds of body are left out, as no rule could tell a copy from the learner's own work:
bodies of fewer than ``MIN_BODY`` live equations (``o = x + y``), and any body that is the
instructor's solution of a task (the answer an honest learner writes; a test checks that no
stored fingerprint is one).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

STORE = Path(__file__).with_name("shipped_kernels.json")
MIN_BODY = 8  # live equations: smaller bodies are what anyone writes


@functools.cache
def known() -> dict[str, str]:
    """fingerprint -> where the body ships (the stored corpus)."""
    return json.loads(STORE.read_text())["kernels"]


def stored_digest() -> str | None:
    return json.loads(STORE.read_text()).get("sources")
