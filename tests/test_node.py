"""The user's path on a real node: `make images`, `helm install` with the chart's defaults, the
operator as a pod, `helm test`, a flip, a pod lost mid-flip, `helm upgrade` and `helm uninstall`.

The cluster is tsoracle_dev.controlplane with its node (kubelet, containerd, runc, CNI bridge,
kube-proxy, CoreDNS, scheduler, controller-manager), started by the module fixture in a folder of
its own and purged afterwards. The tests run in file order and build on each other, as a user's
session does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.node import own_node
from tsoracle_dev import images
from tsoracle_dev.controlplane.node import NODE_NAME
from tsoracle_dev.kube import Kube, condition, is_ready

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.node, pytest.mark.kube, pytest.mark.pg]  # the module's own cluster

RELEASE, SYSTEM = "tsoracle", "tsoracle-system"
NS = "orders-app"
OPERATOR_SA = f"system:serviceaccount:{SYSTEM}:tsoracle"
EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"
TIMES: dict[str, float] = {}  # step -> seconds, printed at the end for the issue note
SEEN: dict[str, Any] = {}  # pods, phases and probe counts, printed with them


def _timed(step: str, started: float) -> None:
    TIMES[step] = round(time.monotonic() - started, 1)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    started = time.monotonic()
    with own_node(tmp_path_factory, "node") as cluster:
        _timed("make dev-cluster (binaries cached)", started)
        try:
            yield cluster
        finally:
            print("\nnode test timings (s):", json.dumps(TIMES))
            print("node test saw:", json.dumps(SEEN, default=str))


def run(node: SimpleNamespace, *argv: str, timeout: float = 600) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=node.env, timeout=timeout,
                          cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def operator_pods(kube: Kube) -> list[dict[str, Any]]:
    return json.loads(kube.kubectl(
        "-n", SYSTEM, "get", "pods", "-l", "app.kubernetes.io/component=operator",
        "-o", "json").stdout)["items"]


def wait_for(what: str, probe: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def ready_pod(kube: Kube, *, other_than: str = "") -> dict[str, Any] | None:
    for pod in operator_pods(kube):
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        if pod["metadata"]["name"] != other_than and pod["status"].get("phase") == "Running" \
                and conds.get("Ready") == "True" and "deletionTimestamp" not in pod["metadata"]:
            return pod
    return None


def probe_counts(kube: Kube, pod: str) -> dict[tuple[str, str], float]:
    """The kubelet's own probe counters for a pod: (probe type, result) -> count."""
    text = kube.kubectl("get", "--raw", f"/api/v1/nodes/{NODE_NAME}/proxy/metrics/probes").stdout
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("prober_probe_total{") and f'pod="{pod}"' in line:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            key = (labels["probe_type"], labels["result"])
            counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_make_images_imports_the_charts_image_into_the_node(node):
    started = time.monotonic()
    out = run(node, "make", "-s", "images")
    _timed("make images", started)
    assert images.OPERATOR_IMAGE in out, out
    listed = subprocess.run(
        ["ctr", "--address", node.plane.info()["containerd_address"], "-n", "k8s.io", "images",
         "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    assert images.OPERATOR_IMAGE_NORMALISED in listed
    assert images.PAUSE_IMAGE in listed


def test_helm_install_runs_the_operator_as_a_ready_pod(node):
    kube = node.kube
    started = time.monotonic()
    # The chart's defaults: no image override, no values at all.
    run(node, "helm", "install", RELEASE, "charts/tsoracle", "-n", SYSTEM, "--create-namespace",
        "--wait", "--timeout", "5m")
    _timed("helm install --wait", started)
    [pod] = operator_pods(kube)
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["phase"] == "Running"
    [status] = pod["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status
    assert status["image"] == images.OPERATOR_IMAGE_NORMALISED
    # The kubelet probed it: its readiness made the pod Ready, and liveness (first after 10 s)
    # answered too, both counted by the kubelet itself.
    counts = wait_for("a liveness probe", lambda: (c := probe_counts(kube, name)).get(
        ("Liveness", "successful")) and c, timeout=60)
    assert counts.get(("Readiness", "successful"), 0) >= 1, counts
    SEEN["installed pod"] = {"name": name, "phase": pod["status"]["phase"],
                             "probes": {f"{t}/{r}": n for (t, r), n in counts.items()}}
    # Readiness may fail while the operator starts (no initial delay); liveness never may.
    assert set(counts) <= {("Liveness", "successful"), ("Readiness", "successful"),
                           ("Readiness", "failed")}, counts
    # The ServiceAccount token was mounted by the kubelet (projected, nothing minted here).
    assert pod["spec"]["serviceAccountName"] == "tsoracle"
    token = kube.kubectl("-n", SYSTEM, "exec", name, "--", "cat",
                         "/var/run/secrets/kubernetes.io/serviceaccount/token").stdout
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["sub"] == OPERATOR_SA
    assert claims["kubernetes.io"]["pod"]["name"] == name
    # It runs as the chart says: uid 65532, read-only root file system.
    ident = kube.kubectl("-n", SYSTEM, "exec", name, "--", "python", "-c",
                         "import os; print(os.getuid()); open('/x', 'w')", check=False)
    assert ident.stdout.split() == ["65532"] and "Read-only file system" in ident.stderr
    # RBAC as the chart grants it, no more.
    def can(*args: str) -> str:
        return kube.kubectl("auth", "can-i", *args, "--as", OPERATOR_SA, check=False).stdout
    assert can("watch", "timestamporacles.tsoracle.io", "-A").strip() == "yes"
    assert can("create", "pods", "-n", SYSTEM).strip() == "no"


def test_helm_test_hook_pod_runs_and_passes(node):
    started = time.monotonic()
    out = run(node, "helm", "test", RELEASE, "-n", SYSTEM, "--logs", "--timeout", "3m")
    _timed("helm test", started)
    assert re.search(r"Phase:\s+Succeeded", out), out
    assert "operator is serving metrics" in out, out  # the hook pod's own output


def test_apply_the_example_and_flip_with_the_plugin(node):
    kube = node.kube
    kube.kubectl("create", "namespace", NS)
    kube.backend_secret(NS, "oracle-db", node.pg_url)  # the URL pods reach PostgreSQL at
    started = time.monotonic()
    kube.kubectl("-n", NS, "apply", "-f", str(EXAMPLE))
    obj = kube.wait_tso(NS, "orders", is_ready, timeout=120, what="Ready")
    _timed("kubectl apply -> Ready", started)
    assert obj["status"]["epoch"] == 1
    started = time.monotonic()
    out = run(node, "kubectl", "tsoracle", "flip", "orders", "--to", "legacy", "-n", NS)
    _timed("kubectl tsoracle flip", started)
    assert "legacy" in out
    obj = kube.tso(NS, "orders")
    assert obj["status"]["epoch"] == 2 and obj["status"]["activeImplementation"] == "legacy"
    wait_for("the Flipped event", lambda: kube.events(NS, "Flipped"), timeout=60)
    shown = run(node, "kubectl", "tsoracle", "status", "orders", "-n", NS, "-o", "json")
    assert json.loads(shown)["implementation"] == "legacy"


def _admin(node: SimpleNamespace) -> psycopg.Connection[Any]:
    return psycopg.connect(node.pg_url, autocommit=True)


def test_operator_pod_deleted_mid_flip_a_new_pod_finishes_it_once(node):
    """The flip's first statement waits on a table lock the test holds; the pod is deleted
    while it waits, the lock released only once that pod is gone: the new pod must flip."""
    kube = node.kube
    [old] = [p["metadata"]["name"] for p in operator_pods(kube)]
    flips_before = len(kube.events(NS, "Flipped"))
    holder = psycopg.connect(node.pg_url)
    table = holder.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
        " AND table_name LIKE %s", ("tsoracle_orders", "%timestamps%")).fetchone()[0]
    holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
        sql.Identifier("tsoracle_orders", table)))
    try:
        kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p",
                     '{"spec":{"implementation":"distributed"}}')
        with _admin(node) as admin:
            wait_for("the operator's flip to wait on the lock", lambda: admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                " 'tsoracle-operator' AND wait_event_type = 'Lock'").fetchone()[0], timeout=60)
        container = operator_pods(kube)[0]["status"]["containerStatuses"][0]["containerID"]
        kube.kubectl("-n", SYSTEM, "delete", "pod", old, "--grace-period=0", "--force")
        # The API object goes at once with --force; the process goes when the kubelet kills it.
        tasks = ["ctr", "--address", node.plane.info()["containerd_address"], "-n", "k8s.io",
                 "tasks", "ls", "-q"]
        wait_for("the old pod's container to stop", lambda: container.split("//")[1] not in
                 subprocess.run(tasks, capture_output=True, text=True).stdout, timeout=60)
        new = wait_for("a new Ready operator pod", lambda: ready_pod(kube, other_than=old),
                       timeout=180)
    finally:
        holder.rollback()
        holder.close()
    obj = kube.wait_tso(NS, "orders", lambda o: is_ready(o) and o["status"]["epoch"] == 3,
                        timeout=120, what="the flip finished by the new pod")
    assert obj["status"]["activeImplementation"] == "distributed"
    assert new["metadata"]["name"] != old
    SEEN["mid-flip"] = {"deleted": old, "finished by": new["metadata"]["name"]}
    time.sleep(5)  # room for a wrong second flip or a late event
    with _admin(node) as admin:
        epoch = admin.execute(sql.SQL("SELECT epoch FROM {} WHERE id = 1").format(
            sql.Identifier("tsoracle_orders", table.replace("timestamps", "deployment")))
        ).fetchone()[0]
    assert epoch == 3
    assert kube.tso(NS, "orders")["status"]["epoch"] == 3
    assert len(kube.events(NS, "Flipped")) == flips_before + 1


