"""`kubectl tsoracle`, found by the real kubectl binary as a plugin, on the real API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.kube import is_ready

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"


@pytest.fixture
def plugin(kube, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "kubectl-tsoracle"
    # The console script pip installs: the same entry point, under this test's interpreter.
    entry = "import sys; from tsoracle.cli import kubectl_main; sys.exit(kubectl_main())"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{entry}" "$@"\n')
    wrapper.chmod(0o755)
    env = {**kube.env(), "PATH": f"{bindir}:{os.environ['PATH']}"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(kube.tools / "kubectl"), "tsoracle", *args],
                              capture_output=True, text=True, env=env, timeout=180)

    return run


def test_status_flip_fencing_report(kube, oracle_ns, plugin, tmp_path):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(ns, "orders", is_ready)

    human = plugin("status", "orders", "-n", ns)
    assert human.returncode == 0, human.stderr
    assert "implementation  distributed" in human.stdout and "epoch           1" in human.stdout
    assert "counter:orders" in human.stdout and "Ready" in human.stdout
    machine = json.loads(plugin("status", "orders", "-n", ns, "-o", "json").stdout)
    assert machine["status"]["epoch"] == 1
    assert {t["name"] for t in machine["status"]["timelines"]} == {"EpochMilliseconds",
                                                                   "counter:orders"}

    flipped = plugin("flip", "orders", "--to", "legacy", "-n", ns)
    assert flipped.returncode == 0, flipped.stderr
    assert "waiting for the operator" in flipped.stdout
    assert "flipped to legacy at epoch 2" in flipped.stdout
    assert kube.tso(ns, "orders")["status"]["activeImplementation"] == "legacy"
    again = plugin("flip", "orders", "--to", "legacy", "-n", ns)
    assert "nothing to do" in again.stdout

    off = plugin("fencing", "off", "orders", "-n", ns)
    assert off.returncode == 0 and "warning" in off.stderr
    assert kube.tso(ns, "orders")["spec"]["fencing"] == "Disabled"
    assert plugin("fencing", "on", "orders", "-n", ns).returncode == 0
    assert kube.tso(ns, "orders")["spec"]["fencing"] == "Always"

    out = tmp_path / "report.zip"
    leaky = tmp_path / "leaky.log"  # a log line that quotes the backend URL must be redacted
    leaky.write_text(f"connecting to {oracle_ns.url} failed\n")
    rep = plugin("report", "orders", "-n", ns, "--output", str(out),
                 "--operator-log", str(oracle_ns.log), "--operator-log", str(leaky))
    assert rep.returncode == 0, rep.stderr
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert {"timestamporacle.json", "events.json", "operator-local-0.log",
                "operator-local-1.log"} <= names
        assert "connecting to <backend> failed" in z.read("operator-local-1.log").decode()
        everything = "".join(z.read(n).decode() for n in names)
    assert "Flipped" in everything  # the flip's Event is in the report
    assert "tsoracle-test-pw" not in everything and oracle_ns.url not in everything

    missing = plugin("status", "nope", "-n", ns)
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr
