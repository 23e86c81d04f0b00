"""`make dev-cluster` and friends: the control-plane script as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kubetools import tools_dir

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tools" / "controlplane" / "cluster.py"


def cluster(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(CLUSTER), *args], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools_dir() / "kubectl"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KUBECONFIG": kubeconfig})


def test_down_keeps_state_and_purge_starts_empty(tmp_path):
    state = str(tmp_path / "dev")
    try:
        kubeconfig = cluster("up", state).splitlines()[-1].removeprefix("export KUBECONFIG=")
        version = kubectl(kubeconfig, "version", "-o", "json")
        assert version.returncode == 0, version.stderr  # failed on `v0.0.0-master+$Format:%H$`
        server = json.loads(version.stdout)["serverVersion"]
        assert server["gitVersion"] == "v1.35.4"
        assert (server["major"], server["minor"]) == ("1", "35")
        assert kubectl(kubeconfig, "create", "namespace", "kept").returncode == 0

        cluster("down", state)
        kubeconfig = cluster("up", state).splitlines()[-1].removeprefix("export KUBECONFIG=")
        assert kubectl(kubeconfig, "get", "namespace", "kept").returncode == 0

        assert "state deleted" in cluster("down", "--purge", state)
        assert not Path(state).exists()
        kubeconfig = cluster("up", state).splitlines()[-1].removeprefix("export KUBECONFIG=")
        gone = kubectl(kubeconfig, "get", "namespace", "kept")
        assert gone.returncode != 0 and "NotFound" in gone.stderr
    finally:
        cluster("down", "--purge", state)


def test_bad_arguments_print_usage():
    proc = subprocess.run([sys.executable, str(CLUSTER), "up", "--purge"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "down --purge" in proc.stderr
    assert "Traceback" not in proc.stderr
