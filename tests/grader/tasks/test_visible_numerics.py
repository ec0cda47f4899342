"""Numerics in the open (issue 25): every numerical requirement a task's text names fails a
VISIBLE case when it is left out, so the learner sees why; the honest kernel passes that case.

- the row max subtracted before ``exp``: row softmax, flash attention, causal flash attention
  (case v1, large logits);
- the epsilon: RMS norm (v1, an all-zero row) and layernorm (v1, a constant row);
- the two-pass variance layernorm's text asks for (v1, rows around 100);
- float32 accumulation: matmul, sum_all, block-sparse matmul, matmul_tuned, both GPU tasks
  (v1, long all-positive bfloat16 sums).

The planted answers are the ones the adversarial tests already use on the hidden cases.
"""

from __future__ import annotations

import functools

import gradertools
import pytest
from test_adversarial_a01_a04 import _sum_all, wrong_values
from test_adversarial_a04_a06 import layernorm, the_best, tiled_matmul
from test_adversarial_a05_a07 import _bsmm, _flash
from test_gpu_tasks import matmul_gpu_shape
from test_tolerance import _column_softmax, _matmul


def _without_eps(assignment: str, task: str, old: str, new: str):
    """The instructor's solution of ``task`` with its epsilon edited out (``old`` -> ``new``)."""
    source = gradertools.cells(assignment)[f"{task}_solution"]
    assert old in source, old
    namespace = gradertools.run(assignment, ("_solution",))
    exec(compile(source.replace(old, new), f"planted {task}", "exec"), namespace)  # noqa: S102
    return namespace[task]


PLANTED = {
    "column_softmax": lambda: _column_softmax(subtract_max=False),
    "flash_attention": lambda: _flash(subtract_max=False),
    "causal_flash_attention": lambda: _flash(causal=True, subtract_max=False),
    "rms_norm": lambda: _without_eps("10_transformations", "rms_norm", "eps = 1e-6",
                                     "eps = 0.0"),
    "layernorm": lambda: layernorm(eps=0.0),
    "layernorm (one-pass variance)": lambda: layernorm(one_pass_variance=True),
    "matmul": lambda: _matmul(accumulate_in_input_dtype=True),
    "sum_all": lambda: _sum_all(running_sum_in_input_dtype=True),
    "block_sparse_matmul": lambda: _bsmm(accumulate_in_input_dtype=True),
    "matmul_tuned": lambda: tiled_matmul(the_best, acc_dtype=None),
    "gpu_matmul": lambda: functools.partial(matmul_gpu_shape, input_dtype_acc=True),
}


@pytest.mark.parametrize("label", sorted(PLANTED))
def test_a_left_out_requirement_fails_the_visible_case(label):
    task = label.split(" ")[0]
    found = wrong_values(task, "v1", PLANTED[label]())
    assert found is not None and ("elements differ" in found or "NaN" in found
                                  or "nan" in found), found


def test_every_named_requirement_has_its_visible_case():
    """Each task above has a visible v1 case, and the honest solutions pass it (the task tests
    run every solution on every case; here the planted switch turned off)."""
    honest = {"column_softmax": _column_softmax(subtract_max=True), "flash_attention": _flash(),
              "causal_flash_attention": _flash(causal=True), "layernorm": layernorm(),
              "sum_all": _sum_all(running_sum_in_input_dtype=False),
              "matmul": _matmul(accumulate_in_input_dtype=False),
              "block_sparse_matmul": _bsmm(), "matmul_tuned": tiled_matmul(the_best),
              "gpu_matmul": matmul_gpu_shape}
    for task, fn in honest.items():
        assert wrong_values(task, "v1", fn) is None, task
