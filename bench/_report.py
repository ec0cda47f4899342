"""Shared output for bench scripts: a printed table and a JSON file under bench/results/."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write(name: str, rows: list[dict], notes: dict | None = None) -> Path:
    """Print ``rows`` as a table and write them, with machine facts, to results/NAME.json."""
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(_fmt(r[k])) for r in rows)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys))
    print("  ".join("-" * widths[k] for k in keys))
    for r in rows:
        print("  ".join(_fmt(r[k]).ljust(widths[k]) for k in keys))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": {"python": platform.python_version(), "cpu": platform.processor(),
                           "system": platform.platform()},
               "rows": rows, **(notes or {})}
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
    return path


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
