"""Which lessons each assignment practises: the course's one table of it.

An assignment practises its own lesson (``PRACTISES``) and, through a later task, maybe
another (``ALSO_PRACTISES``). A lesson's closing cell names the assignments that practise it
(or, where none does yet, the next assignment), and which of its tasks wait for a later lesson
(``later_tasks``); the site's exercise table and course map show the same
(``site/content.py`` reads ``lessons_of``), and ``tests/lessons/test_navigation.py`` holds the
lessons' closing cells to it. Assignments are the folders under ``exercises/source/``; their
numbers are not their lessons' (assignment 1 practises lesson 2, assignment 8 lesson 5).
Imports nothing of the grader.
"""

from __future__ import annotations

# assignment (its folder under exercises/source/) -> the number of the lesson it practises
PRACTISES: dict[str, int] = {
    "01_first_kernel": 2,
    "02_tiling": 3,
    "03_index_maps": 4,
    "04_memory_spaces": 5,
    "05_scalar_prefetch": 6,
    "06_performance": 7,
    "07_flash_attention": 8,
    "08_manual_dma": 5,  # lesson 5's pl.ANY operands and DMA semaphores, after lesson 8's
    "09_debugging": 9,
    "10_transformations": 10,
    "11_gpu": 11,
    "12_kernel_api": 13,
    "13_across_chips": 14,
    "14_production_kernels": 15,
    "15_mosaic_gpu": 16,
}

# assignment -> the numbers of later lessons one of its tasks practises as well
ALSO_PRACTISES: dict[str, tuple[int, ...]] = {
    "07_flash_attention": (10, 12),  # its backward tasks: lesson 10's custom_vjp, 12's backward
}

# assignment -> (its tasks that need a later lesson, the lessons to read before them). The
# assignment's text and every lesson that links it say so in the words of ``later_tasks``.
LATER_TASKS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "07_flash_attention": ((4, 5), (10, 12)),
}


def _and(numbers: tuple[int, ...]) -> str:
    return " and ".join([", ".join(map(str, numbers[:-1])), str(numbers[-1])]
                        if len(numbers) > 1 else [str(numbers[0])])


def later_tasks(assignment: str) -> str | None:
    """The sentence part that says which of ``assignment``'s tasks wait for later lessons,
    e.g. "tasks 4 and 5 after lessons 10 and 12"; None when every task follows its lesson."""
    if assignment not in LATER_TASKS:
        return None
    tasks, lessons = LATER_TASKS[assignment]
    return (f"task{'s' if len(tasks) > 1 else ''} {_and(tasks)} after "
            f"lesson{'s' if len(lessons) > 1 else ''} {_and(lessons)}")


def lessons_of(assignment: str) -> tuple[int, ...]:
    """The numbers of the lessons ``assignment`` practises, its own first."""
    return (PRACTISES[assignment], *ALSO_PRACTISES.get(assignment, ()))


def assignments_of(lesson: int) -> list[str]:
    """The assignments that practise lesson number ``lesson``, in folder order."""
    return sorted(a for a in PRACTISES if lesson in lessons_of(a))


def next_assignment(lesson: int) -> str | None:
    """Where a lesson without an assignment of its own sends the learner: the assignment that
    practises the nearest later lesson (the first in folder order on a tie); None after the
    last."""
    later = sorted((n, a) for a in PRACTISES for n in lessons_of(a) if n > lesson)
    return later[0][1] if later else None
