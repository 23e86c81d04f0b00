"""Run only by tests/test_localpg.py, in a pytest of its own that it then interrupts or kills.

Uses the suite's own server fixtures, writes the pids of the servers they started to
$HOLD_SERVERS_FILE and waits to be stopped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest


@pytest.mark.pg
@pytest.mark.kube
def test_hold_servers(request) -> None:
    pg = request.getfixturevalue("pg")
    pids = {"postgres": int((pg.data / "postmaster.pid").read_text().split()[0])}
    dirs = [str(pg.base), str(getattr(pg, "home", pg.base))]
    if os.environ.get("HOLD_SERVERS_KUBE"):
        kube = request.getfixturevalue("kube")
        pids.update(kube.plane.info()["pids"])
        dirs.append(str(kube.plane.state))
    out = Path(os.environ["HOLD_SERVERS_FILE"])
    out.with_suffix(".tmp").write_text(json.dumps({"pids": pids, "dirs": dirs}))
    out.with_suffix(".tmp").rename(out)
    time.sleep(600)