def test_operator_logs_tell_the_story_without_secrets(node):
    kube = node.kube
    pod = ready_pod(kube)
    assert pod is not None
    logs = kube.kubectl("-n", SYSTEM, "logs", pod["metadata"]["name"]).stdout
    assert f"{NS}/orders" in logs, logs[-3000:]
    assert re.search(r"flip", logs, re.IGNORECASE), logs[-3000:]
    password = psycopg.conninfo.conninfo_to_dict(node.pg_url)["password"]
    assert password not in logs and node.pg_url not in logs


CATALOG_TOKEN = "catalog-bearer-7f3a"


def catalog_pods(kube: Kube) -> list[dict[str, Any]]:
    return json.loads(kube.kubectl(
        "-n", NS, "get", "pods", "-l", "app.kubernetes.io/name=tsoracle-catalog",
        "-o", "json").stdout)["items"]


def ready_catalog_pods(kube: Kube) -> list[str]:
    return [p["metadata"]["name"] for p in catalog_pods(kube)
            if "deletionTimestamp" not in p["metadata"]
            and {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get(
                "Ready") == "True"]


def http(url: str, *, token: str | None = CATALOG_TOKEN, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers={
        "Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def flip_to(node: SimpleNamespace, to: str) -> None:
    node.kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p",
                      json.dumps({"spec": {"implementation": to}}))
    node.kube.wait_tso(NS, "orders", lambda o: is_ready(o) and o["status"][
        "activeImplementation"] == to, timeout=120, what=f"the flip to {to}")


def test_the_catalog_runs_as_pods_behind_its_service_and_the_oracle_stamps_commits(
        node, tmp_path_factory):
    """spec.catalog on the example resource: two catalog pods from the operator's image,
    Ready on /readyz, reached through the Service's ClusterIP (kube-proxy) with the bearer
    token; pyiceberg on this host commits through it, each snapshot stamped with an oracle
    timestamp, on distributed, on legacy (one replica) and back; disabled, they go."""
    import pyarrow as pa
    from pyiceberg.catalog.rest import RestCatalog

    import tsoracle

    kube = node.kube
    warehouse = tmp_path_factory.mktemp("warehouse")
    os.chown(warehouse, 65532, 65532)  # the catalog's user writes the metadata files
    kube.kubectl("-n", NS, "create", "secret", "generic", "catalog-token",
                 f"--from-literal=token={CATALOG_TOKEN}")
    started = time.monotonic()
    kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p", json.dumps(
        {"spec": {"implementation": "distributed", "catalog": {
            "enabled": True, "replicas": 2, "warehouse": f"file://{warehouse}",
            "volume": {"hostPath": str(warehouse)},
            "tokenSecretRef": {"name": "catalog-token"}}}}))
    obj = kube.wait_tso(NS, "orders", lambda o: condition(o, "CatalogReady").get("status")
                        == "True", timeout=240, what="CatalogReady")
    _timed("spec.catalog -> CatalogReady (2 pods)", started)
    assert condition(obj, "CatalogReady")["reason"] == "Serving"
    assert obj["status"]["catalog"] == {"url": f"http://orders-catalog.{NS}.svc:8181",
                                        "replicas": 2, "readyReplicas": 2}
    pods = catalog_pods(kube)
    assert len(pods) == 2 and len(ready_catalog_pods(kube)) == 2
    name = pods[0]["metadata"]["name"]
    [status] = pods[0]["status"]["containerStatuses"]
    assert status["image"] == images.OPERATOR_IMAGE_NORMALISED and status["restartCount"] == 0
    counts = probe_counts(kube, name)
    assert counts.get(("Readiness", "successful"), 0) >= 1, counts
    SEEN["catalog pods"] = {p["metadata"]["name"]: p["status"]["phase"] for p in pods}
    # The URL is in no argument and no pod spec: only the kubelet resolves it.
    password = psycopg.conninfo.conninfo_to_dict(node.pg_url)["password"]
    pod_json = json.dumps(pods)
    assert password not in pod_json and node.pg_url not in pod_json
    assert CATALOG_TOKEN not in pod_json
    ident = kube.kubectl("-n", NS, "exec", name, "--", "python", "-c",
                         "import os; print(os.getuid())").stdout
    assert ident.split() == ["65532"]

    svc = kube.get(NS, "service", "orders-catalog")
    base = f"http://{svc['spec']['clusterIP']}:8181"
    assert http(f"{base}/v1/config", token=None)[0] == 401
    assert http(f"{base}/v1/config", token="wrong")[0] == 401
    assert http(f"{base}/v1/config")[0] == 200
    assert http(f"{base}/readyz", token=None)[0] == 200
    # The Service's DNS name, the one status.catalog.url gives, from a pod (cluster DNS).
    probe = kube.kubectl("-n", NS, "exec", name, "--", "python", "-c",
                         "import urllib.request as u; r = u.Request("
                         f"'{obj['status']['catalog']['url']}/v1/config', headers="
                         f"{{'Authorization': 'Bearer {CATALOG_TOKEN}'}}); "
                         "print('config', u.urlopen(r, timeout=10).status)", check=False)
    assert "config 200" in probe.stdout, probe.stdout + probe.stderr

    url = f"{node.pg_url}?schema=tsoracle_orders"

    def read_ts() -> int:
        code, body = http(f"{base}/v1/tsoracle/read-ts", method="POST")
        assert code == 200, body
        return int(json.loads(body)["read-ts"])

    def replicas(n: int) -> None:
        kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p",
                     json.dumps({"spec": {"catalog": {"replicas": n}}}))

    def serving(n: int, what: str) -> None:
        wait_for(what, lambda: len(catalog_pods(kube)) == n
                 and len(ready_catalog_pods(kube)) == n, timeout=120)

    catalog = RestCatalog("tso", uri=base, token=CATALOG_TOKEN)
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", schema=pa.schema([("id", pa.int64())]))
    stamps = []
    for implementation, rows in (("distributed", [1, 2]), ("legacy", [3]),
                                 ("distributed", [4, 5])):
        if implementation == "legacy":
            # Legacy serves the timeline to one process: one replica, then the flip.
            replicas(1)
            serving(1, "one catalog pod")
            flip_to(node, "legacy")
        elif stamps:
            # Two replicas on legacy: the caveat, in CatalogReady and a Warning Event.
            replicas(2)
            said = kube.wait_tso(NS, "orders", lambda o: condition(o, "CatalogReady").get(
                "reason") == "LegacyServesOneReplica", timeout=120, what="the legacy caveat")
            assert "spec.catalog.replicas is 2" in condition(said, "CatalogReady")["message"]
            wait_for("the Warning Event", lambda: kube.events(NS, "LegacyServesOneReplica"),
                     timeout=60)
            flip_to(node, "distributed")
            serving(2, "both catalog pods ready on distributed")
        before = read_ts()
        table.append(pa.table({"id": pa.array(rows, pa.int64())}))
        snapshot = table.current_snapshot()
        assert snapshot is not None
        after = read_ts()
        # A commit after a read at `before` lands above it, and a read after it sees it.
        assert before < snapshot.timestamp_ms <= after, (before, snapshot.timestamp_ms, after)
        oracle = asyncio.run(tsoracle.status(url))
        [epoch_ms] = [t for t in oracle.timelines if t.timeline == "EpochMilliseconds"]
        assert snapshot.timestamp_ms <= epoch_ms.write_ts  # handed out by the oracle
        stamps.append((implementation, snapshot.snapshot_id, snapshot.timestamp_ms, after))
    assert [s[2] for s in stamps] == sorted({s[2] for s in stamps})  # strictly increasing
    # Time travel at each read timestamp returns that cut, now and later.
    fresh = RestCatalog("tso2", uri=base, token=CATALOG_TOKEN).load_table("shop.orders")
    for n, (_, snapshot_id, _, at) in enumerate(stamps):
        assert fresh.snapshot_as_of_timestamp(at).snapshot_id == snapshot_id
        rows = fresh.scan(snapshot_id=snapshot_id).to_arrow().num_rows
        assert rows == [2, 3, 5][n]
    SEEN["catalog commits"] = [(i, ts) for i, _, ts, _ in stamps]

    code, metrics = http(f"http://{svc['spec']['clusterIP']}:9090/metrics", token=None)
    assert code == 200 and "tsoracle_catalog_commits_total" in metrics
    assert re.search(r'tsoracle_catalog_request_seconds_count\{route="[^"]*",status="200"\}',
                     metrics), metrics[-2000:]
    logs = "".join(kube.kubectl("-n", NS, "logs", p["metadata"]["name"]).stdout
                   for p in catalog_pods(kube))
    assert password not in logs and CATALOG_TOKEN not in logs

    # Disabled: the Deployment goes, and its pods with it (garbage collection).
    started = time.monotonic()
    kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p",
                 '{"spec":{"catalog":{"enabled":false}}}')
    wait_for("the catalog's pods gone", lambda: not catalog_pods(kube), timeout=120)
    _timed("spec.catalog disabled -> pods gone", started)
    assert "catalog" not in kube.tso(NS, "orders")["status"]
    assert kube.kubectl("-n", NS, "get", "service", "orders-catalog", check=False).returncode


