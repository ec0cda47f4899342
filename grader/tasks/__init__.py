"""The graded tasks of the course, one module per assignment.

``core`` says what a task is (``Task``, ``Case``, ``Rule``, the tolerance table and the rules
shared by every assignment); each ``aNN_*`` module registers its assignment's tasks in
``TASKS`` when imported. A new assignment is a new module here, added to ``MODULES``.
"""

from __future__ import annotations

import importlib

from grader.tasks.core import (
    TASKS,
    TOLERANCES,
    Case,
    Rule,
    Task,
    reference_flops,
    tpu_block_rule,
    work_rules,
)

MODULES = (
    "a01_first_kernel",
    "a02_tiling",
    "a03_index_maps",
    "a04_memory_spaces",
    "a05_scalar_prefetch",
    "a06_performance",
    "a07_flash_attention",
    "a08_manual_dma",
    "a09_debugging",
    "a10_transformations",
    "a11_gpu",
    "a12_kernel_api",
    "a13_across_chips",
    "a14_production_kernels",
    "a15_mosaic_gpu",
)
for _name in MODULES:
    importlib.import_module(f"grader.tasks.{_name}")

BY_ID: dict[str, Task] = {t.id: t for t in TASKS}
ASSIGNMENTS: list[str] = sorted({t.assignment for t in TASKS})
assert len(BY_ID) == len(TASKS), "duplicate task ids"

__all__ = ["ASSIGNMENTS", "BY_ID", "MODULES", "TASKS", "TOLERANCES", "Case", "Rule", "Task", "get",
           "reference_flops", "tpu_block_rule", "work_rules"]


def get(task_id: str) -> Task:
    try:
        return BY_ID[task_id]
    except KeyError:
        raise KeyError(f"unknown task {task_id!r}; known tasks: {', '.join(BY_ID)}") from None
