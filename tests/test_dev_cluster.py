"""`make dev-cluster` and friends: the control-plane command as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tsoracle_dev.kubetools import tools_dir

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = [sys.executable, "-m", "tsoracle_dev.controlplane.cluster"]


@pytest.fixture
def short_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a short path: the kubelet's unix sockets under the state must fit in 107
    bytes, and a test's own tmp_path (its name, and under xdist the worker's folder) may not."""
    return tmp_path_factory.mktemp("dc")


def cluster(*args: str) -> str:
    proc = subprocess.run([*CLUSTER, *args], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools_dir() / "kubectl"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KUBECONFIG": kubeconfig})


@pytest.mark.pg
@pytest.mark.kube
@pytest.mark.node
def test_down_keeps_state_and_purge_starts_empty(short_tmp):
    state = str(short_tmp / "dev")
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
    proc = subprocess.run([*CLUSTER, "up", "--purge"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "down --purge" in proc.stderr
    assert "Traceback" not in proc.stderr


def _ours(state: str) -> list[str]:
    """Processes of the node under `state`: its components, containerd's shims, containers."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cgroups = (proc / "cgroup").read_text()
            zombie = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        if zombie or int(proc.name) == os.getpid():
            continue
        if state in argv or "/run/tsoracle-node/" in argv or "/kubepods" in cgroups:
            found.append(f"{proc.name}: {argv[:120]}")
    return found


def _container_id(kubeconfig: str) -> str:
    pod = json.loads(kubectl(kubeconfig, "get", "pod", "sleeper", "-o", "json").stdout)
    statuses = pod["status"].get("containerStatuses") or [{}]
    running = "running" in statuses[0].get("state", {})
    return statuses[0].get("containerID", "") if running else ""


@pytest.mark.pg
@pytest.mark.kube
@pytest.mark.node
def test_node_versions_and_down_leaves_no_process_or_interface(short_tmp):
    """Each component reports its real version; `down` stops containers and shims and removes
    the bridge and the Service rules; `up` brings the same pods back."""
    state = str(short_tmp / "dev")
    try:
        kubeconfig = cluster("up", state).splitlines()[-1].removeprefix("export KUBECONFIG=")
        info = json.loads((Path(state) / "cluster.json").read_text())
        node = json.loads(kubectl(kubeconfig, "get", "node", "tsoracle-node", "-o",
                                  "json").stdout)["status"]["nodeInfo"]
        assert node["kubeletVersion"] == "v1.35.4"
        assert node["containerRuntimeVersion"].startswith("containerd://1.6")
        for component in ("kube-scheduler", "kube-controller-manager", "kube-proxy"):
            argv = Path(f"/proc/{info['pids'][component]}/cmdline").read_bytes().split(b"\0")
            version = subprocess.run([argv[0].decode(), component, "--version"],
                                     capture_output=True, text=True, timeout=30).stdout
            assert version.strip() == "Kubernetes v1.35.4", (component, version)
        argv = Path(f"/proc/{info['pids']['coredns']}/cmdline").read_bytes().split(b"\0")
        assert "CoreDNS-1.14.7" in subprocess.run([argv[0].decode(), "-version"],
                                                 capture_output=True, text=True).stdout

        assert kubectl(kubeconfig, "run", "sleeper", "--image=tsoracle.dev/pause:3.10",
                       "--image-pull-policy=Never").returncode == 0
        assert kubectl(kubeconfig, "wait", "pod/sleeper", "--for=condition=Ready",
                       "--timeout=120s").returncode == 0
        assert any("/pause" in p for p in _ours(state))  # the test sees containers
        before = _container_id(kubeconfig)
        cluster("down", state)
        assert _ours(state) == []
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "tsoracle0" not in links
        for tool in ("iptables", "ip6tables"):
            for table in ("nat", "filter", "mangle"):
                rules = subprocess.run([tool, "-t", table, "-S"], capture_output=True,
                                       text=True).stdout
                assert "KUBE-" not in rules and "TSORACLE-" not in rules, (tool, table, rules)
        mounts = Path("/proc/self/mounts").read_text()
        assert state not in mounts and "/run/tsoracle-node" not in mounts
        assert not list(Path("/run/tsoracle-node").glob("containerd.sock*"))
        logs = [link for link in Path("/var/log/containers").glob("*.log")
                if os.readlink(link).startswith(state)]
        assert logs == []

        kubeconfig = cluster("up", state).splitlines()[-1].removeprefix("export KUBECONFIG=")
        # The same pod runs again: a new container (the old status would read Ready at once).
        deadline = time.monotonic() + 120
        while _container_id(kubeconfig) in (before, "") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _container_id(kubeconfig) not in (before, "")
        assert kubectl(kubeconfig, "wait", "pod/sleeper", "--for=condition=Ready",
                       "--timeout=120s").returncode == 0
    finally:
        cluster("down", "--purge", state)
    assert _ours(state) == []
