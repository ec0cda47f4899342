"""A course folder its group shares (deploy/setup-class.sh: the instructors' group owns it,
folders 2770, files 0660, the setgid bit so new files keep the group).

The instructors and the grading account write the same files in it (autograded/, status/,
feedback/): whatever one of them makes, the others must be able to replace. A process that
writes there with the usual umask (022) makes folders 2755 and files 0644, and the next
instructor's autograde of that submission fails with PermissionError.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

GROUP_UMASK = 0o007  # the group reads and writes, other accounts get nothing


def share_with_group(root: Path) -> None:
    """Make everything this process writes from now on group-writable when ``root`` is a
    course folder its group shares (the setgid bit on the folder says so); else nothing."""
    if os.stat(root).st_mode & stat.S_ISGID:
        os.umask(GROUP_UMASK)
