"""Site build time: cold (no mkdocs-jupyter cache: every lesson executes) and warm (cache hit).

    .venv/bin/python bench/site.py [--warm-runs N]

Each build is `pallas-course build-site` (mkdocs build --strict) in a subprocess. The cold run
moves .cache/mkdocs-jupyter aside first and puts it back if the build fails. Prints a table and
writes bench/results/site.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "mkdocs-jupyter"
SITE = REPO / "build" / "site"


def build() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "grader.cli", "build-site"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()
    lessons = sorted((REPO / "lessons").glob("[0-9][0-9]-*.py"))

    with tempfile.TemporaryDirectory() as keep:
        saved = Path(keep) / "cache"
        if CACHE.exists():
            shutil.move(str(CACHE), saved)
        try:
            cold = build()
        except subprocess.CalledProcessError:
            if saved.exists():
                shutil.rmtree(CACHE, ignore_errors=True)
                shutil.move(str(saved), CACHE)
            raise
    warm = [build() for _ in range(args.warm_runs)]
    pages = len(list(SITE.rglob("*.html")))
    rows = [
        {"build": "cold (lessons executed)", "seconds": round(cold, 2),
         "per_lesson_s": round(cold / max(len(lessons), 1), 2), "runs": 1},
        {"build": "warm (cache hit)", "seconds": round(statistics.median(warm), 2),
         "per_lesson_s": round(statistics.median(warm) / max(len(lessons), 1), 2),
         "runs": len(warm)},
    ]
    write("site", rows, {"lessons": len(lessons), "html_pages": pages,
                         "site_bytes": _size(SITE), "cache_bytes": _size(CACHE),
                         "warm_seconds": [round(w, 2) for w in warm]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
