"""A failed check: what ``grader.learner.course.check`` shows and ``grader.learner.selfcheck``
raises. Light, as ``course`` is: the notebook's process of the grader's run imports it."""

from __future__ import annotations

import os
import traceback
from pathlib import Path


class CheckFailed(AssertionError):
    """A task's check failed: wrong values, wrong shape, or a structural rule not met."""

    # shown but not raised (in a Jupyter kernel): the frames from the notebook's cell down to
    # the call of ``check``, which the traceback of an exception caught in ``check`` lacks
    caller_frames: list[traceback.FrameSummary] = []

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error: the learner's frames and the message, without
        the grader's frames (IPython always shows the raising frame, even with
        ``__tracebackhide__``; the full traceback stays on the exception for ``%debug``)."""
        grader_dir = str(Path(__file__).resolve().parents[1]) + os.sep
        frames = [*self.caller_frames, *traceback.extract_tb(self.__traceback__)]
        frames = [f for f in frames if not str(Path(f.filename).resolve()).startswith(grader_dir)]
        lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)] \
            if frames else []
        return [*"".join(lines).splitlines(), f"{type(self).__name__}: {self}"]
