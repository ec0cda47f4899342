"""Run pip and say how far it got: its whole output goes to a log, the terminal gets one line
every few packages, with the minutes since it began.

    python .ci/pip_progress.py LOG -- python -m pip install ...

The course's first install takes some minutes (about 1.5 GB); `pip -q` showed nothing for all of
them. Standard library only: the Makefile runs it before the venv has anything installed. The
exit status is pip's; when pip fails, the log's last lines follow on stderr."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

EVERY = 10  # packages between two progress lines while pip collects


def progress(line: str, collected: int) -> tuple[str | None, int]:
    """The progress line (or None) one line of pip's output gives, and the count of packages
    collected so far."""
    if line.startswith("Collecting "):
        collected += 1
        name = line.split()[1]
        return (f"collected {collected} packages (latest: {name})"
                if collected % EVERY == 0 else None), collected
    if line.startswith("Installing collected packages:"):
        count = len(line.split(":", 1)[1].split(","))
        return f"installing {count} packages (a few minutes without a line)", collected
    if line.startswith("Successfully installed"):
        return f"installed {len(line.split()) - 2} packages", collected
    return None, collected


def main(argv: list[str]) -> int:
    log, sep, *command = argv
    if sep != "--" or not command:
        print("usage: pip_progress.py LOG -- COMMAND...", file=sys.stderr)
        return 2
    start, collected = time.monotonic(), 0
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        for line in pip.stdout:
            out.write(line)
            said, collected = progress(line.strip(), collected)
            if said:
                minutes = (time.monotonic() - start) / 60
                print(f"  pip, {minutes:.0f} min: {said}", flush=True)
    if pip.returncode:
        print("".join(Path(log).read_text().splitlines(keepends=True)[-20:]), file=sys.stderr)
    return pip.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
