"""The operator on a real API server, under the chart's RBAC, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.request
from pathlib import Path

import tsoracle
from tsoracle_dev.kube import Operator, condition, is_ready
from tsoracle_dev.lincheck.history import check, load
from tsoracle_dev.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"


def test_chart_rbac_is_sufficient_and_no_wider(kube, chart, oracle_ns):
    ns = oracle_ns.name
    can = {}
    for verb, resource in [("patch", "timestamporacles/status"), ("get", "secrets"),
                           ("watch", "timestamporacles"), ("create", "events"),
                           ("list", "secrets"), ("delete", "timestamporacles"),
                           ("create", "pods"), ("update", "secrets")]:
        r = kube.kubectl("auth", "can-i", verb, resource, "-n", ns, check=False,
                         kubeconfig=chart.kubeconfig)
        can[(verb, resource)] = r.stdout.strip()
    assert can[("patch", "timestamporacles/status")] == "yes"
    assert can[("get", "secrets")] == "yes"
    assert can[("watch", "timestamporacles")] == "yes"
    assert can[("create", "events")] == "yes"
    for denied in [("list", "secrets"), ("delete", "timestamporacles"), ("create", "pods"),
                   ("update", "secrets")]:
        assert can[denied] == "no", denied
    # spec.catalog: its Deployment and Service, one by one; nothing listed, watched or put.
    for verb, resource, allowed in [
            ("create", "deployments.apps", "yes"), ("patch", "deployments.apps", "yes"),
            ("delete", "deployments.apps", "yes"), ("get", "services", "yes"),
            ("patch", "services", "yes"), ("list", "deployments.apps", "no"),
            ("watch", "services", "no"), ("update", "deployments.apps", "no"),
            ("create", "replicasets.apps", "no")]:
        said = kube.kubectl("auth", "can-i", verb, resource, "-n", ns, check=False,
                            kubeconfig=chart.kubeconfig).stdout.strip()
        assert said == allowed, (verb, resource, said)
    # The Lease: its own, in the release namespace only.
    def lease_can(verb: str, target: str, namespace: str) -> str:
        return kube.kubectl("auth", "can-i", verb, target, "-n", namespace, check=False,
                            kubeconfig=chart.kubeconfig).stdout.strip()

    assert lease_can("update", "leases/tsoracle", chart.namespace) == "yes"
    assert lease_can("get", "leases/tsoracle", chart.namespace) == "yes"
    assert lease_can("update", "leases/kube-scheduler", chart.namespace) == "no"
    assert lease_can("create", "leases", ns) == "no"
    # A real call, not only a review: listing Secrets is refused.
    r = kube.kubectl("-n", ns, "get", "secrets", check=False, kubeconfig=chart.kubeconfig)
    assert r.returncode != 0 and "forbidden" in r.stderr.lower()
    # And the operator, running with exactly this token, reconciles (sufficient).
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(ns, "orders", is_ready, what="Ready under the chart's RBAC")


def test_example_cr_becomes_ready_with_tables(kube, oracle_ns, pg):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    obj = kube.wait_tso(ns, "orders", is_ready, what="Ready")
    status = obj["status"]
    assert condition(obj, "Provisioned")["status"] == "True"
    assert condition(obj, "Degraded")["status"] == "False"
    assert status["activeImplementation"] == "distributed" and status["epoch"] == 1
    assert [t["name"] for t in status["timelines"]] == ["EpochMilliseconds", "counter:orders"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    dbname = oracle_ns.url.rsplit("/", 1)[1]
    tables = pg.sql("SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = 'tsoracle_orders' ORDER BY 1", dbname)
    assert [t[0] for t in tables] == ["deployment", "timestamps"]
    printed = kube.kubectl("-n", ns, "get", "tso").stdout
    assert "IMPLEMENTATION" in printed and "distributed" in printed and "True" in printed
    op = oracle_ns.operator
    live = urllib.request.urlopen(f"http://127.0.0.1:{op.liveness_port}/healthz", timeout=10)
    assert live.status == 200
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics",
                                     timeout=10).read().decode()
    assert 'tsoracle_operator_reconciles_total{result="ok"}' in metrics
    assert "tsoracle_operator_managed_oracles 1.0" in metrics


def test_flip_back_and_forth_under_client_load(kube, oracle_ns, tmp_path):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(ns, "orders", is_ready)
    url = oracle_ns.url + "?schema=tsoracle_orders"
    out = tmp_path / "client.jsonl"
    client = Workload(url, out, concurrency=8, timeline="counter:orders")
    client.wait_for_ops(100)
    flips = []
    epoch = 1
    for n, target in enumerate(("legacy", "distributed"), start=2):
        started = time.monotonic_ns()
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     json.dumps({"spec": {"implementation": target}}))
        obj = kube.wait_tso(ns, "orders", lambda o, e=epoch: is_ready(o)
                            and o["status"].get("epoch") == e + 1, what=f"flip to {target}")
        assert obj["status"]["activeImplementation"] == target
        epoch += 1
        flips.append((started, int(obj["status"]["bootstrapTimestamp"]["counter:orders"])))
        client.wait_for_ops(100 * n)  # it goes on after the flip (reopened if fenced)
    summary = client.finish()
    assert summary["fenced"] >= 1  # clients on the old epoch were told to reopen
    ops = load([out])
    assert len(ops) >= 300
    assert check(ops) == []
    for started, bootstrap in flips:
        before = [o.value for o in ops if o.end < started]
        assert before and bootstrap >= max(before)
    flipped = kube.events(ns, "Flipped")
    assert len(flipped) == 2, [e["message"] for e in flipped]
    assert any("-> legacy" in e["message"] for e in flipped)
    assert any("-> distributed" in e["message"] for e in flipped)


def test_api_server_rejects_bad_resources(kube, chart):
    ns = kube.new_namespace("bad")
    base = {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
            "metadata": {"name": "x"},
            "spec": {"backend": {"urlSecretRef": {"name": "s"}}}}

    def apply(spec_update: dict) -> subprocess.CompletedProcess[str]:
        doc = json.loads(json.dumps(base))
        doc["spec"].update(spec_update)
        return kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(doc), check=False)

    r = apply({"implementation": "quantum"})
    assert r.returncode != 0 and 'Unsupported value: "quantum"' in r.stderr
    r = apply({"timelines": ["EpochMilliseconds", "wallclock"]})
    assert r.returncode != 0 and "should match" in r.stderr and "wallclock" in r.stderr
    assert apply({}).returncode == 0
    obj = kube.tso(ns, "x")
    assert obj["spec"]["implementation"] == "distributed"  # defaults from the schema
    assert obj["spec"]["fencing"] == "Always" and obj["spec"]["deletionPolicy"] == "Retain"
    r = kube.kubectl("-n", ns, "patch", "tso", "x", "--type", "merge", "-p",
                     '{"spec":{"backend":{"urlSecretRef":{"name":"other"}}}}', check=False)
    assert r.returncode != 0 and "urlSecretRef is immutable" in r.stderr
    r = kube.kubectl("-n", ns, "patch", "tso", "x", "--type", "merge", "-p",
                     '{"spec":{"timelines":[]}}', check=False)
    assert r.returncode != 0 and "may only grow" in r.stderr


def test_missing_then_bad_secret_degrades_then_recovers(kube, chart, database, tmp_path):
    ns = kube.new_namespace("sec")
    op = Operator(chart.kubeconfig, ns, tmp_path / "op.log").start()
    try:
        doc = {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
               "metadata": {"name": "s"},
               "spec": {"backend": {"urlSecretRef": {"name": "later"}}}}
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(doc))
        obj = kube.wait_tso(ns, "s", lambda o: condition(o, "Degraded").get("reason")
                            == "SecretNotFound", what="Degraded/SecretNotFound")
        assert condition(obj, "Ready")["status"] == "False"
        assert "later" in condition(obj, "Degraded")["message"]
        bad = "postgresql://tsoracle:s3cr3t-value@127.0.0.1:notaport/x"
        kube.backend_secret(ns, "later", bad)
        obj = kube.wait_tso(ns, "s", lambda o: condition(o, "Degraded").get("reason")
                            == "BadURL", what="Degraded/BadURL")
        unreachable = database.rsplit(":", 1)[0] + ":1/x"  # nothing listens on port 1
        kube.kubectl("-n", ns, "create", "secret", "generic", "later", "--dry-run=client",
                     "-o", "yaml", f"--from-literal=url={unreachable}", check=True)
        patch = {"data": {"url": base64.b64encode(unreachable.encode()).decode()}}
        kube.kubectl("-n", ns, "patch", "secret", "later", "-p", json.dumps(patch))
        obj = kube.wait_tso(ns, "s", lambda o: condition(o, "Degraded").get("reason")
                            == "BackendUnavailable", timeout=90, what="BackendUnavailable")
        message = condition(obj, "Degraded")["message"]
        assert "127.0.0.1" not in message and "tsoracle:" not in message
        patch = {"data": {"url": base64.b64encode(database.encode()).decode()}}
        kube.kubectl("-n", ns, "patch", "secret", "later", "-p", json.dumps(patch))
        obj = kube.wait_tso(ns, "s", is_ready, timeout=90, what="recovery")
        assert condition(obj, "Degraded")["status"] == "False"
        everything = json.dumps(obj) + json.dumps(kube.events(ns))
        everything += op.log.read_text()
        for secret in ("s3cr3t-value", "tsoracle-test-pw"):
            assert secret not in everything
    finally:
        op.stop()


def test_operator_restart_mid_flip_finishes_it_exactly_once(kube, chart, database, tmp_path):
    ns = kube.new_namespace("crash")
    kube.backend_secret(ns, "oracle-db", database)
    crashing = Operator(chart.kubeconfig, ns, tmp_path / "op1.log",
                        crash_after_flip=True).start()
    try:
        kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
        kube.wait_tso(ns, "orders", is_ready)
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     '{"spec":{"implementation":"legacy"}}')
        assert crashing.wait_exit(60) == 3  # died right after the flip committed
    finally:
        crashing.stop()
    url = database + "?schema=tsoracle_orders"
    assert asyncio.run(tsoracle.status(url)).deployment.epoch == 2
    assert kube.tso(ns, "orders")["status"]["epoch"] == 1  # not published yet
    healthy = Operator(chart.kubeconfig, ns, tmp_path / "op2.log").start()
    try:
        obj = kube.wait_tso(ns, "orders", lambda o: is_ready(o) and o["status"]["epoch"] == 2,
                            what="resumed flip")
        assert obj["status"]["activeImplementation"] == "legacy"
        # Two more passes (periodic, every statusRefreshSeconds): chances for a wrong 2nd flip.
        healthy.wait_reconciles(healthy.reconciles() + 2)
        deadline = time.monotonic() + 60  # Events are posted in the background
        while not kube.events(ns, "Flipped") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert asyncio.run(tsoracle.status(url)).deployment.epoch == 2
        assert kube.tso(ns, "orders")["status"]["epoch"] == 2
        assert len(kube.events(ns, "Flipped")) == 1
    finally:
        healthy.stop()


def test_deletion_policy(kube, oracle_ns, pg):
    ns = oracle_ns.name
    dbname = oracle_ns.url.rsplit("/", 1)[1]
    for name, policy in (("keep", "Retain"), ("drop", "Delete")):
        doc = {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
               "metadata": {"name": name},
               "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"},
                                    "schema": f"s_{name}"},
                        "deletionPolicy": policy}}
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(doc))
        kube.wait_tso(ns, name, is_ready)
        finalizers = kube.tso(ns, name)["metadata"].get("finalizers", [])
        assert "tsoracle.io/finalizer" in finalizers
        kube.kubectl("-n", ns, "delete", "tso", name, "--timeout=60s")
    schemas = {r[0] for r in pg.sql("SELECT schema_name FROM information_schema.schemata",
                                    dbname)}
    assert "s_keep" in schemas and "s_drop" not in schemas


def test_spark_client_discovers_the_oracle_through_the_resource(kube, oracle_ns):
    from tsoracle.spark import OracleClient

    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(ns, "orders", is_ready)
    client = OracleClient.from_resource("orders", ns, kubeconfig=str(kube.kubeconfig),
                                        timeline="counter:orders")
    try:
        assert client.resource_implementation == "distributed" and client.resource_epoch == 1
        w = client.write_ts().timestamp
        client.apply_write(w)
        assert client.read_ts() == w
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     '{"spec":{"implementation":"legacy"}}')
        kube.wait_tso(ns, "orders", lambda o: o["status"].get("epoch") == 2 and is_ready(o))
        assert client.read_ts() >= w  # reopened on the new implementation, not the old one
        assert client.implementation("counter:orders") == "legacy"
        assert client.epoch("counter:orders") == 2 and client.reopens == 1
    finally:
        client.close()


def test_chart_grants_spark_drivers_just_enough(kube, oracle_ns, tmp_path):
    from tsoracle.spark import OracleClient

    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(ns, "orders", is_ready)
    kube.helm("install", "drivers", str(ROOT / "charts" / "tsoracle"), "-n", ns,
              "--set", "crds.install=false", "--set", "sparkDrivers.enabled=true",
              "--set", "sparkDrivers.secretNames={oracle-db}")
    kube.kubectl("-n", ns, "create", "serviceaccount", "spark")
    kubeconfig = kube.token_kubeconfig(ns, "spark", tmp_path / "spark-kubeconfig")
    client = OracleClient.from_resource("orders", ns, kubeconfig=str(kubeconfig))
    try:
        assert client.read_ts("EpochMilliseconds") >= 0  # the CR and its Secret were readable
    finally:
        client.close()
    for verb, what in [("get", "secret/other"), ("list", "secrets"),
                       ("patch", "timestamporacles"), ("delete", "timestamporacles")]:
        r = kube.kubectl("auth", "can-i", verb, what, "-n", ns, check=False,
                         kubeconfig=kubeconfig)
        assert r.stdout.strip() == "no", (verb, what)


def test_only_secrets_labelled_for_tsoracle_are_used(kube, chart, database, pg, tmp_path):
    # Before the fix: any Secret in the namespace was used, so whoever may create a resource
    # could have the operator provision into (and with Delete, drop from) any database whose
    # credentials sit in that namespace.
    ns = kube.new_namespace("label")
    kube.backend_secret(ns, "app-db", database, label=False)
    op = Operator(chart.kubeconfig, ns, tmp_path / "op.log").start()
    try:
        doc = {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
               "metadata": {"name": "borrowed"},
               "spec": {"backend": {"urlSecretRef": {"name": "app-db"}, "schema": "s_label"},
                        "deletionPolicy": "Delete"}}
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(doc))
        obj = kube.wait_tso(ns, "borrowed", lambda o: condition(o, "Degraded").get("reason")
                            == "SecretNotLabelled", what="Degraded/SecretNotLabelled")
        message = condition(obj, "Degraded")["message"]
        assert "kubectl label secret app-db" in message and "tsoracle.io/backend=true" in message
        dbname = database.rsplit("/", 1)[1]
        schemas = {r[0] for r in pg.sql("SELECT schema_name FROM information_schema.schemata",
                                        dbname)}
        assert "s_label" not in schemas  # nothing was provisioned
        kube.kubectl("-n", ns, "label", "secret", "app-db", "tsoracle.io/backend=true")
        kube.wait_tso(ns, "borrowed", is_ready, what="Ready once labelled")
        # Taking the label away again: the operator stops using the Secret, and a deletion
        # with deletionPolicy: Delete keeps the tables rather than act on it.
        kube.kubectl("-n", ns, "label", "secret", "app-db", "tsoracle.io/backend-")
        kube.wait_tso(ns, "borrowed", lambda o: condition(o, "Degraded").get("reason")
                      == "SecretNotLabelled", what="Degraded again once unlabelled")
        kube.kubectl("-n", ns, "delete", "tso", "borrowed", "--timeout=60s")
        tables = pg.sql("SELECT table_name FROM information_schema.tables"
                        " WHERE table_schema = 's_label'", dbname)
        assert sorted(t[0] for t in tables) == ["deployment", "timestamps"]
    finally:
        op.stop()


def catalog_resource(name: str, **catalog: object) -> str:
    return json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": name},
        "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"}, "schema": f"s_{name}"},
                 "timelines": ["EpochMilliseconds", "counter:lake"],
                 "catalog": {"enabled": True, "warehouse": "file:///srv/warehouse",
                             "volume": {"hostPath": "/srv/warehouse"}, **catalog}}})


def catalog_ready(obj: dict) -> dict:
    return condition(obj, "CatalogReady")


def test_spec_catalog_gets_a_deployment_and_a_service_until_disabled(kube, chart, database,
                                                                     tmp_path):
    """Under the chart's RBAC. This API server runs no pods (no node, no controller-manager):
    the test sets the Deployment's status itself where a kubelet would; test_node.py runs the
    catalog's pods for real."""
    ns = kube.new_namespace("cat")
    kube.backend_secret(ns, "oracle-db", database)
    op = Operator(chart.kubeconfig, ns, tmp_path / "op.log",
                  env={"TSORACLE_CATALOG_IMAGE": "tsoracle:test"}).start()
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=catalog_resource(
            "lake", replicas=2, tokenSecretRef={"name": "lake-token"}))
        obj = kube.wait_tso(ns, "lake", lambda o: catalog_ready(o).get("reason")
                            == "TokenSecretNotFound", what="CatalogReady/TokenSecretNotFound")
        assert is_ready(obj)  # the oracle itself is fine
        assert "lake-token" in catalog_ready(obj)["message"]
        kube.kubectl("-n", ns, "create", "secret", "generic", "lake-token",
                     "--from-literal=token=s3cret-token")
        obj = kube.wait_tso(ns, "lake", lambda o: catalog_ready(o).get("reason")
                            == "ReplicasNotReady", what="CatalogReady/ReplicasNotReady")
        assert catalog_ready(obj)["status"] == "False"
        assert catalog_ready(obj)["message"] == "0 of 2 replicas ready"
        assert obj["status"]["catalog"] == {
            "url": f"http://lake-catalog.{ns}.svc:8181", "replicas": 2, "readyReplicas": 0}

        d = kube.get(ns, "deployment", "lake-catalog")
        [owner] = d["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
            ("TimestampOracle", "lake", obj["metadata"]["uid"], True)
        assert d["spec"]["replicas"] == 2
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        assert c["image"] == "tsoracle:test"
        assert c["args"][:2] == ["catalog", "serve"] and "--token-file" in c["args"]
        assert c["args"][c["args"].index("--timeline") + 1] == "EpochMilliseconds"
        env = {e["name"]: e for e in c["env"]}
        assert env["TSORACLE_BACKEND_URL"]["valueFrom"]["secretKeyRef"] == {"name": "oracle-db",
                                                                            "key": "url"}
        assert env["TSORACLE_URL"]["value"] == "$(TSORACLE_BACKEND_URL)?schema=s_lake"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert {"name": "warehouse", "mountPath": "/srv/warehouse"} in c["volumeMounts"]
        svc = kube.get(ns, "service", "lake-catalog")
        assert svc["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
        assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} == {("http", 8181),
                                                                         ("metrics", 9090)}
        assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        # The server-side apply's field manager is the operator's.
        fields = json.loads(kube.kubectl("-n", ns, "get", "deployment", "lake-catalog", "-o",
                                         "json", "--show-managed-fields").stdout)
        managers = {(m["manager"], m["operation"]) for m in fields["metadata"]["managedFields"]}
        assert ("tsoracle-operator", "Apply") in managers
        # Neither the URL nor its password is in the objects, the resource, Events or the log.
        password = database.split(":")[2].split("@")[0]
        shown = json.dumps([d, svc, kube.tso(ns, "lake"), kube.events(ns)])
        assert password not in shown and database not in shown
        assert "s3cret-token" not in shown

        # Where a kubelet and the Deployment controller would report the pods ready.
        def pods_ready(n: int) -> None:
            kube.kubectl("-n", ns, "patch", "deployment", "lake-catalog", "--subresource=status",
                         "--type", "merge", "-p", json.dumps(
                             {"status": {"replicas": 2, "readyReplicas": n}}))

        pods_ready(2)
        obj = kube.wait_tso(ns, "lake", lambda o: catalog_ready(o).get("status") == "True",
                            what="CatalogReady", timeout=60)
        assert catalog_ready(obj)["reason"] == "Serving"
        assert obj["status"]["catalog"]["readyReplicas"] == 2
        # On legacy one replica serves: said in the condition and a Warning Event.
        kube.kubectl("-n", ns, "patch", "tso", "lake", "--type", "merge", "-p",
                     '{"spec":{"implementation":"legacy"}}')
        pods_ready(1)
        obj = kube.wait_tso(ns, "lake", lambda o: catalog_ready(o).get("reason")
                            == "LegacyServesOneReplica", what="LegacyServesOneReplica",
                            timeout=60)
        assert catalog_ready(obj)["status"] == "True"
        assert "spec.catalog.replicas is 2" in catalog_ready(obj)["message"]
        deadline = time.monotonic() + 30  # Events are posted in the background
        while not kube.events(ns, "LegacyServesOneReplica") and time.monotonic() < deadline:
            time.sleep(0.2)
        [event] = kube.events(ns, "LegacyServesOneReplica")
        assert event["type"] == "Warning"

        # A change to the spec is applied; a change by hand is put back.
        kube.kubectl("-n", ns, "patch", "tso", "lake", "--type", "merge", "-p",
                     '{"spec":{"catalog":{"replicas":1}}}')
        wait_for_object(kube, ns, "deployment", "lake-catalog",
                        lambda o: o["spec"]["replicas"] == 1, "replicas 1")
        kube.kubectl("-n", ns, "scale", "deployment", "lake-catalog", "--replicas=3")
        wait_for_object(kube, ns, "deployment", "lake-catalog",
                        lambda o: o["spec"]["replicas"] == 1, "the operator's replicas back")

        # Disabled: both go, and so do status.catalog and CatalogReady.
        kube.kubectl("-n", ns, "patch", "tso", "lake", "--type", "merge", "-p",
                     '{"spec":{"catalog":{"enabled":false}}}')
        obj = kube.wait_tso(ns, "lake", lambda o: "catalog" not in o["status"],
                            what="status.catalog removed")
        assert not catalog_ready(obj) and is_ready(obj)
        for kind in ("deployment", "service"):
            gone = kube.kubectl("-n", ns, "get", kind, "lake-catalog", check=False)
            assert gone.returncode != 0 and "NotFound" in gone.stderr, kind
        log = (tmp_path / "op.log").read_text()
        # Applied when created, when spec.catalog changed and when put back; not every pass.
        assert log.count(f"{ns}/lake: catalog applied") == 3, log
        assert log.count(f"{ns}/lake: catalog removed") == 1
        assert password not in log and "s3cret-token" not in log
    finally:
        op.stop()


def wait_for_object(kube, ns: str, kind: str, name: str, predicate, what: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        obj = kube.get(ns, kind, name)
        if predicate(obj):
            return obj
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_catalog_name_taken_by_something_else_is_left_alone(kube, chart, database,
                                                               tmp_path):
    ns = kube.new_namespace("taken")
    kube.backend_secret(ns, "oracle-db", database)
    kube.kubectl("-n", ns, "create", "service", "clusterip", "shop-catalog", "--tcp=80:80")
    op = Operator(chart.kubeconfig, ns, tmp_path / "op.log",
                  env={"TSORACLE_CATALOG_IMAGE": "tsoracle:test"}).start()
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=catalog_resource("shop"))
        obj = kube.wait_tso(ns, "shop", lambda o: catalog_ready(o).get("reason")
                            == "CatalogNameInUse", what="CatalogReady/CatalogNameInUse")
        assert f"Service {ns}/shop-catalog exists" in catalog_ready(obj)["message"]
        assert kube.kubectl("-n", ns, "get", "deployment", "shop-catalog",
                            check=False).returncode != 0  # nothing applied
        assert kube.get(ns, "service", "shop-catalog")["spec"]["ports"][0]["port"] == 80
        # Disabling it does not delete what is not the resource's either.
        kube.kubectl("-n", ns, "patch", "tso", "shop", "--type", "merge", "-p",
                     '{"spec":{"catalog":{"enabled":false}}}')
        kube.wait_tso(ns, "shop", lambda o: not catalog_ready(o), what="CatalogReady gone")
        assert kube.get(ns, "service", "shop-catalog")["spec"]["ports"][0]["port"] == 80
    finally:
        op.stop()


def test_api_server_rejects_bad_catalogs(kube, chart):
    ns = kube.new_namespace("badcat")
    base = {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
            "metadata": {"name": "x"},
            "spec": {"backend": {"urlSecretRef": {"name": "s"}}}}

    def apply(catalog: dict, **spec: object) -> subprocess.CompletedProcess[str]:
        doc = json.loads(json.dumps(base))
        doc["spec"].update(spec, catalog=catalog)
        return kube.kubectl("-n", ns, "apply", "--dry-run=server", "-f", "-",
                            stdin=json.dumps(doc), check=False)

    for catalog, says in [
            ({"enabled": True}, "spec.catalog.warehouse is required when spec.catalog.enabled"),
            ({"enabled": True, "warehouse": "file:///w"}, "spec.catalog.volume is required "
                                                          "for a file:// warehouse"),
            ({"enabled": True, "warehouse": "s3://b/w", "volume": {"hostPath": "/w"}},
             "spec.catalog.volume is only for file:// warehouses"),
            ({"enabled": True, "warehouse": "file:///w", "volume": {}},
             "exactly one of hostPath and claimName"),
            ({"enabled": True, "warehouse": "hdfs://nn/w"}, "spec.catalog.warehouse"),
            ({"enabled": True, "warehouse": "s3://b/w", "replicas": 0}, "spec.catalog.replicas"),
            ({"enabled": True, "warehouse": "s3://b/w", "timeline": "counter:x"},
             "spec.catalog.timeline must be one of spec.timelines"),
            ({"enabled": True, "warehouse": "file:///w", "volume": {"hostPath": "/w"},
              "ioProperties": {"s3.region": "x"}}, "are for an s3:// warehouse"),
            ({"enabled": True, "warehouse": "s3://b/w", "credentialsSecretRef": {}},
             "spec.catalog.credentialsSecretRef.name"),
            ({"enabled": True, "warehouse": "s3://b/w",
              "resources": {"limits": {"memory": "lots"}}}, "spec.catalog.resources.limits"),
            ({"enabled": True, "warehouse": "s3://b/w", "retentionSeconds": -1},
             "spec.catalog.retentionSeconds"),
            ({"enabled": True, "warehouse": "s3://b/w", "retentionSeconds": 315360001},
             "spec.catalog.retentionSeconds"),
            ({"enabled": True, "warehouse": "s3://b/w", "retentionSeconds": "3600"},
             "spec.catalog.retentionSeconds"),
    ]:
        r = apply(catalog)
        assert r.returncode != 0 and says in r.stderr, (catalog, r.stderr)
    r = apply({"enabled": True, "warehouse": "s3://b/w", "timeline": "counter:x",
               "resources": {"requests": {"cpu": 1, "memory": "256Mi"}},
               "ioProperties": {"s3.endpoint": "http://minio:9000"},
               "credentialsSecretRef": {"name": "lake-s3"}, "retentionSeconds": 7200.5},
              timelines=["EpochMilliseconds", "counter:x"])
    assert r.returncode == 0, r.stderr
    shown = json.loads(kube.kubectl("-n", ns, "apply", "--dry-run=server", "-o", "json", "-f",
                                    "-", stdin=json.dumps({**base, "spec": {
                                        **base["spec"], "catalog": {
                                            "enabled": True, "warehouse": "s3://b/w",
                                            "tokenSecretRef": {"name": "t"}}}})).stdout)
    assert shown["spec"]["catalog"]["replicas"] == 1  # defaults from the schema
    assert shown["spec"]["catalog"]["tokenSecretRef"]["key"] == "token"
    assert "retentionSeconds" not in shown["spec"]["catalog"]  # no default: the catalog's own
