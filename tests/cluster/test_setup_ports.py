"""The class's default ports stay clear of ``make start``'s (issue 52: the hub's 8000 was the
site's, so an instructor who had run ``make start`` got the site, or a set-up that stopped)."""

from __future__ import annotations

import inspect
import re

from clustertools import REPO

from grader.website import site


def test_the_hubs_default_ports_are_not_those_of_make_start():
    script = (REPO / "deploy" / "setup-class.sh").read_text()
    hub = int(re.search(r"^HUB_PORT=(\d+)", script, re.M)[1])
    serve = inspect.signature(site.serve).parameters
    taken_by_make_start = {serve["port"].default, serve["lab_port"].default}
    assert not {hub, hub + 1, hub + 2} & taken_by_make_start  # the hub takes P, P+1, P+2
    assert f"default {hub}" in (REPO / "deploy" / "README.md").read_text()