def test_deleting_a_resource_deletes_its_catalog(node):
    """The Deployment and Service are owned by the resource: garbage collection removes them
    with it (deletionPolicy Retain keeps the tables)."""
    kube = node.kube
    kube.kubectl("-n", NS, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": "lake"},
        "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"}, "schema": "s_lake"},
                 "catalog": {"enabled": True, "warehouse": "s3://lake/tables"}}}))
    wait_for("the catalog's Deployment", lambda: kube.kubectl(
        "-n", NS, "get", "deployment", "lake-catalog", check=False).returncode == 0, timeout=60)
    kube.kubectl("-n", NS, "delete", "tso", "lake", "--timeout=60s")
    wait_for("the catalog's Deployment and Service collected", lambda: all(
        kube.kubectl("-n", NS, "get", kind, "lake-catalog", check=False).returncode
        for kind in ("deployment", "service")), timeout=120)


def _leftovers(kube: Kube) -> list[str]:
    names = kube.kubectl("-n", SYSTEM, "get", "deployments,replicasets,pods,services,"
                         "serviceaccounts,roles,rolebindings,leases,configmaps", "-o",
                         "name").stdout.split()
    names += kube.kubectl("get", "clusterroles,clusterrolebindings", "-l",
                          f"app.kubernetes.io/instance={RELEASE}", "-o", "name").stdout.split()
    # What every namespace has of its own is not the chart's.
    return [n for n in names if n not in ("serviceaccount/default", "configmap/kube-root-ca.crt")]


