"""First start: serve answers at once while the site is built behind it, swaps the built site
in, and the URLs (in a box) are the last thing printed, before and after the build."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from sitetools import free_port
from wstools import REPO

from grader.learner import workspace
from grader.website import site

# serve with its site folder in tmp and a stand-in for mkdocs that takes 3 s
DRIVER = """
import sys
from pathlib import Path
from grader.website import site
site.SITE_DIR, site.LOG_DIR = Path(sys.argv[1]), Path(sys.argv[2])
site.site_is_stale = lambda: True
site.build_command = lambda strict=True, site_dir=None: [sys.executable, "-c",
    "import pathlib, sys, time; time.sleep(3); d = pathlib.Path(sys.argv[1]); d.mkdir(); "
    "(d / 'index.html').write_text('THE BUILT SITE')", str(site_dir)]
sys.exit(site.serve(port=int(sys.argv[3]), lab_port=int(sys.argv[4]),
                    workspace_dir=Path(sys.argv[5])))
"""


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_site_answers_at_once_and_the_build_is_swapped_in(tmp_path):
    ws = tmp_path / "ws"
    (ws / "lessons").mkdir(parents=True)
    for f in workspace.lesson_files(REPO):
        shutil.copy(f, ws / "lessons")
    port, lab_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path / "site"), str(tmp_path / "logs"),
         str(port), str(lab_port), str(ws)], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()

    def wait_for(pred, what, timeout=120):
        deadline = time.monotonic() + timeout
        while not pred():
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, f"{what}:\n{''.join(lines)}"
            time.sleep(0.2)

    try:
        wait_for(lambda: any(x.startswith("└") for x in lines), "no URL box")
        box = "".join(lines)
        assert f"site:       http://127.0.0.1:{port}/" in box
        assert "being built" in box
        assert f"http://127.0.0.1:{lab_port}/lab/tree/lessons?token=" in box
        if "site built in" not in box:  # while it builds, the page says so and reloads
            page = _get(f"http://127.0.0.1:{port}/")
            assert "being built" in page and 'http-equiv="refresh"' in page
        wait_for(lambda: lines and lines[-1].startswith("└") and
                 any(x.startswith("site built in") for x in lines), "the build never finished")
        assert _get(f"http://127.0.0.1:{port}/") == "THE BUILT SITE"
        after = "".join(lines).split("site built in", 1)[1]
        assert "JupyterLab: http://" in after and "being built" not in after  # the box again
        assert not (tmp_path / "site.next").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            site.stop_processes([proc])
