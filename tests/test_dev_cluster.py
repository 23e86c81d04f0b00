"""`make dev-cluster` and friends: the control-plane command as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tsoracle_dev.controlplane.cluster import ControlPlane
from tsoracle_dev.controlplane.node import missing_prerequisites, write_secret
from tsoracle_dev.kubetools import tools_dir
from tsoracle_dev.localpg import PASSWORD as FIXTURE_PASSWORD

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


def path_without(tmp: Path, *names: str) -> str:
    """This PATH with the programs `names` left out: the folders holding one of them are
    replaced by a folder of links to their other programs."""
    shadow = tmp / "path-bin"
    shadow.mkdir(exist_ok=True)
    kept = []
    for folder in os.environ["PATH"].split(os.pathsep):
        if not folder or not any((Path(folder) / name).exists() for name in names):
            kept.append(folder)
            continue
        for entry in Path(folder).iterdir():
            if entry.name not in names and not (shadow / entry.name).exists():
                (shadow / entry.name).symlink_to(entry)
    return os.pathsep.join([*kept, str(shadow)])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("args", [["build"], ["up", "STATE"]])
def test_a_missing_go_is_one_line_naming_its_package(tmp_path, args):
    """Not a FileNotFoundError traceback: `build` needs go to compile, `up` (with the node) for
    the pause image too. An empty cache, so nothing is found built."""
    env = {**os.environ, "PATH": path_without(tmp_path, "go"),
           "TSORACLE_CACHE": str(tmp_path / "cache"),
           "GOMODCACHE": str(tmp_path / "gomodcache")}  # nothing of Go's found either
    state = tmp_path / "state"
    proc = subprocess.run([*CLUSTER, *[str(state) if a == "STATE" else a for a in args]],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "go not found on PATH" in proc.stderr
    assert "apt-get install golang-go" in proc.stderr
    assert not (state / "cluster.json").exists()  # nothing started


def test_a_new_go_toolchain_names_new_binaries(tmp_path):
    """Each cached Go binary's name is keyed by the toolchain too: the same sources built by
    another Go are another binary, so a newer go on PATH never runs an older build."""
    fake = tmp_path / "fake-go"
    fake.mkdir()
    (fake / "go").write_text("#!/bin/sh\necho go1.99.0\n")
    (fake / "go").chmod(0o755)
    probe = ("from tsoracle_dev.controlplane.cluster import _recipe; "
             "from tsoracle_dev.lincheck.runner import checker_path; "
             "print(_recipe('etcd', 'v3.6.16'), checker_path().name)")
    keys = []
    for path in (os.environ["PATH"], f"{fake}{os.pathsep}{os.environ['PATH']}"):
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env={**os.environ, "PATH": path}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        keys.append(proc.stdout.strip())
    (etcd, checker), (etcd_new, checker_new) = (k.split() for k in keys)
    assert etcd != etcd_new and checker != checker_new, keys


def test_missing_node_programs_name_their_debian_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", path_without(tmp_path, "containerd", "runc", "conntrack"))
    problems = missing_prerequisites()
    for line in ("containerd not found on PATH: apt-get install containerd",
                 "runc not found on PATH: apt-get install runc",
                 "conntrack not found on PATH: apt-get install conntrack"):
        assert line in problems


def test_the_postgres_password_is_random_per_state_folder(tmp_path):
    one, two = ControlPlane(tmp_path / "one"), ControlPlane(tmp_path / "two")
    first, second = one.postgres_password(), two.postgres_password()
    assert first != second
    assert FIXTURE_PASSWORD not in (first, second) and len(first) >= 32
    assert ControlPlane(tmp_path / "one").postgres_password() == first  # made once, kept
    for plane in (one, two):
        assert _mode(plane.state / "pki" / "postgres-password") == 0o600
        assert _mode(plane.state / "pki") == 0o700


def test_a_database_from_before_random_passwords_keeps_its_password(tmp_path):
    """Its role has the fixed password, and Secrets made from its URL hold it: it stays until
    `make dev-cluster-reset`."""
    plane = ControlPlane(tmp_path / "old")
    plane.pg.data.mkdir(parents=True)
    try:
        (plane.pg.data / "PG_VERSION").write_text("15\n")
        assert plane.postgres_password() == FIXTURE_PASSWORD
        assert _mode(plane.state / "pki" / "postgres-password") == 0o600
    finally:
        shutil.rmtree(plane.pg.home)  # as root, a folder of its own outside tmp_path


def test_write_secret_replaces_a_readable_file_whole(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text("old")
    path.chmod(0o644)
    before = path.stat().st_ino
    umask = os.umask(0)
    try:
        write_secret(path, "new")
    finally:
        os.umask(umask)
    assert path.read_text() == "new" and _mode(path) == 0o600
    assert path.stat().st_ino != before  # a new file renamed over: never readable, never half
    assert os.listdir(tmp_path) == ["cluster.json"]


@pytest.mark.pg
@pytest.mark.kube
def test_up_without_a_node_says_what_it_waits_for_and_keeps_its_secrets(short_tmp):
    """PostgreSQL, etcd and kube-apiserver only (no node): the progress lines on stderr, the
    last line on stdout, every secret file 0600, a random password kept across `down`, and a
    new one after `down --purge`."""
    state = short_tmp / "dev"
    try:
        up = subprocess.run([*CLUSTER, "up", "--no-node", str(state)], capture_output=True,
                            text=True, timeout=900)
        assert up.returncode == 0, up.stderr[-3000:]
        assert up.stdout.splitlines()[-1] == f"export KUBECONFIG={state / 'kubeconfig'}"
        waits = [line for line in up.stderr.splitlines() if line.startswith("waiting for ")]
        assert [w.partition("...")[0] for w in waits] == [
            "waiting for PostgreSQL", "waiting for etcd", "waiting for kube-apiserver"], up.stderr
        assert all(re.fullmatch(r"waiting for [^.]+\.\.\. ok( \(\d+ s\))?", w) for w in waits)
        assert "Traceback" not in up.stderr

        for rel in ("cluster.json", "kubeconfig", "pki/admin-token", "pki/tokens.csv",
                    "pki/postgres-password", "pki/sa.key", "pki/apiserver.key"):
            assert _mode(state / rel) == 0o600, rel
        password = (state / "pki" / "postgres-password").read_text().strip()
        match = re.search(r"^postgres: (\S+)$", up.stdout, re.M)
        assert match
        url = match.group(1)
        assert f":{password}@" in url and FIXTURE_PASSWORD not in url
        assert json.loads((state / "cluster.json").read_text())["postgres_url"] == url
        psycopg.connect(url, connect_timeout=10).close()

        cluster("down", str(state))
        plane = ControlPlane(state)  # PostgreSQL again, as `up` starts it
        assert plane.postgres_password() == password
        plane.pg.password = plane.postgres_password()
        plane.pg.start()
        try:
            psycopg.connect(url, connect_timeout=10).close()  # the URL users hold still works
        finally:
            plane.pg.stop()

        cluster("down", "--purge", str(state))
        assert not state.exists()
        assert ControlPlane(state).postgres_password() != password
    finally:
        cluster("down", "--purge", str(state))


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


# --- `make spark-k8s-demo`'s wait (issue 28, item 1) ---------------------------------------

def _tso_status(*conditions: tuple[str, str, str, str]) -> dict:
    return {"conditions": [{"type": t, "status": s, "reason": r, "message": m}
                           for t, s, r, m in conditions]}


def test_the_spark_demo_stops_at_once_on_a_degraded_resource(capsys):
    """It waited about 4 minutes on `kubectl wait … --for=condition=CatalogReady`, saying
    nothing, while the resource was Degraded (SchemaInUse), then failed with a timeout."""
    from tsoracle_dev import spark_k8s

    degraded = _tso_status(("CatalogReady", "Unknown", "SchemaInUse", ""),
                           ("Degraded", "True", "SchemaInUse", "schema 'x' belongs to default/o"))
    asked = []
    assert not spark_k8s.wait_condition(lambda: asked.append(1) or degraded, "CatalogReady", 180)
    assert len(asked) == 1  # at once, not at the timeout
    err = capsys.readouterr().err
    assert "Degraded (SchemaInUse): schema 'x' belongs to default/o" in err
    ready = _tso_status(("CatalogReady", "True", "Serving", ""))
    assert spark_k8s.wait_condition(lambda: ready, "CatalogReady", 180)


def test_the_spark_demo_uses_a_schema_of_its_own():
    """docs/operator.md's default/orders owns the example's schema in the same database."""
    import yaml

    from tsoracle_dev import spark_k8s
    example = yaml.safe_load((spark_k8s.CHECKOUT / "examples" / "timestamporacle.yaml")
                             .read_text())
    assert spark_k8s.DEMO_SCHEMA != example["spec"]["backend"]["schema"]


def _driver(writer_ts: list[int], read_ts: int, rows: int) -> dict:
    return {"failures": [], "appends": [{"batch": b, "ts": ts} for b, ts in enumerate(writer_ts)],
            "final": {"read_ts": read_ts, "rows": rows, "distinct": rows}}


def test_the_spark_demo_checks_what_two_drivers_across_a_flip_must_show():
    """`make spark-k8s-demo` (run on the node by the guides chain) is where two drivers across
    a flip back to distributed are asserted: each way the run can go wrong fails its check."""
    from tsoracle_dev.spark_k8s import DEMO_BATCHES, DEMO_ROWS, demo_checks

    bootstrap = 1_000
    x = [990 + 10 * b for b in range(DEMO_BATCHES)]  # the first on legacy, then distributed
    y = [1_005 + 10 * b for b in range(DEMO_BATCHES)]  # submitted as the flip began
    rows = 2 * DEMO_BATCHES * DEMO_ROWS

    def held(reports=None, boot=bootstrap, through=True) -> list[bool]:
        reports = reports or {"x": _driver(x, 2_000, rows // 2), "y": _driver(y, 2_100, rows)}
        return [ok for _, ok in demo_checks(reports, boot, through)]

    assert held() == [True] * 5
    failed = {w: _driver(s, r, n) for w, s, r, n in (("x", x, 2_000, 600), ("y", y, 2_100, rows))}
    failed["x"]["failures"] = ["a read missed an append"]
    assert held(failed) == [False, True, True, True, True]
    out_of_order = {"x": _driver(x[::-1], 2_000, 600), "y": _driver(y, 2_100, rows)}
    assert held(out_of_order)[0] is False
    reused = {"x": _driver(x, 2_000, 600), "y": _driver([*y[:-1], x[-1]], 2_100, rows)}
    assert held(reused)[1] is False
    assert held(boot=x[0] - 1)[2] is False  # x never committed on legacy
    assert held(through=False) == [True, True, True, False, True]  # y ended before the flip did
    assert held(boot=y[-1])[3] is False  # y never committed on distributed
    short = {"x": _driver(x, 2_000, 600), "y": _driver(y, 2_100, rows - 1)}
    assert held(short)[4] is False