def test_helm_upgrade_then_uninstall_leaves_nothing_behind(node):
    kube = node.kube
    [before] = [p["metadata"]["name"] for p in operator_pods(kube)]
    started = time.monotonic()
    run(node, "helm", "upgrade", RELEASE, "charts/tsoracle", "-n", SYSTEM, "--reuse-values",
        "--set", "metrics.port=9191", "--wait", "--timeout", "5m")
    _timed("helm upgrade --wait", started)
    pod = wait_for("the upgraded pod alone", lambda: (p := operator_pods(kube)) and len(p) == 1
                   and p[0]["metadata"]["name"] != before and ready_pod(kube), timeout=120)
    assert "--metrics-port=9191" in pod["spec"]["containers"][0]["args"]
    SEEN["upgraded pod"] = {"name": pod["metadata"]["name"], "phase": pod["status"]["phase"]}
    def replicas() -> list[int]:
        items = json.loads(kube.kubectl("-n", SYSTEM, "get", "rs", "-o", "json").stdout)["items"]
        return sorted(rs["status"].get("replicas", 0) for rs in items)
    wait_for("the old ReplicaSet scaled to 0", lambda: replicas() == [0, 1], timeout=60)

    started = time.monotonic()
    run(node, "helm", "uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "3m")
    # helm deletes the Deployment; its ReplicaSets and Pods go by garbage collection.
    left: list[str] = []

    def gone() -> bool:
        left[:] = _leftovers(kube)
        return not left
    try:
        wait_for("garbage collection", gone, timeout=120)
    except AssertionError:
        raise AssertionError(f"left behind after helm uninstall: {left}") from None
    _timed("helm uninstall -> nothing left", started)
    crd = kube.kubectl("get", "crd", "timestamporacles.tsoracle.io", "-o", "json", check=False)
    assert crd.returncode == 0, "the CRD must be kept (helm.sh/resource-policy: keep)"
    assert kube.tso(NS, "orders")["metadata"]["name"] == "orders"  # and the resources with it
