"""``python -m grader.website.ship_lessons``: execute the lessons whose shipped pages
(``grader.website.shipped_lessons``) are stale, ship them, and prune the pages and heads no
lesson uses. Seconds when every page is current. It stands on both the site's build
(``grader.website.site.prerender_lessons``) and the store of shipped pages, which the build
reads in turn."""

from __future__ import annotations

import sys

from grader.sources import REPO
from grader.website import shipped_lessons, site


def main() -> int:
    """Execute the lessons whose shipped pages are stale, ship them, prune the rest."""
    runs = site.prerender_lessons(ship=True)
    failed = [run for run in runs.values() if run.error]
    for run in failed:
        print(f"lessons/{run.lesson} failed, not shipped:\n{run.error}", file=sys.stderr)
    removed = shipped_lessons.prune()
    shipped = sorted(run.lesson for run in runs.values()
                     if run.source == "executed" and not run.error)
    store = shipped_lessons.STORE
    size = sum(p.stat().st_size for p in store.iterdir())
    print(f"{store.relative_to(REPO)}: {len(shipped)} lesson(s) executed and shipped "
          f"({', '.join(shipped) or 'none'}), {len(runs) - len(shipped) - len(failed)} "
          f"were current, {len(removed)} files removed; {size / 1e6:.1f} MB", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
